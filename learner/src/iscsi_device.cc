// IscsiDevice's data path (iscsi_device.h): a batch of commands kept
// queue_depth in flight on the session, their outcomes turned into Status,
// and the session serviced by poll(). A dropped session is handed to
// Reconnect (iscsi_reconnect.cc), and what it says to resend is sent again.

#include "iscsi_device.h"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <deque>

#include "scsi_sense.h"

namespace blkps::iscsi {
namespace {

static_assert(sizeof(scsi_iovec) == sizeof(iovec) && offsetof(scsi_iovec, iov_base) == offsetof(iovec, iov_base) &&
                  offsetof(scsi_iovec, iov_len) == offsetof(iovec, iov_len),
              "libiscsi promises scsi_iovec has the layout of iovec");

constexpr std::chrono::seconds kLogoutTimeout(2);

}  // namespace

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

namespace {

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

}  // namespace

uint64_t IscsiDevice::default_exchange_request_bytes() const {
  const uint64_t bytes = spec_.iser ? default_request_bytes() : std::min(default_request_bytes(), kTcpFirstBurstBytes);
  return std::max<uint64_t>(bytes / block_size_ * block_size_, block_size_);
}

Status IscsiDevice::Transfer(Direction direction, const std::vector<IoRequest>& requests, uint32_t queue_depth) {
  return RunRequests(direction, requests, queue_depth, nullptr);
}

Status IscsiDevice::ReadConsuming(const std::vector<IoRequest>& requests, uint32_t queue_depth,
                                  const ConsumeFn& consume) {
  return RunRequests(Direction::kRead, requests, queue_depth, &consume);
}

Status IscsiDevice::RunRequests(Direction direction, const std::vector<IoRequest>& requests, uint32_t queue_depth,
                                const ConsumeFn* consume) {
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
                     direction == Direction::kWrite ? &requests : nullptr, consume);
}

Status IscsiDevice::Exchange(const std::vector<IoRequest>& writes, const std::vector<IoRequest>& reads,
                             uint32_t queue_depth, const ConsumeFn* consume) {
  const size_t n = writes.size();
  auto start = [&](size_t index, Command* command) {
    const bool write = index < n;
    const IoRequest& request = write ? writes[index] : reads[index - n];
    const uint64_t lba = request.offset / block_size_;
    const uint32_t length = static_cast<uint32_t>(request.length);
    scsi_iovec* iov = reinterpret_cast<scsi_iovec*>(request.iov);
    return write ? iscsi_write16_iov_task(iscsi_, lun_, lba, nullptr, length, block_size_, 0, 0, 0, 0, 0, OnCommandDone,
                                          command, iov, request.iovcnt)
                 : iscsi_read16_iov_task(iscsi_, lun_, lba, length, block_size_, 0, 0, 0, 0, 0, OnCommandDone, command,
                                         iov, request.iovcnt);
  };
  auto describe = [&](size_t index) {
    const bool write = index < n;
    return std::string(write ? "exchange's write" : "exchange's read") + " at offset " +
           std::to_string(write ? writes[index].offset : reads[index - n].offset) + " on " + name_;
  };
  return RunCommands(2 * n, queue_depth, start, describe, &writes, consume, true);
}

Status IscsiDevice::Sync() {
  auto start = [&](size_t, Command* command) {
    return iscsi_synchronizecache10_task(iscsi_, lun_, 0, 0, 0, 0, OnCommandDone, command);
  };
  auto describe = [&](size_t) { return "sync on " + name_; };
  Status s = RunCommands(1, 1, start, describe, nullptr);
  // Every write acknowledged before it is in the checkpoint: none of them
  // can be lost any more.
  if (s.ok()) ForgetUnsyncedLengths();
  // A sync that reconnected tells what a restart lost through the row
  // windows too.
  if (s.ok() && !row_windows_.empty()) s = SyncRowWindows(table_width_ * sizeof(float));
  return s;
}

void IscsiDevice::RecordWriteLength(uint64_t unit, uint64_t length) {
  write_length_[unit] = length;
  std::vector<LengthRun>& runs = unsynced_lengths_[unit];
  if (!runs.empty() && (runs.back().length == length || unsynced_runs_ >= kMaxUnsyncedRuns)) {
    if (runs.back().length != length && !said_lengths_approximate_) {
      said_lengths_approximate_ = true;
      fprintf(stderr,
              "blkps: %s: more than %zu lengths of writes since the last fsync; pushed_bytes_lost may count lost "
              "writes approximately until the next fsync (fsync more often to keep it exact)\n",
              name_.c_str(), kMaxUnsyncedRuns);
    }
    ++runs.back().count;
    return;
  }
  runs.push_back(LengthRun{length, 1});
  ++unsynced_runs_;
}

uint64_t IscsiDevice::LostBytes(uint64_t unit, uint64_t behind) const {
  uint64_t bytes = 0;
  auto runs = unsynced_lengths_.find(unit);
  if (runs != unsynced_lengths_.end()) {
    for (auto run = runs->second.rbegin(); run != runs->second.rend() && behind > 0; ++run) {
      const uint64_t n = std::min(behind, run->count);
      bytes += n * run->length;
      behind -= n;
    }
  }
  // Older than the last durable point (a server that restarted without
  // its checkpoint): the last length written there.
  auto last = write_length_.find(unit);
  return bytes + (last != write_length_.end() ? behind * last->second : 0);
}

void IscsiDevice::ForgetUnsyncedLengths() {
  unsynced_lengths_.clear();
  unsynced_runs_ = 0;
}

