// Checkpoints that do not stop training (job.h "Checkpoints", model.h
// "Snapshots"; doc/server.md "Checkpoints"): pushes issued while the
// checkpoint writer is paused half-way complete, and the file is the model,
// its state, clocks and receipts exactly as at the checkpoint's instant.
// Without tgt.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <future>
#include <map>
#include <string>
#include <vector>

#include "checkpoint_file.h"
#include "job.h"
#include "model.h"

namespace blkps::server {
namespace {

struct Case {
  const char* name;
  const char* rule;
  const char* mode;
  bool table;
};

// 10 MiB of weights in 1 MiB blocks: the writer reads the weights section
// in three pieces (checkpoint_file.cc's chunks of 4 MiB).
constexpr uint64_t kParams = 10 * 256 * 1024;
constexpr uint64_t kWidth = 64;  // a table's row

JobOptions Options(const Case& c, const std::string& checkpoint) {
  JobOptions o;
  o.model.num_params = kParams;
  o.model.block_bytes = 1 << 20;
  o.model.rule.name = c.rule;
  o.model.init.kind = InitSpec::Kind::kNormal;
  o.model.init.scale = 0.1;
  o.model.init.seed = 7;
  if (c.table) {
    o.model.table = TableShape{kParams / kWidth, kWidth};
    o.staleness_aware = false;
  }
  EXPECT_TRUE(ParseConsistency(c.mode, &o.consistency).ok());
  o.checkpoint = checkpoint;
  o.job_id = "snapshot-test";  // the reference and the file under test: one job
  return o;
}

// A gradient for parameters [first, first + n) that differs by parameter and
// by `round`; in a table, it touches every other row only.
std::vector<float> Gradient(uint64_t first, uint64_t n, int round) {
  std::vector<float> g(n);
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t p = first + i;
    g[i] = ((p / kWidth) % 2 == 0) ? 0.0f : 0.001f * static_cast<float>((p * 7 + round) % 13) - 0.006f;
  }
  return g;
}

Status Push(Job& job, size_t slot, uint64_t first, uint64_t n, int round, const std::string& initiator) {
  const std::vector<float> g = Gradient(first, n, round);
  int cmd = 0;
  EXPECT_EQ(job.Admit(slot, true, first * 4, n * 4, &cmd, initiator), Job::Admission::kRun);
  return job.Write(slot, first * 4, g.data(), n * 4, initiator);
}

struct FileContents {
  std::map<std::string, std::string> meta;
  std::vector<std::pair<std::string, std::vector<char>>> sections;
};

FileContents ReadFile(const std::string& path) {
  FileContents f;
  CheckpointHeader header;
  EXPECT_TRUE(ReadCheckpointHeader(path, &header).ok());
  f.meta = header.meta;
  std::vector<CheckpointDest> dests;
  for (const auto& [name, bytes] : header.sections) f.sections.emplace_back(name, std::vector<char>(bytes));
  for (auto& [name, bytes] : f.sections) dests.push_back({name, bytes.data(), bytes.size()});
  const Status s = ReadCheckpointSections(path, dests);
  EXPECT_TRUE(s.ok()) << s.message();
  return f;
}

class JobSnapshot : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/blkps-checkpoint-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  std::string dir_;
};

TEST_P(JobSnapshot, PushesCompleteAndTheFileIsTheInstant) {
  const Case& c = GetParam();
  const uint64_t half = kParams / 2;
  // The reference: the same pushes before a checkpoint, none during it.
  {
    std::shared_ptr<Job> job;
    ASSERT_TRUE(Job::Create("m", Options(c, dir_ + "/reference.ckpt"), nullptr, &job).ok());
    const size_t slot = job->AddLearner(1, [] {});
    ASSERT_TRUE(Push(*job, slot, 0, kParams, 1, "iqn.a").ok());
    ASSERT_TRUE(Push(*job, slot, half, 1024, 2, "iqn.a").ok());
    ASSERT_TRUE(job->Checkpoint().ok());
  }

  // The same, and the writer pauses before the weights' second piece while
  // pushes go to parts it has written (the first block) and parts it has
  // not (the last block, every other array), by another initiator too.
  std::promise<void> paused, resume;
  std::shared_future<void> resumed = resume.get_future().share();
  bool paused_once = false;
  JobOptions o = Options(c, dir_ + "/model.ckpt");
  o.checkpoint_hook = [&](const std::string& section, uint64_t offset) {
    if (section != "weights" || offset == 0 || paused_once) return;
    paused_once = true;
    paused.set_value();
    resumed.wait();
  };
  std::shared_ptr<Job> job;
  ASSERT_TRUE(Job::Create("m", o, nullptr, &job).ok());
  const size_t slot = job->AddLearner(1, [] {});
  ASSERT_TRUE(Push(*job, slot, 0, kParams, 1, "iqn.a").ok());
  ASSERT_TRUE(Push(*job, slot, half, 1024, 2, "iqn.a").ok());
  std::future<Status> checkpoint = std::async(std::launch::async, [&] { return job->Checkpoint(); });
  paused.get_future().wait();
  std::future<bool> pushes = std::async(std::launch::async, [&] {
    return Push(*job, slot, 0, 4096, 3, "iqn.a").ok() && Push(*job, slot, kParams - 4096, 4096, 4, "iqn.b").ok() &&
           Push(*job, slot, 0, kParams, 5, "iqn.b").ok();
  });
  // Not a timing assertion: a bound on a wait that must end, so that a
  // checkpoint that holds writes fails the test instead of hanging it.
  const bool completed = pushes.wait_for(std::chrono::seconds(120)) == std::future_status::ready;
  resume.set_value();
  ASSERT_TRUE(checkpoint.get().ok());
  ASSERT_TRUE(completed) << "a push waited for the paused checkpoint writer";
  ASSERT_TRUE(pushes.get());

  const FileContents want = ReadFile(dir_ + "/reference.ckpt");
  const FileContents got = ReadFile(dir_ + "/model.ckpt");
  EXPECT_EQ(got.meta, want.meta);
  ASSERT_EQ(got.sections.size(), want.sections.size());
  for (size_t k = 0; k < want.sections.size(); ++k) {
    EXPECT_EQ(got.sections[k].first, want.sections[k].first);
    EXPECT_TRUE(got.sections[k].second == want.sections[k].second) << "section " << want.sections[k].first;
  }

  // The live model has the pushes made during the checkpoint; a restart
  // from the file has neither them nor their receipts.
  std::vector<float> live(4), restarted(4);
  ASSERT_TRUE(job->ReadWeights((kParams - 64) * 4, live.data(), 16).ok());
  job.reset();
  ASSERT_TRUE(Job::Create("m", Options(c, dir_ + "/model.ckpt"), nullptr, &job).ok());
  job->AddLearner(1, [] {});
  ASSERT_TRUE(job->ReadWeights((kParams - 64) * 4, restarted.data(), 16).ok());
  EXPECT_NE(live, restarted);
  std::vector<uint32_t> counts(1);
  EXPECT_EQ(job->GetReceipt(1, "iqn.b", 0, &counts).writes_applied, 0u);
  EXPECT_EQ(job->GetReceipt(1, "iqn.a", 0, &counts).writes_applied, 2u);
  EXPECT_EQ(counts[0], 1u);
}

