// Specification of tables (model.h "Tables", job.h "Tables"): rows made
// when first written, per-row init, per-row rules, async only, checkpoints,
// receipts and status.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "blkps/control_lun.h"
#include "checkpoint_file.h"
#include "job.h"
#include "json_check.h"
#include "lu_options.h"
#include "table_checkpoint.h"
#include "temp_dir.h"

namespace blkps::server {
namespace {

ModelOptions TableOptions(uint64_t rows, uint64_t width, const std::string& rule = "sgd") {
  ModelOptions o;
  o.table = {rows, width};
  o.num_params = rows * width;
  o.block_bytes = TableBlockBytes(width * 4);
  o.rule.name = rule;
  o.rule.lr = 0.5f;
  o.init.kind = InitSpec::Kind::kNormal;
  o.init.scale = 0.1;
  o.init.seed = 11;
  return o;
}

std::unique_ptr<Model> MakeTable(const ModelOptions& o) {
  std::unique_ptr<Model> m;
  Status s = Model::Create(o, &m);
  EXPECT_TRUE(s.ok()) << s.message();
  return m;
}

std::vector<float> ReadRow(const Model& m, uint64_t r) {
  std::vector<float> w(m.table().width);
  Status s = m.Read(r * m.table().row_bytes(), w.data(), w.size() * 4);
  EXPECT_TRUE(s.ok()) << s.message();
  return w;
}

std::vector<float> InitRow(const ModelOptions& o, uint64_t r) {
  std::vector<float> w(o.table.width);
  InitializeRow(o.init, r, w.data(), w.size());
  return w;
}

// A gradient for the whole device: rows not in `rows` are zeros.
std::vector<float> RowGradient(const Model& m, const std::vector<std::pair<uint64_t, std::vector<float>>>& rows) {
  std::vector<float> g(m.size_bytes() / 4, 0.0f);
  for (const auto& [r, values] : rows) std::copy(values.begin(), values.end(), g.begin() + r * m.table().width);
  return g;
}

uint64_t ResidentBytes() {
  std::ifstream in("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

TEST(Table, UnwrittenRowReadsItsSeededInitialValuesAndIsNotMade) {
  const ModelOptions o = TableOptions(100, 16);
  auto m = MakeTable(o);
  const std::vector<float> row = ReadRow(*m, 42);
  EXPECT_EQ(row, InitRow(o, 42));
  EXPECT_EQ(ReadRow(*m, 42), row);  // the same each time
  EXPECT_NE(ReadRow(*m, 43), row);  // and its own
  double sum2 = 0;
  for (uint64_t r = 0; r < 100; ++r) {
    for (float v : ReadRow(*m, r)) sum2 += v * v;
  }
  EXPECT_NEAR(std::sqrt(sum2 / 1600), 0.1, 0.01);  // normal:0.1
  EXPECT_EQ(m->RowsMade(), 0u);
}

TEST(Table, RowInitDependsOnSeedAndRowOnly) {
  ModelOptions o = TableOptions(64, 8);
  auto a = MakeTable(o);
  auto b = MakeTable(o);
  std::vector<float> g = RowGradient(*b, {{3, std::vector<float>(8, 1.0f)}});
  ASSERT_TRUE(b->ApplyGradient(0, g.data(), g.size() * 4).ok());
  EXPECT_EQ(ReadRow(*a, 7), ReadRow(*b, 7));
  o.init.seed = 12;
  EXPECT_NE(ReadRow(*MakeTable(o), 7), ReadRow(*a, 7));
  o.init.kind = InitSpec::Kind::kUniform;
  for (float v : ReadRow(*MakeTable(o), 9)) EXPECT_LE(std::fabs(v), 0.1f);
}

TEST(Table, RowGradientIsAppliedToItsInitialValuesAndMakesOnlyThatRow) {
  const ModelOptions o = TableOptions(40, 32);  // 128-byte rows: 4 in a sector
  auto m = MakeTable(o);
  std::vector<float> grad(32);
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = static_cast<float>(i) - 10.0f;
  // One sector, rows 4..7, only row 5 with a gradient: as a learner writes it.
  std::vector<float> sector = RowGradient(*m, {{5, grad}});
  ASSERT_TRUE(m->ApplyGradient(4 * 128, sector.data() + 4 * 32, 512).ok());
  const std::vector<float> init = InitRow(o, 5), row = ReadRow(*m, 5);
  for (size_t i = 0; i < grad.size(); ++i) EXPECT_FLOAT_EQ(row[i], init[i] - 0.5f * grad[i]) << i;
  EXPECT_EQ(ReadRow(*m, 4), InitRow(o, 4));
  EXPECT_EQ(m->RowsMade(), 1u);
}

// Reference adam, one row, its own step count.
struct AdamRow {
  std::vector<double> w, m, v;
  int t = 0;
  void Step(const std::vector<float>& g, double lr) {
    ++t;
    for (size_t i = 0; i < w.size(); ++i) {
      m[i] = 0.9 * m[i] + 0.1 * g[i];
      v[i] = 0.999 * v[i] + 0.001 * g[i] * g[i];
      const double mh = m[i] / (1 - std::pow(0.9, t)), vh = v[i] / (1 - std::pow(0.999, t));
      w[i] -= lr * mh / (std::sqrt(vh) + 1e-8);
    }
  }
};

TEST(Table, AdamStepsEachRowByItsOwnCountAndSkipsRowsWithoutGradient) {
  const ModelOptions o = TableOptions(16, 8, "adam");
  auto m = MakeTable(o);
  std::vector<AdamRow> ref(16);
  for (uint64_t r = 0; r < 16; ++r) {
    const std::vector<float> init = InitRow(o, r);
    ref[r].w.assign(init.begin(), init.end());
    ref[r].m.assign(8, 0);
    ref[r].v.assign(8, 0);
  }
  // Row 1 in every push, row 2 in one, row 3 never: with a shared count row
  // 2's bias correction would be wrong, and a zero gradient would move row 3.
  for (int step = 0; step < 5; ++step) {
    std::vector<std::pair<uint64_t, std::vector<float>>> rows = {{1, std::vector<float>(8, 0.3f + step)}};
    if (step == 3) rows.push_back({2, std::vector<float>(8, -2.0f)});
    for (const auto& [r, g] : rows) ref[r].Step(g, 0.5);
    std::vector<float> g = RowGradient(*m, rows);
    ASSERT_TRUE(m->ApplyGradient(0, g.data(), g.size() * 4).ok());
  }
  for (uint64_t r : {1, 2, 3}) {
    const std::vector<float> row = ReadRow(*m, r);
    for (size_t i = 0; i < 8; ++i) EXPECT_NEAR(row[i], ref[r].w[i], 1e-5) << "row " << r << " value " << i;
  }
  EXPECT_EQ(m->RowsMade(), 2u);
}

TEST(Table, AdagradAccumulatesPerRow) {
  const ModelOptions o = TableOptions(8, 4, "adagrad");
  auto m = MakeTable(o);
  const std::vector<float> init = InitRow(o, 6);
  std::vector<double> w(init.begin(), init.end()), s(4, 0);
  for (float gv : {1.0f, -3.0f, 0.5f}) {
    std::vector<float> g = RowGradient(*m, {{6, std::vector<float>(4, gv)}});
    ASSERT_TRUE(m->ApplyGradient(0, g.data(), g.size() * 4).ok());
    for (size_t i = 0; i < 4; ++i) {
      s[i] += gv * gv;
      w[i] -= 0.5 * gv / (std::sqrt(s[i]) + 1e-10);
    }
  }
  const std::vector<float> row = ReadRow(*m, 6);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(row[i], w[i], 1e-5) << i;
}

TEST(Table, UnwrittenRowsCommitNoMemory) {
  // 128 MiB of weights and 128 MiB of adagrad state, mostly never written.
  const ModelOptions o = TableOptions(262144, 128, "adagrad");
  const uint64_t before = ResidentBytes();
  auto m = MakeTable(o);
  for (uint64_t r = 0; r < 262144; r += 4099) ReadRow(*m, r);
  std::vector<float> g(128, 1.0f);
  for (uint64_t r = 0; r < 262144; r += 65536) {
    ASSERT_TRUE(m->ApplyGradient(r * 512, g.data(), 512).ok());
  }
  // Each row made commits its own 4 KiB page of each of the two arrays
  // (page_buffer.h): 32 KiB for the 4 rows, not a 2 MiB huge page each, and
  // not the 256 MiB.
  EXPECT_LT(ResidentBytes() - before, uint64_t{2} << 20);
  EXPECT_EQ(m->RowsMade(), 4u);
}

// While a table's checkpoint of rows made runs, a push to a block with no
// row made at the instant copies nothing for it, and one to a block with a
// row made does not change what the checkpoint reads of that row.
TEST(Table, CheckpointOfRowsMadeCopiesOnlyTheBlocksItReads) {
  const ModelOptions o = TableOptions(16384, 256);  // 1 KiB rows, 1024 to a block
  auto m = MakeTable(o);
  ASSERT_EQ(m->num_blocks(), 16u);
  std::vector<float> g(256, 1.0f);
  ASSERT_TRUE(m->ApplyGradient(5 * 1024, g.data(), 1024).ok());  // row 5, block 0
  const std::vector<float> at_instant = ReadRow(*m, 5);
  auto snapshot = m->TakeSnapshot(nullptr);
  MadeRowsWriter rows(*m, *snapshot);
  ASSERT_EQ(rows.rows_made(), 1u);
  ASSERT_TRUE(m->ApplyGradient(9000 * 1024, g.data(), 1024).ok());  // block 8: no row made
  EXPECT_EQ(snapshot->bytes_copied(), 0u);
  ASSERT_TRUE(m->ApplyGradient(5 * 1024, g.data(), 1024).ok());  // block 0: copied first
  EXPECT_EQ(snapshot->bytes_copied(), uint64_t{1} << 20);
  ASSERT_EQ(rows.Bytes(0), 1024u);
  std::vector<float> read(256);
  rows.Fill(0, 0, 1024, read.data());
  EXPECT_EQ(read, at_instant);
  EXPECT_NE(ReadRow(*m, 5), at_instant);
}

TEST(Table, AssignedWeightsMakeTheirRows) {
  const ModelOptions o = TableOptions(8, 4);
  auto m = MakeTable(o);
  const float two[2] = {2.0f, 3.0f};
  ASSERT_TRUE(m->AssignWeights(5 * 16 + 8, two, sizeof(two)).ok());  // second half of row 5
  const std::vector<float> init = InitRow(o, 5), row = ReadRow(*m, 5);
  EXPECT_EQ(row, (std::vector<float>{init[0], init[1], 2.0f, 3.0f}));
  EXPECT_EQ(m->RowsMade(), 1u);
}

TEST(Table, ConcurrentPushesToRowsOfOneBlockAreAllApplied) {
  ModelOptions o = TableOptions(64, 32, "sum");
  o.init.kind = InitSpec::Kind::kZeros;
  auto m = MakeTable(o);
  ASSERT_EQ(m->num_blocks(), 1u);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < 200; ++k) {
        std::vector<float> g(128, 0.0f);  // one sector: rows 4j..4j+3
        g[(t % 4) * 32] = 1.0f;
        ASSERT_TRUE(m->ApplyGradient(uint64_t(k % 16) * 512, g.data(), 512).ok());
      }
    });
  }
  for (std::thread& th : threads) th.join();
  double total = 0;
  for (uint64_t r = 0; r < 64; ++r) total += ReadRow(*m, r)[0];
  EXPECT_EQ(total, 800.0);
}

