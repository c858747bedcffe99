// The libiscsi session (iscsi_session.h) and OpenIscsiDevice (device.h):
// parsing the URL and CHAP credentials, logging in (iscsi:// over TCP,
// iser:// over RDMA), probing the LUN (capacity, limits, the control LUN),
// and telling a refused login from a portal nobody listens at.

#include "iscsi_session.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>

#include "blkps/control_lun.h"
#include "iscsi_device.h"
#include "scsi_sense.h"

namespace blkps::iscsi {

// libiscsi's last error on one line: its messages may hold newlines.
std::string LastError(iscsi_context* iscsi) {
  std::string line;
  for (const char* c = iscsi_get_error(iscsi); *c != '\0'; ++c) {
    const bool space = isspace(static_cast<unsigned char>(*c));
    if (space && (line.empty() || line.back() == ' ')) continue;
    line += space ? ' ' : *c;
  }
  while (!line.empty() && line.back() == ' ') line.pop_back();
  return line;
}

// iscsi_service() without SIGPIPE: libiscsi writes to the socket with
// writev, and a connection the peer reset must end in an error the device
// handles, not kill the learner. SIGPIPE is blocked in this thread while
// libiscsi runs, and one it raised is taken back.
int ServiceWithoutSigpipe(iscsi_context* iscsi, int revents) {
  sigset_t sigpipe, old_mask, pending;
  sigemptyset(&sigpipe);
  sigaddset(&sigpipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &sigpipe, &old_mask);
  sigpending(&pending);
  const bool was_pending = sigismember(&pending, SIGPIPE);
  const int result = iscsi_service(iscsi, revents);
  sigpending(&pending);
  if (!was_pending && sigismember(&pending, SIGPIPE)) {
    const timespec now = {0, 0};
    sigtimedwait(&sigpipe, nullptr, &now);
  }
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  return result;
}

// "iqn.2026-11.io.blkps:learner-<host>-<pid>", the host name folded to the
// characters an IQN allows.
std::string DefaultInitiatorName() {
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  std::string name = "iqn.2026-11.io.blkps:learner-";
  for (const char* c = host; *c != '\0'; ++c) {
    const unsigned char ch = static_cast<unsigned char>(*c);
    const bool allowed = isalnum(ch) || ch == '.' || ch == '-';
    name += allowed ? static_cast<char>(tolower(ch)) : '-';
  }
  return name + "-" + std::to_string(getpid());
}

namespace {

constexpr uint64_t kDefaultRequestBytes = 1 << 20;

// How long poll() may wait: kPollTimeoutMs, less if the deadline is sooner.
int PollMs(Deadline deadline) {
  if (deadline == kNoDeadline) return kPollTimeoutMs;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count() + 1, 0, kPollTimeoutMs));
}

// Services `iscsi` once: waits up to PollMs(deadline) for its socket (or
// kReconnectWaitMs when libiscsi asks for no events) and runs it. False if
// the connection failed.
bool ServiceUntil(iscsi_context* iscsi, Deadline deadline) {
  pollfd pfd{iscsi_get_fd(iscsi), static_cast<short>(iscsi_which_events(iscsi)), 0};
  if (pfd.events == 0) {
    poll(nullptr, 0, std::min(kReconnectWaitMs, PollMs(deadline)));
    return ServiceWithoutSigpipe(iscsi, 0) >= 0;
  }
  if (poll(&pfd, 1, PollMs(deadline)) < 0 && errno != EINTR) return false;
  return ServiceWithoutSigpipe(iscsi, pfd.revents) >= 0;
}

