// Unit tests for libblkps that need no server: TransferPlan (cutting a byte
// range into block-aligned requests) run against an in-memory disk, and
// blkps::Model over a temporary regular file.

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "blkps/model.hpp"
#include "transfer_plan.h"

namespace blkps {
namespace {

constexpr uint32_t kBlock = 512;

// A disk in memory: runs requests the way a Device does.
class MemoryDisk {
 public:
  explicit MemoryDisk(size_t size, uint8_t fill = 0) : bytes_(size, fill) {}

  void Run(Direction direction, const std::vector<IoRequest>& requests) {
    for (const IoRequest& request : requests) {
      uint64_t offset = request.offset;
      for (int i = 0; i < request.iovcnt; ++i) {
        const iovec& iov = request.iov[i];
        if (direction == Direction::kRead) {
          memcpy(iov.iov_base, bytes_.data() + offset, iov.iov_len);
        } else {
          memcpy(bytes_.data() + offset, iov.iov_base, iov.iov_len);
        }
        offset += iov.iov_len;
      }
    }
  }

  std::vector<uint8_t>& bytes() { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

std::vector<uint8_t> Pattern(size_t size, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(size);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(1 + rng() % 255);  // != 0
  return bytes;
}

bool PointsInto(const iovec& iov, const void* buffer, size_t size) {
  const uint8_t* base = static_cast<const uint8_t*>(iov.iov_base);
  const uint8_t* begin = static_cast<const uint8_t*>(buffer);
  return base >= begin && base + iov.iov_len <= begin + size;
}

TEST(TransferPlan, AlignedRangeGoesStraightFromCallerMemory) {
  std::vector<uint8_t> buffer(8 * kBlock);
  TransferPlan plan(Direction::kWrite, 4 * kBlock, buffer.data(), buffer.size(),
                    kBlock, 1 << 20);
  ASSERT_EQ(plan.requests().size(), 1u);
  const IoRequest& request = plan.requests()[0];
  EXPECT_EQ(request.offset, 4u * kBlock);
  EXPECT_EQ(request.length, buffer.size());
  ASSERT_EQ(request.iovcnt, 1);
  EXPECT_EQ(request.iov[0].iov_base, buffer.data());
}

TEST(TransferPlan, SplitsIntoRequestsOfRequestBytes) {
  std::vector<uint8_t> buffer(10 * kBlock);
  TransferPlan plan(Direction::kRead, 0, buffer.data(), buffer.size(), kBlock,
                    4 * kBlock);
  ASSERT_EQ(plan.requests().size(), 3u);
  EXPECT_EQ(plan.requests()[0].offset, 0u);
  EXPECT_EQ(plan.requests()[0].length, 4u * kBlock);
  EXPECT_EQ(plan.requests()[1].offset, 4u * kBlock);
  EXPECT_EQ(plan.requests()[1].length, 4u * kBlock);
  EXPECT_EQ(plan.requests()[2].offset, 8u * kBlock);
  EXPECT_EQ(plan.requests()[2].length, 2u * kBlock);
}

TEST(TransferPlan, RoundsRequestBytesDownToWholeBlocks) {
  std::vector<uint8_t> buffer(3 * kBlock);
  TransferPlan plan(Direction::kRead, 0, buffer.data(), buffer.size(), kBlock,
                    kBlock + 100);
  ASSERT_EQ(plan.requests().size(), 3u);
  for (const IoRequest& request : plan.requests()) {
    EXPECT_EQ(request.length, kBlock);
  }
}

TEST(TransferPlan, RangeInsideOneBlockIsOneBlockRequest) {
  std::vector<uint8_t> buffer(40);
  TransferPlan plan(Direction::kRead, kBlock + 100, buffer.data(),
                    buffer.size(), kBlock, 1 << 20);
  ASSERT_EQ(plan.requests().size(), 1u);
  EXPECT_EQ(plan.requests()[0].offset, kBlock);
  EXPECT_EQ(plan.requests()[0].length, kBlock);
  EXPECT_EQ(plan.requests()[0].iovcnt, 1);
  EXPECT_FALSE(
      PointsInto(plan.requests()[0].iov[0], buffer.data(), buffer.size()));
}

TEST(TransferPlan, UnalignedWritePadsPartialBlocksWithZeros) {
  MemoryDisk disk(8 * kBlock, 0xAA);
  const std::vector<uint8_t> data = Pattern(3 * kBlock, 1);
  const uint64_t offset = kBlock + 100;
  TransferPlan plan(Direction::kWrite, offset,
                    const_cast<uint8_t*>(data.data()), data.size(), kBlock,
                    1 << 20);
  disk.Run(Direction::kWrite, plan.requests());

  const uint64_t end = offset + data.size();
  for (uint64_t i = 0; i < disk.bytes().size(); ++i) {
    if (i >= offset && i < end) {
      ASSERT_EQ(disk.bytes()[i], data[i - offset]) << "byte " << i;
    } else if (i >= kBlock && i < 5 * kBlock) {
      ASSERT_EQ(disk.bytes()[i], 0) << "padding byte " << i;
    } else {
      ASSERT_EQ(disk.bytes()[i], 0xAA) << "untouched byte " << i;
    }
  }
}

TEST(TransferPlan, UnalignedReadCopiesOnlyTheRequestedBytes) {
  MemoryDisk disk(8 * kBlock);
  disk.bytes() = Pattern(8 * kBlock, 2);
  const uint64_t offset = 300, length = 2 * kBlock + 5;
  std::vector<uint8_t> buffer(length + 16, 0xEE);  // 16 guard bytes
  TransferPlan plan(Direction::kRead, offset, buffer.data(), length, kBlock,
                    1 << 20);
  disk.Run(Direction::kRead, plan.requests());
  plan.FinishRead();

  EXPECT_EQ(0, memcmp(buffer.data(), disk.bytes().data() + offset, length));
  for (size_t i = length; i < buffer.size(); ++i) ASSERT_EQ(buffer[i], 0xEE);
}

TEST(TransferPlan, UnalignedRangeMovesItsMiddleWithoutCopy) {
  std::vector<uint8_t> buffer(4 * kBlock);
  TransferPlan plan(Direction::kRead, 10, buffer.data(), buffer.size(), kBlock,
                    1 << 20);
  ASSERT_EQ(plan.requests().size(), 1u);
  const IoRequest& request = plan.requests()[0];
  ASSERT_EQ(request.iovcnt, 3);  // head bounce, caller's middle, tail bounce
  EXPECT_EQ(request.iov[1].iov_base, buffer.data() + (kBlock - 10));
  EXPECT_EQ(request.iov[1].iov_len, 3u * kBlock);
}

// Random ranges, block and request sizes: requests tile the covering blocks,
// and a write then a read through plans reproduce the data.
TEST(TransferPlan, RandomRangesRoundTrip) {
  std::mt19937_64 rng(20261101);
  for (int trial = 0; trial < 2000; ++trial) {
    const uint32_t block = (rng() % 2) ? 512 : 4096;
    const uint64_t disk_size = 64 * block;
    const uint64_t offset = rng() % (disk_size - 1);
    const uint64_t length = 1 + rng() % (disk_size - offset);
    const uint64_t request_bytes = block * (1 + rng() % 9) + rng() % block;
    SCOPED_TRACE("block " + std::to_string(block) + " offset " +
                 std::to_string(offset) + " length " + std::to_string(length) +
                 " request_bytes " + std::to_string(request_bytes));

    std::vector<uint8_t> data = Pattern(length, static_cast<uint32_t>(trial));
    MemoryDisk disk(disk_size, 0xAA);
    TransferPlan write(Direction::kWrite, offset, data.data(), length, block,
                       request_bytes);
    uint64_t expected_offset = offset / block * block;
    for (const IoRequest& request : write.requests()) {
      ASSERT_EQ(request.offset, expected_offset);
      ASSERT_EQ(request.length % block, 0u);
      ASSERT_LE(request.length, request_bytes / block * block);
      uint64_t iov_bytes = 0;
      for (int i = 0; i < request.iovcnt; ++i)
        iov_bytes += request.iov[i].iov_len;
      ASSERT_EQ(iov_bytes, request.length);
      expected_offset += request.length;
    }
    ASSERT_EQ(expected_offset, (offset + length + block - 1) / block * block);
    disk.Run(Direction::kWrite, write.requests());

    std::vector<uint8_t> back(length);
    TransferPlan read(Direction::kRead, offset, back.data(), length, block,
                      request_bytes);
    disk.Run(Direction::kRead, read.requests());
    read.FinishRead();
    ASSERT_EQ(back, data);
  }
}

// blkps::Model over a temporary regular file.
class ModelOnFile : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmpdir = getenv("TMPDIR");
    path_ = std::string(tmpdir != nullptr ? tmpdir : "/tmp") +
            "/blkps_learner_unit_XXXXXX";
    const int fd = mkstemp(&path_[0]);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, kParams * sizeof(float)), 0);
    close(fd);
    std::string error;
    model_ = Model::Open(path_, OpenOptions(), &error);
    ASSERT_NE(model_, nullptr) << error;
  }
  void TearDown() override { unlink(path_.c_str()); }

