// Job's data path: a learner's READ (the weights) and WRITE (a gradient,
// applied through Model::ApplyGradient and counted on the learner's clocks;
// in bsp, a block's round is averaged and applied when its last gradient
// arrives). Runs on tgt's worker threads, concurrently.
#include "job.h"

#include <algorithm>
#include <optional>

namespace blkps::server {

Status Job::Read(size_t, uint64_t offset, void* dst, size_t len) {
  if (standby()) return StandbyStatus();
  if (Status leased = CheckLease(); !leased.ok()) return leased;  // a backup may serve newer weights
  if (failed_.load()) {
    MutexLock lock(&mu_);
    return Status::Unavailable(failure_);
  }
  return model_->Read(offset, dst, len);
}

Status Job::ReadParams(uint64_t first, uint64_t count, const Model::TakeWeights& take) {
  if (standby()) return StandbyStatus();
  if (Status leased = CheckLease(); !leased.ok()) return leased;  // a backup may serve newer weights
  if (failed_.load()) {
    MutexLock lock(&mu_);
    return Status::Unavailable(failure_);
  }
  return model_->ReadParams(first, count, take);
}

Status Job::Write(size_t slot, uint64_t offset, const void* src, size_t len, const Initiator& initiator,
                  uint64_t device_offset, wire::Dtype values) {
  EnterWriteGate();
  uint64_t round = 0;  // the round its gradient is towards: its clock on its first block
  if (RoundBoundaries() && offset / sizeof(float) < model_->num_params()) {
    MutexLock lock(&mu_);
    round = clocks_.clock(slot, model_->BlockOf(offset / sizeof(float)));
  }
  // A primary's record, sent before the WRITE completes through the
  // channel its backup had when the write entered the gate (none while the
  // backup is outdated: a catch-up's snapshot, taken with the gate closed,
  // has this write or the record goes to it).
  std::optional<ReplicaPush> push;
  std::shared_ptr<ReplicaChannel> channel = replicated_.load() ? backup_.ChannelForWrite() : nullptr;
  if (channel) {
    MutexLock lock(&mu_);
    push.emplace(slots_[slot].lun, initiator.name, device_offset / kReceiptUnit);
    push->Reserve(*model_, len / sizeof(float));
  }
  // Checked while the write is in progress on its receipt: a learner that
  // fences after the check waits for it to end (writes_in_progress).
  Status s = CheckNotFenced(slot, initiator);
  if (s.ok()) s = ApplyWrite(slot, offset, src, len, values, push ? &*push : nullptr);
  // Counted inside the gate: a checkpoint holds both the gradient and its
  // count, or neither.
  FinishWrite(slot, initiator.name, device_offset, s.ok(), round);
  LeaveWriteGate();
  if (s.ok() && push && !push->empty()) s = Replicate(ReplicaChannel::Record::kPush, push->Body(), *channel);
  // Acknowledged only while the lease holds (a lease may lapse while the
  // backup has the record): the receipt says it was applied.
  if (s.ok()) s = CheckLease();
  // Only now: a learner that reconnected while the record was on its way
  // would otherwise read a receipt counting a write its backup may lack.
  EndWrite(slot, initiator.name);
  return s;
}

Status Job::ApplyWrite(size_t slot, uint64_t offset, const void* src, size_t len, wire::Dtype values,
                       ReplicaPush* push) {
  if (standby()) return StandbyStatus();
  Status leased = CheckLease();
  if (!leased.ok()) return leased;
  if (failed_.load()) {
    MutexLock lock(&mu_);
    return Status::Unavailable(failure_);
  }
  return ApplyAdmittedWrite(slot, offset, src, len, values, push);
}

Status Job::ApplyAdmittedWrite(size_t slot, uint64_t offset, const void* src, size_t len, wire::Dtype values,
                               ReplicaPush* push) {
  const bool bsp = opts_.consistency.mode == ConsistencyMode::kBsp;
  Model::BlockStaleness staleness;
  if (!bsp && !model_->table().is_table()) {  // a table: as written (CheckTableJob)
    staleness = [&](uint64_t b) {
      MutexLock lock(&mu_);
      return PushStalenessLocked(slot, b);
    };
  }
  Status s = model_->ApplyGradient(
      offset, src, len,
      [&](uint64_t b, uint64_t n) {
        uint32_t given = 0;
        std::vector<uint64_t> clocks;  // b's, as this push left them, for the backup
        uint64_t clocks_sequence = 0;
        {
          MutexLock lock(&mu_);
          given = CountGradientLocked(slot, b, n);
          if (push) {
            clocks = clocks_.SaveBlock(b);
            clocks_sequence = ++clock_sequence_[b];
          }
        }
        // Readers released by the round wait for this block's lock, which
        // ApplyGradient holds here, so they see the round's update.
        if (given > 0) model_->ApplyAverageLocked(b, given);
        if (push) {
          push->AddBlockLocked(*model_, replica_parts_, b, offset / sizeof(float), len / sizeof(float));
          push->AddClocks(b, clocks_sequence, clocks);
        }
      },
      staleness, values);
  if (!s.ok()) rejected_writes_.fetch_add(1);
  return s;
}

uint32_t Job::CountGradientLocked(size_t slot, uint64_t b, uint64_t n) {
  if (!clocks_.AddGradient(slot, b, n)) return 0;
  if (!slots_[slot].own_since_read.empty()) ++slots_[slot].own_since_read[b];
  if (opts_.consistency.mode == ConsistencyMode::kBsp) return FinishRoundIfCompleteLocked(b);
  if (holds_.held() > 0) ReleaseLocked();                // ssp: the slowest may have moved
  if (checkpoints_waiting_ > 0) round_cv_.notify_all();  // ssp: towards a round boundary
  return 0;
}

uint64_t Job::PushStalenessLocked(size_t slot, uint64_t b) {
  Slot& s = slots_[slot];
  // With N learners taking part a push is at least 1/N of a round (one
  // step of one process on the total batch), however fresh: it is applied
  // as at least N-1 updates stale (doc/async.md "Gradient mode:
  // staleness-aware steps in the server"). One learner: 0, as written. N
  // counts the learners that push, not the LUNs: a spare or read-only LUN
  // takes no share.
  const size_t pushing = std::max<size_t>(PushingLearnersLocked(Clock::now()), 1);
  const uint64_t round = opts_.staleness_aware ? pushing - 1 : 0;
  if (s.read_version.empty() || s.read_version[b] == kNeverRead) return round;  // nothing read: unknown
  // A pipelined learner's gradient is on the weights of its previous step's
  // read: the updates since, its own push of that step included, are stale
  // to it (before a second step's read: its only read).
  const uint64_t previous = s.previous_step_read_version[b];
  const uint64_t read = s.pipeline_depth > 0 && previous != kNeverRead ? previous : s.read_version[b];
  const uint64_t tau = clocks_.version(b) - read - s.own_since_read[b];
  s.push_staleness_max = std::max(s.push_staleness_max, tau);
  s.push_staleness_sum += tau;
  ++s.pushes_measured;
  if (tau > opts_.stale_bound) {
    ++s.stale_pushes;
    if (!s.told_stale) {
      s.told_stale = true;
      log_("learner at lun " + std::to_string(s.lun) + ": push " + std::to_string(tau) + " updates stale (bound " +
           std::to_string(opts_.stale_bound) +
           "): it is much slower than the others or pulls too rarely; fewer learners, or a "
           "lower lr, or bsp/ssp help (doc/server.md \"Asynchronous training\")");
    }
  } else {
    s.told_stale = false;
  }
  return opts_.staleness_aware ? std::max(tau, round) : 0;
}

size_t Job::PushingLearnersLocked(Clock::time_point now) const {
  const auto window = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opts_.dead_after_s));
  size_t n = 0;
  for (const Slot& s : slots_) n += s.last_push != Clock::time_point::min() && now - s.last_push <= window ? 1 : 0;
  return n;
}

uint32_t Job::FinishRoundIfCompleteLocked(uint64_t b) {
  if (!clocks_.RoundComplete(b)) return 0;
  const uint32_t given = clocks_.FinishRound(b);
  ReleaseLocked();
  round_cv_.notify_all();  // a checkpoint may wait for this round
  return given;
}

}  // namespace blkps::server
