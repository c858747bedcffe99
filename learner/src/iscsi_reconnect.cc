// IscsiDevice's reconnect (iscsi_device.h says the contract, "Exactly-once
// writes"): logging in again with backoff until BLKPS_RECONNECT_SECONDS, to
// the first of the LUN's replicas that serves,
// fencing the old session's writes on the control LUN, reading the receipt,
// and choosing what to resend; writes the server lost with a restart are
// counted and said on stderr.

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "iscsi_device.h"

namespace blkps::iscsi {
namespace {

// A lost session is re-established with backoff between attempts for
// BLKPS_RECONNECT_SECONDS, by default kReconnectBaseSeconds plus one second
// per kReconnectBytesPerSecond of model: enough for a loaded server to
// restart and load its checkpoint, short enough that a learner whose server
// is gone fails.
constexpr double kReconnectBaseSeconds = 60;
constexpr double kReconnectBytesPerSecond = 64 << 20;
constexpr std::chrono::milliseconds kReconnectBackoffMax(1000);
// With replicas a round asks each one a READ at most (a backup not yet
// promoted answers "standby" at once): rounds this close follow a
// promotion within a quarter second of it.
constexpr std::chrono::milliseconds kReplicaBackoffMax(250);

}  // namespace

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

Status IscsiDevice::Reconnect(const std::vector<size_t>& dropped, const std::vector<IoRequest>* writes,
                              std::vector<size_t>* resend, bool silent) {
  // The receipt is read after every reconnect, whatever the batch: a target
  // restarted while the device was reading or idle lost writes too.
  const bool receipts = !expected_.empty();
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                    std::chrono::duration<double>(spec_.reconnect_seconds));
  std::chrono::milliseconds backoff(50);
  int attempts = 0;
  std::string error;
  // With several replicas: the last error of each, by replica (each is
  // tried before the deadline is checked).
  std::vector<std::string> errors(spec_.replicas.size());
  const size_t was = replica_;
  std::vector<uint32_t> counts;
  // The new session may drop too, before the receipt is read: start again.
  // The replicas are tried in turn from the current one on (a target that
  // restarts is tried first), from the next one on if the current one went
  // silent; the backoff comes after each round of them.
  // The replica that went silent rests until the others have had
  // kReplicaSilenceSeconds to take over: a backup on its way to promotion
  // answers "standby" meanwhile, and going back to the silent one at once
  // would wait out its silence again before the backup is tried anew.
  const size_t silent_replica = silent ? replica_ : spec_.replicas.size();
  const uint64_t ended = session_;  // the session whose writes may still reach the server
  const auto silent_rests_until = start + std::chrono::seconds(kReplicaSilenceSeconds);
  if (silent) replica_ = (replica_ + 1) % spec_.replicas.size();
  const size_t first = replica_;
  for (;;) {
    // With replicas, one that does not log in and answer the probe within
    // kReplicaSilenceSeconds is left for the next.
    const Deadline attempt =
        spec_.replicated()
            ? std::min(deadline, std::chrono::steady_clock::now() + std::chrono::seconds(kReplicaSilenceSeconds))
            : deadline;
    if (replica_ == silent_replica && std::chrono::steady_clock::now() < silent_rests_until) {
      error = "it went silent; tried again once the others had " + std::to_string(kReplicaSilenceSeconds) + " s";
    } else {
      session_ = NewSessionToken();
      iscsi_ = LogIn(spec_, replica_, session_, &error, attempt);
      ++attempts;
    }
    if (iscsi_ != nullptr && spec_.replicated()) {
      Status s = ProbeServing(iscsi_, lun_, block_size_, attempt);
      if (!s.ok()) {
        error = s.reason();
        iscsi_destroy_context(iscsi_);
        iscsi_ = nullptr;
      }
    }
    if (iscsi_ != nullptr && receipts) {
      Status s = FenceAndReadReceipt(ended, &counts, deadline);
      if (s.ok()) break;
      error = s.reason();
      iscsi_destroy_context(iscsi_);
      iscsi_ = nullptr;
    }
    if (iscsi_ != nullptr) break;
    errors[replica_] = spec_.replicas[replica_].name + ": " + error;
    replica_ = (replica_ + 1) % spec_.replicas.size();
    if (replica_ != first) continue;  // the next replica at once
    if (std::chrono::steady_clock::now() + backoff > deadline) {
      const double tried = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      reconnect_seconds_ += tried;
      std::string last = error;
      if (spec_.replicated()) {
        last = "no replica serves; last errors: ";
        for (size_t r = 0; r < errors.size(); ++r) last += (r > 0 ? "; " : "") + errors[r];
      }
      return Status::Error(EIO,
                           "%s: the connection was lost; gave up reconnecting after %d attempts in %.1f s (deadline "
                           "%.0f s, BLKPS_RECONNECT_SECONDS); last error: %s; reopen the model",
                           name_.c_str(), attempts, tried, spec_.reconnect_seconds, last.c_str());
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, spec_.replicated() ? kReplicaBackoffMax : kReconnectBackoffMax);
  }
  ++reconnects_;
  reconnect_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (replica_ != was) {
    fprintf(stderr, "blkps: %s: followed a failover: replica %s serves it now\n", name_.c_str(),
            spec_.replicas[replica_].name.c_str());
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
    lost_bytes += LostBytes(u, static_cast<uint64_t>(behind));
  }
  for (size_t index : dropped) {
    // Reads and syncs are resent; a write only if the receipt does not count
    // it (applied, it is one more than was expected before it).
    const bool write = writes != nullptr && index < writes->size();
    const uint64_t u = write ? (*writes)[index].offset / BLKPS_CONTROL_RECEIPT_UNIT : 0;
    const bool applied = write && counts[u] - expected_[u] == 1u;
    if (!applied) resend->push_back(index);
  }
  if (lost > 0) {
    pushed_bytes_lost_ += lost_bytes;
    // The server holds its checkpoint and nothing after it: what it counts
    // now cannot be lost by a later restart.
    ForgetUnsyncedLengths();
    fprintf(stderr,
            "blkps: %s: the target restarted from a checkpoint older than %llu acknowledged writes (%llu bytes, "
            "the first at byte %llu); those gradients are not in the model\n",
            name_.c_str(), static_cast<unsigned long long>(lost), static_cast<unsigned long long>(lost_bytes),
            static_cast<unsigned long long>(first_lost_unit * BLKPS_CONTROL_RECEIPT_UNIT));
  }
  expected_ = std::move(counts);
  return Status();
}

Status IscsiDevice::FenceAndReadReceipt(uint64_t ended, std::vector<uint32_t>* counts, Deadline deadline) {
  char token[17];
  snprintf(token, sizeof token, "%016llx", static_cast<unsigned long long>(ended));
  std::string fence = "fence=" + std::to_string(lun_) + ":" + token + "\n";
  fence.resize(block_size_, '\0');
  Status s = SyncTransfer(iscsi_, control_lun_, Direction::kWrite, BLKPS_CONTROL_COMMANDS_OFFSET, fence.data(),
                          fence.size(), block_size_, deadline);
  if (!s.ok()) return Status::Error(EIO, "%s: after reconnecting: fence: %s", name_.c_str(), s.message().c_str());
  // Writes already running on the server finish in under a command
  // timeout (a primary's waits at most 10 s for its backup's acknowledgement
  // and 10 s more for a lease keeper's verdict: doc/replicas.md); poll for
  // that.
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

}  // namespace blkps::iscsi
