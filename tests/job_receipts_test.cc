// Job receipts (job.h, "Receipts"): what the server counts of each
// initiator's writes, how a fence ends held writes, and that receipts
// survive a checkpoint with the gradients they count. Without tgt.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "job.h"

namespace blkps::server {
namespace {

constexpr uint64_t kParams = 1024;  // 4 KiB: 8 receipt units

JobOptions SumOptions(const std::string& mode) {
  JobOptions o;
  o.model.num_params = kParams;
  o.model.block_bytes = 1024;
  o.model.rule.name = "sum";
  EXPECT_TRUE(ParseConsistency(mode, &o.consistency).ok());
  return o;
}

// Admits and writes `bytes` of +1 gradients at `offset` as `initiator`.
Status WriteOnes(Job& job, size_t slot, uint64_t offset, uint64_t bytes, const std::string& initiator) {
  const std::vector<float> ones(bytes / 4, 1.0f);
  int cmd = 0;
  EXPECT_EQ(job.Admit(slot, true, offset, bytes, &cmd, initiator), Job::Admission::kRun);
  return job.Write(slot, offset, ones.data(), bytes, initiator);
}

std::vector<uint32_t> Receipt(const Job& job, uint64_t lun, const std::string& initiator,
                              Job::ReceiptNumbers* numbers = nullptr) {
  std::vector<uint32_t> counts(kParams * 4 / Job::kReceiptUnit);
  const Job::ReceiptNumbers n = job.GetReceipt(lun, initiator, 0, &counts);
  if (numbers) *numbers = n;
  return counts;
}

TEST(JobReceipts, CountAppliedWritesByStartUnitAndInitiator) {
  std::shared_ptr<Job> job;
  ASSERT_TRUE(Job::Create("m", SumOptions("async"), nullptr, &job).ok());
  const size_t slot = job->AddLearner(3, [] {});
  ASSERT_TRUE(WriteOnes(*job, slot, 0, 1024, "iqn.a").ok());
  ASSERT_TRUE(WriteOnes(*job, slot, 0, 1024, "iqn.a").ok());
  ASSERT_TRUE(WriteOnes(*job, slot, 1536, 512, "iqn.a").ok());
  ASSERT_TRUE(WriteOnes(*job, slot, 1024, 512, "iqn.b").ok());
  // A NaN gradient is refused: not applied, not counted.
  std::vector<float> nan(128, std::nanf(""));
  int cmd = 0;
  job->Admit(slot, true, 2048, 512, &cmd, "iqn.a");
  EXPECT_FALSE(job->Write(slot, 2048, nan.data(), 512, "iqn.a").ok());

  Job::ReceiptNumbers a;
  EXPECT_EQ(Receipt(*job, 3, "iqn.a", &a), (std::vector<uint32_t>{2, 0, 0, 1, 0, 0, 0, 0}));
  EXPECT_EQ(a.writes_applied, 3u);
  EXPECT_EQ(a.writes_in_progress, 0u);
  EXPECT_EQ(Receipt(*job, 3, "iqn.b"), (std::vector<uint32_t>{0, 0, 1, 0, 0, 0, 0, 0}));
  EXPECT_EQ(Receipt(*job, 4, "iqn.a"), std::vector<uint32_t>(8, 0));  // no learner at LUN 4
}

TEST(JobReceipts, FenceFailsTheInitiatorsHeldWritesOnly) {
  std::shared_ptr<Job> job;
  ASSERT_TRUE(Job::Create("m", SumOptions("bsp"), nullptr, &job).ok());
  const size_t a = job->AddLearner(1, [] {});
  job->AddLearner(2, [] {});
  // a gives its round-0 gradient; a second write of a waits for the round.
  ASSERT_TRUE(WriteOnes(*job, a, 0, 4096, "iqn.a").ok());
  int held = 0;
  ASSERT_EQ(job->Admit(a, true, 0, 4096, &held, "iqn.a"), Job::Admission::kHold);
  Job::ReceiptNumbers n;
  Receipt(*job, 1, "iqn.a", &n);
  EXPECT_EQ(n.writes_in_progress, 1u);

  ASSERT_TRUE(job->Control("fence=1\n", "iqn.other").ok());  // another initiator's fence
  EXPECT_TRUE(job->TakeReleased(a).empty());
  ASSERT_TRUE(job->Control("fence=1\n", "iqn.a").ok());
  const std::vector<Job::Released> released = job->TakeReleased(a);
  ASSERT_EQ(released.size(), 1u);
  EXPECT_EQ(released[0].cmd, &held);
  EXPECT_FALSE(released[0].status.ok());
  EXPECT_EQ(Receipt(*job, 1, "iqn.a", &n), (std::vector<uint32_t>{1, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(n.writes_in_progress, 0u);
  EXPECT_FALSE(job->Control("fence=x\n", "iqn.a").ok());
}

TEST(JobReceipts, ACheckpointHoldsTheReceiptsOfItsGradients) {
  char tmpl[] = "/tmp/blkps-receipts-test-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  JobOptions o = SumOptions("async");
  o.checkpoint = dir + "/model.ckpt";
  {
    std::shared_ptr<Job> job;
    ASSERT_TRUE(Job::Create("m", o, nullptr, &job).ok());
    const size_t slot = job->AddLearner(1, [] {});
    ASSERT_TRUE(WriteOnes(*job, slot, 512, 512, "iqn.a").ok());
    ASSERT_TRUE(job->Checkpoint().ok());
    ASSERT_TRUE(WriteOnes(*job, slot, 512, 512, "iqn.a").ok());  // after it: lost with the job
  }
  std::shared_ptr<Job> job;
  ASSERT_TRUE(Job::Create("m", o, nullptr, &job).ok());
  job->AddLearner(1, [] {});
  Job::ReceiptNumbers n;
  EXPECT_EQ(Receipt(*job, 1, "iqn.a", &n), (std::vector<uint32_t>{0, 1, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(n.writes_applied, 1u);
  std::vector<float> w(kParams);
  ASSERT_TRUE(job->ReadWeights(0, w.data(), kParams * 4).ok());
  EXPECT_EQ(w[128], 1.0f);
  EXPECT_EQ(w[0], 0.0f);
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace blkps::server