  static constexpr uint64_t kParams = 4096;
  std::string path_;
  std::unique_ptr<Model> model_;
};

TEST_F(ModelOnFile, ReportsSizeAndBlockSize) {
  EXPECT_EQ(model_->size_bytes(), kParams * sizeof(float));
  EXPECT_EQ(model_->logical_block_size(), 512u);
}

TEST_F(ModelOnFile, UnalignedPushLeavesNeighboursAsZeroGradients) {
  std::vector<float> weights(kParams, 7.0f);
  ASSERT_EQ(model_->Push(0, weights.data(), kParams),
            0);  // a plain file stores
  std::vector<float> grad(100, -1.0f);
  ASSERT_EQ(model_->Push(130, grad.data(), grad.size()), 0);

  std::vector<float> back(kParams);
  ASSERT_EQ(model_->Pull(0, back.data(), kParams), 0);
  for (uint64_t i = 0; i < kParams; ++i) {
    // Block 1 holds parameters [128, 256): padded with zeros around the push.
    const float want = (i >= 130 && i < 230)   ? -1.0f
                       : (i >= 128 && i < 256) ? 0.0f
                                               : 7.0f;
    ASSERT_EQ(back[i], want) << "parameter " << i;
  }
}

TEST_F(ModelOnFile, PullOfUnalignedRangeReturnsExactlyThoseParameters) {
  std::vector<float> weights(kParams);
  for (uint64_t i = 0; i < kParams; ++i) weights[i] = static_cast<float>(i);
  ASSERT_EQ(model_->Push(0, weights.data(), kParams), 0);
  std::vector<float> back(301, -1.0f);
  ASSERT_EQ(model_->Pull(1001, back.data(), 300), 0);
  for (uint64_t i = 0; i < 300; ++i) ASSERT_EQ(back[i], 1001.0f + i);
  EXPECT_EQ(back[300], -1.0f);
}

