// One round on every shard (aggregator/job.h; doc/server.md "One round on
// every shard"): a scaled-out bsp job's checkpoint parts are taken at one
// round boundary, leave out what was given towards the next round, and a
// set whose parts are at different rounds is neither committed nor loaded;
// an ssp job's parts hold every live learner at one iteration, holding the
// writes past it until the part is written.
// Two Jobs in one process stand for two co-located shards; without tgt.
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint_file.h"
#include "checkpoint_set.h"
#include "job.h"
#include "temp_dir.h"

namespace blkps::server {
namespace {

constexpr uint64_t kParams = 1024;  // one block of 4 KiB

class RoundBoundaryTest : public ::testing::Test {
 protected:
  std::string Path() const { return dir_.path + "/model.ckpt"; }

  JobOptions Options(uint32_t shard) const {
    JobOptions o;
    o.model.num_params = kParams;
    o.model.block_bytes = 4096;
    o.model.rule.name = "sum";
    o.consistency = consistency_;
    o.checkpoint = Path();
    o.job_id = "job-a";
    o.shard = shard;
    o.shards = 2;
    o.hold_limit_s = hold_limit_s_;
    return o;
  }

  // Shard k with learners A (lun 1) and B (lun 2), loading what is there.
  void Start(uint32_t k, Status* status = nullptr) {
    shards_[k].reset();
    Status s = Job::Create("model", Options(k), nullptr, &shards_[k]);
    if (status != nullptr) *status = s;
    else ASSERT_TRUE(s.ok()) << s.message();
    if (!s.ok()) return;
    a_ = shards_[k]->AddLearner(1, [] {});
    b_ = shards_[k]->AddLearner(2, [] {});
  }

  // Learner `slot` pushes `value` to every weight of shard k: one gradient.
  void Push(uint32_t k, size_t slot, float value) {
    std::vector<float> g(kParams, value);
    int cmd = 0;
    const std::string who = "learner-" + std::to_string(slot);
    ASSERT_EQ(shards_[k]->Admit(slot, true, 0, kParams * 4, &cmd, who), Job::Admission::kRun);
    ASSERT_TRUE(shards_[k]->Write(slot, 0, g.data(), kParams * 4, who).ok());
  }

  float Weight(uint32_t k) const {
    float w = -1;
    EXPECT_TRUE(shards_[k]->ReadWeights(0, &w, 4).ok());
    return w;
  }

  uint32_t ReceiptOf(uint32_t k, uint64_t lun, size_t slot) const {
    std::vector<uint32_t> counts(1);
    shards_[k]->GetReceipt(lun, "learner-" + std::to_string(slot), 0, &counts);
    return counts[0];
  }

  std::string MetaOf(const std::string& file, const std::string& key) const {
    CheckpointHeader header;
    EXPECT_TRUE(ReadCheckpointHeader(file, &header).ok()) << file;
    return header.meta[key];
  }

  // Two parts numbered 2, at rounds 1 and 0: shard 1 starts (fresh=1) over a
  // stray part numbered 1, so its round 0 is generation 2, as shard 0's
  // round 1 is (shards not started together from one generation). Returns
  // what shard 1's checkpoint, the last part, says.
  Status WriteTwoPartsAtDifferentRounds() {
    JobOptions o0 = Options(0), o1 = Options(1);
    o0.fresh = o1.fresh = true;
    EXPECT_TRUE(Job::Create("model", o0, nullptr, &shards_[0]).ok());
    { std::ofstream stray(Path() + ".shard-1.gen-1"); }
    EXPECT_TRUE(Job::Create("model", o1, nullptr, &shards_[1]).ok());
    if (!shards_[0] || !shards_[1]) return Status::InvalidArgument("a shard did not start");
    for (uint32_t k = 0; k < 2; ++k) {
      a_ = shards_[k]->AddLearner(1, [] {});
      b_ = shards_[k]->AddLearner(2, [] {});
    }
    Push(0, a_, 1);
    Push(0, b_, 3);
    EXPECT_TRUE(shards_[0]->Checkpoint().ok());  // round 1: generation 2
    return shards_[1]->Checkpoint();             // round 0: generation 2
  }

  // Waits (yielding) until shard k's status shows a checkpoint waiting for
  // `round`, or `returned`.
  void UntilWaiting(uint32_t k, uint64_t round, const std::atomic<bool>& returned) const {
    const std::string waiting = "\"waiting_round\": " + std::to_string(round) + "}";
    while (!returned && shards_[k]->StatusJson().find(waiting) == std::string::npos) std::this_thread::yield();
  }