TEST(Table, RowsByIdReadAsEachRowReadAloneInTheBatchsOrder) {
  ModelOptions o = TableOptions(16, 8);
  o.block_bytes = 4 * 32;  // 4 rows a block: the batch spans all 4 blocks
  auto m = MakeTable(o);
  ASSERT_EQ(m->num_blocks(), 4u);
  for (uint64_t r : {2, 9, 12}) {  // made; the others keep their initial values
    std::vector<float> g(8, 1.0f + static_cast<float>(r));
    ASSERT_TRUE(m->ApplyGradient(r * 32, g.data(), 32).ok());
  }
  const std::vector<uint64_t> ids{9, 2, 9, 0, 15, 5, 2, 12, 3};  // repeats, out of order, made and not
  std::vector<float> rows(ids.size() * 8, -1.0f);
  Status s = m->ReadRows(ids.data(), ids.size(), rows.data());
  ASSERT_TRUE(s.ok()) << s.message();
  for (size_t k = 0; k < ids.size(); ++k) {
    EXPECT_EQ(std::vector<float>(rows.begin() + k * 8, rows.begin() + (k + 1) * 8), ReadRow(*m, ids[k])) << k;
  }
  EXPECT_EQ(m->RowsMade(), 3u);  // reading made no row
}

TEST(Table, RowsByIdWithOnePastTheEndAreRefusedCopyingNothing) {
  auto m = MakeTable(TableOptions(16, 8));
  const std::vector<uint64_t> ids{3, 16};
  std::vector<float> rows(2 * 8, -1.0f);
  Status s = m->ReadRows(ids.data(), ids.size(), rows.data());
  EXPECT_EQ(s.code(), Status::Code::kOutOfRange) << s.message();
  EXPECT_NE(s.message().find("row id 16 (position 1) is past the table's end (16 rows)"), std::string::npos)
      << s.message();
  EXPECT_EQ(rows, std::vector<float>(2 * 8, -1.0f));
}

