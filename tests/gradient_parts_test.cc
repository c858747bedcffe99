// A bsp gradient in parts (doc/server.md "A gradient in parts"): blocks in
// the parts= range take each learner's gradient in K writes a round, applied
// once, as the average of the learners' sums of parts. Through the Job,
// without tgt (tests/fault_test.cc drives the same through a real tgtd with
// cut connections).
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "job.h"

namespace blkps::server {
namespace {

// 48 parameters in blocks of 16: blocks 0 and 1 (the range [0, 32), "the
// tied weight") take two parts a round; block 2 one write.
constexpr uint64_t kParams = 48;
constexpr uint64_t kTied = 32;

JobOptions PartsOptions(const std::string& mode) {
  JobOptions o;
  o.model.num_params = kParams;
  o.model.block_bytes = 64;
  o.model.rule.lr = 1.0f;  // sgd: w -= the round's average
  EXPECT_TRUE(ParseConsistency(mode, &o.consistency).ok());
  o.parts = GradientParts{0, kTied, 2};
  return o;
}

// Admits and applies `g` at parameter `first` from `slot` as `initiator`.
void Give(Job& job, size_t slot, uint64_t first, const std::vector<float>& g, const std::string& initiator = "") {
  ASSERT_EQ(job.Admit(slot, true, first * 4, g.size() * 4, nullptr, initiator), Job::Admission::kRun);
  ASSERT_TRUE(job.Write(slot, first * 4, g.data(), g.size() * 4, initiator).ok());
}

std::vector<float> Weights(const Job& job) {
  std::vector<float> w(kParams);
  EXPECT_TRUE(job.ReadWeights(0, w.data(), kParams * 4).ok());
  return w;
}

// Whether `slot`'s released commands are exactly `cmd`, to run now. Rounds
// complete inside the write that completes them: what they release is on
// the released list when that write returns.
bool ReleasedToRun(Job& job, size_t slot, const void* cmd) {
  const std::vector<Job::Released> released = job.TakeReleased(slot);
  return released.size() == 1 && released[0].cmd == cmd && released[0].status.ok();
}

// Small integers: every sum and average below is exact in float32.
std::vector<float> Gradient(std::mt19937& rng, uint64_t n) {
  std::vector<float> g(n);
  for (float& x : g) x = static_cast<float>(static_cast<int>(rng() % 17) - 8);
  return g;
}

// A bsp job of PartsOptions with learners a (LUN 1) and b (LUN 2).
class GradientParts : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(Job::Create("m", PartsOptions("bsp"), nullptr, &job_).ok());
    a = job_->AddLearner(1, [] {});
    b = job_->AddLearner(2, [] {});
  }
  std::shared_ptr<Job> job_;
  Job& job() { return *job_; }
  size_t a = 0, b = 0;
  const std::vector<float> ones = std::vector<float>(kTied, 1.0f);
};

// The status names the range and the parts, as parts= reads them, so that a
// learner or an operator can read them back (doc/server.md "Status and control").
TEST_F(GradientParts, AreNamedInTheStatus) {
  EXPECT_NE(job().StatusJson().find("\"parts\": \"0:32:2\""), std::string::npos) << job().StatusJson();
}

// Each learner gives the tied range twice (the head's part, then the rows'
// part) and the rest once, interleaved with the other learner's; the round
// is applied once, when the last part arrives, as the one-process step on
// the average of the learners' summed parts.
TEST_F(GradientParts, TwoPartsFromEachOfTwoLearnersGiveTheRoundsAverageOnce) {
  std::vector<float> reference(kParams, 0.0f);
  std::mt19937 rng(37);
  for (int round = 0; round < 3; ++round) {
    std::vector<float> head[2], rows[2], rest[2];
    for (int l = 0; l < 2; ++l) {
      head[l] = Gradient(rng, kTied);
      rows[l] = Gradient(rng, kTied);
      rest[l] = Gradient(rng, kParams - kTied);
    }
    const std::vector<float> before = reference;
    for (uint64_t i = 0; i < kParams; ++i) {
      reference[i] -= i < kTied ? (head[0][i] + rows[0][i] + head[1][i] + rows[1][i]) / 2.0f
                                : (rest[0][i - kTied] + rest[1][i - kTied]) / 2.0f;
    }
    Give(job(), a, 0, head[0]);
    Give(job(), b, 0, head[1]);
    Give(job(), b, kTied, rest[1]);
    Give(job(), a, kTied, rest[0]);
    Give(job(), b, 0, rows[1]);
    std::vector<float> tied_waits = Weights(job());
    EXPECT_EQ(std::vector<float>(tied_waits.begin(), tied_waits.begin() + kTied),
              std::vector<float>(before.begin(), before.begin() + kTied))
        << "round " << round << ": applied before learner a's second part";
    Give(job(), a, 0, rows[0]);
    ASSERT_EQ(Weights(job()), reference) << "round " << round;
    for (size_t slot : {a, b}) EXPECT_EQ(job().Admit(slot, false, 0, kParams * 4, nullptr), Job::Admission::kRun);
  }
}

