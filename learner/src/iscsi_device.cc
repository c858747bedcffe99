// IscsiDevice: the model device as a LUN reached through libiscsi, one
// session per device: iscsi:// over TCP, iser:// over RDMA.
//
// Data moves as READ(16)/WRITE(16) commands whose scsi_iovecs point at the
// caller's memory (zero copy), queue_depth of them in flight, driven by poll()
// on the context's descriptor. libiscsi reconnects a dropped session by itself
// and resends what was in flight; with no_ua_on_reconnect a target restart
// stays invisible to the learner.

#include <iscsi/iscsi.h>
#include <iscsi/scsi-lowlevel.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <functional>

#include "device.h"

namespace blkps {
namespace {

static_assert(sizeof(scsi_iovec) == sizeof(iovec) &&
                  offsetof(scsi_iovec, iov_base) == offsetof(iovec, iov_base) &&
                  offsetof(scsi_iovec, iov_len) == offsetof(iovec, iov_len),
              "libiscsi promises scsi_iovec has the layout of iovec");

constexpr uint64_t kDefaultRequestBytes = 1 << 20;
// tgt's iSER driver carries at most buf_sz_kb (512 KiB by default) per command.
constexpr uint64_t kIserDefaultRequestBytes = 512 << 10;
// libiscsi sends commands from the poll loop; wake it at least this often so
// that its timeouts and reconnect attempts run.
constexpr int kPollTimeoutMs = 1000;
// iscsi_which_events() == 0 means "reconnect pending, wait >= 100 ms".
constexpr int kReconnectWaitMs = 100;
// A lost session is re-established with backoff between attempts; 7 attempts
// span about 30 s (measured, libiscsi 1.19): long enough for a server
// restart, short enough that a learner whose server is gone fails.
constexpr int kReconnectAttempts = 7;
// A command the target does not answer fails after this, as with the Linux
// SCSI layer: a hung server must not hang the learner. blkps servers bound
// their held commands well below it.
constexpr int kCommandTimeoutSeconds = 30;
constexpr std::chrono::seconds kLogoutTimeout(2);

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

void OnCommandDone(iscsi_context* iscsi, int status, void* command_data,
                   void* private_data) {
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
      return Status::Error(code, "%s: target returned %s (%s, asc/ascq 0x%04x)",
                           what.c_str(), scsi_sense_key_str(sense.key),
                           scsi_sense_ascq_str(sense.ascq), sense.ascq);
    }
    case SCSI_STATUS_ERROR:
    case SCSI_STATUS_CANCELLED:
    case SCSI_STATUS_TIMEOUT:
      return Status::Error(EIO, "%s: command failed: %s", what.c_str(),
                           command.transport_error.c_str());
    default:
      return Status::Error(EIO, "%s: target returned SCSI status 0x%x",
                           what.c_str(), command.status);
  }
}

class IscsiDevice : public Device {
 public:
  // Takes ownership of the logged-in context.
  IscsiDevice(iscsi_context* iscsi, std::string name, int lun,
              uint64_t size_bytes, uint32_t block_size,
              uint64_t default_request_bytes, uint64_t max_request_bytes)
      : iscsi_(iscsi),
        name_(std::move(name)),
        lun_(lun),
        size_bytes_(size_bytes),
        block_size_(block_size),
        default_request_bytes_(default_request_bytes),
        max_request_bytes_(max_request_bytes) {}

  ~IscsiDevice() override {
    if (lost_.ok() && iscsi_is_logged_in(iscsi_)) LogOut();
    // Runs the callbacks of commands libiscsi still holds (after a lost
    // connection); they land in commands_, which is still alive.
    iscsi_destroy_context(iscsi_);
    for (Command& command : commands_) {
      if (command.task != nullptr) scsi_free_scsi_task(command.task);
    }
  }

  uint64_t size_bytes() const override { return size_bytes_; }
  uint32_t logical_block_size() const override { return block_size_; }
  uint64_t default_request_bytes() const override {
    return std::min(default_request_bytes_, max_request_bytes_);
  }
  uint64_t max_request_bytes() const override { return max_request_bytes_; }