// Switches a new context to iSER. Works around libiscsi 1.19.0's iSER
// initiator (Debian 12), which reads its connection state as if zeroed but
// allocates it with a plain malloc (iscsi_init_iser_transport(); upstream
// fixed it in 2020, "iser: fix segfault at iser_reg_mr", released in 1.20):
// the send descriptor list's head is then heap garbage, and the connection
// thread walks it when the RDMA connection is established (SIGSEGV, or heap
// corruption that glibc reports as a double free later). The state is the
// context's `opaque` (the second field of struct iscsi_context, after `drv`;
// 1.19's layout), 0x10b8 bytes (sizeof(struct iser_conn) in Debian's
// libiscsi7 1.19.0-3, read from its iscsi_init_transport). We zero it as
// 1.20 does, before anything reads it. CMake defines
// BLKPS_LIBISCSI_ISER_UNZEROED only when building against libiscsi 1.19.
// Returns false with the reason in *error.
bool InitIserTransport(iscsi_context* iscsi, std::string* error) {
  if (iscsi_init_transport(iscsi, ISER_TRANSPORT) != 0) {
    *error = LastError(iscsi);
    return false;
  }
#ifdef BLKPS_LIBISCSI_ISER_UNZEROED
  struct ContextHead {  // struct iscsi_context's first fields in libiscsi 1.19
    void* drv;
    void* opaque;
    int transport;  // enum iscsi_transport_type
  };
  constexpr size_t kIserConnBytes = 0x10b8;
  auto* head = reinterpret_cast<ContextHead*>(iscsi);
  if (head->transport != ISER_TRANSPORT || head->opaque == nullptr) {
    *error = "libiscsi's context is not laid out as in 1.19: rebuild blkps against the installed libiscsi";
    return false;
  }
  std::memset(head->opaque, 0, kIserConnBytes);
#endif
  return true;
}

// What iscsi_full_connect_async's callback leaves. Allocated on the heap:
// a context destroyed mid-login may still run the callback.
struct LoginEnd {
  bool done = false;
  int status = 0;
};

}  // namespace

const char kLoginUnanswered[] = "the target did not answer the login in time";

uint64_t NewSessionToken() {
  static std::mutex mu;
  static std::mt19937_64 tokens(std::random_device{}());
  std::lock_guard<std::mutex> lock(mu);
  uint64_t token = 0;
  while (token == 0) token = tokens();
  return token;
}

iscsi_context* LogIn(const SessionSpec& spec, size_t replica, uint64_t session, std::string* error, Deadline deadline) {
  iscsi_context* iscsi = iscsi_create_context(spec.initiator.c_str());
  if (iscsi == nullptr) {
    *error = "cannot create an iSCSI context for " + spec.initiator;
    return nullptr;
  }
  char alias[64];
  snprintf(alias, sizeof alias, "%s%016llx", BLKPS_SESSION_ALIAS_PREFIX, static_cast<unsigned long long>(session));
  iscsi_set_alias(iscsi, alias);
  if (spec.iser && !InitIserTransport(iscsi, error)) {
    iscsi_destroy_context(iscsi);
    return nullptr;
  }
  const Replica& to = spec.replicas[replica];
  iscsi_set_targetname(iscsi, to.target.c_str());
  iscsi_set_session_type(iscsi, ISCSI_SESSION_NORMAL);
  iscsi_set_header_digest(iscsi, ISCSI_HEADER_DIGEST_NONE);
  iscsi_set_initial_r2t(iscsi, ISCSI_INITIAL_R2T_NO);
  iscsi_set_immediate_data(iscsi, ISCSI_IMMEDIATE_DATA_YES);
  iscsi_set_no_ua_on_reconnect(iscsi, 1);
  // A dropped session fails the commands in flight (CANCELLED) and the
  // device reconnects itself (see the top of this file).
  iscsi_set_noautoreconnect(iscsi, 1);
  // The login's commands time out in libiscsi two seconds after
  // `deadline` would: its clock counts whole seconds, and an unanswered
  // login must end here, named kLoginUnanswered, not as libiscsi's
  // "command timed out". Later commands get kCommandTimeoutSeconds.
  iscsi_set_timeout(iscsi, kCommandTimeoutSeconds + 2);
  if (!spec.chap.user.empty()) {
    iscsi_set_initiator_username_pwd(iscsi, spec.chap.user.c_str(), spec.chap.secret.c_str());
  }
  if (!spec.chap.target_user.empty()) {
    iscsi_set_target_username_pwd(iscsi, spec.chap.target_user.c_str(), spec.chap.target_secret.c_str());
  }
  auto on_login = [](iscsi_context*, int status, void*, void* private_data) {
    LoginEnd* end = static_cast<LoginEnd*>(private_data);
    end->done = true;
    end->status = status;
  };
  LoginEnd* end = new LoginEnd;
  if (iscsi_full_connect_async(iscsi, to.portal.c_str(), spec.lun, on_login, end) != 0) {
    delete end;
    *error = LastError(iscsi);
    iscsi_destroy_context(iscsi);
    return nullptr;
  }
  while (!end->done) {
    const bool late = std::chrono::steady_clock::now() >= deadline;
    if (late || !ServiceUntil(iscsi, deadline)) {
      *error = late ? kLoginUnanswered : LastError(iscsi);
      iscsi_destroy_context(iscsi);  // may run on_login, synchronously: `end` is freed after it
      delete end;
      return nullptr;
    }
  }
  const int status = end->status;
  delete end;
  if (status != SCSI_STATUS_GOOD) {
    *error = LastError(iscsi);
    iscsi_destroy_context(iscsi);
    return nullptr;
  }
  iscsi_set_timeout(iscsi, kCommandTimeoutSeconds);
  return iscsi;
}