Status IscsiDevice::RunCommands(size_t count, uint32_t queue_depth, const StartFn& start, const DescribeFn& describe,
                                const std::vector<IoRequest>* writes, const ConsumeFn* consume, bool exchange) {
  if (!lost_.ok()) return lost_;
  // No command is in flight between batches, so the slots may move.
  if (spec_.iser) queue_depth = std::min(queue_depth, kIserMaxInFlight);
  commands_.assign(std::min<size_t>(std::max<uint32_t>(queue_depth, 1), count), Command());
  Status result;
  const size_t write_count = writes != nullptr ? writes->size() : 0;
  const size_t first_read = exchange ? write_count : 0;
  std::deque<size_t> pending;  // commands to start, in order
  for (size_t i = 0; i < (exchange ? write_count : count); ++i) pending.push_back(i);
  // An exchange's reads whose writes are done, in the order those ended;
  // they start ahead of `pending`, so reads follow writes closely.
  std::deque<size_t> reads_ready;
  auto write_done = [&](size_t index) {
    if (exchange && result.ok()) reads_ready.push_back(write_count + index);
  };
  size_t in_flight = 0;
  auto start_more = [&] {
    for (Command& command : commands_) {
      if (!result.ok() || (pending.empty() && reads_ready.empty())) return;
      if (command.task != nullptr) continue;
      std::deque<size_t>& next = reads_ready.empty() ? pending : reads_ready;
      command = Command();
      command.index = next.front();
      command.task = start(command.index, &command);
      command.started = std::chrono::steady_clock::now();
      if (command.task == nullptr) {
        result = Status::Error(EIO, "%s: cannot queue the command: %s", describe(command.index).c_str(),
                               LastError(iscsi_).c_str());
        return;
      }
      next.pop_front();
      ++in_flight;
    }
  };

  start_more();
  while (in_flight > 0) {
    // A dropped session ends every command in flight with CANCELLED
    // (noautoreconnect); a failing poll ends them when the context goes.
    bool dropped = !Service().ok();
    // A replica that answers standby applied nothing: with another replica
    // to follow to, its session is as good as dropped.
    auto standby = [&](const Command& command) {
      return spec_.replicated() && command.status == SCSI_STATUS_CHECK_CONDITION &&
             IsStandbySense(command.sense.key, command.sense.ascq);
    };
    // A command unanswered too long drops the session, and the reconnect's
    // receipts say what to resend: on a LUN with replicas after
    // kReplicaSilenceSeconds (the replica may be frozen or cut off), on iSER
    // after kCommandTimeoutSeconds (libiscsi times commands out on TCP only).
    const auto now = std::chrono::steady_clock::now();
    auto unanswered = [&](const Command& command) {
      const int limit = spec_.replicated() ? kReplicaSilenceSeconds : spec_.iser ? kCommandTimeoutSeconds : 0;
      return limit > 0 && !command.done && now - command.started > std::chrono::seconds(limit);
    };
    bool silent = false;
    for (const Command& command : commands_) {
      silent = silent || (command.task != nullptr && unanswered(command));
      dropped = dropped || (command.task != nullptr && command.done &&
                            (command.status == SCSI_STATUS_CANCELLED || standby(command)));
    }
    dropped = dropped || silent;
    if (dropped) {
      iscsi_destroy_context(iscsi_);  // runs the callbacks of what it held
      iscsi_ = nullptr;
    }
    std::vector<size_t> ended_with_session;
    for (Command& command : commands_) {
      if (command.task == nullptr || !(command.done || dropped)) continue;
      if (dropped && (!command.done || command.status == SCSI_STATUS_CANCELLED || standby(command))) {
        ended_with_session.push_back(command.index);
      } else if (command.status != SCSI_STATUS_GOOD) {
        if (result.ok()) result = CommandError(describe(command.index), command);
      } else if (command.index < write_count) {
        if (!expected_.empty()) {
          const IoRequest& write = (*writes)[command.index];
          ++expected_[write.offset / BLKPS_CONTROL_RECEIPT_UNIT];
          RecordWriteLength(write.offset / BLKPS_CONTROL_RECEIPT_UNIT,
                            write.length - write.padding_head - write.padding_tail);
        }
        write_done(command.index);
      } else if (consume != nullptr) {
        (*consume)(command.index - first_read);
      }
      scsi_free_scsi_task(command.task);
      command = Command();
      --in_flight;
    }
    if (dropped) {
      std::vector<size_t> resend;
      Status s = Reconnect(ended_with_session, writes, &resend, silent);
      if (!s.ok()) {
        lost_ = s;
        return s;
      }
      pending.insert(pending.begin(), resend.begin(), resend.end());
      // A write the receipt shows applied is done: its read may start.
      for (size_t index : ended_with_session) {
        if (index < write_count && std::find(resend.begin(), resend.end(), index) == resend.end()) {
          write_done(index);
        }
      }
    }
    start_more();
  }
  return result;
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

Status IscsiDevice::ReadTableWidth() {
  std::vector<char> region(BLKPS_CONTROL_COUNTERS_BYTES);
  Status s = SyncTransfer(iscsi_, control_lun_, Direction::kRead, BLKPS_CONTROL_COUNTERS_OFFSET, region.data(),
                          region.size(), block_size_);
  if (!s.ok()) return Status::Error(s.code(), "%s: counters: %s", name_.c_str(), s.message().c_str());
  blkps_control_counters counters{};
  // An older server's shorter record decodes as none: its width is unknown.
  if (blkps_control_counters_decode(region.data(), region.size(), &counters) == 0) {
    table_width_ = counters.table_width;
    table_hashed_ = counters.table_hashed != 0;
  }
  return Status();
}

}  // namespace blkps::iscsi
