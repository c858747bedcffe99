// LearnerClocks: iteration clocks from writes, and the async/bsp/ssp gates.
#include "learner_clocks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

namespace blkps::server {
namespace {

ConsistencyOptions Bsp() { return {ConsistencyMode::kBsp, 0}; }
ConsistencyOptions Ssp(uint32_t s) { return {ConsistencyMode::kSsp, s}; }
ConsistencyOptions Async() { return {ConsistencyMode::kAsync, 0}; }

TEST(ParseConsistency, KnowsTheModes) {
  ConsistencyOptions o;
  ASSERT_TRUE(ParseConsistency("ssp:4", &o).ok());
  EXPECT_EQ(o.mode, ConsistencyMode::kSsp);
  EXPECT_EQ(o.staleness, 4u);
  EXPECT_EQ(FormatConsistency(o), "ssp:4");
  ASSERT_TRUE(ParseConsistency("bsp", &o).ok());
  EXPECT_EQ(FormatConsistency(o), "bsp");
  for (const char* bad : {"", "ssp", "ssp:", "ssp:x", "ssp:-1", "ssp:1x", "BSP", "sync"}) {
    Status s = ParseConsistency(bad, &o);
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.message().rfind("mode:", 0), 0u) << s.message();
  }
}

TEST(LearnerClocks, ClockTicksWhenTheWholeBlockIsWrittenInAnyPieces) {
  LearnerClocks c(Async(), {10, 4});
  c.AddLearner();
  EXPECT_FALSE(c.AddGradient(0, 0, 3));
  EXPECT_FALSE(c.AddGradient(0, 0, 6));
  EXPECT_TRUE(c.AddGradient(0, 0, 1));
  EXPECT_EQ(c.clock(0, 0), 1u);
  EXPECT_EQ(c.iteration(0), 0u);  // block 1 not yet written
  EXPECT_TRUE(c.AddGradient(0, 1, 4));
  EXPECT_EQ(c.iteration(0), 1u);
  EXPECT_EQ(c.version(0), 1u);
}

TEST(LearnerClocks, BspReadWaitsForAllLiveLearners) {
  LearnerClocks c(Bsp(), {4});
  c.AddLearner();
  c.AddLearner();
  EXPECT_TRUE(c.ReadMayPass(0, 0, 0));
  ASSERT_TRUE(c.AddGradient(0, 0, 4));
  EXPECT_FALSE(c.ReadMayPass(0, 0, 0));  // learner 1 has not given iteration 0
  EXPECT_FALSE(c.RoundComplete(0));
  EXPECT_FALSE(c.WriteMayPass(0, 0, 0));  // a second gradient before reading waits
  ASSERT_TRUE(c.AddGradient(1, 0, 4));
  ASSERT_TRUE(c.RoundComplete(0));
  EXPECT_EQ(c.FinishRound(0), 2u);
  EXPECT_TRUE(c.ReadMayPass(0, 0, 0));
  EXPECT_TRUE(c.ReadMayPass(1, 0, 0));
  EXPECT_TRUE(c.WriteMayPass(0, 0, 0));
  EXPECT_EQ(c.version(0), 1u);
}

TEST(LearnerClocks, BspGoesOnWithoutADeadLearnerAndRejoinsItAtTheCurrentRound) {
  LearnerClocks c(Bsp(), {4});
  for (int i = 0; i < 3; ++i) c.AddLearner();
  c.AddGradient(0, 0, 4);
  c.AddGradient(1, 0, 4);
  EXPECT_FALSE(c.RoundComplete(0));
  c.MarkDead(2);
  ASSERT_TRUE(c.RoundComplete(0));
  EXPECT_EQ(c.FinishRound(0), 2u);  // the average of the two given
  c.Rejoin(2);
  EXPECT_EQ(c.clock(2, 0), 1u);
  EXPECT_TRUE(c.ReadMayPass(2, 0, 0));
  c.AddGradient(0, 0, 4);
  c.AddGradient(1, 0, 4);
  EXPECT_FALSE(c.RoundComplete(0));  // waits for the rejoined learner again
  c.AddGradient(2, 0, 4);
  EXPECT_TRUE(c.RoundComplete(0));
}

TEST(LearnerClocks, SspReadWaitsOnlyBeyondTheBound) {
  LearnerClocks c(Ssp(1), {4});
  c.AddLearner();
  c.AddLearner();
  c.AddGradient(0, 0, 4);
  EXPECT_TRUE(c.ReadMayPass(0, 0, 0));  // 1 ahead
  c.AddGradient(0, 0, 4);
  EXPECT_FALSE(c.ReadMayPass(0, 0, 0));  // 2 ahead
  EXPECT_EQ(c.Lead(0, 0), 2u);
  EXPECT_TRUE(c.ReadMayPass(1, 0, 0));
  c.MarkDead(1);
  EXPECT_TRUE(c.ReadMayPass(0, 0, 0));  // the dead do not hold anyone back
  c.Rejoin(1);
  EXPECT_EQ(c.clock(1, 0), 2u);
}

TEST(LearnerClocks, AsyncNeverWaits) {
  LearnerClocks c(Async(), {4});
  c.AddLearner();
  c.AddLearner();
  for (int i = 0; i < 100; ++i) c.AddGradient(0, 0, 4);
  EXPECT_TRUE(c.ReadMayPass(0, 0, 0));
  EXPECT_TRUE(c.WriteMayPass(0, 0, 0));
  EXPECT_EQ(c.Lead(0, 0), 100u);
}

// Random schedules: at each step a random learner tries its next action
// (read, then write its whole gradient in random pieces). A read that may not
// pass waits. At every read that passes, the reader is at most s iterations
// ahead of every live learner.
TEST(LearnerClocks, SspNeverLetsAReaderRunMoreThanSAhead) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const uint32_t s = trial % 4;
    const size_t learners = 2 + trial % 4;
    LearnerClocks c(Ssp(s), {8, 8, 5});
    for (size_t l = 0; l < learners; ++l) c.AddLearner();
    std::vector<bool> has_read(learners, false);
    std::vector<uint64_t> iteration(learners, 0);
    for (int step = 0; step < 400; ++step) {
      const size_t l = rng() % learners;
      if (!has_read[l]) {
        if (!c.ReadMayPass(l, 0, 2)) continue;
        for (size_t k = 0; k < learners; ++k) ASSERT_LE(iteration[l], iteration[k] + s) << "trial " << trial;
        has_read[l] = true;
      } else {
        for (uint64_t b = 0; b < 3; ++b) {
          const uint64_t size = b == 2 ? 5 : 8, cut = rng() % (size + 1);
          c.AddGradient(l, b, cut);
          c.AddGradient(l, b, size - cut);
        }
        ++iteration[l];
        has_read[l] = false;
      }
    }
  }
}

