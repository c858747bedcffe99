// Integration tests of table LUNs (doc/embeddings.md): a real tgtd with the
// built plugin, learners through libblkps pushing and pulling single rows.
// The expected values come from the aggregator's own per-row initialiser.
#include <blkps/control_lun.h>
#include <unistd.h>
#include <blkps/model.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "initializer.h"
#include "target_process.h"

namespace blkps_test {
namespace {

constexpr uint64_t kRows = 4096, kWidth = 32;  // 128-byte rows: 4 in a sector

std::string LearnerName(const std::string& who) {
  static std::atomic<int> counter{0};
  return "iqn.2026-11.io.blkps:table-test-" + who + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
}

std::unique_ptr<blkps::Model> Open(const std::string& url, const std::string& who) {
  blkps::OpenOptions o;
  o.initiator_name = LearnerName(who);
  std::string error;
  auto m = blkps::Model::Open(url, o, &error);
  EXPECT_NE(m, nullptr) << error;
  return m;
}

std::vector<float> InitRow(uint64_t r) {
  blkps::server::InitSpec spec;
  spec.kind = blkps::server::InitSpec::Kind::kNormal;
  spec.scale = 0.1;
  spec.seed = 5;
  std::vector<float> w(kWidth);
  blkps::server::InitializeRow(spec, r, w.data(), kWidth);
  return w;
}

std::string Status(const TargetProcess& target) {
  auto control = Open(target.control_url(), "status");
  if (!control) return "";
  std::string text(64 << 10, '\0');
  EXPECT_EQ(control->ReadBytes(BLKPS_CONTROL_STATUS_OFFSET, text.data(), text.size()), 0) << control->last_error();
  return text.substr(0, text.find('\0'));
}

// Learner l's gradient for row r, value i, push k: small integers.
float RowGradient(int l, int k, uint64_t r, uint64_t i) {
  return static_cast<float>((l + 1) * ((r + i + k) % 5)) - 2.0f;
}

// Two learners push single rows (each padded by libblkps to a 512-byte
// sector of zero gradients for the neighbouring rows) at once, rows they
// share and rows of their own; every row ends at its seeded initial value
// minus the sum of its gradients, untouched rows read as their initial
// values and are not made, and a checkpoint taken by fsync brings it all
// back, rows made and receipts included, after tgtd is killed.
TEST(TableTarget, RowPushesFromTwoLearnersApplyToSeededRowsAndSurviveARestart) {
  TempDir dir;
  TargetProcess target("table=" + std::to_string(kRows) + ":" + std::to_string(kWidth) +
                           ";rule=sgd;lr=1;init=normal:0.1;seed=5;checkpoint=" + dir.path + "/table.ckpt",
                       "--luns 2");
  ASSERT_TRUE(target.ok()) << target.start_output();
  constexpr int kPushes = 6;
  const std::vector<uint64_t> shared = {0, 5, 6, 1000, kRows - 1};
  auto rows_of = [&](int l) {
    std::vector<uint64_t> rows = shared;
    rows.push_back(l == 0 ? 7 : 2001);  // 7 shares a sector with 5 and 6
    return rows;
  };
  std::vector<std::string> errors(2);
  std::vector<std::thread> learners;
  for (int l = 0; l < 2; ++l) {
    learners.emplace_back([&, l] {
      auto m = Open(target.url(l + 1), "learner" + std::to_string(l));
      if (!m) return;
      for (int k = 0; k < kPushes; ++k) {
        for (uint64_t r : rows_of(l)) {
          std::vector<float> g(kWidth);
          for (uint64_t i = 0; i < kWidth; ++i) g[i] = RowGradient(l, k, r, i);
          if (m->Push(r * kWidth, g.data(), kWidth) != 0) errors[l] = m->last_error();
        }
      }
      if (m->Sync() != 0) errors[l] = m->last_error();
    });
  }
  for (std::thread& t : learners) t.join();
  ASSERT_EQ(errors, std::vector<std::string>(2));

  std::map<uint64_t, std::vector<double>> want;
  for (int l = 0; l < 2; ++l) {
    for (uint64_t r : rows_of(l)) {
      if (!want.count(r)) {
        const std::vector<float> init = InitRow(r);
        want[r].assign(init.begin(), init.end());
      }
      for (int k = 0; k < kPushes; ++k) {
        for (uint64_t i = 0; i < kWidth; ++i) want[r][i] -= RowGradient(l, k, r, i);
      }
    }
  }
  for (uint64_t untouched : {1ull, 4ull, 8ull, 2000ull}) {
    const std::vector<float> init = InitRow(untouched);
    want[untouched].assign(init.begin(), init.end());
  }
  auto expect_rows = [&](const std::string& when) {
    auto m = Open(target.url(1), "reader");
    ASSERT_NE(m, nullptr);
    for (const auto& [r, values] : want) {
      std::vector<float> got(kWidth);
      ASSERT_EQ(m->Pull(r * kWidth, got.data(), kWidth), 0) << m->last_error();
      for (uint64_t i = 0; i < kWidth; ++i) {
        ASSERT_NEAR(got[i], values[i], 1e-4) << when << ": row " << r << " value " << i;
      }
    }
  };
  expect_rows("served");
  const std::string made =
      "\"table\": {\"rows\": 4096, \"width\": 32, \"row_bytes\": 128, \"rows_made\": 7, \"hashed\": false";
  EXPECT_TRUE(Contains(Status(target), made)) << Status(target);

  std::string why;
  ASSERT_TRUE(target.KillTgtd(&why)) << why;
  ASSERT_TRUE(target.Restart()) << target.start_output();
  expect_rows("after a restart from the checkpoint");
  EXPECT_TRUE(Contains(Status(target), made)) << Status(target);
}

// A hashed table's rows, keyed by ids anywhere in 64 bits, are in the
// checkpoint a learner's fsync writes, and a tgtd restarted from it serves
// them bit for bit.
TEST(TableTarget, HashedTableRowsSurviveARestartFromTheCheckpoint) {
  TempDir dir;
  TargetProcess target("table=hash:64:8;rule=adam;lr=0.1;init=normal:0.1;seed=5;checkpoint=" + dir.path + "/h.ckpt");
  ASSERT_TRUE(target.ok()) << target.start_output();
  const std::vector<uint64_t> ids = {(uint64_t{1} << 63) + 3, 12345, ~uint64_t{0}, 0};
  std::vector<float> grads(ids.size() * 8), before(ids.size() * 8), after(ids.size() * 8);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.25f * static_cast<float>(i % 7) - 0.5f;
  {
    auto m = Open(target.url(1), "hashed");
    ASSERT_NE(m, nullptr);
    ASSERT_EQ(m->PushRows(ids.data(), ids.size(), 8, grads.data()), 0) << m->last_error();
    ASSERT_EQ(m->Sync(), 0) << m->last_error();
    ASSERT_EQ(m->PullRows(ids.data(), ids.size(), 8, before.data()), 0) << m->last_error();
  }
  const std::string made = "\"rows_made\": 4, \"hashed\": true";
  EXPECT_TRUE(Contains(Status(target), made)) << Status(target);
  std::string why;
  ASSERT_TRUE(target.KillTgtd(&why)) << why;
  ASSERT_TRUE(target.Restart()) << target.start_output();
  auto m = Open(target.url(1), "hashed-after");
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(m->PullRows(ids.data(), ids.size(), 8, after.data()), 0) << m->last_error();
  EXPECT_EQ(after, before);
  EXPECT_TRUE(Contains(Status(target), made)) << Status(target);
}

// On a table of 128-wide rows (one sector each), rows of 64 values would
// land as half of another row: PushRows and PullRows refuse them in one line
// naming the table's width, and nothing reaches the server.
TEST(TableTarget, RowsOfAnotherWidthThanTheTablesAreRefusedBeforeSending) {
  TargetProcess target("table=1000:128;rule=sgd;lr=1;init=normal:0.1;seed=5");
  ASSERT_TRUE(target.ok()) << target.start_output();
  auto m = Open(target.url(1), "narrow");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->table_width(), 128u);
  std::vector<float> before(2 * 128), after(2 * 128), half(64, 1.0f);
  ASSERT_EQ(m->Pull(0, before.data(), before.size()), 0) << m->last_error();
  const uint64_t id = 1;
  EXPECT_EQ(m->PushRows(&id, 1, 64, half.data()), -EINVAL);
  EXPECT_TRUE(Contains(m->last_error(), "the table's rows are 128 values wide")) << m->last_error();
  EXPECT_EQ(m->PullRows(&id, 1, 64, half.data()), -EINVAL);
  ASSERT_EQ(m->Pull(0, after.data(), after.size()), 0) << m->last_error();
  EXPECT_EQ(after, before);
  EXPECT_TRUE(Contains(Status(target), "\"writes\": 0,")) << Status(target);  // LUN 1 saw no write
}

// push_rows sums a batch's gradients per distinct row and checks the sums
// before it sends anything: a NaN anywhere in the batch, or two finite
// gradients of one id whose sum overflows, fail the call in one line and
// leave the table and the server's counts as they were.
TEST(TableTarget, PushRowsWithANonFiniteSumSendsNothing) {
  TargetProcess target("table=1000:128;rule=sgd;lr=1;init=normal:0.1;seed=5");
  ASSERT_TRUE(target.ok()) << target.start_output();
  auto m = Open(target.url(1), "nonfinite");
  ASSERT_NE(m, nullptr);
  std::vector<float> before(1000 * 128), after(1000 * 128);
  ASSERT_EQ(m->Pull(0, before.data(), before.size()), 0) << m->last_error();
  const std::vector<uint64_t> ids = {3, 900, 3, 17};
  std::vector<float> grads(ids.size() * 128, 0.5f);
  grads[3 * 128 + 127] = std::nanf("");  // id 17's last value
  EXPECT_EQ(m->PushRows(ids.data(), ids.size(), 128, grads.data()), -EINVAL);
  EXPECT_TRUE(Contains(m->last_error(), "a summed gradient is NaN; nothing was sent")) << m->last_error();
  grads[3 * 128 + 127] = 0.5f;
  grads[0 * 128 + 64] = grads[2 * 128 + 64] = std::numeric_limits<float>::max();  // id 3, twice
  EXPECT_EQ(m->PushRows(ids.data(), ids.size(), 128, grads.data()), -EINVAL);
  EXPECT_TRUE(Contains(m->last_error(), "a summed gradient is infinite; nothing was sent")) << m->last_error();
  ASSERT_EQ(m->Pull(0, after.data(), after.size()), 0) << m->last_error();
  EXPECT_EQ(after, before);
  EXPECT_TRUE(Contains(Status(target), "\"writes\": 0,")) << Status(target);  // LUN 1 saw no write
}

// A row-sized WRITE runs on tgtd's main thread (the plugin's inline path,
// bs_blkps.c); one the server refuses, here a sector of raw bytes with a
// NaN (WriteBytes: any language's pwrite, no client-side check), fails
// with its sense rather than completing GOOD, and nothing is applied.
TEST(TableTarget, ARefusedRowSizedWriteFailsAndAppliesNothing) {
  TargetProcess target("table=1000:128;rule=sgd;lr=1;init=normal:0.1;seed=5");
  ASSERT_TRUE(target.ok()) << target.start_output();
  auto m = Open(target.url(1), "nan");
  ASSERT_NE(m, nullptr);
  std::vector<float> before(128), after(128), grad(128, 1.0f);
  ASSERT_EQ(m->Pull(0, before.data(), before.size()), 0) << m->last_error();
  grad[7] = std::nanf("");
  EXPECT_NE(m->WriteBytes(0, grad.data(), grad.size() * sizeof(float)), 0);
  ASSERT_EQ(m->Pull(0, after.data(), after.size()), 0) << m->last_error();
  EXPECT_EQ(after, before);
}

// A restart from the checkpoint loses the pushes since the learner's
// fsync; pushed_bytes_lost is exactly their rows' bytes, though the runs of
// rows starting at one sector differ in length (1, 2 and 4 rows at row 0),
// and the push made before the fsync is not counted.
TEST(TableTarget, PushedBytesLostIsExactlyTheRowsARestartLost) {
  TempDir dir;
  TargetProcess target("table=1000:128;rule=sgd;lr=1;init=normal:0.1;seed=5;checkpoint=" + dir.path + "/t.ckpt");
  ASSERT_TRUE(target.ok()) << target.start_output();
  auto m = Open(target.url(1), "lost");
  ASSERT_NE(m, nullptr);
  auto push = [&](std::vector<uint64_t> ids) {
    const std::vector<float> g(ids.size() * 128, 0.25f);
    ASSERT_EQ(m->PushRows(ids.data(), ids.size(), 128, g.data()), 0) << m->last_error();
  };
  push({0, 1, 2});  // kept: the fsync checkpoints it
  ASSERT_EQ(m->Sync(), 0) << m->last_error();
  push({0});
  push({0, 1});
  push({0, 1, 2, 3});
  push({10});
  const uint64_t lost_rows = 1 + 2 + 4 + 1;
  std::string why;
  ASSERT_TRUE(target.KillTgtd(&why)) << why;
  ASSERT_TRUE(target.Restart()) << target.start_output();
  std::vector<float> row(128);
  const uint64_t id = 0;
  ASSERT_EQ(m->PullRows(&id, 1, 128, row.data()), 0) << m->last_error();  // reconnects, reads the receipt
  EXPECT_EQ(m->pushed_bytes_lost(), lost_rows * 128 * sizeof(float));
}

// pull_rows and push_rows of a blkps table go through the control LUN's row
// windows (a batch in a few commands); they give what the per-row path does:
// a batch of ids with repeats pushed as one (each id's gradients summed),
// bit for bit equal to the summed rows written at their bytes, adagrad's
// state included, and pulled rows equal to the rows' bytes, in id order.
TEST(TableTarget, RowsThroughWindowsEqualThePerRowPath) {
  constexpr uint64_t kHalf = kRows / 2;
  TargetProcess target("table=" + std::to_string(kRows) + ":" + std::to_string(kWidth) +
                       ";rule=adagrad;lr=0.5;init=zeros");
  ASSERT_TRUE(target.ok()) << target.start_output();
  auto m = Open(target.url(1), "windows");
  ASSERT_NE(m, nullptr);
  std::mt19937_64 rng(38);
  std::uniform_int_distribution<uint64_t> pick(0, kHalf - 1);
  for (int step = 0; step < 3; ++step) {
    std::vector<uint64_t> ids(3000);
    for (uint64_t& id : ids) id = pick(rng) % 700;  // repeats
    std::vector<float> g(ids.size() * kWidth);
    for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(static_cast<int>(rng() % 9) - 4) / 4.0f;
    ASSERT_EQ(m->PushRows(ids.data(), ids.size(), kWidth, g.data()), 0) << m->last_error();
    std::map<uint64_t, std::vector<float>> summed;
    for (size_t k = 0; k < ids.size(); ++k) {
      std::vector<float>& row = summed.try_emplace(ids[k], kWidth, 0.0f).first->second;
      for (uint64_t i = 0; i < kWidth; ++i) row[i] += g[k * kWidth + i];
    }
    for (const auto& [id, row] : summed) {
      ASSERT_EQ(m->Push((kHalf + id) * kWidth, row.data(), kWidth), 0) << m->last_error();
    }
  }
  std::vector<uint64_t> ids(kHalf);
  for (uint64_t k = 0; k < kHalf; ++k) ids[k] = kHalf - 1 - k;  // reversed
  std::vector<float> pulled(kHalf * kWidth), bytes(kRows * kWidth);
  ASSERT_EQ(m->PullRows(ids.data(), ids.size(), kWidth, pulled.data()), 0) << m->last_error();
  ASSERT_EQ(m->Pull(0, bytes.data(), kRows * kWidth), 0) << m->last_error();
  uint64_t touched = 0;
  for (uint64_t k = 0; k < kHalf; ++k) {
    const float* got = pulled.data() + k * kWidth;
    ASSERT_EQ(0, std::memcmp(got, bytes.data() + ids[k] * kWidth, kWidth * 4)) << "pulled id " << ids[k];
    ASSERT_EQ(0, std::memcmp(got, bytes.data() + (kHalf + ids[k]) * kWidth, kWidth * 4)) << "pushed id " << ids[k];
    touched += got[0] != 0.0f ? 1 : 0;
  }
  EXPECT_GT(touched, 500u);
}

TEST(TableTarget, BspAndSspTablesAreRefusedWithOneLine) {
  TargetProcess target("table=64:8;lr=1");
  ASSERT_TRUE(target.ok()) << target.start_output();
  int lun = 10;
  for (const char* mode : {"bsp", "ssp:1"}) {
    std::string out;
    const int rc = target.Admin("--lld iscsi --op new --mode logicalunit --tid 1 --lun " + std::to_string(lun++) +
                                    " --bstype blkps --backing-store t2 --bsopts " +
                                    ShellQuote(std::string("table=64:8;mode=") + mode),
                                &out);
    EXPECT_NE(rc, 0) << mode;
    EXPECT_TRUE(Contains(target.Log(), "mode: a table is served async only")) << target.Log();
  }
  TargetProcess refused("table=64:8;mode=bsp");
  EXPECT_FALSE(refused.ok());
  EXPECT_TRUE(Contains(refused.start_output(), "mode: a table is served async only")) << refused.start_output();
}

}  // namespace
}  // namespace blkps_test
