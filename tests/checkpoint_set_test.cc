// Checkpoint sets (aggregator/checkpoint_set.h; doc/server.md "Checkpoints"):
// a scaled-out job's shards write generations whose identity is in every
// file, a generation commits only when every part is durable, and a restart
// loads the committed generation or refuses the set in one line. Two Jobs
// in one process stand for two co-located shards (one tgtd each); without
// tgt.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint_file.h"
#include "checkpoint_set.h"
#include "job.h"
#include "temp_dir.h"

namespace blkps::server {
namespace {

constexpr uint64_t kParams = 1024;

class CheckpointSetTest : public ::testing::Test {
 protected:
  std::string Path() const { return dir_.path + "/model.ckpt"; }

  JobOptions Options(uint32_t shard, const std::string& job = "job-a") const {
    JobOptions o;
    o.model.num_params = kParams;
    o.model.block_bytes = 4096;
    o.model.rule.name = "sum";
    o.checkpoint = Path();
    o.job_id = job;
    o.shard = shard;
    o.shards = 2;
    return o;
  }

  std::shared_ptr<Job> Start(const JobOptions& o, Status* status = nullptr) {
    std::shared_ptr<Job> job;
    Status s = Job::Create("model", o, nullptr, &job);
    if (status != nullptr) *status = s;
    else EXPECT_TRUE(s.ok()) << s.message();
    return job;
  }

  // Both shards of job-a, started (loading what is there).
  void StartBoth() {
    for (uint32_t k = 0; k < 2; ++k) shards_[k] = Start(Options(k));
  }

  // Adds `value` to every weight of shard k.
  void Push(uint32_t k, float value) {
    ASSERT_NE(shards_[k], nullptr) << "shard " << k << " did not start";
    Job& job = *shards_[k];
    const size_t slot = job.AddLearner(1, [] {});
    std::vector<float> g(kParams, value);
    int cmd = 0;
    ASSERT_EQ(job.Admit(slot, true, 0, kParams * 4, &cmd, "learner"), Job::Admission::kRun);
    ASSERT_TRUE(job.Write(slot, 0, g.data(), kParams * 4, "learner").ok());
  }

  // Weight 0 of shard k; NaN (and a failure) if it did not start.
  float Weight(uint32_t k) const {
    float w = std::nanf("");
    if (shards_[k] == nullptr) ADD_FAILURE() << "shard " << k << " did not start";
    else EXPECT_TRUE(shards_[k]->ReadWeights(0, &w, 4).ok());
    return w;
  }

  void CheckpointBoth() {
    for (uint32_t k = 0; k < 2; ++k) {
      ASSERT_NE(shards_[k], nullptr) << "shard " << k << " did not start";
      ASSERT_TRUE(shards_[k]->Checkpoint().ok());
    }
  }

  bool Exists(const std::string& path) const { return ::access(path.c_str(), F_OK) == 0; }

  blkps_test::TempDir dir_{"blkps-checkpoint-set"};
  std::shared_ptr<Job> shards_[2];
};

TEST_F(CheckpointSetTest, AGenerationCommitsOnlyWhenEveryPartIsDurable) {
  StartBoth();
  ASSERT_TRUE(shards_[0]->Checkpoint().ok());
  EXPECT_FALSE(Exists(CheckpointManifestPath(Path())));
  CheckpointSet set;
  EXPECT_EQ(ReadCheckpointSet(Path(), &set).code(), Status::Code::kInvalidArgument);

  ASSERT_TRUE(shards_[1]->Checkpoint().ok());
  ASSERT_TRUE(ReadCheckpointSet(Path(), &set).ok());
  EXPECT_EQ(set.job, "job-a");
  EXPECT_EQ(set.generation, 1u);
  ASSERT_EQ(set.parts.size(), 2u);
  EXPECT_EQ(set.parts[1].file, Path() + ".shard-1.gen-1");
}

TEST_F(CheckpointSetTest, EveryPartCarriesTheJobsIdentity) {
  StartBoth();
  CheckpointBoth();
  CheckpointHeader header;
  ASSERT_TRUE(ReadCheckpointHeader(Path() + ".shard-1.gen-1", &header).ok());
  EXPECT_EQ(header.meta["job"], "job-a");
  EXPECT_EQ(header.meta["generation"], "1");
  EXPECT_EQ(header.meta["shard"], "1");
  EXPECT_EQ(header.meta["shards"], "2");
  EXPECT_EQ(header.meta["step"], "0");
}

TEST_F(CheckpointSetTest, ARestartLoadsTheCommittedGeneration) {
  StartBoth();
  Push(0, 1);
  Push(1, 2);
  CheckpointBoth();
  shards_[0].reset();
  shards_[1].reset();
  StartBoth();
  EXPECT_EQ(Weight(0), 1.0f);
  EXPECT_EQ(Weight(1), 2.0f);
}

TEST_F(CheckpointSetTest, AShardsFailureKeepsThePreviousGenerationTheOneLoaded) {
  StartBoth();
  Push(0, 1);
  Push(1, 1);
  CheckpointBoth();  // generation 1: both at 1
  Push(0, 1);
  Push(1, 1);
  // Shard 1 cannot write generation 2: a folder where its temporary file goes.
  ASSERT_EQ(::mkdir((Path() + ".shard-1.gen-2.tmp").c_str(), 0755), 0);
  ASSERT_TRUE(shards_[0]->Checkpoint().ok());
  EXPECT_FALSE(shards_[1]->Checkpoint().ok());
  shards_[0].reset();
  shards_[1].reset();
  StartBoth();
  EXPECT_EQ(Weight(0), 1.0f);
  EXPECT_EQ(Weight(1), 1.0f);
}

TEST_F(CheckpointSetTest, AnOlderPartSwappedInIsRefusedNamingItAndTheDifference) {
  StartBoth();
  CheckpointBoth();
  Push(1, 1);
  CheckpointBoth();
  shards_[0].reset();
  shards_[1].reset();
  std::filesystem::copy_file(Path() + ".shard-1.gen-1", Path() + ".shard-1.gen-2",
                             std::filesystem::copy_options::overwrite_existing);
  Status s;
  Start(Options(0), &s);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find(Path() + ".shard-1.gen-2"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("mixed: it is generation 1"), std::string::npos) << s.message();
}

TEST_F(CheckpointSetTest, APartOfAnotherJobIsRefusedAsForeign) {
  StartBoth();
  CheckpointBoth();
  shards_[0].reset();
  shards_[1].reset();
  // Another job's shard 1, written over this one's part.
  {
    JobOptions o = Options(1, "job-b");
    o.checkpoint = dir_.path + "/other.ckpt";
    std::shared_ptr<Job> other = Start(o);
    ASSERT_TRUE(other->Checkpoint().ok());
  }
  std::filesystem::copy_file(dir_.path + "/other.ckpt.shard-1.gen-1", Path() + ".shard-1.gen-1",
                             std::filesystem::copy_options::overwrite_existing);
  Status s;
  Start(Options(0), &s);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("foreign: it is of job job-b"), std::string::npos) << s.message();
}

TEST_F(CheckpointSetTest, PartsThatNeverCommittedAreRefusedAsIncomplete) {
  StartBoth();
  ASSERT_TRUE(shards_[0]->Checkpoint().ok());
  shards_[0].reset();
  shards_[1].reset();
  Status s;
  Start(Options(1), &s);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("incomplete"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(Path() + ".shard-0.gen-1"), std::string::npos) << s.message();
}

TEST_F(CheckpointSetTest, AMissingPartOfTheCommittedGenerationIsRefused) {
  StartBoth();
  CheckpointBoth();
  shards_[0].reset();
  shards_[1].reset();
  ASSERT_EQ(::unlink((Path() + ".shard-1.gen-1").c_str()), 0);
  Status s;
  Start(Options(0), &s);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find(Path() + ".shard-1.gen-1, which is missing"), std::string::npos) << s.message();
}

