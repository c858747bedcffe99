// A backup's PUSH records (wire/include/blkps/replication.h; Job::
// ApplyReplica): a block's clocks are taken from the newest record that
// carries them, whatever order the records arrive in, and a record whose
// clocks are for another number of learners is refused. Without tgt.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "job.h"
#include "replication.h"

namespace blkps::server {
namespace {

// A standby backup of 2048 parameters in 2 blocks, learners at LUNs 1 and 2.
std::shared_ptr<Job> Backup() {
  JobOptions o;
  o.model.num_params = 2048;
  o.model.block_bytes = 4096;
  o.model.rule.name = "sum";
  o.backup = true;
  std::shared_ptr<Job> job;
  EXPECT_TRUE(Job::Create("m", o, nullptr, &job).ok());
  job->AddLearner(1, [] {});
  job->AddLearner(2, [] {});
  return job;
}

// A record of a write by LUN 1 carrying block 0's clocks: `version` updates
// applied, learner 1 at clock `version`; `learners` learners' words.
std::string RecordWithClocks(uint64_t sequence, uint64_t version, size_t learners = 2) {
  ReplicaPush push(1, "iqn.a", 0);
  std::vector<uint64_t> words{0, 0, version, version, 0};
  for (size_t l = 1; l < learners; ++l) words.insert(words.end(), {0, 0});
  push.AddClocks(0, sequence, words);
  return push.Body();
}

TEST(ReplicaRecords, ABlocksClocksAreTheNewestRecordsWhateverTheOrder) {
  std::shared_ptr<Job> backup = Backup();
  ASSERT_TRUE(backup->ApplyReplica(RecordWithClocks(2, 5)).ok());
  ASSERT_TRUE(backup->ApplyReplica(RecordWithClocks(1, 3)).ok());  // older, after it
  EXPECT_EQ(backup->GetCounters().updates, 5u);
  ASSERT_TRUE(backup->ApplyReplica(RecordWithClocks(3, 6)).ok());
  EXPECT_EQ(backup->GetCounters().updates, 6u);
}

TEST(ReplicaRecords, ClocksForAnotherNumberOfLearnersAreRefused) {
  std::shared_ptr<Job> backup = Backup();
  const Status s = backup->ApplyReplica(RecordWithClocks(1, 5, 1));
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("learners"), std::string::npos) << s.message();
  EXPECT_EQ(backup->GetCounters().updates, 0u);
  std::string cut = RecordWithClocks(1, 5);
  cut.resize(cut.size() - 8);  // its last word missing
  EXPECT_FALSE(backup->ApplyReplica(cut).ok());
  EXPECT_EQ(backup->GetCounters().updates, 0u);
}

}  // namespace
}  // namespace blkps::server