TEST(Table, RowsPushedByIdApplyAsEachRowPushedAloneInTheBatchsOrder) {
  ModelOptions o = TableOptions(16, 8, "adam");  // adam: a repeat is a step of its own
  o.block_bytes = 4 * 32;                        // 4 rows a block: the batch spans all 4 blocks
  auto batched = MakeTable(o), alone = MakeTable(o);
  const std::vector<uint64_t> ids{9, 2, 9, 0, 15, 5, 12, 3};  // repeats, out of order
  std::vector<float> rows(ids.size() * 8);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(i % 7) - 3.0f;
  std::fill_n(rows.begin() + 5 * 8, 8, 0.0f);  // row 5's: all zeros, no gradient
  std::vector<uint64_t> counted(4, 0);
  Status s =
      batched->ApplyRows(ids.data(), ids.size(), rows.data(), [&](uint64_t block, uint64_t n) { counted[block] += n; });
  ASSERT_TRUE(s.ok()) << s.message();
  for (size_t k = 0; k < ids.size(); ++k) {
    ASSERT_TRUE(alone->ApplyGradient(ids[k] * 32, rows.data() + k * 8, 32).ok());
  }
  for (uint64_t r = 0; r < 16; ++r) EXPECT_EQ(ReadRow(*batched, r), ReadRow(*alone, r)) << r;
  EXPECT_EQ(batched->RowsMade(), 6u);                       // 9, 2, 0, 15, 12, 3: not 5
  EXPECT_EQ(counted, (std::vector<uint64_t>{3, 1, 2, 2}));  // each block's rows, repeats and zeros included
}

