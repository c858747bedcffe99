// One round on every shard (job.h, "One round on every shard"): a scaled-out
// bsp or ssp job's checkpoint generation is taken at a round boundary, the
// same on every shard. Here: which round a request is for, waiting until the
// shard is at it, and keeping it there: bsp leaves out of the part what was
// given towards later rounds (the writes on the receipts); ssp applies
// pushes on arrival, so it holds the writes past the boundary until the
// part is written.
#include <algorithm>
#include <map>
#include <optional>

#include "job.h"

namespace blkps::server {

bool Job::RoundBoundaries() const { return opts_.consistency.mode != ConsistencyMode::kAsync && opts_.shards > 1; }

uint64_t Job::BoundaryAskedLocked(size_t slot) const {
  // A learner has pushed its whole gradient to every shard before its fsync:
  // its iteration is the same on all of them.
  if (opts_.consistency.mode == ConsistencyMode::kSsp) {
    if (slot != kNoSlot) return clocks_.iteration(slot);
    uint64_t furthest = 0;
    for (size_t k = 0; k < slots_.size(); ++k) {
      if (clocks_.live(k)) furthest = std::max(furthest, clocks_.furthest_iteration(k));
    }
    return furthest;
  }
  // bsp: a learner behind the shard (dead, or never pushed) asks for the
  // shard's own round.
  return slot == kNoSlot ? clocks_.max_round() : std::max(clocks_.iteration(slot), clocks_.global_step());
}

bool Job::BoundaryReachedLocked(uint64_t R) const {
  if (opts_.consistency.mode != ConsistencyMode::kSsp) return clocks_.global_step() >= R;
  for (size_t k = 0; k < slots_.size(); ++k) {
    if (clocks_.live(k) && clocks_.iteration(k) < R) return false;
  }
  return true;
}

std::string Job::PastBoundaryLocked(uint64_t R) const {
  if (opts_.consistency.mode != ConsistencyMode::kSsp) {
    if (clocks_.max_round() <= R) return "";
    return "this shard is at round " + std::to_string(clocks_.max_round()) +
           " already (fsync after the pushes of a round, before those of the next)";
  }
  const std::string past = LiveLearnersLocked(" towards iteration ", [&](size_t k) REQUIRES(mu_) {
    return clocks_.furthest_iteration(k) > R ? std::optional<uint64_t>(clocks_.furthest_iteration(k)) : std::nullopt;
  });
  if (past.empty()) return "";
  return "learners on this shard have pushed past iteration " + std::to_string(R) + " already (" + past +
         "; in ssp every learner syncs after the same iterations)";
}

std::string Job::BehindBoundaryLocked(uint64_t R) const {
  if (opts_.consistency.mode != ConsistencyMode::kSsp) {
    return "some of its blocks are at round " + std::to_string(clocks_.global_step()) + ": a learner is behind";
  }
  return "learners behind it: " + LiveLearnersLocked(" at iteration ", [&](size_t k) REQUIRES(mu_) {
           return clocks_.iteration(k) < R ? std::optional<uint64_t>(clocks_.iteration(k)) : std::nullopt;
         });
}

std::string Job::LiveLearnersLocked(const std::string& what,
                                    const std::function<std::optional<uint64_t>(size_t)>& at) const {
  std::string out;
  for (size_t k = 0; k < slots_.size(); ++k) {
    const std::optional<uint64_t> iteration = clocks_.live(k) ? at(k) : std::nullopt;
    if (iteration)
      out += (out.empty() ? "lun " : ", lun ") + std::to_string(slots_[k].lun) + what + std::to_string(*iteration);
  }
  return out;
}

bool Job::HeldAtBoundaryLocked(size_t slot, uint64_t first_block, uint64_t last_block) const {
  if (boundaries_.empty()) return false;
  const uint64_t R = boundaries_.begin()->first;
  for (uint64_t b = first_block; b <= last_block; ++b) {
    if (clocks_.clock(slot, b) >= R) return true;  // a gradient towards R+1 or later
  }
  return false;
}

Status Job::AwaitRoundBoundary(size_t slot, uint64_t* round) {
  MutexLock lock(&mu_);
  const uint64_t R = BoundaryAskedLocked(slot);
  *round = R;
  const bool ssp = opts_.consistency.mode == ConsistencyMode::kSsp;
  if (ssp) ++boundaries_[R];  // EndRoundBoundary() ends it
  const std::string unit = ssp ? "iteration " : "round ";
  const std::string why = "a scaled-out " + FormatConsistency(opts_.consistency) +
                          " job's checkpoint is taken at one round on every shard "
                          "(doc/server.md \"One round on every shard\")";
  const auto not_past = [&]() REQUIRES(mu_) {
    const std::string past = PastBoundaryLocked(R);
    if (past.empty()) return Status::OK();
    return Status::IOError("the checkpoint asked for " + unit + std::to_string(R) + " but " + past + "; " + why);
  };
  if (Status s = not_past(); !s.ok()) return s;
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opts_.hold_limit_s));
  ++checkpoints_waiting_;  // status "waiting_round"
  waiting_round_ = R;
  bool reached = false;
  while (!(reached = FailedLocked() || BoundaryReachedLocked(R)) && Clock::now() < deadline) {
    lock.WaitUntil(round_cv_, deadline);
  }
  --checkpoints_waiting_;
  if (FailedLocked()) return Status::Unavailable(failure_);
  if (!reached) {
    return Status::IOError(unit + std::to_string(R) + " did not finish on this shard within hold_limit (" +
                           BehindBoundaryLocked(R) + "); " + why);
  }
  return not_past();
}