  Status Transfer(Direction direction, const std::vector<IoRequest>& requests,
                  uint32_t queue_depth) override;
  Status Sync() override;

 private:
  // Queues command `index` with OnCommandDone and `command` as its callback
  // data; returns the task, or nullptr when libiscsi refuses it.
  using StartFn = std::function<scsi_task*(size_t index, Command* command)>;
  // Names command `index` for messages.
  using DescribeFn = std::function<std::string(size_t index)>;

  Status RunCommands(size_t count, uint32_t queue_depth, const StartFn& start,
                     const DescribeFn& describe);
  Status Service();
  void LogOut();

  iscsi_context* const iscsi_;
  const std::string name_;  // the URL without credentials, for messages
  const int lun_;
  const uint64_t size_bytes_;
  const uint32_t block_size_;
  const uint64_t default_request_bytes_;
  const uint64_t max_request_bytes_;

  // Slots for the commands in flight. libiscsi keeps pointers to them until
  // each command completes, so they live as long as the context.
  std::vector<Command> commands_;
  // Set once the session is lost for good: libiscsi then still holds the
  // unfinished commands, and the device refuses further work.
  Status lost_;
  bool logout_done_ = false;  // set by the LOGOUT's callback
};

Status IscsiDevice::Transfer(Direction direction,
                             const std::vector<IoRequest>& requests,
                             uint32_t queue_depth) {
  auto start = [&](size_t index, Command* command) {
    const IoRequest& request = requests[index];
    const uint64_t lba = request.offset / block_size_;
    const uint32_t length = static_cast<uint32_t>(request.length);
    scsi_iovec* iov = reinterpret_cast<scsi_iovec*>(request.iov);
    return direction == Direction::kRead
               ? iscsi_read16_iov_task(iscsi_, lun_, lba, length, block_size_,
                                       0, 0, 0, 0, 0, OnCommandDone, command,
                                       iov, request.iovcnt)
               : iscsi_write16_iov_task(
                     iscsi_, lun_, lba, nullptr, length, block_size_, 0, 0, 0,
                     0, 0, OnCommandDone, command, iov, request.iovcnt);
  };
  auto describe = [&](size_t index) {
    return std::string(DirectionName(direction)) + " at offset " +
           std::to_string(requests[index].offset) + " on " + name_;
  };
  return RunCommands(requests.size(), queue_depth, start, describe);
}

Status IscsiDevice::Sync() {
  auto start = [&](size_t, Command* command) {
    return iscsi_synchronizecache10_task(iscsi_, lun_, 0, 0, 0, 0,
                                         OnCommandDone, command);
  };
  auto describe = [&](size_t) { return "sync on " + name_; };
  return RunCommands(1, 1, start, describe);
}

Status IscsiDevice::RunCommands(size_t count, uint32_t queue_depth,
                                const StartFn& start,
                                const DescribeFn& describe) {
  if (!lost_.ok()) return lost_;
  // No command is in flight between batches, so the slots may move.
  commands_.assign(std::min<size_t>(std::max<uint32_t>(queue_depth, 1), count),
                   Command());
  Status result;
  size_t next = 0;  // the first command not started yet
  size_t in_flight = 0;
  auto start_more = [&] {
    for (Command& command : commands_) {
      if (!result.ok() || next == count) return;
      if (command.task != nullptr) continue;
      command = Command();
      command.index = next;
      command.task = start(next, &command);
      if (command.task == nullptr) {
        result =
            Status::Error(EIO, "%s: cannot queue the command: %s",
                          describe(next).c_str(), LastError(iscsi_).c_str());
        return;
      }
      ++next;
      ++in_flight;
    }
  };

  start_more();
  while (in_flight > 0) {
    Status service = Service();
    if (!service.ok()) {
      lost_ = service;
      return service;
    }
    for (Command& command : commands_) {
      if (command.task == nullptr || !command.done) continue;
      if (result.ok() && command.status != SCSI_STATUS_GOOD) {
        result = CommandError(describe(command.index), command);
      }
      scsi_free_scsi_task(command.task);
      command = Command();
      --in_flight;
    }
    start_more();
  }
  return result;
}