TEST_F(CheckpointSetTest, StrayTemporaryFilesDoNotCount) {
  for (const std::string name : {".shard-0.tmp", ".shard-1.gen-3.tmp"}) {
    FILE* f = std::fopen((Path() + name).c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fclose(f);
  }
  CheckpointSet set;
  EXPECT_EQ(ReadCheckpointSet(Path(), &set).code(), Status::Code::kNotFound);
}

TEST_F(CheckpointSetTest, ServingTheSetWithAnotherShardCountIsRefused) {
  StartBoth();
  CheckpointBoth();
  shards_[0].reset();
  shards_[1].reset();
  JobOptions o = Options(0);
  o.shards = 3;
  Status s;
  Start(o, &s);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("serve it with 2 tgtd(s)"), std::string::npos) << s.message();
}

TEST_F(CheckpointSetTest, ACommitKeepsTheNewestTwoCommittedGenerations) {
  StartBoth();
  for (int g = 0; g < 4; ++g) CheckpointBoth();
  for (uint32_t k = 0; k < 2; ++k) {
    EXPECT_FALSE(Exists(Path() + ".shard-" + std::to_string(k) + ".gen-2"));
    EXPECT_TRUE(Exists(Path() + ".shard-" + std::to_string(k) + ".gen-3"));
    EXPECT_TRUE(Exists(Path() + ".shard-" + std::to_string(k) + ".gen-4"));
  }
}

TEST_F(CheckpointSetTest, FreshStartsANewJobOverAnOldSet) {
  StartBoth();
  Push(0, 5);
  CheckpointBoth();
  shards_[0].reset();
  shards_[1].reset();
  for (uint32_t k = 0; k < 2; ++k) {
    JobOptions o = Options(k, "job-new");
    o.fresh = true;
    shards_[k] = Start(o);
  }
  EXPECT_EQ(Weight(0), 0.0f);
  CheckpointBoth();
  CheckpointSet set;
  ASSERT_TRUE(ReadCheckpointSet(Path(), &set).ok());
  EXPECT_EQ(set.job, "job-new");
  EXPECT_EQ(set.generation, 2u);  // numbered on from the old set's
}

TEST_F(CheckpointSetTest, ACheckpointCommandToEveryShardCommitsAGeneration) {
  StartBoth();
  for (uint32_t k = 0; k < 2; ++k) ASSERT_TRUE(shards_[k]->Control("checkpoint=1").ok());
  CheckpointSet set;
  ASSERT_TRUE(ReadCheckpointSet(Path(), &set).ok());
  EXPECT_EQ(set.generation, 1u);
}

TEST_F(CheckpointSetTest, ACheckpointCommandComesAloneAndFromOperators) {
  StartBoth();
  EXPECT_EQ(shards_[0]->Control("checkpoint=1\nlr=0.5").code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(shards_[0]->Control("checkpoint=1", "learner", Job::ControlRights::kLearner).code(),
            Status::Code::kPermissionDenied);
  EXPECT_FALSE(Exists(Path() + ".shard-0.gen-1"));
}

}  // namespace
}  // namespace blkps::server