namespace {

// What a command's callback leaves for RunToEnd.
struct CommandEnd {
  bool done = false;
  scsi_task* task = nullptr;
};

void OnCommandEnd(iscsi_context*, int status, void* command_data, void* private_data) {
  CommandEnd* end = static_cast<CommandEnd*>(private_data);
  end->done = true;
  end->task = static_cast<scsi_task*>(command_data);
  // The status is the callback's; libiscsi's *_sync calls copy it too.
  if (end->task != nullptr) end->task->status = status;
}

}  // namespace

// Gives up (nullptr) at `deadline`, or after kCommandTimeoutSeconds (which
// libiscsi enforces itself on TCP only); the caller then destroys the
// context.
scsi_task* RunToEnd(iscsi_context* iscsi, const StartCommand& start, Deadline deadline) {
  deadline = std::min(deadline, std::chrono::steady_clock::now() + std::chrono::seconds(kCommandTimeoutSeconds));
  CommandEnd* end = new CommandEnd;
  if (start(OnCommandEnd, end) == nullptr) {
    delete end;
    return nullptr;
  }
  while (!end->done) {
    if (std::chrono::steady_clock::now() >= deadline || !ServiceUntil(iscsi, deadline)) return nullptr;  // `end` leaks
  }
  scsi_task* task = end->task;
  delete end;
  return task;
}

namespace {

// Runs a command (RunToEnd) until it reports no UNIT ATTENTION: the first
// commands to a LUN of a new session report its unit attentions (power on,
// reset, LUNs changed), one each, and do nothing. Returns its task.
scsi_task* PastUnitAttentions(iscsi_context* iscsi, const StartCommand& start, Deadline deadline = kNoDeadline) {
  scsi_task* task = nullptr;
  for (int attempt = 0; attempt < 16; ++attempt) {
    if (task != nullptr) scsi_free_scsi_task(task);
    task = RunToEnd(iscsi, start, deadline);
    const bool unit_attention =
        task != nullptr && task->status == SCSI_STATUS_CHECK_CONDITION && task->sense.key == SCSI_SENSE_UNIT_ATTENTION;
    if (!unit_attention) break;
  }
  return task;
}

}  // namespace

// One synchronous command on `lun` of a context with nothing else in
// flight: READ(16) into `data` or WRITE(16) from it, in pieces of at most
// kIserMaxRequestBytes (what iSER carries as well as TCP).
Status SyncTransfer(iscsi_context* iscsi, int lun, Direction direction, uint64_t offset, void* data, uint64_t len,
                    uint32_t block_size, Deadline deadline) {
  char* bytes = static_cast<char*>(data);
  for (uint64_t done = 0; done < len;) {
    const uint32_t piece = static_cast<uint32_t>(std::min<uint64_t>(len - done, kIserMaxRequestBytes));
    const uint64_t lba = (offset + done) / block_size;
    scsi_task* task = PastUnitAttentions(
        iscsi,
        [&](iscsi_command_cb cb, void* end) {
          return direction == Direction::kRead
                     ? iscsi_read16_task(iscsi, lun, lba, piece, block_size, 0, 0, 0, 0, 0, cb, end)
                     : iscsi_write16_task(iscsi, lun, lba, reinterpret_cast<unsigned char*>(bytes + done), piece,
                                          block_size, 0, 0, 0, 0, 0, cb, end);
        },
        deadline);
    const bool good = task != nullptr && task->status == SCSI_STATUS_GOOD &&
                      (direction == Direction::kWrite || task->datain.size >= static_cast<int>(piece));
    if (good && direction == Direction::kRead) std::memcpy(bytes + done, task->datain.data, piece);
    const bool cancelled = task != nullptr && task->status == SCSI_STATUS_CANCELLED;
    const bool sensed = task != nullptr && task->status == SCSI_STATUS_CHECK_CONDITION;
    const bool refused = sensed && task->sense.key == SCSI_SENSE_ILLEGAL_REQUEST;
    const bool late = task == nullptr && std::chrono::steady_clock::now() >= deadline;
    const std::string why = cancelled ? "the connection was lost"
                            : sensed  ? "target returned " + ScsiSenseMessage(task->sense.key, task->sense.ascq)
                            : late    ? "no answer in time"
                                      : LastError(iscsi);
    if (task != nullptr) scsi_free_scsi_task(task);
    if (!good) {
      return Status::Error(refused ? EINVAL : EIO, "%s of LUN %d at byte %llu failed: %s", DirectionName(direction),
                           lun, static_cast<unsigned long long>(offset + done), why.c_str());
    }
    done += piece;
  }
  return Status();
}

