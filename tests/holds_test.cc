// Holds: learners' commands that may not run yet, their release (the Job
// decides), and the released lists a slot's main thread takes.
#include "holds.h"

#include <gtest/gtest.h>

#include <optional>
#include <vector>

namespace blkps::server {
namespace {

int commands[4];  // their addresses are the opaque command pointers

Holds::Command Held(int k, size_t slot, bool write = false) {
  return Holds::Command{&commands[k], slot, write, "iqn.learner", 0, 0, Holds::Clock::now()};
}

TEST(Holds, ReleasedCommandsAreTakenInReleaseOrderWithTheirStatusAndWakeTheirSlot) {
  Holds holds;
  holds.AddSlot();
  int wakes = 0;
  holds.SetWake(0, [&] { ++wakes; });
  holds.Hold(Held(0, 0));
  holds.Hold(Held(1, 0, true));
  holds.Release([](const Holds::Command& c) -> std::optional<Status> {
    return c.write ? Status::DeadlineExceeded("fenced") : Status::OK();
  });
  EXPECT_EQ(wakes, 2);
  EXPECT_EQ(holds.held(), 0u);
  std::vector<Holds::Released> taken = holds.Take(0);
  ASSERT_EQ(taken.size(), 2u);
  EXPECT_EQ(taken[0].cmd, &commands[0]);
  EXPECT_TRUE(taken[0].status.ok());
  EXPECT_EQ(taken[1].cmd, &commands[1]);
  EXPECT_EQ(taken[1].status.code(), Status::Code::kDeadlineExceeded);
  EXPECT_TRUE(holds.Take(0).empty());
}

TEST(Holds, ACommandNotReleasedStaysHeldAndCountsOnItsSlot) {
  Holds holds;
  holds.AddSlot();
  holds.AddSlot();
  holds.Hold(Held(0, 0));
  holds.Hold(Held(1, 1));
  holds.Hold(Held(2, 1));
  holds.Release([](const Holds::Command& c) -> std::optional<Status> {
    if (c.cmd == &commands[1]) return Status::OK();
    return std::nullopt;
  });
  EXPECT_EQ(holds.held(), 2u);
  EXPECT_EQ(holds.held(0), 1u);
  EXPECT_EQ(holds.held(1), 1u);
  std::vector<const void*> order;
  holds.Release([&](const Holds::Command& c) -> std::optional<Status> {
    order.push_back(c.cmd);
    return std::nullopt;
  });
  EXPECT_EQ(order, (std::vector<const void*>{&commands[0], &commands[2]}));
}

TEST(Holds, DroppingASlotReturnsItsHeldCommandsAndForgetsItsReleasedOnes) {
  Holds holds;
  holds.AddSlot();
  holds.AddSlot();
  int wakes = 0;
  holds.SetWake(0, [&] { ++wakes; });
  holds.Hold(Held(0, 0));
  holds.Hold(Held(1, 1));
  holds.Hold(Held(2, 0, true));
  holds.Release([](const Holds::Command& c) -> std::optional<Status> {
    if (c.cmd == &commands[0]) return Status::OK();
    return std::nullopt;
  });
  std::vector<Holds::Command> dropped = holds.Drop(0);
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].cmd, &commands[2]);
  EXPECT_EQ(holds.held(0), 0u);
  EXPECT_EQ(holds.held(), 1u);
  EXPECT_TRUE(holds.Take(0).empty());
  holds.Hold(Held(3, 0));
  holds.Release([](const Holds::Command&) -> std::optional<Status> { return Status::OK(); });
  EXPECT_EQ(wakes, 1);  // its wake went with it
}

}  // namespace
}  // namespace blkps::server