void Job::EndRoundBoundary(uint64_t R) {
  MutexLock lock(&mu_);
  auto it = boundaries_.find(R);
  if (it == boundaries_.end()) return;  // bsp holds nothing
  if (--it->second == 0) boundaries_.erase(it);
  ReleaseLocked();
}

std::string Job::NotAtBoundaryLocked(uint64_t R) const {
  const bool at = opts_.consistency.mode == ConsistencyMode::kSsp
                      ? BoundaryReachedLocked(R) && PastBoundaryLocked(R).empty()
                      : clocks_.global_step() == R && clocks_.max_round() == R;
  return at ? "" : "this shard moved past round " + std::to_string(R) + " before its checkpoint's instant";
}

uint64_t Job::RoundGeneration(uint64_t R) const {
  return round_generation_base_ + 1 + (R > round_base_ ? R - round_base_ : 0);
}

bool Job::AtOneRound() const {
  MutexLock lock(&mu_);
  return NotAtBoundaryLocked(BoundaryAskedLocked(kNoSlot)).empty();
}

std::vector<uint64_t> Job::SaveClocksAtRoundLocked(uint64_t R) const {
  // ssp held every write past R: the clocks are at R as they are.
  return opts_.consistency.mode == ConsistencyMode::kSsp ? clocks_.Save() : clocks_.SaveAtRound(R);
}

void Job::RecordRoundWriteLocked(size_t slot, const std::string& initiator, uint64_t unit, uint64_t round) {
  if (opts_.consistency.mode == ConsistencyMode::kSsp) return;  // ssp's parts leave nothing out
  round_writes_.push_back(RoundWrite{{slot, initiator, unit}, round});
  if (round_writes_.size() < round_writes_prune_at_) return;
  // A write towards a round every block has finished is in every later
  // boundary: no checkpoint leaves it out.
  const uint64_t finished = clocks_.global_step();
  round_writes_.erase(std::remove_if(round_writes_.begin(), round_writes_.end(),
                                     [&](const RoundWrite& w) { return w.round < finished; }),
                      round_writes_.end());
  round_writes_prune_at_ = 2 * round_writes_.size() + 64;
}

std::vector<uint64_t> Job::SaveReceiptsAtRoundLocked(uint64_t R) {
  std::vector<Receipts::Write> later;
  for (const RoundWrite& w : round_writes_) {
    if (w.round >= R) later.push_back(w.write);
  }
  return receipts_.SaveWithout(later);
}

}  // namespace blkps::server
