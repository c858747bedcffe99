// IscsiDevice: the model device as a LUN reached through libiscsi, one
// session per device: iscsi:// over TCP, iser:// over RDMA.
//
// Data moves as READ(16)/WRITE(16) commands whose scsi_iovecs point at the
// caller's memory (zero copy), queue_depth of them in flight, driven by poll()
// on the context's descriptor.
//
// Exactly-once writes (doc/libblkps.md "Faults"). A write is a gradient: resending one
// the server has already applied counts it twice. So the device, not
// libiscsi, reconnects a dropped session (libiscsi would resend every command
// in flight): it logs in again, fences its old writes (the control LUN's
// fence=<lun>), waits until the server has none in progress, reads its
// receipt (how many of its writes starting at each 512-byte unit the server
// has applied; blkps/control_lun.h) and resends only the writes the receipt
// lacks. Reads and syncs are resent as they are. The device keeps what it
// expects the receipt to say (expected_); after a target restart from a
// checkpoint the receipt is the checkpoint's, and writes it acknowledged that
// the receipt lacks were lost with the server's memory: counted in
// writes_lost() and said on stderr. Without a control LUN (a target not made
// by blkps) the device resends every write in flight, as libiscsi would.

#include <iscsi/iscsi.h>
#include <iscsi/scsi-lowlevel.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <thread>
#include <unordered_map>

#include "blkps/control_lun.h"
#include "device.h"
#include "scsi_sense.h"