TEST(Table, RowsPushedByIdWithOnePastTheEndAreRefusedApplyingNothing) {
  auto m = MakeTable(TableOptions(16, 8));
  const std::vector<uint64_t> ids{3, 16};
  const std::vector<float> rows(2 * 8, 1.0f);
  Status s = m->ApplyRows(ids.data(), ids.size(), rows.data(), nullptr);
  EXPECT_EQ(s.code(), Status::Code::kOutOfRange) << s.message();
  EXPECT_NE(s.message().find("row id 16 (position 1) is past the table's end (16 rows)"), std::string::npos)
      << s.message();
  EXPECT_EQ(m->RowsMade(), 0u);
}

TEST(Table, RowsByIdOfADenseModelAreRefused) {
  ModelOptions o;
  o.num_params = 64;
  std::unique_ptr<Model> m = MakeTable(o);
  const uint64_t id = 0;
  float row[4];
  Status s = m->ReadRows(&id, 1, row);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.message();
  EXPECT_NE(s.message().find("not a table"), std::string::npos) << s.message();
}

TEST(Table, GeometryThatSplitsRowsIsRefused) {
  ModelOptions o = TableOptions(10, 3);
  o.block_bytes = 16;
  std::unique_ptr<Model> m;
  Status s = Model::Create(o, &m);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("whole rows"), std::string::npos) << s.message();
}

JobOptions TableJob(const std::string& rule, const std::string& mode = "async") {
  JobOptions o;
  o.model = TableOptions(32, 8, rule);
  o.staleness_aware = false;
  EXPECT_TRUE(ParseConsistency(mode, &o.consistency).ok());
  return o;
}

TEST(TableJob, BspAndSspAreRefusedInOneLine) {
  for (const char* mode : {"bsp", "ssp:2"}) {
    std::shared_ptr<Job> job;
    Status s = Job::Create("t", TableJob("sgd", mode), nullptr, &job);
    ASSERT_FALSE(s.ok()) << mode;
    EXPECT_EQ(s.message().find('\n'), std::string::npos);
    EXPECT_NE(s.message().find("mode=async"), std::string::npos) << s.message();
  }
}

TEST(TableJob, CheckpointRestoresRowsMadeWeightsAndRuleState) {
  char path[] = "/tmp/blkps-table-ckpt-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  std::remove(path);
  JobOptions o = TableJob("adam");
  o.checkpoint = path;
  std::vector<float> first(32 * 8, 0.0f), second(32 * 8, 0.0f);
  for (size_t i = 0; i < 8; ++i) {
    first[3 * 8 + i] = 1.0f + i;
    first[20 * 8 + i] = -1.0f;
    second[3 * 8 + i] = 0.25f;
  }
  std::vector<float> want(32 * 8), got(32 * 8);
  {  // reference: both pushes on one job
    std::shared_ptr<Job> job;
    JobOptions plain = TableJob("adam");
    ASSERT_TRUE(Job::Create("t", plain, nullptr, &job).ok());
    const size_t slot = job->AddLearner(1, [] {});
    ASSERT_TRUE(job->Write(slot, 0, first.data(), 1024).ok());
    ASSERT_TRUE(job->Write(slot, 0, second.data(), 1024).ok());
    ASSERT_TRUE(job->Read(slot, 0, want.data(), 1024).ok());
  }
  {
    std::shared_ptr<Job> job;
    ASSERT_TRUE(Job::Create("t", o, nullptr, &job).ok());
    const size_t slot = job->AddLearner(1, [] {});
    ASSERT_TRUE(job->Write(slot, 0, first.data(), 1024, "iqn.a").ok());
    ASSERT_TRUE(job->Checkpoint().ok());
  }
  std::shared_ptr<Job> job;
  Status s = Job::Create("t", o, nullptr, &job);
  ASSERT_TRUE(s.ok()) << s.message();
  const size_t slot = job->AddLearner(1, [] {});
  std::vector<uint32_t> counts(1);
  EXPECT_EQ(job->GetReceipt(1, "iqn.a", 0, &counts).writes_applied, 1u);
  EXPECT_EQ(counts[0], 1u);
  EXPECT_NE(job->StatusJson().find("\"rows_made\": 2"), std::string::npos) << job->StatusJson();
  ASSERT_TRUE(job->Write(slot, 0, second.data(), 1024).ok());
  ASSERT_TRUE(job->Read(slot, 0, got.data(), 1024).ok());
  EXPECT_EQ(got, want);
  job.reset();

  // A dense model of as many parameters does not load it.
  JobOptions dense;
  dense.model.num_params = 32 * 8;
  dense.model.block_bytes = o.model.block_bytes;
  dense.model.rule.name = "adam";
  dense.checkpoint = path;
  s = Job::Create("t", dense, nullptr, &job);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("table"), std::string::npos) << s.message();
  std::remove(path);
}