Status ProbeServing(iscsi_context* iscsi, int lun, uint32_t block_size, Deadline deadline) {
  scsi_task* task = PastUnitAttentions(
      iscsi,
      [&](iscsi_command_cb cb, void* end) {
        return iscsi_read16_task(iscsi, lun, 0, block_size, block_size, 0, 0, 0, 0, 0, cb, end);
      },
      deadline);
  Status status;
  if (task == nullptr) {
    status = Status::Error(EIO, "probe read failed: %s", LastError(iscsi).c_str());
  } else if (task->status == SCSI_STATUS_CHECK_CONDITION && IsStandbySense(task->sense.key, task->sense.ascq)) {
    status = Status::Error(EAGAIN, "on standby (a backup not promoted)");
  } else if (task->status == SCSI_STATUS_CHECK_CONDITION) {
    status = Status::Error(EIO, "target returned %s", ScsiSenseMessage(task->sense.key, task->sense.ascq).c_str());
  } else if (task->status != SCSI_STATUS_GOOD) {
    status = Status::Error(EIO, "probe read failed: %s", LastError(iscsi).c_str());
  }
  if (task != nullptr) scsi_free_scsi_task(task);
  return status;
}

namespace {

// The capacity in bytes of `lun`, or 0 if READ CAPACITY(16) fails.
uint64_t CapacityBytes(iscsi_context* iscsi, int lun) {
  uint64_t bytes = 0;
  scsi_task* task = PastUnitAttentions(
      iscsi, [&](iscsi_command_cb cb, void* end) { return iscsi_readcapacity16_task(iscsi, lun, cb, end); });
  auto* capacity = task != nullptr && task->status == SCSI_STATUS_GOOD
                       ? static_cast<scsi_readcapacity16*>(scsi_datain_unmarshall(task))
                       : nullptr;
  if (capacity != nullptr) bytes = (capacity->returned_lba + 1) * capacity->block_length;
  if (task != nullptr) scsi_free_scsi_task(task);
  return bytes;
}

// The control LUN of the model behind `lun`, a learner LUN of `device_bytes`:
// the target's LUN that answers INQUIRY with BLKPS_CONTROL_PRODUCT_ID and is
// as large as such a model's control LUN. -1 if there is none.
int FindControlLun(iscsi_context* iscsi, int lun, uint64_t device_bytes) {
  int found = -1;
  scsi_task* task =
      RunToEnd(iscsi, [&](iscsi_command_cb cb, void* end) { return iscsi_reportluns_task(iscsi, 0, 16384, cb, end); });
  auto* list = task != nullptr && task->status == SCSI_STATUS_GOOD
                   ? static_cast<scsi_reportluns_list*>(scsi_datain_unmarshall(task))
                   : nullptr;
  for (uint32_t i = 0; list != nullptr && i < list->num && found < 0; ++i) {
    const int candidate = list->luns[i];
    if (candidate == lun) continue;
    scsi_task* inquiry = RunToEnd(iscsi, [&](iscsi_command_cb cb, void* end) {
      return iscsi_inquiry_task(iscsi, candidate, 0, 0, 255, cb, end);
    });
    auto* standard = inquiry != nullptr && inquiry->status == SCSI_STATUS_GOOD
                         ? static_cast<scsi_inquiry_standard*>(scsi_datain_unmarshall(inquiry))
                         : nullptr;
    if (standard != nullptr) {
      std::string product = standard->product_identification;
      while (!product.empty() && product.back() == ' ') product.pop_back();
      const uint64_t control_bytes = blkps_control_lun_bytes(device_bytes, static_cast<uint64_t>(candidate));
      if (product == BLKPS_CONTROL_PRODUCT_ID && CapacityBytes(iscsi, candidate) == control_bytes) found = candidate;
    }
    if (inquiry != nullptr) scsi_free_scsi_task(inquiry);
  }
  if (task != nullptr) scsi_free_scsi_task(task);
  return found;
}

// The largest transfer the LUN accepts: Block Limits VPD page's MAXIMUM
// TRANSFER LENGTH when reported, and never more than READ(16)'s 32-bit byte
// count that libiscsi takes.
uint64_t MaxRequestBytes(iscsi_context* iscsi, int lun, uint32_t block_size) {
  uint64_t max_bytes = UINT32_MAX / block_size * block_size;
  scsi_task* task = RunToEnd(iscsi, [&](iscsi_command_cb cb, void* end) {
    return iscsi_inquiry_task(iscsi, lun, 1, SCSI_INQUIRY_PAGECODE_BLOCK_LIMITS, 255, cb, end);
  });
  if (task != nullptr && task->status == SCSI_STATUS_GOOD) {
    auto* limits = static_cast<scsi_inquiry_block_limits*>(scsi_datain_unmarshall(task));
    if (limits != nullptr && limits->max_xfer_len != 0) {
      max_bytes = std::min<uint64_t>(max_bytes, static_cast<uint64_t>(limits->max_xfer_len) * block_size);
    }
  }
  if (task != nullptr) scsi_free_scsi_task(task);
  return max_bytes;
}

// What a refused login's status (RFC 3720 10.13.5, as libiscsi words it:
// "... Status: Target not found(515)") says about its cause. tgt answers
// "Target not found" both for an IQN it does not serve and for an initiator
// its ACL does not admit.
const char* LoginRefusalCause(const std::string& login_error) {
  if (login_error.find("(515)") != std::string::npos) {
    return "the target does not serve this IQN, or its ACL does not admit this host's address (or initiator "
           "name): check the IQN, and the target's --allow (and --initiator)";
  }
  if (login_error.find("(513)") != std::string::npos) {
    return "the CHAP credentials are missing or wrong: check BLKPS_CHAP_FILE or the URL's";
  }
  if (login_error.find("(514)") != std::string::npos) {
    return "the target does not authorize this initiator";
  }
  return "check the target IQN, the LUN and the CHAP credentials";
}

// iscsi_full_connect_sync() failed with `login_error`. libiscsi says the
// same thing whether nothing listens at the portal or the login was refused,
// so tell them apart with a bare TCP connection on a scratch context.
Status DiagnoseConnectFailure(const std::string& name, const std::string& portal, const std::string& target, int lun,
                              const std::string& login_error) {
  iscsi_context* probe = iscsi_create_context("iqn.2026-11.io.blkps:probe");
  if (probe == nullptr) {
    return Status::Error(ENOMEM, "cannot create an iSCSI context");
  }
  Status status;
  if (iscsi_connect_sync(probe, portal.c_str()) != 0) {
    status = Status::Error(ECONNREFUSED,
                           "%s: cannot connect to portal %s (is the target "
                           "running and listening there?): %s",
                           name.c_str(), portal.c_str(), LastError(probe).c_str());
  } else {
    status = Status::Error(ECONNREFUSED, "%s: login to target %s LUN %d failed (%s): %s", name.c_str(), target.c_str(),
                           lun, LoginRefusalCause(login_error), login_error.c_str());
  }
  iscsi_destroy_context(probe);
  return status;
}

// Parses `url` into *replica, its LUN and its credentials (the URL's).
Status ParseReplicaUrl(iscsi_context* scratch, const std::string& url, Replica* replica, int* lun,
                       ChapCredentials* chap) {
  iscsi_url* parsed = iscsi_parse_full_url(scratch, url.c_str());
  if (parsed == nullptr) {
    std::string why = LastError(scratch);  // libiscsi quotes the URL: mask it
    for (size_t at = why.find(url); at != std::string::npos; at = why.find(url, at + 1)) {
      why.replace(at, url.size(), MaskTarget(url));
    }
    return Status::Error(EINVAL, "bad target URL: %s", why.c_str());
  }
  *chap = {parsed->user, parsed->passwd, parsed->target_user, parsed->target_passwd};
  const bool iser = url.rfind("iser://", 0) == 0;
  replica->name = std::string(iser ? "iser://" : "iscsi://") + parsed->portal + "/" + parsed->target + "/" +
                  std::to_string(parsed->lun);
  replica->portal = parsed->portal;
  replica->target = parsed->target;
  *lun = parsed->lun;
  iscsi_destroy_url(parsed);
  return Status();
}

// The LUN's logical block size and capacity in bytes (READ CAPACITY(16)).
Status ReadCapacity(iscsi_context* iscsi, const std::string& name, int lun, uint32_t* block_size,
                    uint64_t* size_bytes) {
  scsi_task* task =
      RunToEnd(iscsi, [&](iscsi_command_cb cb, void* end) { return iscsi_readcapacity16_task(iscsi, lun, cb, end); });
  if (task == nullptr || task->status != SCSI_STATUS_GOOD) {
    Status error = Status::Error(EIO, "%s: READ CAPACITY(16) failed: %s", name.c_str(), LastError(iscsi).c_str());
    if (task != nullptr) scsi_free_scsi_task(task);
    return error;
  }
  auto* capacity = static_cast<scsi_readcapacity16*>(scsi_datain_unmarshall(task));
  if (capacity == nullptr || capacity->block_length == 0) {
    scsi_free_scsi_task(task);
    return Status::Error(EIO, "%s: cannot decode READ CAPACITY(16) data", name.c_str());
  }
  *block_size = capacity->block_length;
  *size_bytes = (capacity->returned_lba + 1) * *block_size;
  scsi_free_scsi_task(task);
  return Status();
}

}  // namespace

