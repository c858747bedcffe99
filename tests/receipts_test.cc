// Receipts: what each initiator's writes to each learner slot have done, as
// a copy of the job's state (a checkpoint, a replica) must hold them.
#include "receipts.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace blkps::server {
namespace {

// Two slots; initiator "a" writes twice at unit 3 and once at unit 9 on slot
// 0, "b" once at unit 3 on slot 1.
Receipts TwoSlotsWithWrites() {
  Receipts r;
  r.AddSlot();
  r.AddSlot();
  for (const auto& [slot, initiator, unit] :
       std::vector<Receipts::Write>{{0, "a", 3}, {0, "a", 3}, {0, "a", 9}, {1, "b", 3}}) {
    ++r.Use(slot, initiator, true)->in_progress;  // admitted
    r.FinishWrite(slot, initiator, unit, true);
  }
  return r;
}

std::vector<uint32_t> CountsFrom(const Receipts& r, size_t slot, const std::string& initiator, uint64_t first_unit,
                                 size_t units) {
  std::vector<uint32_t> counts(units, 0);
  if (const Receipts::Receipt* receipt = r.Find(slot, initiator)) receipt->CopyCounts(first_unit, &counts);
  return counts;
}

TEST(Receipts, ACopyRestoredFromTheSavedWordsShowsEveryInitiatorTheSameReceipt) {
  const Receipts original = TwoSlotsWithWrites();
  Receipts copy;
  copy.AddSlot();
  copy.AddSlot();
  std::vector<size_t> pushed;
  ASSERT_TRUE(copy.Restore(original.Save(), &pushed).ok());
  EXPECT_EQ(pushed, (std::vector<size_t>{0, 1}));
  EXPECT_EQ(CountsFrom(copy, 0, "a", 0, 10), CountsFrom(original, 0, "a", 0, 10));
  EXPECT_EQ(CountsFrom(copy, 1, "b", 0, 10), CountsFrom(original, 1, "b", 0, 10));
  EXPECT_EQ(copy.Find(0, "a")->writes_applied, 3u);
  EXPECT_EQ(copy.Save(), original.Save());
}

TEST(Receipts, SavingWithoutSomeWritesLeavesThemOutOfTheWordsOnly) {
  Receipts r = TwoSlotsWithWrites();
  const std::vector<uint64_t> all = r.Save();
  const std::vector<uint64_t> without = r.SaveWithout({{0, "a", 3}});
  Receipts copy;
  copy.AddSlot();
  copy.AddSlot();
  std::vector<size_t> pushed;
  ASSERT_TRUE(copy.Restore(without, &pushed).ok());
  EXPECT_EQ(CountsFrom(copy, 0, "a", 3, 1), std::vector<uint32_t>{1});
  EXPECT_EQ(copy.Find(0, "a")->writes_applied, 2u);
  EXPECT_EQ(r.Save(), all);  // still counted in memory
}

TEST(Receipts, WordsNamingASlotNotAddedAreRefusedAsMalformed) {
  const Receipts original = TwoSlotsWithWrites();
  Receipts one_slot;
  one_slot.AddSlot();
  std::vector<size_t> pushed;
  const Status s = one_slot.Restore(original.Save(), &pushed);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "its receipts section is malformed");
}

}  // namespace
}  // namespace blkps::server
