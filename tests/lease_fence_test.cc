// A leased primary's fence (aggregator/lease_fence.h, doc/replicas.md
// "Failover by a lease"), through Job's public face: control lease_until=
// and learner writes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <vector>

#include "job.h"

namespace blkps::server {
namespace {

// With checkpoint= `checkpoint` if given.
std::shared_ptr<Job> AsyncJob(const std::string& checkpoint = "") {
  JobOptions o;
  o.model.num_params = 16;
  o.model.block_bytes = 64;
  o.model.rule.lr = 1.0f;
  o.checkpoint = checkpoint;
  EXPECT_TRUE(ParseConsistency("async", &o.consistency).ok());
  std::shared_ptr<Job> job;
  EXPECT_TRUE(Job::Create("m", o, nullptr, &job).ok());
  return job;
}

// One learner's write of 16 ones at offset 0 (Admit, then Write).
Status PushOnes(Job& job, size_t slot) {
  const std::vector<float> g(16, 1.0f);
  EXPECT_EQ(job.Admit(slot, true, 0, g.size() * 4, nullptr), Job::Admission::kRun);
  return job.Write(slot, 0, g.data(), g.size() * 4);
}

std::string LeaseUntil(int64_t from_now_ms) {
  return "lease_until=" + std::to_string(static_cast<int64_t>(LeaseFence::NowMs()) + from_now_ms);
}

std::string StatusLease(Job& job) {
  const std::string s = job.StatusJson();
  const size_t at = s.find("\"lease\": \"");
  return at == std::string::npos ? "(no lease key)" : s.substr(at + 10, s.find('"', at + 10) - at - 10);
}

TEST(LeaseFence, WithoutALeaseWritesAreAcknowledgedAsBefore) {
  std::shared_ptr<Job> job = AsyncJob();
  const size_t slot = job->AddLearner(1, [] {});
  EXPECT_TRUE(PushOnes(*job, slot).ok());
  EXPECT_EQ(StatusLease(*job), "");
}

TEST(LeaseFence, WritesBeforeTheDeadlineAreAcknowledged) {
  std::shared_ptr<Job> job = AsyncJob();
  const size_t slot = job->AddLearner(1, [] {});
  ASSERT_TRUE(job->Control(LeaseUntil(60000)).ok());
  EXPECT_TRUE(PushOnes(*job, slot).ok());
  EXPECT_EQ(StatusLease(*job).rfind("held: ", 0), 0u) << StatusLease(*job);
}

TEST(LeaseFence, WritesPastTheDeadlineAreRefusedWithStandbyAndNotApplied) {
  std::shared_ptr<Job> job = AsyncJob();
  const size_t slot = job->AddLearner(1, [] {});
  ASSERT_TRUE(job->Control(LeaseUntil(-1)).ok());
  Status s = PushOnes(*job, slot);
  EXPECT_EQ(s.code(), Status::Code::kStandby) << s.message();
  EXPECT_EQ(s.message().rfind("lease: lapsed ", 0), 0u) << s.message();
  std::vector<float> w(16);
  ASSERT_TRUE(job->ReadWeights(0, w.data(), w.size() * 4).ok());
  EXPECT_EQ(w, std::vector<float>(16, 0.0f));
  EXPECT_EQ(StatusLease(*job).rfind("lapsed ", 0), 0u) << StatusLease(*job);
}

TEST(LeaseFence, APrimaryPastItsLeaseWritesNoCheckpoint) {
  char folder[] = "/tmp/blkps-lease-fence-test-XXXXXX";
  ASSERT_NE(mkdtemp(folder), nullptr);
  const std::string path = std::string(folder) + "/model.ckpt";
  std::shared_ptr<Job> job = AsyncJob(path);
  ASSERT_NE(job, nullptr);
  ASSERT_TRUE(job->Control(LeaseUntil(-1)).ok());
  Status s = job->Checkpoint();
  EXPECT_EQ(s.code(), Status::Code::kStandby) << s.message();
  EXPECT_EQ(s.message().rfind("lease: lapsed ", 0), 0u) << s.message();
  EXPECT_EQ(access(path.c_str(), F_OK), -1) << "a generation was written past the lease";
  ASSERT_TRUE(job->Control(LeaseUntil(60000)).ok());
  EXPECT_TRUE(job->Checkpoint().ok());
  EXPECT_EQ(access(path.c_str(), F_OK), 0) << "no generation after the renewal";
  std::filesystem::remove_all(folder);
}

TEST(LeaseFence, ARenewalReopensTheFence) {
  std::shared_ptr<Job> job = AsyncJob();
  const size_t slot = job->AddLearner(1, [] {});
  ASSERT_TRUE(job->Control(LeaseUntil(-1)).ok());
  ASSERT_FALSE(PushOnes(*job, slot).ok());
  ASSERT_TRUE(job->Control(LeaseUntil(60000)).ok());
  EXPECT_TRUE(PushOnes(*job, slot).ok());
}

TEST(LeaseFence, AnEarlierDeadlineDoesNotShortenTheLease) {
  std::shared_ptr<Job> job = AsyncJob();
  const size_t slot = job->AddLearner(1, [] {});
  ASSERT_TRUE(job->Control(LeaseUntil(60000)).ok());
  ASSERT_TRUE(job->Control(LeaseUntil(-1)).ok());  // a renewal that arrived late
  EXPECT_TRUE(PushOnes(*job, slot).ok());
}

TEST(LeaseFence, LeaseUntilTakesMillisecondsOnly) {
  std::shared_ptr<Job> job = AsyncJob();
  for (const char* bad : {"lease_until=", "lease_until=0", "lease_until=1.5", "lease_until=-3"}) {
    Status s = job->Control(bad);
    EXPECT_EQ(s.message().rfind("control: lease_until: expected", 0), 0u) << bad << ": " << s.message();
  }
  EXPECT_EQ(StatusLease(*job), "");
}

}  // namespace
}  // namespace blkps::server