TEST(LearnerClocks, SaveAndRestoreRoundTrip) {
  LearnerClocks a(Bsp(), {4, 4});
  a.AddLearner();
  a.AddLearner();
  a.AddGradient(0, 0, 4);
  a.AddGradient(1, 0, 2);
  a.MarkDead(1);
  LearnerClocks b(Bsp(), {4, 4});
  ASSERT_TRUE(b.Restore(a.Save()).ok());
  EXPECT_EQ(b.Save(), a.Save());
  EXPECT_EQ(b.num_learners(), 2u);
  EXPECT_FALSE(b.live(1));
  LearnerClocks other(Bsp(), {4, 4, 4});
  EXPECT_FALSE(other.Restore(a.Save()).ok());
}

TEST(ParseGradientParts, TakesFirstCountAndParts) {
  GradientParts p;
  ASSERT_TRUE(ParseGradientParts("1024:2048:2", &p).ok());
  EXPECT_EQ(p.first, 1024u);
  EXPECT_EQ(p.count, 2048u);
  EXPECT_EQ(p.k, 2u);
  for (const char* bad : {"", "0:16", "0:16:1", "0:16:17", "0:0:2", "a:16:2", "0:16:2:", "-1:16:2", " 0:16:2",
                          "0:16:2x", "18446744073709551615:1:2"}) {
    Status s = ParseGradientParts(bad, &p);
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.message().rfind("parts: ", 0), 0u) << s.message();
  }
}

