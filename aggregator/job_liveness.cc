// Job's ticker (job.h, "Liveness"): every kTick it fails commands held past
// hold_limit, declares learners without I/O for dead_after dead, fails the
// job at max_dead, finishes bsp rounds a death completed, and writes
// periodic checkpoints. Runs on the Job's own thread.
#include "job.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>

#include "number_text.h"

namespace blkps::server {
namespace {

constexpr auto kTick = std::chrono::milliseconds(50);

}  // namespace

void Job::Tick() {
  const Clock::time_point now = Clock::now();
  std::vector<uint64_t> bsp_blocks;  // rounds a death may have completed
  bool checkpoint_due = false;
  {
    MutexLock lock(&mu_);
    const auto hold_limit = std::chrono::duration<double>(opts_.hold_limit_s);
    holds_.Release([&](const HeldCommand& held) REQUIRES(mu_) -> std::optional<Status> {
      if (now - held.since < hold_limit) return std::nullopt;
      Slot& s = slots_[held.slot];
      ++s.hold_timeouts;
      const std::string why = std::string(held.write ? "gradient write" : "read") + " of block " +
                              std::to_string(held.first_block) + " by lun " + std::to_string(s.lun) + " (iteration " +
                              std::to_string(clocks_.clock(held.slot, held.first_block)) + ", mode " +
                              FormatConsistency(opts_.consistency) + ") waited " + Fixed(opts_.hold_limit_s, 1) +
                              " s (hold_limit) for learners behind it: " + WhoIsBehindLocked(held);
      log_(why);
      return OnReleaseLocked(held, Status::DeadlineExceeded(why));
    });

    size_t dead = 0;
    bool died = false;
    for (size_t k = 0; k < slots_.size(); ++k) {
      Slot& s = slots_[k];
      // A backup on standby sees no learner I/O: liveness is its primary's.
      if (!standby() && clocks_.live(k) && holds_.held(k) == 0 && Seconds(now - s.last_io) > opts_.dead_after_s) {
        clocks_.MarkDead(k);
        ++s.deaths;
        died = true;
        log_("learner at lun " + std::to_string(s.lun) + " is dead: no I/O for " + Fixed(Seconds(now - s.last_io), 1) +
             " s (dead_after=" + Fixed(opts_.dead_after_s, 1) + "); the others go on without it");
      }
      dead += clocks_.live(k) ? 0 : 1;
    }
    // Only a new death fails the job: after resume=1 it goes on with the
    // live learners until another one dies.
    if (died && opts_.max_dead > 0 && dead >= opts_.max_dead && !FailedLocked()) {
      failure_ = "job failed: " + std::to_string(dead) + " of " + std::to_string(slots_.size()) +
                 " learners are dead (max_dead=" + std::to_string(opts_.max_dead) +
                 "); learner I/O fails until a control write of resume=1";
      failed_.store(true);
      log_(failure_);
    }
    checkpoint_due = opts_.checkpoint_every_s > 0 && !standby() && !lease_.lapsed() &&
                     Seconds(now - last_checkpoint_) >= opts_.checkpoint_every_s;
    if (died) {
      ReleaseLocked();
      round_cv_.notify_all();  // ssp: a round boundary may have waited for the dead
    }
    if (died || rounds_may_be_complete_) {
      rounds_may_be_complete_ = false;
      if (opts_.consistency.mode == ConsistencyMode::kBsp) {
        for (uint64_t b = 0; b < clocks_.num_blocks(); ++b) {
          if (clocks_.RoundComplete(b)) bsp_blocks.push_back(b);
        }
      }
    }
  }
  for (uint64_t b : bsp_blocks) {
    std::unique_lock<std::shared_mutex> block_lock = model_->LockBlock(b);
    uint32_t given = 0;
    {
      MutexLock lock(&mu_);
      given = FinishRoundIfCompleteLocked(b);
    }
    if (given > 0) model_->ApplyAverageLocked(b, given);
  }

  // A scaled-out bsp or ssp job's part is taken at a round boundary: the
  // ticker never waits for one, it tries again at the next tick.
  if (checkpoint_due && (!RoundBoundaries() || AtOneRound())) {
    Status s = Checkpoint();
    if (!s.ok()) log_("periodic checkpoint failed: " + s.message());
  }
  // A learner that died or returned: the backup must know, or once promoted
  // it would wait dead_after for one its primary had given up.
  if (replicated_.load() && !standby()) (void)ReplicateLiveness();  // a failure is Replicate's to handle
}

void Job::TickerLoop() {
  // tgtd wakes its main thread with signals; they must not land here.
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  MutexLock lock(&ticker_mu_);
  for (;;) {
    const Clock::time_point next = Clock::now() + kTick;
    while (!stopping_ && Clock::now() < next) lock.WaitUntil(ticker_cv_, next);
    if (stopping_) return;
    lock.Unlock();
    Tick();
    lock.Lock();
  }
}

}  // namespace blkps::server