  ConsistencyOptions consistency_{ConsistencyMode::kBsp, 0};
  double hold_limit_s_ = 20;
  blkps_test::TempDir dir_{"blkps-round-boundary"};
  std::shared_ptr<Job> shards_[2];
  size_t a_ = 0, b_ = 1;
};

TEST_F(RoundBoundaryTest, APartLeavesOutWhatWasGivenTowardsTheNextRound) {
  for (uint32_t k = 0; k < 2; ++k) {
    Start(k);
    Push(k, a_, 1);
    Push(k, b_, 3);  // round 1: the average, 2
  }
  Push(0, b_, 3);  // B is ahead on shard 0 only: towards round 2
  for (uint32_t k = 0; k < 2; ++k) ASSERT_TRUE(shards_[k]->Checkpoint(a_).ok());  // A's fsync
  // Round 1 of a new job is its generation 2 (round 0 would be 1).
  EXPECT_EQ(MetaOf(Path() + ".shard-0.gen-2", "round"), "1");
  EXPECT_EQ(MetaOf(Path() + ".shard-1.gen-2", "round"), "1");

  Start(0);  // shard 0 restarted from the committed generation
  EXPECT_EQ(Weight(0), 2.0f);
  EXPECT_EQ(ReceiptOf(0, 2, b_), 1u) << "B's push towards round 2 is not in the part: a restart reports it lost";
  // Both learners are at round 1 again, as on shard 1: B's next gradient
  // is its gradient for round 2, and the round is theirs alone.
  Push(0, b_, 3);
  Push(0, a_, 1);
  EXPECT_EQ(Weight(0), 4.0f);
}

TEST_F(RoundBoundaryTest, AnFsyncWaitsUntilItsRoundHasFinishedOnTheShard) {
  for (uint32_t k = 0; k < 2; ++k) Start(k);
  Push(0, a_, 1);
  Status fsync;
  std::atomic<bool> returned{false};
  std::thread a_syncs([&] {  // A has given round 1; B has not
    fsync = shards_[0]->Checkpoint(a_);
    returned = true;
  });
  UntilWaiting(0, 1, returned);
  EXPECT_FALSE(returned) << "the fsync returned before its round finished: " << fsync.message();
  Push(0, b_, 3);
  a_syncs.join();
  ASSERT_TRUE(fsync.ok()) << fsync.message();
  EXPECT_EQ(MetaOf(Path() + ".shard-0.gen-2", "round"), "1");
  EXPECT_EQ(MetaOf(Path() + ".shard-0.gen-2", "step"), "1");
}

TEST_F(RoundBoundaryTest, EveryShardGivesARoundTheSameGenerationWhateverElseItWasAsked) {
  for (uint32_t k = 0; k < 2; ++k) Start(k);
  ASSERT_TRUE(shards_[0]->Checkpoint().ok());  // round 0, on shard 0 only
  for (uint32_t k = 0; k < 2; ++k) {
    Push(k, a_, 1);
    Push(k, b_, 3);
  }
  for (uint32_t k = 0; k < 2; ++k) ASSERT_TRUE(shards_[k]->Checkpoint(a_).ok());
  CheckpointSet set;
  ASSERT_TRUE(ReadCheckpointSet(Path(), &set).ok());
  EXPECT_EQ(set.generation, 2u);
  EXPECT_EQ(set.parts[0].round, 1u);
  EXPECT_EQ(set.parts[1].round, 1u);
}

TEST_F(RoundBoundaryTest, PartsAtDifferentRoundsAreNotCommitted) {
  Status s = WriteTwoPartsAtDifferentRounds();
  EXPECT_EQ(s.code(), Status::Code::kIOError);
  EXPECT_NE(s.message().find("shard 0 is at round 1, shard 1 at round 0"), std::string::npos) << s.message();
  CheckpointSet set;
  EXPECT_NE(ReadCheckpointSet(Path(), &set).code(), Status::Code::kOk) << "a generation was committed";
}

TEST_F(RoundBoundaryTest, ASetWhoseShardsAreAtDifferentRoundsIsRefusedAtStart) {
  ASSERT_FALSE(WriteTwoPartsAtDifferentRounds().ok());
  // A manifest that names them anyway (written by hand, or by a blkps
  // before rounds were checked at commit).
  ASSERT_TRUE(WriteCheckpointFile(CheckpointManifestPath(Path()),
                                  {{"format", "blkps-checkpoint-set"},
                                   {"job", "job-a"},
                                   {"generation", "2"},
                                   {"shards", "2"},
                                   {"part.0", "1 model.ckpt.shard-0.gen-2"},
                                   {"round.0", "1"},
                                   {"part.1", "0 model.ckpt.shard-1.gen-2"},
                                   {"round.1", "0"}},
                                  {})
                  .ok());
  Status s;
  Start(0, &s);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("mixed rounds"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("shard 0 is at round 1, shard 1 at round 0"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << "one line";
}

// ssp:2: pushes are applied on arrival and learners run apart.
class SspRoundBoundaryTest : public RoundBoundaryTest {
 protected:
  SspRoundBoundaryTest() { consistency_ = ConsistencyOptions{ConsistencyMode::kSsp, 2}; }
};

TEST_F(SspRoundBoundaryTest, APartHoldsEveryLearnerAtOneIterationAndHoldsTheWritesPastIt) {
  for (uint32_t k = 0; k < 2; ++k) Start(k);
  Push(1, a_, 1);
  Push(1, b_, 3);
  Push(0, a_, 1);  // on shard 0, B has not pushed iteration 1 yet
  Status part;
  std::atomic<bool> returned{false};
  std::thread stop_asks([&] {  // control checkpoint=1: the furthest iteration, 1
    part = shards_[0]->Checkpoint();
    returned = true;
  });
  UntilWaiting(0, 1, returned);
  EXPECT_FALSE(returned) << "the part was taken before B reached iteration 1: " << part.message();
  std::vector<float> next(kParams, 1);
  int cmd = 0;
  EXPECT_EQ(shards_[0]->Admit(a_, true, 0, kParams * 4, &cmd, "learner-0"), Job::Admission::kHold)
      << "A's push towards iteration 2 ran while the part for iteration 1 was not written";
  Push(0, b_, 3);
  stop_asks.join();
  ASSERT_TRUE(part.ok()) << part.message();
  const std::vector<Job::Released> released = shards_[0]->TakeReleased(a_);
  ASSERT_EQ(released.size(), 1u) << "the held push was not released once the part was written";
  EXPECT_TRUE(released[0].status.ok()) << released[0].status.message();
  ASSERT_TRUE(shards_[0]->Write(a_, 0, next.data(), kParams * 4, "learner-0").ok());
  ASSERT_TRUE(shards_[1]->Checkpoint().ok());  // the last part: committed
  EXPECT_EQ(MetaOf(Path() + ".shard-0.gen-2", "round"), "1");

  Start(0);  // from the committed generation
  EXPECT_EQ(Weight(0), 4.0f) << "the part holds A's push towards iteration 2";
  EXPECT_EQ(ReceiptOf(0, 1, a_), 1u) << "A's receipt counts a push the part lacks";
}

TEST_F(SspRoundBoundaryTest, AnFsyncFailsWhenAnotherLearnerHasPushedPastItsIteration) {
  Start(0);
  Push(0, a_, 1);
  Push(0, b_, 3);
  Push(0, b_, 3);  // B runs ahead: iteration 2
  Status s = shards_[0]->Checkpoint(a_);
  EXPECT_EQ(s.code(), Status::Code::kIOError);
  EXPECT_NE(s.message().find("past iteration 1 already (lun 2 towards iteration 2"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << "one line";
}

TEST_F(SspRoundBoundaryTest, AnFsyncFailsAtHoldLimitNamingTheLearnerThatDidNotCatchUp) {
  hold_limit_s_ = 0.2;
  Start(0);
  Push(0, a_, 1);  // B never pushes iteration 1
  Status s = shards_[0]->Checkpoint(a_);
  EXPECT_EQ(s.code(), Status::Code::kIOError);
  EXPECT_NE(s.message().find("iteration 1 did not finish on this shard within hold_limit (learners behind it: lun 2 at "
                             "iteration 0)"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << "one line";
}

TEST_F(SspRoundBoundaryTest, AnFsyncOfAnIterationAlreadyWrittenReturnsOnceItsPartIsDurable) {
  Start(0);
  Push(0, a_, 1);
  Push(0, b_, 3);
  ASSERT_TRUE(shards_[0]->Checkpoint(b_).ok());  // B's fsync after iteration 1
  Push(0, b_, 3);                                // B goes on before A's fsync arrives
  Status s = shards_[0]->Checkpoint(a_);
  EXPECT_TRUE(s.ok()) << s.message();
}

}  // namespace
}  // namespace blkps::server