TEST_F(GradientParts, ALearnerGivingOnePartHoldsTheRoundsReaders) {
  Give(job(), a, 0, ones);
  Give(job(), a, 0, ones);
  Give(job(), b, 0, ones);
  int read = 0;
  ASSERT_EQ(job().Admit(a, false, 0, kTied * 4, &read), Job::Admission::kHold);
  EXPECT_TRUE(job().TakeReleased(a).empty());
  Give(job(), b, 0, ones);  // its second part completes the round
  ASSERT_TRUE(ReleasedToRun(job(), a, &read));
  EXPECT_EQ(Weights(job())[0], -2.0f);  // (1 + 1 + 1 + 1) / 2
}

// A (K+1)-th part is the next round's first: it waits for this round, then
// counts towards the next.
TEST_F(GradientParts, AThirdPartWaitsForTheRound) {
  Give(job(), a, 0, ones);
  Give(job(), a, 0, ones);
  int third = 0;
  ASSERT_EQ(job().Admit(a, true, 0, kTied * 4, &third), Job::Admission::kHold);
  Give(job(), b, 0, ones);
  EXPECT_TRUE(job().TakeReleased(a).empty());
  Give(job(), b, 0, ones);
  ASSERT_TRUE(ReleasedToRun(job(), a, &third));
  ASSERT_TRUE(job().Write(a, 0, ones.data(), kTied * 4).ok());
  EXPECT_EQ(Weights(job())[0], -2.0f);  // round 1 only; the third part waits in round 2's sum
  Give(job(), a, 0, ones);
  Give(job(), b, 0, ones);
  Give(job(), b, 0, ones);
  EXPECT_EQ(Weights(job())[0], -4.0f);
}

// A learner that stops after one part is declared dead after dead_after; the
// round then completes with the gradients given, and the part it gave stays
// in the sum (doc/server.md "Learner failure").
TEST_F(GradientParts, ALearnerDeadAfterOnePartLeavesItInTheRound) {
  JobOptions o = PartsOptions("bsp");
  o.dead_after_s = 0.2;
  std::shared_ptr<Job> quick;  // its own job: dead_after 0.2 s
  ASSERT_TRUE(Job::Create("m", o, nullptr, &quick).ok());
  std::mutex mu;
  std::condition_variable cv;
  bool woken = false;
  const size_t first = quick->AddLearner(1, [&] {
    std::lock_guard<std::mutex> lock(mu);
    woken = true;
    cv.notify_all();
  });
  const size_t second = quick->AddLearner(2, [] {});
  Give(*quick, first, 0, ones);
  Give(*quick, first, 0, ones);
  Give(*quick, second, 0, ones);  // then nothing
  int read = 0;
  ASSERT_EQ(quick->Admit(first, false, 0, kTied * 4, &read), Job::Admission::kHold);
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(5), [&] { return woken; }));
  }
  ASSERT_TRUE(ReleasedToRun(*quick, first, &read));
  EXPECT_EQ(Weights(*quick)[0], -3.0f);  // (1 + 1 + 1) over the one learner that gave all its parts
  EXPECT_NE(quick->StatusJson().find("\"state\": \"dead\""), std::string::npos) << quick->StatusJson();
}

// A learner tells its parts apart by its receipt: each part is one more
// write counted at the unit it starts at, so after a reconnect it resends
// only a part the count lacks (doc/libblkps.md "Faults").
TEST_F(GradientParts, EachPartCountsOnceOnTheLearnersReceipt) {
  std::vector<uint32_t> counts(1);
  Give(job(), a, 0, ones, "iqn.a");
  job().GetReceipt(1, "iqn.a", 0, &counts);
  EXPECT_EQ(counts[0], 1u);
  Give(job(), a, 0, ones, "iqn.a");
  const Job::ReceiptNumbers n = job().GetReceipt(1, "iqn.a", 0, &counts);
  EXPECT_EQ(counts[0], 2u);
  EXPECT_EQ(n.writes_applied, 2u);
}

TEST_F(GradientParts, AreRefusedWhereEachWriteIsAStep) {
  for (const char* mode : {"async", "ssp:2"}) {
    std::shared_ptr<Job> refused;
    const Status s = Job::Create("m", PartsOptions(mode), nullptr, &refused);
    EXPECT_EQ(s.message().rfind("parts: only with mode=bsp", 0), 0u) << mode << ": " << s.message();
  }
}

}  // namespace
}  // namespace blkps::server