// Issue 38 item 4: a receipt's memory does not grow with the rows a learner
// touches. Pushes through the row windows are counted per window (its last
// sequence, tag and totals, job.h "Row windows"), never per 512-byte unit as
// plain writes are: after every row of a 4,096-unit table has been pushed
// through one window, the receipt holds no unit.
TEST(TableJob, WindowPushesKeepNoPerUnitReceiptHoweverManyRowsTheyTouch) {
  JobOptions o = TableJob("sgd");
  o.model = TableOptions(16384, 32, "sgd");  // 128-byte rows, 4 to a unit
  std::shared_ptr<Job> job;
  ASSERT_TRUE(Job::Create("t", o, nullptr, &job).ok());
  job->AddLearner(1, [] {});
  std::vector<uint64_t> ids(512);
  std::vector<float> grads(ids.size() * 32, 0.5f);
  for (uint64_t batch = 0; batch < 32; ++batch) {
    for (uint64_t k = 0; k < ids.size(); ++k) ids[k] = batch * ids.size() + k;
    Job::RowBatch b{0, batch + 1, 7, ids.data(), ids.size(), 32, grads.data()};
    ASSERT_TRUE(job->PushRowBatch(1, "iqn.learner", b).ok());
  }
  std::vector<uint32_t> counts(16384 * 128 / 512, 1);
  const Job::ReceiptNumbers numbers = job->GetReceipt(1, "iqn.learner", 0, &counts);
  EXPECT_EQ(numbers.writes_applied, 32u);
  EXPECT_EQ(std::count(counts.begin(), counts.end(), 0u), static_cast<long>(counts.size()));
}

// A hashed table's job restarted from its checkpoint holds the same rows,
// rule state, receipts and order of pushes: the same pushes afterwards,
// evictions included, give the same rows and status as the job that wrote it.
TEST(TableJob, HashedTableRestartsFromItsCheckpointExactly) {
  char path[] = "/tmp/blkps-hashed-ckpt-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  std::remove(path);
  LuOptions o;
  ASSERT_TRUE(
      ParseLuOptions(std::string("table=hash:4:2;rule=adam;lr=0.1;evict=lru-push;checkpoint=") + path, &o).ok());
  const uint64_t big = uint64_t{1} << 63;
  auto push = [](Job& job, uint64_t sequence, std::vector<uint64_t> ids) {
    std::vector<float> grads(ids.size() * 2);
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.5f + static_cast<float>(i + sequence);
    return job.PushRowBatch(1, "iqn.learner", {0, sequence, 7, ids.data(), ids.size(), 2, grads.data()});
  };
  auto rows = [](Job& job, std::vector<uint64_t> ids) {
    std::vector<float> out(ids.size() * 2);
    Job::RowWindowNumbers numbers;
    EXPECT_TRUE(job.PullRowBatch(1, "iqn.learner", {1, 0, 0, ids.data(), ids.size(), 2, nullptr}).ok());
    EXPECT_TRUE(job.ReadRowWindow(1, "iqn.learner", 1, &numbers, 0, ids.size(), out.data()).ok());
    return out;
  };
  std::shared_ptr<Job> wrote, restarted;
  ASSERT_TRUE(Job::Create("h", o.job, nullptr, &wrote).ok());
  wrote->AddLearner(1, [] {});
  ASSERT_TRUE(push(*wrote, 1, {big + 1, 5, 9}).ok());
  ASSERT_TRUE(push(*wrote, 2, {~uint64_t{0}, 5}).ok());  // full: 4 rows
  ASSERT_TRUE(wrote->Checkpoint().ok());
  ASSERT_TRUE(Job::Create("h", o.job, nullptr, &restarted).ok());
  restarted->AddLearner(1, [] {});
  const std::vector<uint64_t> all = {big + 1, 5, 9, ~uint64_t{0}, 11, 12};
  EXPECT_EQ(rows(*restarted, all), rows(*wrote, all));
  // The resend of the last push is known; two new ids evict the two least
  // recently pushed (big + 1 and 9) on both.
  ASSERT_TRUE(push(*restarted, 2, {~uint64_t{0}, 5}).ok());
  for (Job* job : {wrote.get(), restarted.get()}) ASSERT_TRUE(push(*job, 3, {11, 12}).ok());
  EXPECT_EQ(rows(*restarted, all), rows(*wrote, all));
  EXPECT_EQ(rows(*restarted, {big + 1, 9}), std::vector<float>(4, 0.0f));  // evicted: initial zeros again
  EXPECT_NE(rows(*restarted, {5}), std::vector<float>(2, 0.0f));
  EXPECT_NE(restarted->StatusJson().find("\"rows_made\": 4, \"hashed\": true, \"row_limit\": 4, \"evict\": "
                                         "\"lru-push\", \"evictions\": 2"),
            std::string::npos)
      << restarted->StatusJson();
  EXPECT_EQ(restarted->StatusJson().substr(restarted->StatusJson().find("\"table\"")).substr(0, 200),
            wrote->StatusJson().substr(wrote->StatusJson().find("\"table\"")).substr(0, 200));
  std::remove(path);
}

