// Unit tests for libblkps that need no server: TransferPlan (cutting a byte
// range into block-aligned requests) run against an in-memory disk, and
// blkps::Model and the file device (libaio, O_DIRECT) over temporary files.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "blkps/blkps.h"
#include "blkps/byte_size.hpp"
#include "blkps/model.hpp"
#include "device.h"
#include "scsi_sense.h"
#include "transfer_plan.h"

namespace blkps {
namespace {

constexpr uint32_t kBlock = 512;

TEST(ByteSize, ParsesNumbersAndBinarySuffixes) {
  uint64_t bytes = 0;
  EXPECT_TRUE(ParseByteSize("4096", &bytes));
  EXPECT_EQ(bytes, 4096u);
  EXPECT_TRUE(ParseByteSize("64k", &bytes));
  EXPECT_EQ(bytes, 64u << 10);
  EXPECT_TRUE(ParseByteSize("1M", &bytes));
  EXPECT_EQ(bytes, 1u << 20);
  EXPECT_TRUE(ParseByteSize("2G", &bytes));
  EXPECT_EQ(bytes, 2ull << 30);
}

TEST(ByteSize, RefusesAnythingElseAndLeavesTheOutput) {
  for (const char* bad : {"", "M", "-1", " 1", "1 ", "1X", "1MB", "1.5M", "18446744073709551616", "17179869184G"}) {
    uint64_t bytes = 7;
    EXPECT_FALSE(ParseByteSize(bad, &bytes)) << bad;
    EXPECT_EQ(bytes, 7u) << bad;
  }
}

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
  TransferPlan plan(Direction::kWrite, 4 * kBlock, buffer.data(), buffer.size(), kBlock, 1 << 20);
  ASSERT_EQ(plan.requests().size(), 1u);
  const IoRequest& request = plan.requests()[0];
  EXPECT_EQ(request.offset, 4u * kBlock);
  EXPECT_EQ(request.length, buffer.size());
  ASSERT_EQ(request.iovcnt, 1);
  EXPECT_EQ(request.iov[0].iov_base, buffer.data());
}

TEST(TransferPlan, SplitsIntoRequestsOfRequestBytes) {
  std::vector<uint8_t> buffer(10 * kBlock);
  TransferPlan plan(Direction::kRead, 0, buffer.data(), buffer.size(), kBlock, 4 * kBlock);
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
  TransferPlan plan(Direction::kRead, 0, buffer.data(), buffer.size(), kBlock, kBlock + 100);
  ASSERT_EQ(plan.requests().size(), 3u);
  for (const IoRequest& request : plan.requests()) {
    EXPECT_EQ(request.length, kBlock);
  }
}

TEST(TransferPlan, RangeInsideOneBlockIsOneBlockRequest) {
  std::vector<uint8_t> buffer(40);
  TransferPlan plan(Direction::kRead, kBlock + 100, buffer.data(), buffer.size(), kBlock, 1 << 20);
  ASSERT_EQ(plan.requests().size(), 1u);
  EXPECT_EQ(plan.requests()[0].offset, kBlock);
  EXPECT_EQ(plan.requests()[0].length, kBlock);
  EXPECT_EQ(plan.requests()[0].iovcnt, 1);
  EXPECT_FALSE(PointsInto(plan.requests()[0].iov[0], buffer.data(), buffer.size()));
}

TEST(TransferPlan, UnalignedWritePadsPartialBlocksWithZeros) {
  MemoryDisk disk(8 * kBlock, 0xAA);
  const std::vector<uint8_t> data = Pattern(3 * kBlock, 1);
  const uint64_t offset = kBlock + 100;
  TransferPlan plan(Direction::kWrite, offset, const_cast<uint8_t*>(data.data()), data.size(), kBlock, 1 << 20);
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

// The padding each request carries, for pushed_bytes_lost (issue 25, D7).
TEST(TransferPlan, RequestsSayHowMuchPaddingTheyCarry) {
  const std::vector<uint8_t> data = Pattern(3 * kBlock, 1);
  const uint64_t offset = kBlock + 100;  // 100 bytes of head padding, kBlock - 100 of tail
  TransferPlan plan(Direction::kWrite, offset, const_cast<uint8_t*>(data.data()), data.size(), kBlock, 2 * kBlock);
  ASSERT_EQ(plan.requests().size(), 2u);
  EXPECT_EQ(plan.requests()[0].padding_head, 100u);
  EXPECT_EQ(plan.requests()[0].padding_tail, 0u);
  EXPECT_EQ(plan.requests()[1].padding_head, 0u);
  EXPECT_EQ(plan.requests()[1].padding_tail, kBlock - 100);
  uint64_t data_bytes = 0;
  for (const IoRequest& r : plan.requests()) data_bytes += r.length - r.padding_head - r.padding_tail;
  EXPECT_EQ(data_bytes, data.size());
  TransferPlan aligned(Direction::kWrite, kBlock, const_cast<uint8_t*>(data.data()), data.size(), kBlock, 1 << 20);
  EXPECT_EQ(aligned.requests()[0].padding_head + aligned.requests()[0].padding_tail, 0u);
}

TEST(TransferPlan, UnalignedReadCopiesOnlyTheRequestedBytes) {
  MemoryDisk disk(8 * kBlock);
  disk.bytes() = Pattern(8 * kBlock, 2);
  const uint64_t offset = 300, length = 2 * kBlock + 5;
  std::vector<uint8_t> buffer(length + 16, 0xEE);  // 16 guard bytes
  TransferPlan plan(Direction::kRead, offset, buffer.data(), length, kBlock, 1 << 20);
  disk.Run(Direction::kRead, plan.requests());
  plan.FinishRead();

  EXPECT_EQ(0, memcmp(buffer.data(), disk.bytes().data() + offset, length));
  for (size_t i = length; i < buffer.size(); ++i) ASSERT_EQ(buffer[i], 0xEE);
}

TEST(TransferPlan, UnalignedRangeMovesItsMiddleWithoutCopy) {
  std::vector<uint8_t> buffer(4 * kBlock);
  TransferPlan plan(Direction::kRead, 10, buffer.data(), buffer.size(), kBlock, 1 << 20);
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
    SCOPED_TRACE("block " + std::to_string(block) + " offset " + std::to_string(offset) + " length " +
                 std::to_string(length) + " request_bytes " + std::to_string(request_bytes));

    std::vector<uint8_t> data = Pattern(length, static_cast<uint32_t>(trial));
    MemoryDisk disk(disk_size, 0xAA);
    TransferPlan write(Direction::kWrite, offset, data.data(), length, block, request_bytes);
    uint64_t expected_offset = offset / block * block;
    for (const IoRequest& request : write.requests()) {
      ASSERT_EQ(request.offset, expected_offset);
      ASSERT_EQ(request.length % block, 0u);
      ASSERT_LE(request.length, request_bytes / block * block);
      uint64_t iov_bytes = 0;
      for (int i = 0; i < request.iovcnt; ++i) iov_bytes += request.iov[i].iov_len;
      ASSERT_EQ(iov_bytes, request.length);
      expected_offset += request.length;
    }
    ASSERT_EQ(expected_offset, (offset + length + block - 1) / block * block);
    disk.Run(Direction::kWrite, write.requests());

    std::vector<uint8_t> back(length);
    TransferPlan read(Direction::kRead, offset, back.data(), length, block, request_bytes);
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
    path_ = std::string(tmpdir != nullptr ? tmpdir : "/tmp") + "/blkps_learner_unit_XXXXXX";
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
    const float want = (i >= 130 && i < 230) ? -1.0f : (i >= 128 && i < 256) ? 0.0f : 7.0f;
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
  EXPECT_NE(model_->last_error().find("logical block size 512"), std::string::npos);
  EXPECT_EQ(model_->ReadBytes(model_->size_bytes(), buffer.data(), 512), -ERANGE);
}

// Push16/Pull16 (and the C API's blkps_push16/blkps_pull16): the 16-bit
// values travel as they are, at byte 2*i; Pull widens what Push16 wrote as
// blkps/wire_dtype.hpp says.
TEST_F(ModelOnFile, SixteenBitValuesTravelAsTheyAre) {
  for (const char* dtype : {"bfloat16", "float16"}) {
    SCOPED_TRACE(dtype);
    OpenOptions options;
    options.dtype = dtype;
    std::string error;
    std::unique_ptr<Model> model = Model::Open(path_, options, &error);
    ASSERT_NE(model, nullptr) << error;
    wire::Dtype t = wire::Dtype::kFloat32;
    ASSERT_TRUE(wire::ParseDtype(dtype, &t));
    std::vector<uint16_t> values(1000);
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<uint16_t>(0x3c00 + 7 * i);  // finite
    ASSERT_EQ(model->Push16(10, values.data(), values.size()), 0) << model->last_error();
    std::vector<uint16_t> back(values.size());
    ASSERT_EQ(model->Pull16(10, back.data(), back.size()), 0);
    EXPECT_EQ(back, values);
    std::vector<float> wide(values.size());
    ASSERT_EQ(model->Pull(10, wide.data(), wide.size()), 0);
    for (size_t i = 0; i < values.size(); ++i) {
      ASSERT_EQ(wire::FloatBits(wide[i]),
                wire::FloatBits(t == wire::Dtype::kBfloat16 ? wire::Bfloat16ToFloat(values[i])
                                                            : wire::Float16ToFloat(values[i])));
    }
    const uint16_t inf = t == wire::Dtype::kBfloat16 ? 0x7f80 : 0x7c00;
    std::vector<uint16_t> bad = {0x3c00, inf};
    EXPECT_EQ(model->Push16(0, bad.data(), bad.size()), -EINVAL);
    EXPECT_NE(model->last_error().find("parameter 1 is infinite"), std::string::npos) << model->last_error();
    ASSERT_EQ(model->Pull16(0, back.data(), 2), 0);
    EXPECT_EQ(back[0], 0u) << "a refused push16 sent something";
    blkps_model* c = nullptr;
    blkps_open_options copts = {};
    copts.dtype = dtype;
    ASSERT_EQ(blkps_open(path_.c_str(), &copts, &c, nullptr, 0), 0);
    std::vector<uint16_t> via_c(values.size());
    ASSERT_EQ(blkps_pull16(c, 10, via_c.data(), via_c.size()), 0);
    EXPECT_EQ(via_c, values);
    ASSERT_EQ(blkps_push16(c, 10, values.data(), 1), 0);
    blkps_close(c);
  }
  std::vector<uint16_t> some(4);
  EXPECT_EQ(model_->Push16(0, some.data(), some.size()), -EINVAL);
  EXPECT_NE(model_->last_error().find("the device is float32"), std::string::npos);
  EXPECT_EQ(model_->Pull16(0, some.data(), some.size()), -EINVAL);
}

TEST(ModelOpen, MissingFileFailsWithOneLineMessage) {
  std::string error;
  int code = 0;
  EXPECT_EQ(Model::Open("/nonexistent/blkps-model", OpenOptions(), &error, &code), nullptr);
  EXPECT_EQ(code, -ENOENT);
  EXPECT_EQ(error.rfind("blkps: ", 0), 0u) << error;
  EXPECT_EQ(error.find('\n'), std::string::npos);
}

TEST(ModelOpen, UnknownSchemeIsEInval) {
  std::string error;
  int code = 0;
  EXPECT_EQ(Model::Open("nbd://host/export", OpenOptions(), &error, &code), nullptr);
  EXPECT_EQ(code, -EINVAL);
  EXPECT_NE(error.find("iscsi://"), std::string::npos) << error;
}

// A file of `size` bytes filled with `fill` in `dir`; removed by the caller.
std::string MakeFile(const std::string& dir, const std::vector<uint8_t>& fill) {
  std::string path = dir + "/blkps_file_device_XXXXXX";
  const int fd = mkstemp(&path[0]);
  EXPECT_GE(fd, 0) << dir;
  if (fd < 0) return "";
  EXPECT_EQ(pwrite(fd, fill.data(), fill.size(), 0), static_cast<ssize_t>(fill.size()));
  close(fd);
  return path;
}

std::vector<uint8_t> ReadFile(const std::string& path, size_t size) {
  std::vector<uint8_t> bytes(size);
  const int fd = open(path.c_str(), O_RDONLY);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(pread(fd, bytes.data(), size, 0), static_cast<ssize_t>(size));
  close(fd);
  return bytes;
}

std::string TmpDir() {
  const char* tmpdir = getenv("TMPDIR");
  return tmpdir != nullptr ? tmpdir : "/tmp";
}

struct IoShape {
  uint32_t request_bytes;
  uint32_t queue_depth;
};

// Pushes parameters [first, first + count) from a buffer `skew` bytes past
// an aligned address, checks every byte of the file, and pulls them back into
// a buffer with the same skew.
void ExpectRoundTrip(const std::string& dir, IoShape shape, uint64_t first, uint64_t count, size_t skew,
                     uint32_t seed) {
  SCOPED_TRACE(dir + " request_bytes " + std::to_string(shape.request_bytes) + " queue_depth " +
               std::to_string(shape.queue_depth) + " params [" + std::to_string(first) + ", +" + std::to_string(count) +
               ") skew " + std::to_string(skew));
  constexpr size_t kFileBytes = 4 << 20;
  const std::vector<uint8_t> before = Pattern(kFileBytes, seed);
  const std::string path = MakeFile(dir, before);
  ASSERT_FALSE(path.empty());
  OpenOptions options;
  options.request_bytes = shape.request_bytes;
  options.queue_depth = shape.queue_depth;
  std::string error;
  std::unique_ptr<Model> model = Model::Open(path, options, &error);
  ASSERT_NE(model, nullptr) << error;

  const size_t bytes = count * sizeof(float);
  std::vector<uint8_t> out(bytes + 64);  // vector data is 16-byte aligned
  const std::vector<uint8_t> data = Pattern(bytes, seed + 1);
  memcpy(out.data() + skew, data.data(), bytes);
  ASSERT_EQ(model->Push(first, reinterpret_cast<const float*>(out.data() + skew), count), 0) << model->last_error();

  // Partial blocks around the range are padded with zeros; nothing else moves.
  std::vector<uint8_t> want = before;
  const uint64_t begin = first * sizeof(float);
  const uint64_t end = begin + bytes;
  const uint64_t pad_begin = begin / kBlock * kBlock;
  const uint64_t pad_end = (end + kBlock - 1) / kBlock * kBlock;
  memset(want.data() + pad_begin, 0, pad_end - pad_begin);
  memcpy(want.data() + begin, data.data(), bytes);
  const std::vector<uint8_t> on_disk = ReadFile(path, kFileBytes);
  for (size_t i = 0; i < kFileBytes; ++i) {
    ASSERT_EQ(on_disk[i], want[i]) << "file byte " << i;
  }

  std::vector<uint8_t> in(bytes + 64, 0xee);
  ASSERT_EQ(model->Pull(first, reinterpret_cast<float*>(in.data() + skew), count), 0) << model->last_error();
  ASSERT_EQ(memcmp(in.data() + skew, data.data(), bytes), 0);
  for (size_t i = 0; i < skew; ++i) ASSERT_EQ(in[i], 0xee);
  for (size_t i = skew + bytes; i < in.size(); ++i) ASSERT_EQ(in[i], 0xee);
  unlink(path.c_str());
}

const IoShape kShapes[] = {{4 << 10, 1}, {64 << 10, 4}, {1 << 20, 16}};

TEST(FileDevice, RoundTripIsExactForEveryRequestShape) {
  for (const IoShape& shape : kShapes) {
    for (size_t skew : {0, 4}) {
      // Aligned whole file, aligned middle, unaligned start and end.
      ExpectRoundTrip(TmpDir(), shape, 0, 1 << 20, skew, 1);
      ExpectRoundTrip(TmpDir(), shape, 1024, 300000, skew, 2);
      ExpectRoundTrip(TmpDir(), shape, 1001, 654321, skew, 3);
      ExpectRoundTrip(TmpDir(), shape, 130, 100, skew, 4);
    }
  }
}

TEST(FileDevice, RoundTripIsExactOnTmpfs) {
  for (const IoShape& shape : kShapes) {
    ExpectRoundTrip("/dev/shm", shape, 1001, 654321, 4, 5);
  }
}

// Records the flags of every open and refuses O_DIRECT as tmpfs did before
// Linux 6.6.
std::vector<int> open_flags;
int OpenRefusingDirect(const char* path, int flags) {
  open_flags.push_back(flags);
  if ((flags & O_DIRECT) != 0) {
    errno = EINVAL;
    return -1;
  }
  return open(path, flags);
}
int OpenRecording(const char* path, int flags) {
  open_flags.push_back(flags);
  return open(path, flags);
}

TEST(FileDevice, OpensWithODirect) {
  const std::string path = MakeFile(TmpDir(), std::vector<uint8_t>(8192));
  open_flags.clear();
  Status status;
  std::unique_ptr<Device> device = OpenFileDeviceWith(path, OpenRecording, &status);
  ASSERT_NE(device, nullptr) << status.message();
  ASSERT_FALSE(open_flags.empty());
  EXPECT_NE(open_flags[0] & O_DIRECT, 0);
  unlink(path.c_str());
}

TEST(FileDevice, RefusedODirectFallsBackToBufferedAndSaysSoOnce) {
  constexpr size_t kBytes = 1 << 20;
  const std::vector<uint8_t> before = Pattern(kBytes, 6);
  const std::string path = MakeFile("/dev/shm", before);
  open_flags.clear();
  Status status;
  ::testing::internal::CaptureStderr();
  std::unique_ptr<Device> device = OpenFileDeviceWith(path, OpenRefusingDirect, &status);
  ASSERT_NE(device, nullptr) << status.message();

  // Unaligned memory, unaligned range, several requests in flight.
  const std::vector<uint8_t> data = Pattern(100000, 7);
  std::vector<uint8_t> out(data.size() + 8);
  memcpy(out.data() + 4, data.data(), data.size());
  {
    TransferPlan plan(Direction::kWrite, 1000, out.data() + 4, data.size(), kBlock, 16 << 10);
    ASSERT_TRUE(device->Transfer(Direction::kWrite, plan.requests(), 4).ok());
  }
  std::vector<uint8_t> in(data.size() + 8);
  {
    TransferPlan plan(Direction::kRead, 1000, in.data() + 4, data.size(), kBlock, 16 << 10);
    ASSERT_TRUE(device->Transfer(Direction::kRead, plan.requests(), 4).ok());
    plan.FinishRead();
  }
  const std::string said = ::testing::internal::GetCapturedStderr();

  EXPECT_EQ(memcmp(in.data() + 4, data.data(), data.size()), 0);
  const std::vector<uint8_t> on_disk = ReadFile(path, kBytes);
  EXPECT_EQ(memcmp(on_disk.data() + 1000, data.data(), data.size()), 0);
  EXPECT_EQ(memcmp(on_disk.data() + 1024 * 100, before.data() + 1024 * 100, kBytes - 1024 * 100), 0);
  EXPECT_EQ(said.rfind("blkps: ", 0), 0u) << said;
  EXPECT_NE(said.find("O_DIRECT"), std::string::npos) << said;
  EXPECT_EQ(said.find('\n'), said.size() - 1) << "one line: " << said;
  ASSERT_EQ(open_flags.size(), 2u);
  EXPECT_EQ(open_flags[1] & O_DIRECT, 0);
  unlink(path.c_str());
}

TEST(FileDevice, ShrunkFileFailsWithEndOfFile) {
  const std::string path = MakeFile(TmpDir(), std::vector<uint8_t>(1 << 20, 1));
  OpenOptions options;
  options.request_bytes = 64 << 10;
  options.queue_depth = 4;
  std::string error;
  std::unique_ptr<Model> model = Model::Open(path, options, &error);
  ASSERT_NE(model, nullptr) << error;
  ASSERT_EQ(truncate(path.c_str(), 256 << 10), 0);

  std::vector<float> weights((1 << 20) / sizeof(float));
  EXPECT_EQ(model->Pull(0, weights.data(), weights.size()), -EIO);
  EXPECT_NE(model->last_error().find("end of file"), std::string::npos) << model->last_error();
  EXPECT_EQ(model->last_error().find('\n'), std::string::npos);
  // The part still on the file reads fine.
  EXPECT_EQ(model->Pull(0, weights.data(), (256 << 10) / sizeof(float)), 0) << model->last_error();
  unlink(path.c_str());
}

// A measurement, not a check: run with --gtest_also_run_disabled_tests.
TEST(FileDevice, DISABLED_PrintsThroughputOf64MiBPushAndPull) {
  constexpr size_t kBytes = 64 << 20;
  const std::string path = MakeFile(TmpDir(), std::vector<uint8_t>(kBytes));
  std::vector<float> buffer(kBytes / sizeof(float), 1.0f);
  auto mib_per_s = [](std::chrono::steady_clock::duration elapsed) {
    return 64.0 / std::chrono::duration<double>(elapsed).count();
  };
  auto now = [] { return std::chrono::steady_clock::now(); };

  OpenOptions options;
  options.request_bytes = 1 << 20;
  options.queue_depth = 16;
  std::string error;
  std::unique_ptr<Model> model = Model::Open(path, options, &error);
  ASSERT_NE(model, nullptr) << error;
  // The vector's memory is not 512-byte aligned (malloc): it goes through the
  // bounce buffers. `aligned` goes straight to the device.
  float* aligned = static_cast<float*>(aligned_alloc(4096, kBytes));
  ASSERT_NE(aligned, nullptr);
  memset(aligned, 0, kBytes);
  for (int round = 0; round < 3; ++round) {
    auto start = now();
    ASSERT_EQ(model->Push(0, aligned, buffer.size()), 0);
    ASSERT_EQ(model->Sync(), 0);
    const double push = mib_per_s(now() - start);
    start = now();
    ASSERT_EQ(model->Pull(0, aligned, buffer.size()), 0);
    const double pull = mib_per_s(now() - start);
    start = now();
    ASSERT_EQ(model->Push(0, buffer.data(), buffer.size()), 0);
    ASSERT_EQ(model->Sync(), 0);
    const double bounced_push = mib_per_s(now() - start);
    start = now();
    ASSERT_EQ(model->Pull(0, buffer.data(), buffer.size()), 0);
    const double bounced_pull = mib_per_s(now() - start);

    // Plain buffered pwrite/pread in 1 MiB pieces, one at a time.
    const int fd = open(path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    uint8_t* bytes = reinterpret_cast<uint8_t*>(buffer.data());
    start = now();
    for (size_t off = 0; off < kBytes; off += 1 << 20) {
      ASSERT_EQ(pwrite(fd, bytes + off, 1 << 20, off), 1 << 20);
    }
    ASSERT_EQ(fsync(fd), 0);
    const double plain_push = mib_per_s(now() - start);
    start = now();
    for (size_t off = 0; off < kBytes; off += 1 << 20) {
      ASSERT_EQ(pread(fd, bytes + off, 1 << 20, off), 1 << 20);
    }
    const double warm_pull = mib_per_s(now() - start);
    ASSERT_EQ(posix_fadvise(fd, 0, kBytes, POSIX_FADV_DONTNEED), 0);
    start = now();
    for (size_t off = 0; off < kBytes; off += 1 << 20) {
      ASSERT_EQ(pread(fd, bytes + off, 1 << 20, off), 1 << 20);
    }
    const double cold_pull = mib_per_s(now() - start);
    close(fd);
    printf("round %d: libaio O_DIRECT 1 MiB x 16: push+fsync %.0f MiB/s, "
           "pull %.0f MiB/s (aligned memory), %.0f and %.0f MiB/s (bounced) "
           "| pwrite/pread 1 MiB: push+fsync %.0f MiB/s, pull %.0f MiB/s "
           "from the page cache, %.0f MiB/s after dropping it\n",
           round, push, pull, bounced_push, bounced_pull, plain_push, warm_pull, cold_pull);
  }
  free(aligned);
  unlink(path.c_str());
}

// CHAP secrets in a URL never reach a message.
TEST(MaskTarget, HidesCredentialsAndQueryOnly) {
  EXPECT_EQ(MaskTarget("iscsi://user%sec-ret-123456@127.0.0.1:3260/iqn.2026-11.io.blkps:model/1"),
            "iscsi://***@127.0.0.1:3260/iqn.2026-11.io.blkps:model/1");
  EXPECT_EQ(MaskTarget("iscsi://u%s@h/iqn.x/1?target_user=t&target_password=p"), "iscsi://***@h/iqn.x/1?***");
  EXPECT_EQ(MaskTarget("iscsi://h:1/iqn.x:a@b/1"), "iscsi://h:1/iqn.x:a@b/1");  // '@' after the host
  EXPECT_EQ(MaskTarget("/dev/sdb"), "/dev/sdb");
}

TEST(MaskTarget, ABadUrlWithASecretIsRefusedWithoutShowingIt) {
  Status status;
  EXPECT_EQ(OpenDevice("iscsi://user%Leaky-Secret-1@", "", &status), nullptr);
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(status.message().find("Leaky-Secret-1"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("bad target URL"), std::string::npos) << status.message();
}

TEST(ChapFile, ReadsCredentialsAndRefusesAnOpenFileOrUnknownKeys) {
  char tmpl[] = "/tmp/blkps-chap-XXXXXX";
  const int fd = mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  const std::string path = tmpl;
  const std::string text = "# comment\nuser=u\nsecret=s-123456789012\ntarget_user=t\ntarget_secret=t-123456789012\n";
  ASSERT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  close(fd);
  ChapCredentials chap;
  ASSERT_TRUE(ReadChapFile(path, &chap).ok());
  EXPECT_EQ(chap.user, "u");
  EXPECT_EQ(chap.secret, "s-123456789012");
  EXPECT_EQ(chap.target_user, "t");
  EXPECT_EQ(chap.target_secret, "t-123456789012");
  chmod(path.c_str(), 0640);
  Status s = ReadChapFile(path, &chap);
  EXPECT_NE(s.message().find("readable by group or others"), std::string::npos) << s.message();
  chmod(path.c_str(), 0600);
  FILE* f = fopen(path.c_str(), "w");
  fputs("user=u\npassword=s-123456789012\n", f);
  fclose(f);
  s = ReadChapFile(path, &chap);
  EXPECT_NE(s.message().find(":2: expected user="), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find("s-123456789012"), std::string::npos) << s.message();
  unlink(path.c_str());
}

// D8: doc/server.md's sample, inline comment included, reads as it says.
TEST(ChapFile, InlineCommentsAreNotPartOfTheValue) {
  char tmpl[] = "/tmp/blkps-chap-XXXXXX";
  const int fd = mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  const std::string path = tmpl;
  const std::string text =
      "# blkps CHAP credentials: key=value lines, '#' comments\nuser=learner\nsecret=learner#Secret1  # a '#' in a "
      "secret stays\ntarget_user=server            # mutual CHAP: the target must prove these\n"
      "target_secret=server-Secret22\t\n   \n  # indented comment\n";
  ASSERT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  close(fd);
  ChapCredentials chap;
  ASSERT_TRUE(ReadChapFile(path, &chap).ok());
  EXPECT_EQ(chap.user, "learner");
  EXPECT_EQ(chap.secret, "learner#Secret1");
  EXPECT_EQ(chap.target_user, "server");
  EXPECT_EQ(chap.target_secret, "server-Secret22");
  FILE* f = fopen(path.c_str(), "w");
  fputs("user=u\nsecret=two words-12345\n", f);
  fclose(f);
  Status s = ReadChapFile(path, &chap);
  EXPECT_NE(s.message().find(":2: a value holds a space"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find("words-12345"), std::string::npos) << s.message();
  unlink(path.c_str());
}

// D6: every sense the blkps server sends reads as key, ASC/ASCQ and meaning;
// no "(null)".
TEST(ScsiSense, EverySenseTheServerSendsHasAMeaning) {
  EXPECT_EQ(ScsiSenseMessage(3, 0x0c00),
            "MEDIUM ERROR / WRITE ERROR (asc/ascq 0x0c00): the server could not write its checkpoint (its log and "
            "status say why)");
  // bs_blkps.c's complete_io: key, ASC/ASCQ of each blkps_io_result.
  const std::pair<int, int> sent[] = {{5, 0x2100}, {5, 0x2600}, {2, 0x3a00}, {11, 0x2e00},
                                      {2, 0x0403}, {7, 0x2700}, {3, 0x0c00}, {5, 0x2000}};
  for (const auto& [key, asc] : sent) {
    const std::string m = ScsiSenseMessage(key, asc);
    EXPECT_EQ(m.find("(null)"), std::string::npos) << m;
    EXPECT_NE(m.find(" / "), std::string::npos) << m;
    EXPECT_EQ(m.find("not a sense the blkps server sends"), std::string::npos) << m;
  }
  EXPECT_EQ(ScsiSenseMessage(9, 0x8001).rfind("VENDOR SPECIFIC (asc/ascq 0x8001): not a sense", 0), 0u);
  EXPECT_EQ(ScsiSenseMessage(99, 0).rfind("UNKNOWN SENSE KEY", 0), 0u);
}

}  // namespace
}  // namespace blkps

// The control LUN's codec (blkps/control_lun.h): the server's encoders and
// the one reader of the counters record and of receipts, for libblkps and
// (through it) Python.
static blkps_control_receipt SampleReceipt(uint64_t lun) {
  blkps_control_receipt fields = {}, r;
  fields.lun = lun;
  fields.writes_applied = 7;
  blkps_control_receipt_encode(fields, &r);
  return r;
}

TEST(ControlCodec, WhatTheServerEncodesDecodes) {
  std::vector<char> page(BLKPS_CONTROL_RECEIPT_HEADER_BYTES);
  blkps_control_receipt header = {};
  header.lun = 3;
  header.writes_applied = 11;
  header.writes_in_progress = 2;
  blkps_control_receipt_encode(header, page.data());
  EXPECT_EQ(std::string(page.data(), 8), BLKPS_CONTROL_RECEIPT_MAGIC);
  blkps_control_receipt r = {};
  ASSERT_EQ(blkps_control_receipt_decode(page.data(), page.size(), 3, &r), 0);
  EXPECT_EQ(r.writes_applied, 11u);
  EXPECT_EQ(r.writes_in_progress, 2u);
  EXPECT_EQ(r.record_bytes, sizeof r);
  std::vector<char> region(BLKPS_CONTROL_COUNTERS_BYTES);
  blkps_control_counters counters = {};
  counters.global_step = 5;
  counters.stop = 1;
  blkps_control_counters_encode(counters, region.data());
  blkps_control_counters c = {};
  ASSERT_EQ(blkps_control_counters_decode(region.data(), region.size(), &c), 0);
  EXPECT_EQ(c.global_step, 5u);
  EXPECT_EQ(c.stop, 1u);
  EXPECT_EQ(c.format_version, BLKPS_CONTROL_FORMAT_VERSION);
}

TEST(ControlCodec, ReceiptDecodesForItsLunOnly) {
  const blkps_control_receipt r = SampleReceipt(2);
  std::vector<char> page(BLKPS_CONTROL_RECEIPT_HEADER_BYTES);
  std::memcpy(page.data(), &r, sizeof r);
  blkps_control_receipt out = {};
  ASSERT_EQ(blkps_control_receipt_decode(page.data(), page.size(), 2, &out), 0);
  EXPECT_EQ(out.writes_applied, 7u);
  out.writes_applied = 99;
  EXPECT_EQ(blkps_control_receipt_decode(page.data(), page.size(), 1, &out), -1);
  EXPECT_EQ(out.writes_applied, 99u) << "a refused decode leaves *out untouched";
  EXPECT_EQ(blkps_control_receipt_decode(page.data(), sizeof r - 1, 2, &out), -1) << "a short read";
}

TEST(ControlCodec, ReceiptOfAnotherFormatIsRefused) {
  blkps_control_receipt r = SampleReceipt(1), out;
  r.format_version = BLKPS_CONTROL_FORMAT_VERSION + 1;
  EXPECT_EQ(blkps_control_receipt_decode(&r, sizeof r, 1, &out), -1);
  r = SampleReceipt(1);
  r.record_bytes = sizeof r - 8;
  EXPECT_EQ(blkps_control_receipt_decode(&r, sizeof r, 1, &out), -1);
  r = SampleReceipt(1);
  r.magic[0] = 'X';
  EXPECT_EQ(blkps_control_receipt_decode(&r, sizeof r, 1, &out), -1);
}

TEST(ControlCodec, CountersTakeALongerRecordOfTheSameFormat) {
  blkps_control_counters c = {};
  std::memcpy(c.magic, BLKPS_CONTROL_COUNTERS_MAGIC, sizeof c.magic);
  c.format_version = BLKPS_CONTROL_FORMAT_VERSION;
  c.record_bytes = sizeof c + 8;  // a later format's appended counter
  c.global_step = 12;
  std::vector<char> region(BLKPS_CONTROL_COUNTERS_BYTES);
  std::memcpy(region.data(), &c, sizeof c);
  blkps_control_counters out = {};
  ASSERT_EQ(blkps_control_counters_decode(region.data(), region.size(), &out), 0);
  EXPECT_EQ(out.global_step, 12u);
  region[0] = 'X';
  EXPECT_EQ(blkps_control_counters_decode(region.data(), region.size(), &out), -1);
}

TEST(ControlCodec, ReceiptOffsetIsTheLayouts) {
  const uint64_t device = 4000000;
  EXPECT_EQ(blkps_control_receipt_offset(device, 0), blkps_control_receipts_offset(device));
  EXPECT_EQ(blkps_control_receipt_offset(device, 3),
            blkps_control_receipts_offset(device) + 3 * blkps_control_receipt_bytes(device));
}