TEST_F(ModelOnFile, RangePastTheEndIsERangeAndTransfersNothing) {
  std::vector<float> buffer(2, 5.0f);
  EXPECT_EQ(model_->Push(kParams - 1, buffer.data(), 2), -ERANGE);
  EXPECT_NE(model_->last_error().find("past the end"), std::string::npos);
  EXPECT_EQ(model_->Pull(UINT64_MAX, buffer.data(), 2), -ERANGE);
  EXPECT_EQ(model_->Pull(0, buffer.data(), UINT64_MAX), -ERANGE);
  std::vector<float> back(1, 1.0f);
  ASSERT_EQ(model_->Pull(kParams - 1, back.data(), 1), 0);
  EXPECT_EQ(back[0], 0.0f);
}

TEST_F(ModelOnFile, UnalignedByteTransferIsEInval) {
  std::vector<uint8_t> buffer(1024);
  EXPECT_EQ(model_->ReadBytes(100, buffer.data(), 512), -EINVAL);
  EXPECT_EQ(model_->WriteBytes(0, buffer.data(), 100), -EINVAL);
  EXPECT_NE(model_->last_error().find("logical block size 512"),
            std::string::npos);
  EXPECT_EQ(model_->ReadBytes(model_->size_bytes(), buffer.data(), 512),
            -ERANGE);
}

TEST(ModelOpen, MissingFileFailsWithOneLineMessage) {
  std::string error;
  int code = 0;
  EXPECT_EQ(
      Model::Open("/nonexistent/blkps-model", OpenOptions(), &error, &code),
      nullptr);
  EXPECT_EQ(code, -ENOENT);
  EXPECT_EQ(error.rfind("blkps: ", 0), 0u) << error;
  EXPECT_EQ(error.find('\n'), std::string::npos);
}

TEST(ModelOpen, UnknownSchemeIsEInval) {
  std::string error;
  int code = 0;
  EXPECT_EQ(Model::Open("nbd://host/export", OpenOptions(), &error, &code),
            nullptr);
  EXPECT_EQ(code, -EINVAL);
  EXPECT_NE(error.find("iscsi://"), std::string::npos) << error;
}

}  // namespace
}  // namespace blkps