// A hashed table's checkpoint holds the rows made, not CAPACITY rows: its
// "hashed.rows" section grows by one row's words (id, last push, weights,
// the rule state's size and bytes) per row made, and the file of a table of
// 2^20 possible rows with 3 made is a few pages.
TEST(TableJob, HashedTableCheckpointGrowsWithTheRowsMadeOnly) {
  blkps_test::TempDir dir("blkps-hashed-size");
  ASSERT_FALSE(dir.path.empty());
  const std::string path = dir.path + "/h.ckpt";
  LuOptions o;
  ASSERT_TRUE(ParseLuOptions("table=hash:1048576:32;rule=adagrad;checkpoint=" + path, &o).ok());
  std::shared_ptr<Job> job;
  ASSERT_TRUE(Job::Create("h", o.job, nullptr, &job).ok());
  job->AddLearner(1, [] {});
  auto rows_section = [&](uint64_t* file_bytes) {
    EXPECT_TRUE(job->Checkpoint().ok());
    CheckpointHeader header;
    EXPECT_TRUE(ReadCheckpointHeader(path, &header).ok());
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    *file_bytes = static_cast<uint64_t>(in.tellg());
    for (const auto& [name, bytes] : header.sections) {
      if (name == "hashed.rows") return bytes;
    }
    ADD_FAILURE() << "no hashed.rows section";
    return uint64_t{0};
  };
  std::vector<uint64_t> ids(1000);
  for (uint64_t k = 0; k < ids.size(); ++k) ids[k] = k * 0x9e3779b97f4a7c15ull;
  std::vector<float> grads(ids.size() * 32, 0.5f);
  ASSERT_TRUE(job->PushRowBatch(1, "iqn.learner", {0, 1, 7, ids.data(), 3, 32, grads.data()}).ok());
  uint64_t few_file = 0, many_file = 0;
  const uint64_t few = rows_section(&few_file);
  ASSERT_TRUE(job->PushRowBatch(1, "iqn.learner", {0, 2, 7, ids.data(), ids.size(), 32, grads.data()}).ok());
  const uint64_t many = rows_section(&many_file);
  const uint64_t row_words = 2 + 32 / 2 + 1 + 32 / 2;  // id, last push, weights, adagrad's size and sum
  EXPECT_EQ(few, (3 + 3 * row_words) * 8);
  EXPECT_EQ(many, (3 + 1000 * row_words) * 8);
  EXPECT_LE(few_file, 64u << 10) << "a checkpoint of 3 rows made";
  EXPECT_LE(many_file - few_file, many - few + 4096);
}

