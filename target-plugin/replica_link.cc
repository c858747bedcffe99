// ReplicaLink and ReplicaListener (replica_link.h): frames of
// wire/include/blkps/replication.h over one TCP connection.
#include "replica_link.h"

#include <arpa/inet.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "blkps/replication.h"

namespace blkps::server {

namespace {

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

bool SendAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool ReceiveAll(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool SendFrame(int fd, uint32_t kind, uint64_t sequence, const std::string& body) {
  blkps_replica_frame f{};
  std::memcpy(f.magic, BLKPS_REPLICA_MAGIC, sizeof f.magic);
  f.version = BLKPS_REPLICA_VERSION;
  f.kind = kind;
  f.sequence = sequence;
  f.bytes = body.size();
  return SendAll(fd, reinterpret_cast<const char*>(&f), sizeof f) && SendAll(fd, body.data(), body.size());
}

// A frame into *f and *body; a one-line reason on failure.
Status ReceiveFrame(int fd, blkps_replica_frame* f, std::string* body) {
  // A PUSH holds a few blocks' state; more than this is not a record.
  static constexpr uint64_t kMaxBody = uint64_t{1} << 32;
  if (!ReceiveAll(fd, reinterpret_cast<char*>(f), sizeof *f)) return Status::Unavailable("connection lost");
  if (std::memcmp(f->magic, BLKPS_REPLICA_MAGIC, sizeof f->magic) != 0 || f->version != BLKPS_REPLICA_VERSION ||
      f->bytes > kMaxBody) {
    return Status::InvalidArgument("not a blkps replica frame of version " + std::to_string(BLKPS_REPLICA_VERSION));
  }
  body->resize(f->bytes);
  if (!ReceiveAll(fd, body->data(), body->size())) return Status::Unavailable("connection lost");
  return Status::OK();
}

}  // namespace

Status ParseReplicaAddress(const std::string& text, sockaddr_in* out) {
  const size_t colon = text.rfind(':');
  const std::string host = text.substr(0, colon == std::string::npos ? 0 : colon);
  const std::string port = colon == std::string::npos ? "" : text.substr(colon + 1);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  const bool digits = !port.empty() && port.size() <= 5 && port.find_first_not_of("0123456789") == std::string::npos;
  const unsigned long p = digits ? std::stoul(port) : 0;
  if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1 || p == 0 || p > 65535) {
    return Status::InvalidArgument("expected HOST:PORT, HOST a numeric IPv4 address and PORT in [1, 65535], got '" +
                                   text + "'");
  }
  a.sin_port = htons(static_cast<uint16_t>(p));
  *out = a;
  return Status::OK();
}

// ---- The primary's link ----------------------------------------------------

Status ReplicaLink::Connect(const std::string& address, std::shared_ptr<ReplicaLink>* out) {
  sockaddr_in a;
  Status s = ParseReplicaAddress(address, &a);
  if (!s.ok()) return s;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Unavailable(Errno("socket"));
  if (connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
    const std::string why = Errno("connect");
    close(fd);
    return Status::Unavailable(why + ": start the backup first (backup=" + address + ")");
  }
  const int one = 1;  // a record is waited for: send it now
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  out->reset(new ReplicaLink(fd, address));
  return Status::OK();
}

ReplicaLink::~ReplicaLink() {
  shutdown(fd_, SHUT_RDWR);
  if (reader_.joinable()) reader_.join();
  close(fd_);
}

Status ReplicaLink::Hello(const std::string& body) {
  if (!SendFrame(fd_, BLKPS_REPLICA_HELLO, 0, body)) return Status::Unavailable(Errno("send"));
  // A backup that accepts and never answers (stopped) must not hold the
  // caller: a returning backup is looked for again and again.
  pollfd answer_due{fd_, POLLIN, 0};
  if (poll(&answer_due, 1, static_cast<int>(kAckTimeoutSeconds * 1000)) == 0) {
    return Status::Unavailable("no answer to HELLO in " + std::to_string(static_cast<int>(kAckTimeoutSeconds)) + " s");
  }
  blkps_replica_frame f;
  std::string answer;
  Status s = ReceiveFrame(fd_, &f, &answer);
  if (!s.ok()) return s;
  if (f.kind == BLKPS_REPLICA_REFUSE) return Status::Unavailable("refused: " + answer);
  if (f.kind != BLKPS_REPLICA_ACK)
    return Status::Unavailable("answered HELLO with frame kind " + std::to_string(f.kind));
  reader_ = std::thread([this] { ReadAcks(); });
  return Status::OK();
}

Status ReplicaLink::Send(Record kind, const std::string& body) {
  const uint32_t frame_kind = kind == Record::kPush            ? BLKPS_REPLICA_PUSH
                              : kind == Record::kSnapshotBegin ? BLKPS_REPLICA_SNAPSHOT_BEGIN
                              : kind == Record::kParams        ? BLKPS_REPLICA_PARAMS
                              : kind == Record::kLiveness      ? BLKPS_REPLICA_LIVENESS
                                                               : BLKPS_REPLICA_SNAPSHOT;
  uint64_t sequence = 0;
  {
    MutexLock lock(&send_mu_);
    sequence = ++sent_;
    if (!SendFrame(fd_, frame_kind, sequence, body)) Break(Errno("send"));
  }
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                             std::chrono::duration<double>(kAckTimeoutSeconds));
  std::condition_variable answered;
  MutexLock lock(&ack_mu_);
  waiting_[sequence] = &answered;
  while (acked_ < sequence && broken_.empty()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      broken_ = "no acknowledgement in " + std::to_string(static_cast<int>(kAckTimeoutSeconds)) + " s";
      WakeLocked();
      break;
    }
    lock.WaitUntil(answered, deadline);
  }
  waiting_.erase(sequence);
  if (acked_ >= sequence) return Status::OK();
  return Status::Unavailable(broken_);
}