namespace blkps {
namespace {

static_assert(sizeof(scsi_iovec) == sizeof(iovec) && offsetof(scsi_iovec, iov_base) == offsetof(iovec, iov_base) &&
                  offsetof(scsi_iovec, iov_len) == offsetof(iovec, iov_len),
              "libiscsi promises scsi_iovec has the layout of iovec");

constexpr uint64_t kDefaultRequestBytes = 1 << 20;
// The most one iser:// command carries: tgt's iSER driver takes at most
// buf_sz_kb (512 KiB by default) per command, and libiscsi 1.19's iSER
// initiator stages every command's data in one registered buffer of 256 KiB
// (DATA_BUFFER_SIZE in its lib/iser.c; a larger write overruns it). Also the
// default request size on iSER.
constexpr uint64_t kIserMaxRequestBytes = 256 << 10;
// The most iser:// commands in flight: libiscsi 1.19 has 256 send
// descriptors (NUM_MRS) and takes one per command without checking, and does
// not hold commands back for the target's CmdSN window (tgt's is 128).
constexpr uint32_t kIserMaxInFlight = 128;
// libiscsi sends commands from the poll loop; wake it at least this often so
// that its timeouts and reconnect attempts run.
constexpr int kPollTimeoutMs = 1000;
// iscsi_which_events() == 0 means "reconnect pending, wait >= 100 ms".
constexpr int kReconnectWaitMs = 100;
// A lost session is re-established with backoff between attempts for
// BLKPS_RECONNECT_SECONDS, by default kReconnectBaseSeconds plus one second
// per kReconnectBytesPerSecond of model: enough for a loaded server to
// restart and load its checkpoint, short enough that a learner whose server
// is gone fails.
constexpr double kReconnectBaseSeconds = 60;
constexpr double kReconnectBytesPerSecond = 64 << 20;
constexpr std::chrono::milliseconds kReconnectBackoffMax(1000);
// A command the target does not answer fails after this, as with the Linux
// SCSI layer: a hung server must not hang the learner. blkps servers bound
// their held commands well below it.
constexpr int kCommandTimeoutSeconds = 30;
constexpr std::chrono::seconds kLogoutTimeout(2);

// When a blocking step gives up. A reconnect bounds every step by what is
// left of BLKPS_RECONNECT_SECONDS; other steps have none (libiscsi's own
// command timeout, kCommandTimeoutSeconds, bounds them).
using Deadline = std::chrono::steady_clock::time_point;
constexpr Deadline kNoDeadline = Deadline::max();

// How long poll() may wait: kPollTimeoutMs, less if the deadline is sooner.
int PollMs(Deadline deadline) {
  if (deadline == kNoDeadline) return kPollTimeoutMs;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count() + 1, 0, kPollTimeoutMs));
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

// One SCSI command in flight; OnCommandDone fills in the outcome.
struct Command {
  scsi_task* task = nullptr;  // nullptr: this slot is free
  size_t index = 0;           // which of the batch's commands
  bool done = false;
  int status = SCSI_STATUS_GOOD;
  scsi_sense sense{};
  std::string transport_error;  // libiscsi's message when status says so
};

void OnCommandDone(iscsi_context* iscsi, int status, void* command_data, void* private_data) {
  Command* command = static_cast<Command*>(private_data);
  command->done = true;
  command->status = status;
  const scsi_task* task = static_cast<const scsi_task*>(command_data);
  if (status == SCSI_STATUS_CHECK_CONDITION && task != nullptr) {
    command->sense = task->sense;
  } else if (status != SCSI_STATUS_GOOD) {
    command->transport_error = LastError(iscsi);
  }
}

// The error for a SCSI command that did not end GOOD. `what` names the
// command for the user ("write at offset 4096 on iscsi://...").
Status CommandError(const std::string& what, const Command& command) {
  const scsi_sense& sense = command.sense;
  switch (command.status) {
    case SCSI_STATUS_CHECK_CONDITION: {
      int code = EIO;
      if (sense.key == SCSI_SENSE_ILLEGAL_REQUEST) {
        code = sense.ascq == SCSI_SENSE_ASCQ_LBA_OUT_OF_RANGE ? ERANGE : EINVAL;
      }
      return Status::Error(code, "%s: target returned %s", what.c_str(),
                           ScsiSenseMessage(sense.key, sense.ascq).c_str());
    }
    case SCSI_STATUS_ERROR:
    case SCSI_STATUS_CANCELLED:
    case SCSI_STATUS_TIMEOUT:
      return Status::Error(EIO, "%s: command failed: %s", what.c_str(), command.transport_error.c_str());
    default: return Status::Error(EIO, "%s: target returned SCSI status 0x%x", what.c_str(), command.status);
  }
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

// What it takes to log in again.
struct SessionSpec {
  std::string name;  // the URL without credentials, for messages
  std::string initiator, portal, target;
  ChapCredentials chap;
  int lun = 0;
  bool iser = false;
  double reconnect_seconds = 0;  // how long a lost session is retried
};

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

// The reconnect deadline: BLKPS_RECONNECT_SECONDS (seconds > 0) if set, else
// the default for a device of `device_bytes`.
Status ReconnectSeconds(uint64_t device_bytes, double* seconds) {
  const char* text = getenv("BLKPS_RECONNECT_SECONDS");
  if (text == nullptr || *text == '\0') {
    *seconds = kReconnectBaseSeconds + static_cast<double>(device_bytes) / kReconnectBytesPerSecond;
    return Status();
  }
  char* end = nullptr;
  errno = 0;
  *seconds = strtod(text, &end);
  if (errno != 0 || *end != '\0' || !(*seconds > 0) || *seconds > 1e6) {
    return Status::Error(EINVAL, "BLKPS_RECONNECT_SECONDS=%s: expected seconds, a number > 0 and <= 1000000", text);
  }
  return Status();
}

// What iscsi_full_connect_async's callback leaves. Allocated on the heap:
// a context destroyed mid-login may still run the callback.
struct LoginEnd {
  bool done = false;
  int status = 0;
};

// A logged-in context for `spec`, or nullptr with libiscsi's reason in
// *error. Connecting and logging in give up at `deadline` (a target that
// accepts the connection and never answers the login must not hold a
// reconnect past it).
iscsi_context* LogIn(const SessionSpec& spec, std::string* error, Deadline deadline = kNoDeadline) {
  iscsi_context* iscsi = iscsi_create_context(spec.initiator.c_str());
  if (iscsi == nullptr) {
    *error = "cannot create an iSCSI context for " + spec.initiator;
    return nullptr;
  }
  if (spec.iser && !InitIserTransport(iscsi, error)) {
    iscsi_destroy_context(iscsi);
    return nullptr;
  }
  iscsi_set_targetname(iscsi, spec.target.c_str());
  iscsi_set_session_type(iscsi, ISCSI_SESSION_NORMAL);
  iscsi_set_header_digest(iscsi, ISCSI_HEADER_DIGEST_NONE);
  iscsi_set_initial_r2t(iscsi, ISCSI_INITIAL_R2T_NO);
  iscsi_set_immediate_data(iscsi, ISCSI_IMMEDIATE_DATA_YES);
  iscsi_set_no_ua_on_reconnect(iscsi, 1);
  // A dropped session fails the commands in flight (CANCELLED) and the
  // device reconnects itself (see the top of this file).
  iscsi_set_noautoreconnect(iscsi, 1);
  iscsi_set_timeout(iscsi, kCommandTimeoutSeconds);
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
  if (iscsi_full_connect_async(iscsi, spec.portal.c_str(), spec.lun, on_login, end) != 0) {
    delete end;
    *error = LastError(iscsi);
    iscsi_destroy_context(iscsi);
    return nullptr;
  }
  while (!end->done) {
    const bool late = std::chrono::steady_clock::now() >= deadline;
    if (late || !ServiceUntil(iscsi, deadline)) {
      *error = late ? "the target did not answer the login before the reconnect deadline" : LastError(iscsi);
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
  return iscsi;
}

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

// Starts a command with `start(callback, private_data)` (an iscsi_*_task
// call) and services `iscsi` until it ends; returns its task, or nullptr if
// it could not start or the connection failed. Instead of libiscsi's *_sync
// calls: those return on a failed connection leaving the command queued
// with a pointer into their stack frame, which destroying the context later
// writes to (seen as heap corruption after a target restart). Here that
// pointer is to a CommandEnd left allocated for the context's destruction.
using StartCommand = std::function<scsi_task*(iscsi_command_cb, void*)>;
// Gives up (nullptr) at `deadline`; the caller then destroys the context.
scsi_task* RunToEnd(iscsi_context* iscsi, const StartCommand& start, Deadline deadline = kNoDeadline) {
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

// One synchronous command on `lun` of a context with nothing else in
// flight: READ(16) into `data` or WRITE(16) from it, in pieces of at most
// kIserMaxRequestBytes (what iSER carries as well as TCP).
Status SyncTransfer(iscsi_context* iscsi, int lun, Direction direction, uint64_t offset, void* data, uint64_t len,
                    uint32_t block_size, Deadline deadline = kNoDeadline) {
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
                            : late    ? "no answer before the reconnect deadline"
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

class IscsiDevice : public Device {
 public:
  // Takes ownership of the logged-in context. `control_lun`: the target's
  // control LUN, whose receipts make writes exactly-once; -1 if none.
  IscsiDevice(iscsi_context* iscsi, SessionSpec spec, uint64_t size_bytes, uint32_t block_size,
              uint64_t default_request_bytes, uint64_t max_request_bytes, int control_lun)
      : iscsi_(iscsi),
        spec_(std::move(spec)),
        name_(spec_.name),
        lun_(spec_.lun),
        size_bytes_(size_bytes),
        block_size_(block_size),
        default_request_bytes_(default_request_bytes),
        max_request_bytes_(max_request_bytes),
        control_lun_(control_lun) {}

  ~IscsiDevice() override {
    if (iscsi_ == nullptr) return;
    if (lost_.ok() && iscsi_is_logged_in(iscsi_)) LogOut();
    // Runs the callbacks of commands libiscsi still holds (after a lost
    // connection); they land in commands_, which is still alive.
    iscsi_destroy_context(iscsi_);
    FreeTasks();
  }

  uint64_t size_bytes() const override { return size_bytes_; }
  uint32_t logical_block_size() const override { return block_size_; }
  uint64_t default_request_bytes() const override { return std::min(default_request_bytes_, max_request_bytes_); }
  uint64_t max_request_bytes() const override { return max_request_bytes_; }
  uint64_t pushed_bytes_lost() const override { return pushed_bytes_lost_; }

  Status Transfer(Direction direction, const std::vector<IoRequest>& requests, uint32_t queue_depth) override;
  Status Sync() override;

  // Reads this session's receipt into *counts (one per unit of the device).
  // REQUIRES: control_lun_ >= 0 and no command in flight.
  Status ReadReceipt(std::vector<uint32_t>* counts, blkps_control_receipt* header, Deadline deadline = kNoDeadline);
  // The receipt is what the device expects from now on.
  void ExpectReceipt(std::vector<uint32_t> counts) { expected_ = std::move(counts); }

 private:
  // Queues command `index` with OnCommandDone and `command` as its callback
  // data; returns the task, or nullptr when libiscsi refuses it.
  using StartFn = std::function<scsi_task*(size_t index, Command* command)>;
  // Names command `index` for messages.
  using DescribeFn = std::function<std::string(size_t index)>;

  // `writes`: the batch's requests when its commands are writes, else null.
  Status RunCommands(size_t count, uint32_t queue_depth, const StartFn& start, const DescribeFn& describe,
                     const std::vector<IoRequest>* writes);
  Status Service();
  // The session dropped and every command of it has ended; `dropped` lists
  // the batch's commands that were in flight. Logs in again and stores in
  // *resend those to send again: all of them, except writes that the
  // receipt shows applied.
  Status Reconnect(const std::vector<size_t>& dropped, const std::vector<IoRequest>* writes,
                   std::vector<size_t>* resend);
  // Fences this initiator's writes on the server and waits until none is in
  // progress; then reads the receipt. Gives up at `deadline`.
  Status FenceAndReadReceipt(std::vector<uint32_t>* counts, Deadline deadline);
  void FreeTasks();
  void LogOut();

  iscsi_context* iscsi_;  // null while reconnecting failed
  const SessionSpec spec_;
  const std::string& name_;
  const int lun_;
  const uint64_t size_bytes_;
  const uint32_t block_size_;
  const uint64_t default_request_bytes_;
  const uint64_t max_request_bytes_;
  const int control_lun_;

  // Slots for the commands in flight. libiscsi keeps pointers to them until
  // each command completes, so they live as long as the context.
  std::vector<Command> commands_;
  // Set once the session is lost for good: the device refuses further work.
  Status lost_;
  bool logout_done_ = false;  // set by the LOGOUT's callback
  // Per 512-byte unit: how many of this session's writes starting there the
  // server has applied, as far as the device knows (receipts only).
  std::vector<uint32_t> expected_;
  // The caller's bytes (padding aside) in the last write acknowledged at
  // each unit, to put lost writes in bytes.
  std::unordered_map<uint64_t, uint64_t> write_length_;
  uint64_t pushed_bytes_lost_ = 0;
  bool said_no_receipts_ = false;
};

Status IscsiDevice::Transfer(Direction direction, const std::vector<IoRequest>& requests, uint32_t queue_depth) {
  auto start = [&](size_t index, Command* command) {
    const IoRequest& request = requests[index];
    const uint64_t lba = request.offset / block_size_;
    const uint32_t length = static_cast<uint32_t>(request.length);
    scsi_iovec* iov = reinterpret_cast<scsi_iovec*>(request.iov);
    return direction == Direction::kRead ? iscsi_read16_iov_task(iscsi_, lun_, lba, length, block_size_, 0, 0, 0, 0, 0,
                                                                 OnCommandDone, command, iov, request.iovcnt)
                                         : iscsi_write16_iov_task(iscsi_, lun_, lba, nullptr, length, block_size_, 0, 0,
                                                                  0, 0, 0, OnCommandDone, command, iov, request.iovcnt);
  };
  auto describe = [&](size_t index) {
    return std::string(DirectionName(direction)) + " at offset " + std::to_string(requests[index].offset) + " on " +
           name_;
  };
  return RunCommands(requests.size(), queue_depth, start, describe,
                     direction == Direction::kWrite ? &requests : nullptr);
}

Status IscsiDevice::Sync() {
  auto start = [&](size_t, Command* command) {
    return iscsi_synchronizecache10_task(iscsi_, lun_, 0, 0, 0, 0, OnCommandDone, command);
  };
  auto describe = [&](size_t) { return "sync on " + name_; };
  return RunCommands(1, 1, start, describe, nullptr);
}

Status IscsiDevice::RunCommands(size_t count, uint32_t queue_depth, const StartFn& start, const DescribeFn& describe,
                                const std::vector<IoRequest>* writes) {
  if (!lost_.ok()) return lost_;
  // No command is in flight between batches, so the slots may move.
  if (spec_.iser) queue_depth = std::min(queue_depth, kIserMaxInFlight);
  commands_.assign(std::min<size_t>(std::max<uint32_t>(queue_depth, 1), count), Command());
  Status result;
  std::deque<size_t> pending;  // commands to start, in order
  for (size_t i = 0; i < count; ++i) pending.push_back(i);
  size_t in_flight = 0;
  auto start_more = [&] {
    for (Command& command : commands_) {
      if (!result.ok() || pending.empty()) return;
      if (command.task != nullptr) continue;
      command = Command();
      command.index = pending.front();
      command.task = start(command.index, &command);
      if (command.task == nullptr) {
        result = Status::Error(EIO, "%s: cannot queue the command: %s", describe(command.index).c_str(),
                               LastError(iscsi_).c_str());
        return;
      }
      pending.pop_front();
      ++in_flight;
    }
  };

  start_more();
  while (in_flight > 0) {
    // A dropped session ends every command in flight with CANCELLED
    // (noautoreconnect); a failing poll ends them when the context goes.
    bool dropped = !Service().ok();
    for (const Command& command : commands_) {
      dropped = dropped || (command.task != nullptr && command.done && command.status == SCSI_STATUS_CANCELLED);
    }
    if (dropped) {
      iscsi_destroy_context(iscsi_);  // runs the callbacks of what it held
      iscsi_ = nullptr;
    }
    std::vector<size_t> ended_with_session;
    for (Command& command : commands_) {
      if (command.task == nullptr || !(command.done || dropped)) continue;
      if (dropped && (!command.done || command.status == SCSI_STATUS_CANCELLED)) {
        ended_with_session.push_back(command.index);
      } else if (command.status != SCSI_STATUS_GOOD) {
        if (result.ok()) result = CommandError(describe(command.index), command);
      } else if (writes != nullptr && !expected_.empty()) {
        const IoRequest& write = (*writes)[command.index];
        ++expected_[write.offset / BLKPS_CONTROL_RECEIPT_UNIT];
        write_length_[write.offset / BLKPS_CONTROL_RECEIPT_UNIT] =
            write.length - write.padding_head - write.padding_tail;
      }
      scsi_free_scsi_task(command.task);
      command = Command();
      --in_flight;
    }
    if (dropped) {
      std::vector<size_t> resend;
      Status s = Reconnect(ended_with_session, writes, &resend);
      if (!s.ok()) {
        lost_ = s;
        return s;
      }
      pending.insert(pending.begin(), resend.begin(), resend.end());
    }
    start_more();
  }
  return result;
}

Status IscsiDevice::Reconnect(const std::vector<size_t>& dropped, const std::vector<IoRequest>* writes,
                              std::vector<size_t>* resend) {
  // The receipt is read after every reconnect, whatever the batch: a target
  // restarted while the device was reading or idle lost writes too.
  const bool receipts = !expected_.empty();
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                    std::chrono::duration<double>(spec_.reconnect_seconds));
  std::chrono::milliseconds backoff(50);
  int attempts = 0;
  std::string error;
  std::vector<uint32_t> counts;
  // The new session may drop too, before the receipt is read: start again.
  for (;;) {
    iscsi_ = LogIn(spec_, &error, deadline);
    ++attempts;
    if (iscsi_ != nullptr && receipts) {
      Status s = FenceAndReadReceipt(&counts, deadline);
      if (s.ok()) break;
      error = s.message();
      iscsi_destroy_context(iscsi_);
      iscsi_ = nullptr;
    }
    if (iscsi_ != nullptr) break;
    if (std::chrono::steady_clock::now() + backoff > deadline) {
      const double tried = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      return Status::Error(EIO,
                           "%s: the connection was lost; gave up reconnecting after %d attempts in %.1f s (deadline "
                           "%.0f s, BLKPS_RECONNECT_SECONDS); last error: %s; reopen the model",
                           name_.c_str(), attempts, tried, spec_.reconnect_seconds, error.c_str());
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::duration_cast<std::chrono::milliseconds>(kReconnectBackoffMax));
  }
  if (!receipts) {
    if (writes != nullptr && !said_no_receipts_) {
      said_no_receipts_ = true;
      fprintf(stderr,
              "blkps: %s: reconnected; no blkps control LUN on this target, so the writes in flight are sent "
              "again and some may be applied twice\n",
              name_.c_str());
    }
    *resend = dropped;
    return Status();
  }
  // Acknowledged writes the server no longer counts: it restarted from a
  // checkpoint taken before them.
  uint64_t lost = 0, lost_bytes = 0, first_lost_unit = 0;
  for (size_t u = 0; u < counts.size(); ++u) {
    const int32_t behind = static_cast<int32_t>(expected_[u] - counts[u]);
    if (behind <= 0) continue;
    if (lost == 0) first_lost_unit = u;
    lost += static_cast<uint64_t>(behind);
    lost_bytes += static_cast<uint64_t>(behind) * write_length_[u];
  }
  for (size_t index : dropped) {
    // Reads and syncs are resent; a write only if the receipt does not count
    // it (applied, it is one more than was expected before it).
    const uint64_t u = writes != nullptr ? (*writes)[index].offset / BLKPS_CONTROL_RECEIPT_UNIT : 0;
    const bool applied = writes != nullptr && counts[u] - expected_[u] == 1u;
    if (!applied) resend->push_back(index);
  }
  if (lost > 0) {
    pushed_bytes_lost_ += lost_bytes;
    fprintf(stderr,
            "blkps: %s: the target restarted from a checkpoint older than %llu acknowledged writes (%llu bytes, "
            "the first at byte %llu); those gradients are not in the model\n",
            name_.c_str(), static_cast<unsigned long long>(lost), static_cast<unsigned long long>(lost_bytes),
            static_cast<unsigned long long>(first_lost_unit * BLKPS_CONTROL_RECEIPT_UNIT));
  }
  expected_ = std::move(counts);
  return Status();
}

Status IscsiDevice::FenceAndReadReceipt(std::vector<uint32_t>* counts, Deadline deadline) {
  std::string fence = "fence=" + std::to_string(lun_) + "\n";
  fence.resize(block_size_, '\0');
  Status s = SyncTransfer(iscsi_, control_lun_, Direction::kWrite, BLKPS_CONTROL_COMMANDS_OFFSET, fence.data(),
                          fence.size(), block_size_, deadline);
  if (!s.ok()) return Status::Error(EIO, "%s: after reconnecting: fence: %s", name_.c_str(), s.message().c_str());
  // Writes already running on the server finish in well under a command
  // timeout; poll for that.
  const Deadline drained =
      std::min(deadline, std::chrono::steady_clock::now() + std::chrono::seconds(kCommandTimeoutSeconds));
  blkps_control_receipt header{};
  for (;;) {
    s = ReadReceipt(counts, &header, drained);
    if (!s.ok() || header.writes_in_progress == 0) break;
    if (std::chrono::steady_clock::now() > drained) {
      return Status::Error(EIO, "%s: after reconnecting: the server still runs %llu old writes", name_.c_str(),
                           static_cast<unsigned long long>(header.writes_in_progress));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return s;
}

Status IscsiDevice::ReadReceipt(std::vector<uint32_t>* counts, blkps_control_receipt* header, Deadline deadline) {
  const uint64_t record = blkps_control_receipt_offset(size_bytes_, static_cast<uint64_t>(lun_));
  std::vector<char> page(BLKPS_CONTROL_RECEIPT_HEADER_BYTES);
  Status s =
      SyncTransfer(iscsi_, control_lun_, Direction::kRead, record, page.data(), page.size(), block_size_, deadline);
  if (!s.ok()) return Status::Error(s.code(), "%s: receipt: %s", name_.c_str(), s.message().c_str());
  if (blkps_control_receipt_decode(page.data(), page.size(), static_cast<uint64_t>(lun_), header) != 0) {
    return Status::Error(EPROTO, "%s: the control LUN holds no receipt of format %u for LUN %d", name_.c_str(),
                         BLKPS_CONTROL_FORMAT_VERSION, lun_);
  }
  const uint64_t units = blkps_control_receipt_unit_count(size_bytes_);
  const uint64_t bytes = (units * 4 + block_size_ - 1) / block_size_ * block_size_;
  std::vector<uint32_t> words(bytes / 4);
  s = SyncTransfer(iscsi_, control_lun_, Direction::kRead, record + BLKPS_CONTROL_RECEIPT_HEADER_BYTES, words.data(),
                   bytes, block_size_, deadline);
  if (!s.ok()) return Status::Error(s.code(), "%s: receipt: %s", name_.c_str(), s.message().c_str());
  words.resize(units);
  *counts = std::move(words);
  return Status();
}

void IscsiDevice::FreeTasks() {
  for (Command& command : commands_) {
    if (command.task != nullptr) scsi_free_scsi_task(command.task);
    command = Command();
  }
}

// Logs out politely. A target that went away while the device was idle must
// not hold up closing (libiscsi would retry reconnecting for ~30 s): give up
// after kLogoutTimeout and let iscsi_destroy_context close the socket.
void IscsiDevice::LogOut() {
  auto on_done = [](iscsi_context*, int, void*, void* private_data) { *static_cast<bool*>(private_data) = true; };
  if (iscsi_logout_async(iscsi_, on_done, &logout_done_) != 0) return;
  const auto deadline = std::chrono::steady_clock::now() + kLogoutTimeout;
  while (!logout_done_ && std::chrono::steady_clock::now() < deadline) {
    if (!Service().ok()) return;
  }
}

// Waits for the socket and lets libiscsi send, receive and run callbacks.
Status IscsiDevice::Service() {
  if (iscsi_get_fd(iscsi_) < 0) {
    return Status::Error(EIO, "connection to %s lost", name_.c_str());
  }
  pollfd pfd = {iscsi_get_fd(iscsi_), static_cast<short>(iscsi_which_events(iscsi_)), 0};
  if (pfd.events == 0) {
    poll(nullptr, 0, kReconnectWaitMs);
  } else if (poll(&pfd, 1, kPollTimeoutMs) < 0) {
    if (errno == EINTR) return Status();
    return Status::Error(errno, "poll on the connection to %s failed: %s", name_.c_str(), strerror(errno));
  }
  if (ServiceWithoutSigpipe(iscsi_, pfd.revents) < 0) {
    return Status::Error(EIO, "connection to %s lost (%s)", name_.c_str(), LastError(iscsi_).c_str());
  }
  return Status();
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

}  // namespace

std::unique_ptr<Device> OpenIscsiDevice(const std::string& url, const std::string& initiator_name, Status* status) {
  SessionSpec spec;
  spec.iser = url.rfind("iser://", 0) == 0;
  spec.initiator = initiator_name.empty() ? DefaultInitiatorName() : initiator_name;
  iscsi_context* scratch = iscsi_create_context(spec.initiator.c_str());
  if (scratch == nullptr) {
    *status = Status::Error(ENOMEM, "cannot create an iSCSI context for %s", spec.initiator.c_str());
    return nullptr;
  }
  iscsi_url* parsed = iscsi_parse_full_url(scratch, url.c_str());
  if (parsed == nullptr) {
    std::string why = LastError(scratch);  // libiscsi quotes the URL: mask it
    for (size_t at = why.find(url); at != std::string::npos; at = why.find(url, at + 1)) {
      why.replace(at, url.size(), MaskTarget(url));
    }
    *status = Status::Error(EINVAL, "bad target URL: %s", why.c_str());
    iscsi_destroy_context(scratch);
    return nullptr;
  }
  // CHAP: the URL's credentials, else BLKPS_CHAP_FILE's.
  spec.chap = {parsed->user, parsed->passwd, parsed->target_user, parsed->target_passwd};
  const char* chap_file = std::getenv("BLKPS_CHAP_FILE");
  if (spec.chap.user.empty() && chap_file != nullptr && *chap_file != '\0') {
    Status s = ReadChapFile(chap_file, &spec.chap);
    if (!s.ok()) {
      *status = std::move(s);
      iscsi_destroy_url(parsed);
      iscsi_destroy_context(scratch);
      return nullptr;
    }
  }
  spec.name = std::string(spec.iser ? "iser://" : "iscsi://") + parsed->portal + "/" + parsed->target + "/" +
              std::to_string(parsed->lun);
  spec.portal = parsed->portal;
  spec.target = parsed->target;
  spec.lun = parsed->lun;
  iscsi_destroy_url(parsed);
  iscsi_destroy_context(scratch);

  std::string login_error;
  iscsi_context* iscsi = LogIn(spec, &login_error);
  if (iscsi == nullptr && spec.iser) {
    *status =
        Status::Error(ENODEV, "%s: iSER transport unavailable (no RDMA device on this host?): %s; use iscsi:// instead",
                      spec.name.c_str(), login_error.c_str());
    return nullptr;
  }
  if (iscsi == nullptr) {
    *status = DiagnoseConnectFailure(spec.name, spec.portal, spec.target, spec.lun, login_error);
    return nullptr;
  }
  auto fail = [&](Status error) {
    *status = std::move(error);
    iscsi_destroy_context(iscsi);
    return nullptr;
  };

  scsi_task* task = RunToEnd(
      iscsi, [&](iscsi_command_cb cb, void* end) { return iscsi_readcapacity16_task(iscsi, spec.lun, cb, end); });
  if (task == nullptr || task->status != SCSI_STATUS_GOOD) {
    Status error = Status::Error(EIO, "%s: READ CAPACITY(16) failed: %s", spec.name.c_str(), LastError(iscsi).c_str());
    if (task != nullptr) scsi_free_scsi_task(task);
    return fail(std::move(error));
  }
  auto* capacity = static_cast<scsi_readcapacity16*>(scsi_datain_unmarshall(task));
  if (capacity == nullptr || capacity->block_length == 0) {
    scsi_free_scsi_task(task);
    return fail(Status::Error(EIO, "%s: cannot decode READ CAPACITY(16) data", spec.name.c_str()));
  }
  const uint32_t block_size = capacity->block_length;
  const uint64_t size_bytes = (capacity->returned_lba + 1) * block_size;
  scsi_free_scsi_task(task);
  if (Status s = ReconnectSeconds(size_bytes, &spec.reconnect_seconds); !s.ok()) return fail(std::move(s));

  uint64_t max_request_bytes = MaxRequestBytes(iscsi, spec.lun, block_size);
  if (spec.iser) max_request_bytes = std::min(max_request_bytes, kIserMaxRequestBytes);
  const uint64_t default_request_bytes = spec.iser ? kIserMaxRequestBytes : kDefaultRequestBytes;
  const int control_lun = FindControlLun(iscsi, spec.lun, size_bytes);
  auto device = std::make_unique<IscsiDevice>(iscsi, spec, size_bytes, block_size, default_request_bytes,
                                              max_request_bytes, control_lun);
  if (control_lun >= 0) {
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
      const std::string why = s.message().rfind("blkps: ", 0) == 0 ? s.message().substr(7) : s.message();
      *status = Status::Error(s.code(), "%s; exactly-once pushes need it, so the open fails: open the model again",
                              why.c_str());
      return nullptr;
    }
  }
  return device;
}

}  // namespace blkps