// Logs out politely. A target that went away while the device was idle must
// not hold up closing (libiscsi would retry reconnecting for ~30 s): give up
// after kLogoutTimeout and let iscsi_destroy_context close the socket.
void IscsiDevice::LogOut() {
  auto on_done = [](iscsi_context*, int, void*, void* private_data) {
    *static_cast<bool*>(private_data) = true;
  };
  if (iscsi_logout_async(iscsi_, on_done, &logout_done_) != 0) return;
  const auto deadline = std::chrono::steady_clock::now() + kLogoutTimeout;
  while (!logout_done_ && std::chrono::steady_clock::now() < deadline) {
    if (!Service().ok()) return;
  }
}

// Waits for the socket and lets libiscsi send, receive and run callbacks.
Status IscsiDevice::Service() {
  pollfd pfd = {iscsi_get_fd(iscsi_),
                static_cast<short>(iscsi_which_events(iscsi_)), 0};
  if (pfd.events == 0) {
    poll(nullptr, 0, kReconnectWaitMs);
  } else if (poll(&pfd, 1, kPollTimeoutMs) < 0) {
    if (errno == EINTR) return Status();
    return Status::Error(errno, "poll on the connection to %s failed: %s",
                         name_.c_str(), strerror(errno));
  }
  if (iscsi_service(iscsi_, pfd.revents) < 0) {
    return Status::Error(EIO,
                         "connection to %s lost and not re-established (%s); "
                         "reopen the model",
                         name_.c_str(), LastError(iscsi_).c_str());
  }
  return Status();
}

// The largest transfer the LUN accepts: Block Limits VPD page's MAXIMUM
// TRANSFER LENGTH when reported, and never more than READ(16)'s 32-bit byte
// count that libiscsi takes.
uint64_t MaxRequestBytes(iscsi_context* iscsi, int lun, uint32_t block_size) {
  uint64_t max_bytes = UINT32_MAX / block_size * block_size;
  scsi_task* task = iscsi_inquiry_sync(iscsi, lun, 1,
                                       SCSI_INQUIRY_PAGECODE_BLOCK_LIMITS, 255);
  if (task != nullptr && task->status == SCSI_STATUS_GOOD) {
    auto* limits =
        static_cast<scsi_inquiry_block_limits*>(scsi_datain_unmarshall(task));
    if (limits != nullptr && limits->max_xfer_len != 0) {
      max_bytes = std::min<uint64_t>(
          max_bytes, static_cast<uint64_t>(limits->max_xfer_len) * block_size);
    }
  }
  if (task != nullptr) scsi_free_scsi_task(task);
  return max_bytes;
}

// iscsi_full_connect_sync() failed with `login_error`. libiscsi says the
// same thing whether nothing listens at the portal or the login was refused,
// so tell them apart with a bare TCP connection on a scratch context.
Status DiagnoseConnectFailure(const std::string& name,
                              const std::string& portal,
                              const std::string& target, int lun,
                              const std::string& login_error) {
  iscsi_context* probe = iscsi_create_context("iqn.2026-11.io.blkps:probe");
  if (probe == nullptr) {
    return Status::Error(ENOMEM, "cannot create an iSCSI context");
  }
  Status status;
  if (iscsi_connect_sync(probe, portal.c_str()) != 0) {
    status =
        Status::Error(ECONNREFUSED,
                      "%s: cannot connect to portal %s (is the target "
                      "running and listening there?): %s",
                      name.c_str(), portal.c_str(), LastError(probe).c_str());
  } else {
    status =
        Status::Error(ECONNREFUSED,
                      "%s: login to target %s LUN %d failed (check the "
                      "target IQN and LUN): %s",
                      name.c_str(), target.c_str(), lun, login_error.c_str());
  }
  iscsi_destroy_context(probe);
  return status;
}

}  // namespace