void ReplicaLink::Break(const std::string& why) {
  MutexLock lock(&ack_mu_);
  if (broken_.empty()) broken_ = why;
  WakeLocked();
}

void ReplicaLink::WakeLocked() {
  for (const auto& [sequence, answered] : waiting_) {
    if (sequence > acked_ && broken_.empty()) break;
    answered->notify_one();
  }
}

void ReplicaLink::ReadAcks() {
  for (;;) {
    blkps_replica_frame f;
    std::string body;
    Status s = ReceiveFrame(fd_, &f, &body);
    if (!s.ok()) return Break(s.message());
    if (f.kind == BLKPS_REPLICA_REFUSE) return Break("refused: " + body);
    if (f.kind != BLKPS_REPLICA_ACK) return Break("sent frame kind " + std::to_string(f.kind));
    MutexLock lock(&ack_mu_);
    acked_ = std::max(acked_, f.sequence);
    WakeLocked();
  }
}

// ---- The primary's watch for its backup's return ---------------------------

BackupRejoiner::BackupRejoiner(std::string address, std::weak_ptr<Job> job, Logger log)
    : address_(std::move(address)), job_(std::move(job)), log_(std::move(log)) {
  thread_ = std::thread([this] { Watch(); });
}

BackupRejoiner::~BackupRejoiner() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  thread_.join();
}

void BackupRejoiner::Watch() {
  std::string said;  // the last reason logged
  for (;;) {
    {
      MutexLock lock(&mu_);
      const auto next =
          std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int>(kRetrySeconds * 1000));
      while (!stopping_ && std::chrono::steady_clock::now() < next) lock.WaitUntil(stop_cv_, next);
      if (stopping_) return;
    }
    std::shared_ptr<Job> job = job_.lock();
    if (!job) return;
    if (!job->BackupOutdated()) continue;
    std::shared_ptr<ReplicaLink> link;
    Status s = ReplicaLink::Connect(address_, &link);
    if (s.ok()) s = job->CatchUp(std::move(link));
    if (s.ok()) said.clear();  // a later loss's first reason is said again
    if (s.ok() || s.message() == said) continue;
    said = s.message();
    log_("backup at " + address_ + " not caught up: " + said + "; looking for it again every " +
         std::to_string(static_cast<int>(kRetrySeconds)) + " s");
  }
}

// ---- The backup's port -----------------------------------------------------

