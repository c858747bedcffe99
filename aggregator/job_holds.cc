// Job admission (job.h, "Holding commands"): whether a learner's command may
// run now under the consistency mode (and, in ssp, a round boundary being
// written: job.h "One round on every shard"), and if not, keeping it until
// it may, or until the ticker fails it at hold_limit. Everything here runs
// under mu_ and never waits for I/O: Admit and TakeReleased are called on
// tgtd's main thread.
#include "job.h"

#include <algorithm>

namespace blkps::server {

Job::Admission Job::Admit(size_t slot, bool write, uint64_t offset, uint64_t len, void* cmd,
                          const std::string& initiator) {
  const uint64_t first_param = offset / sizeof(float);
  const uint64_t end_param = std::min(model_->num_params(), (offset + len + sizeof(float) - 1) / sizeof(float));
  MutexLock lock(&mu_);
  Slot& s = slots_[slot];
  s.last_io = Clock::now();
  if (write) s.last_push = s.last_io;
  (write ? s.writes : s.reads) += 1;
  (write ? s.bytes_written : s.bytes_read) += len;
  Receipt* receipt = receipts_.Use(slot, initiator, write);
  if (write) ++receipt->in_progress;
  // Read/Write fail it; a backup's clocks are its primary's, and hold nothing.
  if (FailedLocked() || standby()) return Admission::kRun;
  if (!clocks_.live(slot)) {
    clocks_.Rejoin(slot);
    log_("learner at lun " + std::to_string(s.lun) + " is back; it rejoins at iteration " +
         std::to_string(clocks_.iteration(slot)));
  }
  if (first_param >= end_param || offset + len < offset) return Admission::kRun;  // padding, or Read/Write refuse it
  const uint64_t first = model_->BlockOf(first_param), last = model_->BlockOf(end_param - 1);
  if (MayPassLocked(slot, write, first, last)) {
    if (!write) RecordLeadLocked(slot, first, last);
    return Admission::kRun;
  }
  holds_.Hold(HeldCommand{cmd, slot, write, initiator, first, last, Clock::now()});
  ++s.holds;
  return Admission::kHold;
}

bool Job::MayPassLocked(size_t slot, bool write, uint64_t first_block, uint64_t last_block) const {
  if (!write) return clocks_.ReadMayPass(slot, first_block, last_block);
  return clocks_.WriteMayPass(slot, first_block, last_block) && !HeldAtBoundaryLocked(slot, first_block, last_block);
}

std::vector<Job::Released> Job::TakeReleased(size_t slot) {
  MutexLock lock(&mu_);
  return holds_.Take(slot);
}

void Job::RecordLeadLocked(size_t slot, uint64_t first_block, uint64_t last_block) {
  uint64_t lead = 0;
  for (uint64_t b = first_block; b <= last_block; ++b) lead = std::max(lead, clocks_.Lead(slot, b));
  Slot& s = slots_[slot];
  if (s.read_version.empty()) {
    s.read_version.assign(clocks_.num_blocks(), kNeverRead);
    s.previous_step_read_version.assign(clocks_.num_blocks(), kNeverRead);
    s.own_since_read.assign(clocks_.num_blocks(), 0);
  }
  for (uint64_t b = first_block; b <= last_block; ++b) {
    // A read after a push of its own starts the slot's next step on b; a
    // read again without one (the rest of a block, a re-read) is the same
    // step's.
    if (s.own_since_read[b] > 0) s.previous_step_read_version[b] = s.read_version[b];
    s.read_version[b] = clocks_.version(b);
    s.own_since_read[b] = 0;
  }
  s.lead_last = lead;
  s.lead_max = std::max(s.lead_max, lead);
  s.lead_sum += lead;
  ++s.lead_count;
}

Status Job::OnReleaseLocked(const HeldCommand& held, Status status) {
  if (status.ok() && !held.write) RecordLeadLocked(held.slot, held.first_block, held.last_block);
  if (held.write && !status.ok()) receipts_.EndWrite(held.slot, held.initiator);  // it will never run
  return status;
}

void Job::ReleaseLocked() {
  holds_.Release([&](const HeldCommand& held) REQUIRES(mu_) -> std::optional<Status> {
    if (FailedLocked()) return OnReleaseLocked(held, Status::Unavailable(failure_));
    if (!MayPassLocked(held.slot, held.write, held.first_block, held.last_block)) return std::nullopt;
    return OnReleaseLocked(held, Status::OK());
  });
}

std::string Job::WhoIsBehindLocked(const HeldCommand& held) const {
  std::string behind;
  const uint64_t b = held.first_block;
  const uint64_t mine = clocks_.clock(held.slot, b);
  for (size_t k = 0; k < slots_.size(); ++k) {
    if (k == held.slot || !clocks_.live(k) || clocks_.clock(k, b) >= mine) continue;
    behind += (behind.empty() ? "" : ", ") + std::string("lun ") + std::to_string(slots_[k].lun) + " at " +
              std::to_string(clocks_.clock(k, b));
  }
  return behind.empty() ? "the rest of this round" : behind;
}

}  // namespace blkps::server
