// Holds: the learners' commands that may not run yet (job.h "Holding
// commands"), kept by the Job rather than by a blocked thread, and those
// released, waiting for their slot's main thread to take them. A held
// command is the caller's opaque pointer and what the Job needs to decide
// on it; whether it may run is the Job's decision (Release's `decide`), not
// this object's. At a failover these are what the learners must
// be told to resend.
//
// Not thread-safe: the Job keeps its Holds GUARDED_BY its mu_ and calls
// them under it; the wake callbacks run under that lock too.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "status.h"

namespace blkps::server {

class Holds {
 public:
  using Clock = std::chrono::steady_clock;
  // A learner's command that waits.
  struct Command {
    void* cmd;
    size_t slot;
    bool write;
    std::string initiator;
    uint64_t first_block, last_block;
    Clock::time_point since;
  };
  struct Released {
    void* cmd;
    Status status;  // OK: run it now; otherwise fail it with this
  };

  // A learner slot with nothing held; slots are numbered from 0 in the order
  // they are added.
  void AddSlot();
  // `wake` is called (under the owner's lock, so it must not call the
  // owner) when `slot` has released commands; null: none.
  void SetWake(size_t slot, std::function<void()> wake);

  void Hold(Command command);
  // Every held command for which `decide` gives a status is released with
  // it, its slot woken; the others stay held, in their order. `decide` may
  // release nothing itself.
  void Release(const std::function<std::optional<Status>(const Command&)>& decide);
  // Drops `slot`'s held and released commands (they never run) and its
  // wake; returns the held ones.
  std::vector<Command> Drop(size_t slot);
  // `slot`'s released commands, in release order; it has none after.
  std::vector<Released> Take(size_t slot);

  size_t held() const { return held_.size(); }
  uint32_t held(size_t slot) const { return slots_[slot].held; }

 private:
  struct Slot {
    uint32_t held = 0;
    std::vector<Released> released;
    std::function<void()> wake;
  };
  std::vector<Command> held_;
  std::vector<Slot> slots_;
};

}  // namespace blkps::server