Status ReplicaListener::Listen(const std::string& address, std::weak_ptr<Job> job, Logger log,
                               std::unique_ptr<ReplicaListener>* out) {
  sockaddr_in a;
  Status s = ParseReplicaAddress(address, &a);
  if (!s.ok()) return s;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Unavailable(Errno("socket"));
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0 || listen(fd, 4) != 0) {
    const std::string why = Errno("backup=" + address);
    close(fd);
    return Status::Unavailable(why + ": give a free port");
  }
  out->reset(new ReplicaListener(fd, std::move(job), std::move(log)));
  (*out)->acceptor_ = std::thread([l = out->get()] { l->Accept(); });
  return Status::OK();
}

ReplicaListener::~ReplicaListener() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    if (follow_fd_ >= 0) shutdown(follow_fd_, SHUT_RDWR);
  }
  shutdown(listen_fd_, SHUT_RDWR);  // accept() returns
  if (acceptor_.joinable()) acceptor_.join();
  if (follower_.joinable()) follower_.join();
  close(listen_fd_);
}

void ReplicaListener::Accept() {
  for (;;) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0 && errno == EINTR) continue;
    if (fd < 0) return;
    {
      // A connection still followed is ended first: the primary opened this
      // one because it counts that one lost (its far end may not know).
      MutexLock lock(&mu_);
      if (follow_fd_ >= 0) shutdown(follow_fd_, SHUT_RDWR);
    }
    if (follower_.joinable()) follower_.join();
    MutexLock lock(&mu_);
    if (stopping_) {
      close(fd);
      return;
    }
    follow_fd_ = fd;
    const int one = 1;  // an acknowledgement is waited for: send it now (no Nagle delay behind the last one)
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    // Every connection after the first may have missed records: it is
    // followed from a catch-up's snapshot on, never from a write's record.
    const bool snapshot_first = followed_;
    followed_ = true;
    follower_ = std::thread([this, fd, snapshot_first] { Follow(fd, snapshot_first); });
  }
}

void ReplicaListener::Follow(int fd, bool snapshot_first) {
  std::string ended = "its connection ended";
  bool snapshot_begun = false;
  std::string body;  // kept: a record's size is much like the last one's, and not zeroed again
  for (;;) {
    blkps_replica_frame f;
    Status s = ReceiveFrame(fd, &f, &body);
    if (!s.ok()) {
      if (s.code() != Status::Code::kUnavailable) ended = s.message();
      break;
    }
    std::shared_ptr<Job> job = job_.lock();
    if (!job) {
      s = Status::Unavailable("this backup's model is no longer served");
    } else if (f.kind == BLKPS_REPLICA_HELLO) {
      s = job->CheckReplicaHello(body);
    } else if (f.kind == BLKPS_REPLICA_PUSH && snapshot_first && !snapshot_begun) {
      s = Status::Unavailable(
          "this backup followed a primary before and may have missed records since: only a catch-up follows it "
          "again (its primary starts one once the backup is declared outdated)");
    } else if (f.kind == BLKPS_REPLICA_PUSH) {
      s = job->ApplyReplica(body);
    } else if (f.kind == BLKPS_REPLICA_SNAPSHOT_BEGIN) {
      s = job->BeginReplicaSnapshot(body);
      snapshot_begun = snapshot_begun || s.ok();
    } else if (f.kind == BLKPS_REPLICA_SNAPSHOT) {
      s = job->ApplyReplicaSnapshot(body);
    } else if (f.kind == BLKPS_REPLICA_PARAMS) {
      s = job->ApplyReplicaParams(body);
    } else if (f.kind == BLKPS_REPLICA_LIVENESS) {
      s = job->ApplyReplicaLiveness(body);
    } else {
      s = Status::InvalidArgument("unexpected frame kind " + std::to_string(f.kind));
    }
    if (!s.ok()) {
      SendFrame(fd, BLKPS_REPLICA_REFUSE, 0, s.message());
      ended = "refused: " + s.message();
      break;
    }
    // Acknowledgements are cumulative: while the next record is already
    // here, this one's is left to it (one send, and one wake-up of the
    // primary, for a burst of small records).
    char next;
    if (recv(fd, &next, 1, MSG_PEEK | MSG_DONTWAIT) > 0) continue;
    if (!SendFrame(fd, BLKPS_REPLICA_ACK, f.sequence, "")) break;
  }
  log_("replica: stopped following the primary: " + ended + "; this server stays a backup on standby until promoted");
  MutexLock lock(&mu_);
  follow_fd_ = -1;
  close(fd);
}

}  // namespace blkps::server