INSTANTIATE_TEST_SUITE_P(Rules, JobSnapshot,
                         ::testing::Values(Case{"adam_async", "adam", "async", false},
                                           Case{"momentum_bsp", "momentum", "bsp", false},
                                           Case{"adagrad_table", "adagrad", "async", true}),
                         [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// checkpoint_memory=: a snapshot's copies never hold more than the limit.
// A writer pushes to every block while the snapshot has read none; with a
// 2-block limit it copies two blocks and then waits, holding no lock, until
// the reader frees copies. The snapshot is still the instant exactly, and
// every gradient is applied once.
TEST(ModelSnapshot, CopiesStayWithinTheLimit) {
  constexpr uint64_t kBlock = 1 << 20, kBlocks = 10, kN = kBlocks * kBlock / 4;
  ModelOptions o;
  o.num_params = kN;
  o.block_bytes = kBlock;
  o.rule.name = "sum";
  o.init.kind = InitSpec::Kind::kNormal;
  o.init.scale = 0.1;
  o.snapshot_copy_limit_bytes = 2 * kBlock;
  std::unique_ptr<Model> model;
  ASSERT_TRUE(Model::Create(o, &model).ok());
  std::vector<float> instant(kN), g(kN, 0.5f), out(kN), after(kN);
  ASSERT_TRUE(model->Read(0, instant.data(), kN * 4).ok());

  std::unique_ptr<Model::Snapshot> snap = model->TakeSnapshot(nullptr);
  std::future<Status> writer =
      std::async(std::launch::async, [&] { return model->ApplyGradient(0, g.data(), kN * 4); });
  // Not a timing assertion: time for a writer that ignores the limit to copy
  // every block (and fail below); a correct one waits here either way.
  writer.wait_for(std::chrono::seconds(2));
  for (uint64_t b = 0; b < kBlocks; ++b) snap->Read(0, b * kBlock, kBlock, out.data() + b * kBlock / 4);
  ASSERT_TRUE(writer.get().ok());
  EXPECT_LE(snap->peak_bytes_held(), 2 * kBlock);
  EXPECT_GE(snap->bytes_copied(), 2 * kBlock);  // the writer did run ahead of the reader
  snap.reset();

  EXPECT_TRUE(out == instant) << "the snapshot is not the instant";
  ASSERT_TRUE(model->Read(0, after.data(), kN * 4).ok());
  for (uint64_t i = 0; i < kN; ++i) ASSERT_EQ(after[i], instant[i] + 0.5f) << "parameter " << i;
}

// Random initialisation is filled in parallel pieces: the same seed gives
// the same values, and a smaller model's are the first of a larger one's.
TEST(Model, RandomInitialValuesAreAFunctionOfSeedAndIndex) {
  // More than one piece (initializer.cc fills 2^22 parameters a piece), and
  // sizes that end a normal pair half-way.
  const uint64_t n = (uint64_t{1} << 22) + 5;
  for (InitSpec::Kind kind : {InitSpec::Kind::kNormal, InitSpec::Kind::kUniform}) {
    InitSpec spec;
    spec.kind = kind;
    spec.scale = 1;
    spec.seed = 3;
    std::vector<float> a(n), b(n - 3), c(11);
    ASSERT_TRUE(InitializeWeights(spec, a.data(), a.size()).ok());
    ASSERT_TRUE(InitializeWeights(spec, b.data(), b.size()).ok());
    ASSERT_TRUE(InitializeWeights(spec, c.data(), c.size()).ok());
    EXPECT_TRUE(std::equal(b.begin(), b.end(), a.begin()));
    EXPECT_TRUE(std::equal(c.begin(), c.end(), a.begin()));
    double sum2 = 0;
    for (float v : a) sum2 += double(v) * v;
    EXPECT_NEAR(sum2 / n, kind == InitSpec::Kind::kNormal ? 1.0 : 1.0 / 3, 0.01);
  }
}

}  // namespace
}  // namespace blkps::server