std::unique_ptr<Device> OpenIscsiDevice(const std::string& url,
                                        const std::string& initiator_name,
                                        Status* status) {
  const bool iser = url.rfind("iser://", 0) == 0;
  const std::string initiator =
      initiator_name.empty() ? DefaultInitiatorName() : initiator_name;
  iscsi_context* iscsi = iscsi_create_context(initiator.c_str());
  if (iscsi == nullptr) {
    *status = Status::Error(ENOMEM, "cannot create an iSCSI context for %s",
                            initiator.c_str());
    return nullptr;
  }
  auto fail = [&](Status error) {
    *status = std::move(error);
    iscsi_destroy_context(iscsi);
    return nullptr;
  };

  iscsi_url* parsed = iscsi_parse_full_url(iscsi, url.c_str());
  if (parsed == nullptr) {
    return fail(
        Status::Error(EINVAL, "bad target URL: %s", LastError(iscsi).c_str()));
  }
  const std::string name = std::string(iser ? "iser://" : "iscsi://") +
                           parsed->portal + "/" + parsed->target + "/" +
                           std::to_string(parsed->lun);
  const std::string portal = parsed->portal;
  const std::string target = parsed->target;
  const int lun = parsed->lun;
  iscsi_destroy_url(parsed);

  auto no_rdma = [&] {
    return fail(Status::Error(
        ENODEV,
        "%s: iSER transport unavailable (no RDMA device on this host?): %s; "
        "use iscsi:// instead",
        name.c_str(), LastError(iscsi).c_str()));
  };
  if (iser && iscsi_init_transport(iscsi, ISER_TRANSPORT) != 0)
    return no_rdma();

  iscsi_set_targetname(iscsi, target.c_str());
  iscsi_set_session_type(iscsi, ISCSI_SESSION_NORMAL);
  iscsi_set_header_digest(iscsi, ISCSI_HEADER_DIGEST_NONE);
  iscsi_set_initial_r2t(iscsi, ISCSI_INITIAL_R2T_NO);
  iscsi_set_immediate_data(iscsi, ISCSI_IMMEDIATE_DATA_YES);
  iscsi_set_no_ua_on_reconnect(iscsi, 1);
  iscsi_set_reconnect_max_retries(iscsi, kReconnectAttempts);
  iscsi_set_timeout(iscsi, kCommandTimeoutSeconds);
  if (iscsi_full_connect_sync(iscsi, portal.c_str(), lun) != 0) {
    if (iser) return no_rdma();
    return fail(
        DiagnoseConnectFailure(name, portal, target, lun, LastError(iscsi)));
  }

  scsi_task* task = iscsi_readcapacity16_sync(iscsi, lun);
  if (task == nullptr || task->status != SCSI_STATUS_GOOD) {
    Status error = Status::Error(EIO, "%s: READ CAPACITY(16) failed: %s",
                                 name.c_str(), LastError(iscsi).c_str());
    if (task != nullptr) scsi_free_scsi_task(task);
    return fail(std::move(error));
  }
  auto* capacity =
      static_cast<scsi_readcapacity16*>(scsi_datain_unmarshall(task));
  if (capacity == nullptr || capacity->block_length == 0) {
    scsi_free_scsi_task(task);
    return fail(Status::Error(EIO, "%s: cannot decode READ CAPACITY(16) data",
                              name.c_str()));
  }
  const uint32_t block_size = capacity->block_length;
  const uint64_t size_bytes = (capacity->returned_lba + 1) * block_size;
  scsi_free_scsi_task(task);

  const uint64_t max_request_bytes = MaxRequestBytes(iscsi, lun, block_size);
  const uint64_t default_request_bytes =
      iser ? kIserDefaultRequestBytes : kDefaultRequestBytes;
  return std::make_unique<IscsiDevice>(iscsi, name, lun, size_bytes, block_size,
                                       default_request_bytes,
                                       max_request_bytes);
}

}  // namespace blkps
