// Holds (holds.h): held commands, their release, and the released lists.
#include "holds.h"

#include <algorithm>
#include <iterator>

namespace blkps::server {

void Holds::AddSlot() { slots_.emplace_back(); }

void Holds::SetWake(size_t slot, std::function<void()> wake) { slots_[slot].wake = std::move(wake); }

void Holds::Hold(Command command) {
  ++slots_[command.slot].held;
  held_.push_back(std::move(command));
}

void Holds::Release(const std::function<std::optional<Status>(const Command&)>& decide) {
  auto it = std::remove_if(held_.begin(), held_.end(), [&](const Command& held) {
    std::optional<Status> status = decide(held);
    if (!status) return false;
    Slot& s = slots_[held.slot];
    s.released.push_back(Released{held.cmd, std::move(*status)});
    --s.held;
    if (s.wake) s.wake();
    return true;
  });
  held_.erase(it, held_.end());
}

std::vector<Holds::Command> Holds::Drop(size_t slot) {
  std::vector<Command> dropped;
  auto it = std::stable_partition(held_.begin(), held_.end(), [&](const Command& h) { return h.slot != slot; });
  std::move(it, held_.end(), std::back_inserter(dropped));
  held_.erase(it, held_.end());
  Slot& s = slots_[slot];
  s.held = 0;
  s.released.clear();
  s.wake = nullptr;
  return dropped;
}

std::vector<Holds::Released> Holds::Take(size_t slot) {
  std::vector<Released> out;
  out.swap(slots_[slot].released);
  return out;
}

}  // namespace blkps::server