std::unique_ptr<Device> OpenIscsiDevice(const std::vector<std::string>& urls, const std::string& initiator_name,
                                        Status* status) {
  SessionSpec spec;
  spec.iser = urls.front().rfind("iser://", 0) == 0;
  spec.initiator = initiator_name.empty() ? DefaultInitiatorName() : initiator_name;
  iscsi_context* scratch = iscsi_create_context(spec.initiator.c_str());
  if (scratch == nullptr) {
    *status = Status::Error(ENOMEM, "cannot create an iSCSI context for %s", spec.initiator.c_str());
    return nullptr;
  }
  for (size_t r = 0; r < urls.size(); ++r) {
    Replica replica;
    ChapCredentials chap;
    int lun = 0;
    Status s = ParseReplicaUrl(scratch, urls[r], &replica, &lun, &chap);
    if (s.ok() && r > 0 && (lun != spec.lun || (urls[r].rfind("iser://", 0) == 0) != spec.iser)) {
      s = Status::Error(EINVAL, "replica %s: serves LUN %d over %s; every replica serves LUN %d over %s as %s does",
                        replica.name.c_str(), lun, urls[r].substr(0, urls[r].find(':')).c_str(), spec.lun,
                        spec.iser ? "iser" : "iscsi", spec.replicas[0].name.c_str());
    }
    if (!s.ok()) {
      *status = std::move(s);
      iscsi_destroy_context(scratch);
      return nullptr;
    }
    if (r == 0) {
      // CHAP: the first URL's credentials, else BLKPS_CHAP_FILE's; the same
      // for every replica.
      spec.chap = chap;
      spec.lun = lun;
    }
    spec.replicas.push_back(std::move(replica));
  }
  iscsi_destroy_context(scratch);
  const char* chap_file = std::getenv("BLKPS_CHAP_FILE");
  if (spec.chap.user.empty() && chap_file != nullptr && *chap_file != '\0') {
    if (Status s = ReadChapFile(chap_file, &spec.chap); !s.ok()) {
      *status = std::move(s);
      return nullptr;
    }
  }
  spec.name = spec.replicas[0].name;

  // The first replica that logs in and serves (one replica: the first that
  // logs in, as always); what each other one answered, for the error.
  iscsi_context* iscsi = nullptr;
  const uint64_t session = NewSessionToken();
  size_t replica = 0;
  uint32_t block_size = 0;
  uint64_t size_bytes = 0;
  std::string tried;
  for (; replica < spec.replicas.size(); ++replica) {
    const Replica& r = spec.replicas[replica];
    std::string login_error;
    const Deadline login_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kCommandTimeoutSeconds);
    iscsi = LogIn(spec, replica, session, &login_error, login_deadline);
    Status s;
    if (iscsi == nullptr && login_error == kLoginUnanswered) {
      s = Status::Error(ETIMEDOUT, "%s: the target did not answer the login within %d s", r.name.c_str(),
                        kCommandTimeoutSeconds);
    } else if (iscsi == nullptr && spec.iser) {
      s = Status::Error(ENODEV,
                        "%s: iSER transport unavailable (no RDMA device on this host?): %s; use iscsi:// instead",
                        r.name.c_str(), login_error.c_str());
    } else if (iscsi == nullptr) {
      s = DiagnoseConnectFailure(r.name, r.portal, r.target, spec.lun, login_error);
    } else {
      s = ReadCapacity(iscsi, r.name, spec.lun, &block_size, &size_bytes);
      if (s.ok() && spec.replicated()) {
        s = ProbeServing(iscsi, spec.lun, block_size, kNoDeadline);
        if (!s.ok()) s = Status::Error(s.code(), "%s: %s", r.name.c_str(), s.reason());
      }
      if (!s.ok()) {
        iscsi_destroy_context(iscsi);
        iscsi = nullptr;
      }
    }
    if (s.ok()) break;
    if (!spec.replicated()) {
      *status = std::move(s);
      return nullptr;
    }
    tried += std::string(tried.empty() ? "" : "; ") + s.reason();
  }
  if (iscsi == nullptr) {
    *status = Status::Error(EIO,
                            "no replica of %s serves learners; tried %zu: %s; start one, or promote a backup "
                            "(blkps target promote)",
                            spec.name.c_str(), spec.replicas.size(), tried.c_str());
    return nullptr;
  }
  auto fail = [&](Status error) {
    *status = std::move(error);
    iscsi_destroy_context(iscsi);
    return nullptr;
  };
  if (Status s = ReconnectSeconds(size_bytes, &spec.reconnect_seconds); !s.ok()) return fail(std::move(s));

  uint64_t max_request_bytes = MaxRequestBytes(iscsi, spec.lun, block_size);
  if (spec.iser) max_request_bytes = std::min(max_request_bytes, kIserMaxRequestBytes);
  const uint64_t default_request_bytes = spec.iser ? kIserMaxRequestBytes : kDefaultRequestBytes;
  const int control_lun = FindControlLun(iscsi, spec.lun, size_bytes);
  auto device = std::make_unique<IscsiDevice>(iscsi, session, spec, replica, size_bytes, block_size,
                                              default_request_bytes, max_request_bytes, control_lun);
  if (control_lun >= 0) {
    // A table's width, so that rows of another width are refused before
    // they are sent (Device::table_width).
    if (Status s = device->ReadTableWidth(); !s.ok()) {
      *status = Status::Error(s.code(), "%s; open the model again", s.reason());
      return nullptr;
    }
    // Where the receipt starts: what the server has applied of this
    // initiator's writes so far (nothing, for a new initiator name).
    std::vector<uint32_t> counts;
    blkps_control_receipt header{};
    // A server without receipts (EPROTO), or none for this LUN (the read
    // refused, EINVAL), gets every write in flight resent after a
    // reconnect; a read that failed on the way must not silently do the same.
    Status s = device->ReadReceipt(&counts, &header);
    if (s.ok()) {
      device->ExpectReceipt(std::move(counts));
    } else if (s.code() == EIO) {
      *status = Status::Error(s.code(), "%s; exactly-once pushes need it, so the open fails: open the model again",
                              s.reason());
      return nullptr;
    }
  }
  return device;
}

}  // namespace blkps::iscsi

namespace blkps {

// device.h's entry points; the work is iscsi::OpenIscsiDevice's, above.
std::unique_ptr<Device> OpenIscsiDevice(const std::string& url, const std::string& initiator_name, Status* status) {
  return iscsi::OpenIscsiDevice({url}, initiator_name, status);
}

std::unique_ptr<Device> OpenIscsiDevice(const std::vector<std::string>& replicas, const std::string& initiator_name,
                                        Status* status) {
  return iscsi::OpenIscsiDevice(replicas, initiator_name, status);
}

}  // namespace blkps
