// Specification of libblkps's row gather and scatter (RowBatch,
// Model::PullRows / PushRows) on a plain file: a file stores what is
// written, so the bytes show exactly what a push sent.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "blkps/model.hpp"
#include "row_batch.h"

namespace blkps {
namespace {

TEST(RowBatch, RowsAreKeptOnceSortedAndCoalescedByBlock) {
  // 128-byte rows: rows 4..7 share block 1; row 1000 is alone in block 250.
  const uint64_t ids[] = {1000, 6, 5, 7, 5, 1000};
  RowBatch batch(Direction::kRead, ids, 6, 32, nullptr, 512, 1 << 20);
  EXPECT_EQ(batch.unique_rows(), 4u);
  ASSERT_EQ(batch.requests().size(), 2u);
  EXPECT_EQ(batch.requests()[0].offset, 512u);
  EXPECT_EQ(batch.requests()[0].length, 512u);
  EXPECT_EQ(batch.requests()[1].offset, 1000u * 128 / 512 * 512);
  EXPECT_EQ(batch.requests()[1].length, 512u);
}

TEST(DistinctRows, EachOrderKeepsEveryIdOnceAndNamesItsRow) {
  // Many repeats, ids that all hash alike (j / G mod 2^64 for the
  // multiplier G of DistinctRows's hash: their hashes are j, whose top bits
  // are all zero), and the largest ids.
  uint64_t inverse = 0x9E3779B97F4A7C15ull;  // Newton: inverse * G = 1 mod 2^64
  for (int i = 0; i < 6; ++i) inverse *= 2 - 0x9E3779B97F4A7C15ull * inverse;
  std::mt19937_64 rng(11);
  std::vector<uint64_t> ids;
  for (int k = 0; k < 5000; ++k) ids.push_back((rng() % 700) * inverse);
  ids.push_back(~uint64_t{0});
  ids.push_back(0);
  ids.push_back(~uint64_t{0});
  for (auto order : {DistinctRows::Order::kAscending, DistinctRows::Order::kFirstSeen}) {
    const DistinctRows distinct(ids.data(), ids.size(), order);
    std::vector<uint64_t> expected;  // in the order asked
    for (uint64_t id : ids) {
      if (std::find(expected.begin(), expected.end(), id) == expected.end()) expected.push_back(id);
    }
    if (order == DistinctRows::Order::kAscending) std::sort(expected.begin(), expected.end());
    EXPECT_EQ(distinct.rows, expected);
    ASSERT_EQ(distinct.row_of_id.size(), ids.size());
    for (size_t k = 0; k < ids.size(); ++k) ASSERT_EQ(distinct.rows[distinct.row_of_id[k]], ids[k]) << k;
  }
}

TEST(RowBatch, TouchingBlocksShareARequestCutAtRequestBytes) {
  std::vector<uint64_t> ids;
  for (uint64_t r = 0; r < 64; ++r) ids.push_back(63 - r);  // 64 rows of 512 bytes, back to back
  RowBatch batch(Direction::kRead, ids.data(), ids.size(), 128, nullptr, 512, 8192);
  ASSERT_EQ(batch.requests().size(), 4u);  // 32 KiB in 8 KiB requests
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(batch.requests()[i].offset, i * 8192);
    EXPECT_EQ(batch.requests()[i].length, 8192u);
  }
}

class RowFile : public ::testing::Test {
 protected:
  void SetUp() override {
    char path[] = "/tmp/blkps-rows-XXXXXX";
    const int fd = mkstemp(path);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, kRows * kWidth * 4), 0);
    close(fd);
    path_ = path;
    std::string error;
    model_ = Model::Open(path_, OpenOptions(), &error);
    ASSERT_NE(model_, nullptr) << error;
  }
  void TearDown() override {
    model_.reset();
    std::remove(path_.c_str());
  }
  static constexpr uint64_t kRows = 2048, kWidth = 32;
  std::string path_;
  std::unique_ptr<Model> model_;
};

TEST_F(RowFile, PushSendsEachRowsSummedGradientAndZerosElsewhere) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<uint64_t> row(0, kRows - 1);
  std::vector<uint64_t> ids(500);
  for (uint64_t& id : ids) id = row(rng) % 300;  // many repeats
  std::vector<float> grads(ids.size() * kWidth);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = static_cast<float>(static_cast<int>(rng() % 9) - 4);
  ASSERT_EQ(model_->PushRows(ids.data(), ids.size(), kWidth, grads.data()), 0) << model_->last_error();

  std::map<uint64_t, std::vector<float>> want;
  for (size_t k = 0; k < ids.size(); ++k) {
    std::vector<float>& w = want[ids[k]];
    w.resize(kWidth);
    for (uint64_t i = 0; i < kWidth; ++i) w[i] += grads[k * kWidth + i];
  }
  std::vector<float> all(kRows * kWidth);
  ASSERT_EQ(model_->Pull(0, all.data(), all.size()), 0) << model_->last_error();
  for (uint64_t r = 0; r < kRows; ++r) {
    for (uint64_t i = 0; i < kWidth; ++i) {
      const float expected = want.count(r) ? want[r][i] : 0.0f;
      ASSERT_EQ(all[r * kWidth + i], expected) << "row " << r << " value " << i;
    }
  }
}

TEST_F(RowFile, PullGivesEveryIdItsRowInTheOrderGiven) {
  std::vector<float> all(kRows * kWidth);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<float>(i);
  ASSERT_EQ(model_->Push(0, all.data(), all.size()), 0);  // a file stores it
  const std::vector<uint64_t> ids = {kRows - 1, 3, 3, 0, 1500, 4};
  std::vector<float> rows(ids.size() * kWidth);
  ASSERT_EQ(model_->PullRows(ids.data(), ids.size(), kWidth, rows.data()), 0) << model_->last_error();
  for (size_t k = 0; k < ids.size(); ++k) {
    for (uint64_t i = 0; i < kWidth; ++i) ASSERT_EQ(rows[k * kWidth + i], all[ids[k] * kWidth + i]) << k;
  }
}

TEST_F(RowFile, BadBatchesAreRefusedAndSendNothing) {
  const uint64_t past[] = {1, kRows};
  std::vector<float> g(2 * kWidth, 1.0f);
  EXPECT_EQ(model_->PushRows(past, 2, kWidth, g.data()), -ERANGE);
  EXPECT_NE(model_->last_error().find("row id 2048"), std::string::npos) << model_->last_error();
  const uint64_t twice[] = {7, 7};
  g[kWidth] = INFINITY;
  EXPECT_EQ(model_->PushRows(twice, 2, kWidth, g.data()), -EINVAL);
  EXPECT_EQ(model_->PushRows(twice, 2, 0, g.data()), -EINVAL);
  std::vector<float> all(kRows * kWidth, 1.0f);
  ASSERT_EQ(model_->Pull(0, all.data(), all.size()), 0);
  for (float v : all) ASSERT_EQ(v, 0.0f);
}

}  // namespace
}  // namespace blkps
