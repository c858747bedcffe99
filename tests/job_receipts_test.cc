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
#include "temp_dir.h"

namespace blkps::server {
namespace {

using blkps_test::TempDir;

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

// fence=<lun>:<session> ends that session of the fencing initiator's name:
// its writes are refused from then on (a late one tgtd read after the
// fence), nothing applied or counted; the name's other sessions, and the
// same session token under another name, go on.
TEST(JobReceipts, AFenceEndsTheSessionItNamesOnly) {
  std::shared_ptr<Job> job;
  ASSERT_TRUE(Job::Create("m", SumOptions("async"), nullptr, &job).ok());
  const size_t slot = job->AddLearner(1, [] {});
  const std::vector<float> ones(128, 1.0f);
  const auto write = [&](const Initiator& initiator) {
    int cmd = 0;
    job->Admit(slot, true, 0, 512, &cmd, initiator.name);
    return job->Write(slot, 0, ones.data(), 512, initiator);
  };
  ASSERT_TRUE(write({"iqn.a", 0xa1}).ok());
  ASSERT_TRUE(job->Control("fence=1:00000000000000a1\n", {"iqn.a", 0xa2}).ok());
  const Status late = write({"iqn.a", 0xa1});
  EXPECT_EQ(late.code(), Status::Code::kDeadlineExceeded) << late.message();
  EXPECT_TRUE(write({"iqn.a", 0xa2}).ok());
  EXPECT_TRUE(write({"iqn.b", 0xa1}).ok());
  EXPECT_TRUE(write({"iqn.a", 0}).ok());  // no session token: nothing to end
  Job::ReceiptNumbers n;
  EXPECT_EQ(Receipt(*job, 1, "iqn.a", &n)[0], 3u);
  EXPECT_EQ(n.writes_in_progress, 0u);
  EXPECT_FALSE(job->Control("fence=1:a1\n", {"iqn.a", 0xa2}).ok());
  EXPECT_FALSE(job->Control("fence=1:00000000000000A1\n", {"iqn.a", 0xa2}).ok());
}

TEST(JobReceipts, ACheckpointHoldsTheReceiptsOfItsGradients) {
  const TempDir scratch("blkps-receipts-test");
  const std::string& dir = scratch.path;
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
}

// Each slot keeps the receipts of its kReceiptsPerSlot most recently active
// initiators (a read counts as activity); a receipt with a write in progress
// is never dropped; a checkpoint carries the kept ones in their order of use.
TEST(JobReceipts, EachSlotKeepsItsMostRecentlyUsedReceipts) {
  const TempDir scratch("blkps-receipts-test");
  const std::string& dir = scratch.path;
  JobOptions o = SumOptions("async");
  o.checkpoint = dir + "/model.ckpt";
  auto writes_applied = [](const Job& job, uint64_t lun, const std::string& initiator) {
    Job::ReceiptNumbers n;
    Receipt(job, lun, initiator, &n);
    return n.writes_applied;
  };
  constexpr size_t kKeep = Job::kReceiptsPerSlot;
  {
    std::shared_ptr<Job> job;
    ASSERT_TRUE(Job::Create("m", o, nullptr, &job).ok());
    const size_t slot = job->AddLearner(1, [] {});
    const size_t other = job->AddLearner(2, [] {});
    ASSERT_TRUE(WriteOnes(*job, slot, 0, 512, "iqn.reader").ok());
    int busy_cmd = 0;  // admitted, still running
    ASSERT_EQ(job->Admit(slot, true, 512, 512, &busy_cmd, "iqn.busy"), Job::Admission::kRun);
    ASSERT_TRUE(WriteOnes(*job, other, 0, 512, "iqn.other").ok());
    for (size_t k = 0; k < kKeep; ++k) {
      ASSERT_TRUE(WriteOnes(*job, slot, 0, 512, "iqn." + std::to_string(k)).ok());
      int cmd = 0;  // iqn.reader keeps pulling
      ASSERT_EQ(job->Admit(slot, false, 0, 512, &cmd, "iqn.reader"), Job::Admission::kRun);
    }
    // kKeep + 2 initiators used slot 1: the two least recently used without a
    // write in progress, iqn.0 and iqn.1, are dropped.
    EXPECT_EQ(writes_applied(*job, 1, "iqn.reader"), 1u);
    for (size_t k = 0; k < kKeep; ++k) EXPECT_EQ(writes_applied(*job, 1, "iqn." + std::to_string(k)), k < 2 ? 0u : 1u);
    Job::ReceiptNumbers busy;
    Receipt(*job, 1, "iqn.busy", &busy);
    EXPECT_EQ(busy.writes_in_progress, 1u);
    EXPECT_EQ(writes_applied(*job, 2, "iqn.other"), 1u);  // another slot's receipts are not counted
    ASSERT_TRUE(job->Write(slot, 512, std::vector<float>(128, 1.0f).data(), 512, "iqn.busy").ok());
    ASSERT_TRUE(job->Checkpoint().ok());
  }
  std::shared_ptr<Job> job;
  ASSERT_TRUE(Job::Create("m", o, nullptr, &job).ok());
  const size_t slot = job->AddLearner(1, [] {});
  job->AddLearner(2, [] {});
  EXPECT_EQ(writes_applied(*job, 1, "iqn.busy"), 1u);
  EXPECT_EQ(writes_applied(*job, 1, "iqn.reader"), 1u);
  EXPECT_EQ(writes_applied(*job, 1, "iqn.0"), 0u);
  EXPECT_EQ(writes_applied(*job, 2, "iqn.other"), 1u);
  // The order of use came back too: a new initiator drops the least recently
  // used, iqn.2 (iqn.busy's write ended last).
  ASSERT_TRUE(WriteOnes(*job, slot, 0, 512, "iqn.new").ok());
  EXPECT_EQ(writes_applied(*job, 1, "iqn.2"), 0u);
  EXPECT_EQ(writes_applied(*job, 1, "iqn.3"), 1u);
  EXPECT_EQ(writes_applied(*job, 1, "iqn.busy"), 1u);
}

}  // namespace
}  // namespace blkps::server