TEST(CheckGradientParts, WantsBspOneServerAndWholeBlocks) {
  const GradientParts blocks_1_and_2{16, 32, 2};
  EXPECT_TRUE(CheckGradientParts({}, Async(), 100, 16, 4).ok());  // none: anything goes
  EXPECT_TRUE(CheckGradientParts(blocks_1_and_2, Bsp(), 100, 16, 1).ok());
  EXPECT_TRUE(CheckGradientParts({96, 4, 2}, Bsp(), 100, 16, 1).ok());  // the short last block
  const Status ssp = CheckGradientParts(blocks_1_and_2, Ssp(1), 100, 16, 1);
  EXPECT_EQ(ssp.message().rfind("parts: only with mode=bsp (ssp:1 ", 0), 0u) << ssp.message();
  const Status sharded = CheckGradientParts(blocks_1_and_2, Bsp(), 100, 16, 2);
  EXPECT_EQ(sharded.message().rfind("parts: not yet for a scaled-out model", 0), 0u) << sharded.message();
  const Status ragged = CheckGradientParts({10, 20, 2}, Bsp(), 100, 16, 1);
  EXPECT_EQ(ragged.message(),
            "parts: 10:20:2 does not start and end at model blocks of 16 parameters inside the 100 of the model; "
            "e.g. parts=0:32:2");
  EXPECT_FALSE(CheckGradientParts({96, 8, 2}, Bsp(), 100, 16, 1).ok());  // past the model's end
}

// Blocks 0 and 1 of {4, 4, 4} take two parts; block 2 one.
// A backup takes each block's clocks from its primary's records: the
// blocks restored one by one equal the whole, a round half given included,
// and clocks for another number of learners are refused.
TEST(LearnerClocks, BlocksSavedAndRestoredOneByOneEqualTheWhole) {
  LearnerClocks primary(Bsp(), {4, 4, 2});
  primary.AddLearner();
  primary.AddLearner();
  for (uint64_t b = 0; b < 3; ++b) primary.AddGradient(0, b, b == 2 ? 2 : 4);
  for (uint64_t b = 0; b < 3; ++b) primary.AddGradient(1, b, b == 2 ? 2 : 4);
  for (uint64_t b = 0; b < 3; ++b) {
    if (primary.RoundComplete(b)) primary.FinishRound(b);
  }
  primary.AddGradient(0, 1, 4);  // block 1's next round, half given
  primary.AddGradient(1, 2, 1);  // and a partial gradient
  LearnerClocks backup(Bsp(), {4, 4, 2});
  backup.AddLearner();
  backup.AddLearner();
  for (uint64_t b = 0; b < 3; ++b) ASSERT_TRUE(backup.RestoreBlock(b, primary.SaveBlock(b)).ok());
  EXPECT_EQ(backup.Save(), primary.Save());
  LearnerClocks other(Bsp(), {4, 4, 2});
  other.AddLearner();
  EXPECT_FALSE(other.RestoreBlock(0, primary.SaveBlock(0)).ok());
}

TEST(LearnerClocks, BspBlockInPartsTicksAtItsLastPartOnly) {
  LearnerClocks c(Bsp(), {4, 4, 4}, GradientParts{0, 8, 2});
  c.AddLearner();
  c.AddLearner();
  EXPECT_FALSE(c.AddGradient(0, 0, 4));   // part 1
  EXPECT_TRUE(c.WriteMayPass(0, 0, 0));   // part 2 may come in this round
  EXPECT_TRUE(c.ReadMayPass(0, 0, 0));    // and it may read this round's weights between
  EXPECT_TRUE(c.AddGradient(0, 0, 4));    // part 2: its gradient is complete
  EXPECT_FALSE(c.WriteMayPass(0, 0, 0));  // a third part waits for the round
  EXPECT_TRUE(c.AddGradient(0, 2, 4));    // block 2: one write, as ever
  EXPECT_FALSE(c.WriteMayPass(0, 2, 2));
  EXPECT_FALSE(c.AddGradient(1, 0, 3));  // learner 1: its parts in other pieces
  EXPECT_FALSE(c.AddGradient(1, 0, 3));
  EXPECT_FALSE(c.RoundComplete(0));  // learner 1 has given one part and a half
  EXPECT_TRUE(c.AddGradient(1, 0, 2));
  ASSERT_TRUE(c.RoundComplete(0));
  EXPECT_EQ(c.FinishRound(0), 2u);  // two learners' gradients: the average over 2
  EXPECT_EQ(c.clock(0, 0), 1u);
  EXPECT_EQ(c.clock(1, 0), 1u);
}

}  // namespace
}  // namespace blkps::server