// A dense table's checkpoint holds the rows made (table_checkpoint.h): a
// table of 256 MiB (weights and adagrad state) with 2 rows made writes a
// file of a few pages, a restart from it commits memory for those rows only
// and serves them as written, and a file of whole arrays (as written before)
// still loads.
TEST(TableJob, DenseTableCheckpointHoldsTheRowsMadeOnly) {
  blkps_test::TempDir dir("blkps-table-rows");
  ASSERT_FALSE(dir.path.empty());
  const std::string path = dir.path + "/t.ckpt";
  LuOptions o;
  ASSERT_TRUE(
      ParseLuOptions("table=262144:128;rule=adagrad;lr=0.5;init=normal:0.1;seed=3;checkpoint=" + path, &o).ok());
  const uint64_t rows[] = {7, 200000};
  std::vector<float> want(2 * 128), got(2 * 128);
  {
    std::shared_ptr<Job> job;
    ASSERT_TRUE(Job::Create("t", o.job, nullptr, &job).ok());
    const size_t slot = job->AddLearner(1, [] {});
    std::vector<float> g(128, 0.25f);
    for (size_t i = 0; i < 2; ++i) {
      ASSERT_TRUE(job->Write(slot, rows[i] * 512, g.data(), 512, "iqn.a").ok());
      ASSERT_TRUE(job->Read(slot, rows[i] * 512, want.data() + i * 128, 512).ok());
    }
    ASSERT_TRUE(job->Checkpoint().ok());
  }
  CheckpointHeader header;
  ASSERT_TRUE(ReadCheckpointHeader(path, &header).ok());
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  EXPECT_LE(static_cast<uint64_t>(in.tellg()), 128u << 10) << "a checkpoint of 2 rows made";
  for (const auto& [name, bytes] : header.sections) {
    if (name == "weights" || name == "adagrad.s") {
      EXPECT_EQ(bytes, 2u * 512) << name;
    }
  }
  auto restarted = [&](uint64_t* grew) {
    const uint64_t before = ResidentBytes();
    std::shared_ptr<Job> job;
    Status s = Job::Create("t", o.job, nullptr, &job);
    EXPECT_TRUE(s.ok()) << s.message();
    if (!s.ok()) return;
    *grew = ResidentBytes() - before;
    const size_t slot = job->AddLearner(1, [] {});
    for (size_t i = 0; i < 2; ++i) ASSERT_TRUE(job->Read(slot, rows[i] * 512, got.data() + i * 128, 512).ok());
    EXPECT_EQ(got, want);
    EXPECT_NE(job->StatusJson().find("\"rows_made\": 2"), std::string::npos) << job->StatusJson();
  };
  uint64_t grew = 0;
  restarted(&grew);
  // Each row made commits at most a 2 MiB huge page of each array.
  EXPECT_LT(grew, uint64_t{24} << 20);

  // The same file with whole arrays, as blkps wrote tables before.
  std::vector<std::vector<char>> data;
  std::vector<CheckpointDest> dests;
  for (const auto& [name, bytes] : header.sections) data.emplace_back(bytes);
  for (size_t k = 0; k < data.size(); ++k) dests.push_back({header.sections[k].first, data[k].data(), data[k].size()});
  ASSERT_TRUE(ReadCheckpointSections(path, dests).ok());
  std::vector<std::vector<char>> whole(data.size());
  std::vector<CheckpointSection> sections;
  for (size_t k = 0; k < data.size(); ++k) {
    whole[k] = data[k];
    if (header.sections[k].first == "weights" || header.sections[k].first == "adagrad.s") {
      whole[k].assign(uint64_t{262144} * 512, 0);
      for (size_t i = 0; i < 2; ++i) std::copy_n(data[k].data() + i * 512, 512, whole[k].data() + rows[i] * 512);
    }
    sections.push_back({header.sections[k].first, whole[k].data(), whole[k].size()});
  }
  header.meta.erase("table.arrays");
  ASSERT_TRUE(WriteCheckpointFile(path, header.meta, sections).ok());
  got.assign(got.size(), 0.0f);
  restarted(&grew);
}

// An operator's lr= reaches a hashed table's rows, as it does a model's.
TEST(TableJob, ControlLrStepsAHashedTablesRows) {
  LuOptions o;
  ASSERT_TRUE(ParseLuOptions("table=hash:4:2;rule=sgd;lr=1", &o).ok());
  std::shared_ptr<Job> job;
  ASSERT_TRUE(Job::Create("h", o.job, nullptr, &job).ok());
  job->AddLearner(1, [] {});
  ASSERT_TRUE(job->Control("lr=0.25").ok());
  const uint64_t id = 77;
  const float grads[2] = {1, 2};
  ASSERT_TRUE(job->PushRowBatch(1, "iqn.learner", {0, 1, 7, &id, 1, 2, grads}).ok());
  float row[2] = {};
  Job::RowWindowNumbers numbers;
  ASSERT_TRUE(job->PullRowBatch(1, "iqn.learner", {1, 0, 0, &id, 1, 2, nullptr}).ok());
  ASSERT_TRUE(job->ReadRowWindow(1, "iqn.learner", 1, &numbers, 0, 1, row).ok());
  EXPECT_EQ(row[0], -0.25f);
  EXPECT_EQ(row[1], -0.5f);
}

