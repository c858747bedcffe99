// One round on every shard (job.h, "One round on every shard"): a scaled-out
// bsp job's checkpoint generation is taken at a round boundary, the same on
// every shard. Here: which round a request is for, waiting until the shard
// has finished it, and what the part leaves out of what came after it (the
// writes given towards later rounds, on the receipts).
#include <algorithm>
#include <map>

#include "job.h"

namespace blkps::server {

bool Job::RoundBoundaries() const { return opts_.consistency.mode == ConsistencyMode::kBsp && opts_.shards > 1; }

Status Job::AwaitRoundBoundary(size_t slot, uint64_t* round) {
  std::unique_lock<std::mutex> lock(mu_);
  // A learner has pushed its whole gradient to every shard before its fsync:
  // its iteration is the same on all of them. A learner behind the shard
  // (dead, or never pushed) asks for the shard's own round.
  const uint64_t R = slot == kNoSlot ? clocks_.max_round() : std::max(clocks_.iteration(slot), clocks_.global_step());
  *round = R;
  const auto limit = std::chrono::duration<double>(opts_.hold_limit_s);
  ++checkpoints_waiting_;  // status "waiting_round"
  waiting_round_ = R;
  const bool finished = round_cv_.wait_for(lock, limit, [&] { return FailedLocked() || clocks_.global_step() >= R; });
  --checkpoints_waiting_;
  if (FailedLocked()) return Status::Unavailable(failure_);
  const std::string why = "a scaled-out bsp job's checkpoint is taken at one round on every shard "
                          "(doc/server.md \"One round on every shard\")";
  if (!finished) {
    return Status::IOError("round " + std::to_string(R) + " did not finish on this shard within hold_limit (some " +
                           "of its blocks are at round " + std::to_string(clocks_.global_step()) +
                           ": a learner is behind); " + why);
  }
  if (clocks_.max_round() > R) {
    return Status::IOError("the checkpoint asked for round " + std::to_string(R) + " but this shard is at round " +
                           std::to_string(clocks_.max_round()) +
                           " already (fsync after the pushes of a round, before "
                           "those of the next); " +
                           why);
  }
  return Status::OK();
}

uint64_t Job::RoundGeneration(uint64_t R) const {
  return round_generation_base_ + 1 + (R > round_base_ ? R - round_base_ : 0);
}

bool Job::AtOneRound() const {
  std::lock_guard<std::mutex> lock(mu_);
  return clocks_.global_step() == clocks_.max_round();
}

void Job::RecordRoundWriteLocked(size_t slot, const std::string& initiator, uint64_t unit, uint64_t round) {
  round_writes_.push_back(RoundWrite{slot, initiator, unit, round});
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
  // Uncount the later rounds' writes, save, count them again: all under mu_,
  // so no one sees the receipts in between.
  std::vector<std::pair<Receipt*, uint64_t>> uncounted;
  for (const RoundWrite& w : round_writes_) {
    if (w.round < R) continue;
    auto it = slots_[w.slot].receipts.find(w.initiator);
    if (it == slots_[w.slot].receipts.end()) continue;  // dropped (kReceiptsPerSlot): nothing to uncount
    Receipt& r = it->second;
    --r.applied[w.unit];
    --r.writes_applied;
    uncounted.emplace_back(&r, w.unit);
  }
  std::vector<uint64_t> words = SaveReceiptsLocked();
  for (const auto& [r, unit] : uncounted) {
    ++r->applied[unit];
    ++r->writes_applied;
  }
  return words;
}

}  // namespace blkps::server