TEST(TableJob, StatusShowsTheTableWithTheKeysTheHeaderLists) {
  std::shared_ptr<Job> job;
  ASSERT_TRUE(Job::Create("t", TableJob("sgd"), nullptr, &job).ok());
  const size_t slot = job->AddLearner(1, [] {});
  std::vector<float> g(32 * 8, 0.0f);
  g[9 * 8] = 1.0f;
  ASSERT_TRUE(job->Write(slot, 0, g.data(), 1024).ok());
  const std::string status = job->StatusJson();
  EXPECT_EQ(blkps_test::JsonCheck::Problem(status), "") << status;
  EXPECT_NE(
      status.find("\"table\": {\"rows\": 32, \"width\": 8, \"row_bytes\": 32, \"rows_made\": 1, \"hashed\": false"),
      std::string::npos)
      << status;
  // The table object's keys, in order, are the header's list.
  const size_t from = status.find("\"table\": {") + 9;
  const std::string table = status.substr(from, status.find('}', from) - from);
  const std::regex key("\"(\\w+)\":");
  std::string keys;
  for (auto m = std::sregex_iterator(table.begin(), table.end(), key); m != std::sregex_iterator(); ++m) {
    keys += (keys.empty() ? "" : " ") + (*m)[1].str();
  }
  EXPECT_EQ(keys, BLKPS_STATUS_TABLE_KEYS) << status;
}

// The start-time memory check of a hashed table counts its fixed part (the
// slot array and one row) beside its one-row stand-in model: not CAPACITY
// rows, which memory= bounds at run time, and not nothing.
TEST(TableOptions, HashedTableMemoryCheckCountsItsSlotArrayAndOneRow) {
  LuOptions o;
  ASSERT_TRUE(ParseLuOptions("table=hash:1048576:32;rule=adam", &o).ok());
  std::unique_ptr<UpdateRule> rule;
  ASSERT_TRUE(MakeUpdateRule(o.job.model.rule, 0, &rule).ok());
  uint64_t memory = 0;
  ASSERT_TRUE(Job::MemoryBytes(o.job, &memory).ok());
  EXPECT_EQ(memory, Model::MemoryBytes(o.job.model, *rule) + HashedTable::SlotArrayBytes(1048576) +
                        HashedTable::RowBytes(32, *rule));
}

TEST(TableOptions, TableDeclaresRowsAndWidth) {
  LuOptions o;
  Status s = ParseLuOptions("table=1000:128;rule=adagrad;init=normal:0.01;seed=3", &o);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(o.job.model.table.rows, 1000u);
  EXPECT_EQ(o.job.model.table.width, 128u);
  EXPECT_EQ(o.job.model.num_params, 128000u);
  EXPECT_EQ(o.job.model.block_bytes, 1u << 20);
  EXPECT_FALSE(o.job.staleness_aware);
  ASSERT_TRUE(ParseLuOptions("table=10:3", &o).ok());
  EXPECT_EQ(o.job.model.block_bytes % 12, 0u);
}

TEST(TableOptions, HashedTableDeclaresCapacityWidthAndEvictionRule) {
  LuOptions o;
  Status s = ParseLuOptions("table=hash:1000:16;rule=adagrad;evict=idle:5", &o);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(o.job.hashed_capacity, 1000u);
  // The model is the table's one-row stand-in: the learner LUN is one row.
  EXPECT_EQ(o.job.model.table.rows, 1u);
  EXPECT_EQ(o.job.model.table.width, 16u);
  EXPECT_EQ(o.job.model.num_params, 16u);
  EXPECT_EQ(o.job.evict.kind, EvictionRule::Kind::kIdle);
  EXPECT_EQ(o.job.evict.idle_updates, 5u);
}

TEST(TableOptions, BadTablesAreRefusedInOneLine) {
  const std::pair<const char*, const char*> cases[] = {
      {"table=10", "table:"},
      {"table=0:4", "table:"},
      {"table=4:x", "table:"},
      {"table=10:4;params=40", "params:"},
      {"table=10:4;mode=bsp", "mode=async"},
      {"table=hash:10", "table:"},
      {"table=hash:0:4", "table:"},
      {"table=10:4;evict=lru-push", "evict: only for a hashed table"},
      {"table=hash:10:4;evict=sometimes", "evict:"},
      {"table=10:4;mode=ssp:1", "mode=async"},
      {"table=10:4;block=20", "block:"},
      {"table=10:4;staleness_aware=1", "staleness_aware:"},
  };
  for (const auto& [bsopts, start] : cases) {
    LuOptions o;
    Status s = ParseLuOptions(bsopts, &o);
    ASSERT_FALSE(s.ok()) << bsopts;
    EXPECT_NE(s.message().find(start), std::string::npos) << bsopts << ": " << s.message();
    EXPECT_EQ(s.message().find('\n'), std::string::npos);
  }
}

}  // namespace
}  // namespace blkps::server
