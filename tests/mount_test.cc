// SplitWriteAssembler (learner/mount/): the pieces of a write, cut anywhere
// and arriving in any order or concurrently, reach the device as whole
// blocks, each exactly once. No server: the "device" here records blocks.

#include "split_write_assembler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <thread>
#include <vector>

namespace blkps {
namespace {

constexpr uint32_t kBlock = 512;

// Records what reaches the device: whole blocks only, each at most once.
class RecordingDevice {
 public:
  explicit RecordingDevice(uint64_t size) : bytes_(size, 0), sends_(size / kBlock, 0) {}

  void WriteDirect(uint64_t begin, uint64_t end, const uint8_t* data) {
    ASSERT_EQ(begin % kBlock, 0u);
    ASSERT_EQ(end % kBlock, 0u);
    std::lock_guard<std::mutex> lock(mutex_);
    memcpy(bytes_.data() + begin, data, end - begin);
    for (uint64_t b = begin / kBlock; b < end / kBlock; ++b) ++sends_[b];
  }
  void Write(const Drained& drained) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const ReadyBlock& block : drained.blocks) {
      ASSERT_EQ(block.offset % kBlock, 0u);
      ASSERT_EQ(block.bytes.size(), kBlock);
      memcpy(bytes_.data() + block.offset, block.bytes.data(), kBlock);
      ++sends_[block.offset / kBlock];
    }
  }
  void Apply(SplitWriteAssembler::PieceResult result, uint64_t offset, const uint8_t* data) {
    if (result.direct_end > result.direct_begin) {
      WriteDirect(result.direct_begin, result.direct_end, data + (result.direct_begin - offset));
    }
    Write(result.drained);
  }
  const std::vector<uint8_t>& bytes() const { return bytes_; }
  const std::vector<int>& sends() const { return sends_; }

 private:
  std::mutex mutex_;
  std::vector<uint8_t> bytes_;
  std::vector<int> sends_;
};

std::vector<uint8_t> Pattern(size_t length, uint32_t seed) {
  std::vector<uint8_t> data(length);
  std::mt19937 random(seed);
  for (uint8_t& byte : data) byte = static_cast<uint8_t>(random() | 1);  // never 0
  return data;
}

// Cuts [0, length) at `cuts` random byte positions.
std::vector<std::pair<uint64_t, uint64_t>> RandomPieces(uint64_t length, int cuts, std::mt19937* random) {
  std::vector<uint64_t> at = {0, length};
  for (int i = 0; i < cuts; ++i) at.push_back(1 + (*random)() % (length - 1));
  std::sort(at.begin(), at.end());
  at.erase(std::unique(at.begin(), at.end()), at.end());
  std::vector<std::pair<uint64_t, uint64_t>> pieces;
  for (size_t i = 0; i + 1 < at.size(); ++i) pieces.emplace_back(at[i], at[i + 1]);
  return pieces;
}

TEST(SplitWriteAssembler, WholeBlocksGoStraightThrough) {
  SplitWriteAssembler assembler(kBlock, 4);
  std::vector<uint8_t> data = Pattern(4 * kBlock, 1);
  auto result = assembler.AddPiece(kBlock, data.data(), data.size(), 1);
  EXPECT_EQ(result.direct_begin, kBlock);
  EXPECT_EQ(result.direct_end, 5 * kBlock);
  EXPECT_TRUE(result.drained.blocks.empty());
  EXPECT_EQ(assembler.pending_blocks(), 0u);
}

TEST(SplitWriteAssembler, BlockSplitInsideAFloatIsSentOnceWhenComplete) {
  SplitWriteAssembler assembler(kBlock, 4);
  std::vector<uint8_t> data = Pattern(kBlock, 2);
  auto first = assembler.AddPiece(0, data.data(), 301, 1);  // cuts float 75
  EXPECT_TRUE(first.drained.blocks.empty());
  EXPECT_EQ(assembler.pending_blocks(), 1u);
  auto second = assembler.AddPiece(301, data.data() + 301, kBlock - 301, 1);
  ASSERT_EQ(second.drained.blocks.size(), 1u);
  EXPECT_EQ(second.drained.blocks[0].bytes, data);
  EXPECT_EQ(assembler.pending_blocks(), 0u);
  EXPECT_TRUE(assembler.TakeAll().blocks.empty());
}

TEST(SplitWriteAssembler, PartialBlockOfWholeFloatsIsZeroCompletedAtFlush) {
  SplitWriteAssembler assembler(kBlock, 4);
  std::vector<uint8_t> data = Pattern(100, 3);
  assembler.AddPiece(kBlock + 8, data.data(), 100, 7);
  EXPECT_TRUE(assembler.TakeOwnedBy(8).blocks.empty());  // another open file
  Drained drained = assembler.TakeOwnedBy(7);
  ASSERT_EQ(drained.blocks.size(), 1u);
  EXPECT_TRUE(drained.dropped.empty());
  std::vector<uint8_t> expected(kBlock, 0);
  memcpy(expected.data() + 8, data.data(), 100);
  EXPECT_EQ(drained.blocks[0].offset, kBlock);
  EXPECT_EQ(drained.blocks[0].bytes, expected);
  EXPECT_EQ(assembler.pending_blocks(), 0u);
}

TEST(SplitWriteAssembler, PartlyWrittenFloatIsDroppedAtFlushWithAMessage) {
  SplitWriteAssembler assembler(kBlock, 4);
  std::vector<uint8_t> data = Pattern(10, 4);
  assembler.AddPiece(0, data.data(), 10, 1);  // float at byte 8 half written
  Drained drained = assembler.TakeAll();
  EXPECT_TRUE(drained.blocks.empty());
  ASSERT_EQ(drained.dropped.size(), 1u);
  EXPECT_NE(drained.dropped[0].find("float at byte 8"), std::string::npos) << drained.dropped[0];
  EXPECT_EQ(assembler.pending_blocks(), 0u);
}

// A 16-bit LUN's file (blkps-mount --dtype): a value is 2 bytes, so bytes
// 8..9 are whole, and byte 10 alone is half of one.
TEST(SplitWriteAssembler, SixteenBitFilesCheckTwoByteValues) {
  SplitWriteAssembler assembler(kBlock, 2);
  std::vector<uint8_t> data = Pattern(11, 4);
  assembler.AddPiece(0, data.data(), 10, 1);
  Drained whole = assembler.TakeAll();
  ASSERT_EQ(whole.blocks.size(), 1u);
  EXPECT_TRUE(whole.dropped.empty());
  assembler.AddPiece(0, data.data(), 11, 1);
  Drained drained = assembler.TakeAll();
  EXPECT_TRUE(drained.blocks.empty());
  ASSERT_EQ(drained.dropped.size(), 1u);
  EXPECT_NE(drained.dropped[0].find("16-bit value at byte 10"), std::string::npos) << drained.dropped[0];
}

TEST(SplitWriteAssembler, ByteFilesZeroCompleteAnyPartialBlock) {
  SplitWriteAssembler assembler(kBlock, 0);  // e.g. the control LUN
  const char command[] = "lr=0.001\n";
  assembler.AddPiece(65536, reinterpret_cast<const uint8_t*>(command), 9, 1);
  Drained drained = assembler.TakeOwnedBy(1);
  ASSERT_EQ(drained.blocks.size(), 1u);
  EXPECT_EQ(memcmp(drained.blocks[0].bytes.data(), command, 9), 0);
  EXPECT_EQ(drained.blocks[0].bytes[9], 0);
}

TEST(SplitWriteAssembler, ReadTakesOverlappingWholeFloatBlocksOnly) {
  SplitWriteAssembler assembler(kBlock, 4);
  std::vector<uint8_t> data = Pattern(kBlock, 5);
  assembler.AddPiece(0, data.data(), 8, 1);           // whole floats
  assembler.AddPiece(2 * kBlock, data.data(), 6, 1);  // a partial float
  assembler.AddPiece(4 * kBlock, data.data(), 8, 1);  // outside the read
  Drained drained = assembler.TakeOverlapping(0, 3 * kBlock);
  ASSERT_EQ(drained.blocks.size(), 1u);
  EXPECT_EQ(drained.blocks[0].offset, 0u);
  EXPECT_TRUE(drained.dropped.empty());
  EXPECT_EQ(assembler.pending_blocks(), 2u);  // still waiting for the rest
}

TEST(SplitWriteAssembler, SecondGradientForTheSameBytesPushesTheFirstOut) {
  SplitWriteAssembler assembler(kBlock, 4);
  std::vector<uint8_t> a = Pattern(16, 6), b = Pattern(16, 7);
  assembler.AddPiece(0, a.data(), 16, 1);
  auto result = assembler.AddPiece(8, b.data(), 16, 1);  // overlaps bytes 8..15
  ASSERT_EQ(result.drained.blocks.size(), 1u);
  EXPECT_EQ(memcmp(result.drained.blocks[0].bytes.data(), a.data(), 16), 0);
  Drained rest = assembler.TakeAll();
  ASSERT_EQ(rest.blocks.size(), 1u);
  EXPECT_EQ(memcmp(rest.blocks[0].bytes.data() + 8, b.data(), 16), 0);
  EXPECT_EQ(rest.blocks[0].bytes[0], 0);
}

// The property: any write, cut at random bytes into pieces that arrive in a
// random order, reaches the device whole, every block exactly once.
TEST(SplitWriteAssembler, RandomSplitsInRandomOrderArriveExactlyOnce) {
  std::mt19937 random(42);
  for (int round = 0; round < 200; ++round) {
    const uint64_t device_size = 64 * kBlock;
    const uint64_t offset = random() % (8 * kBlock) / 4 * 4;
    const uint64_t length = (1 + random() % (device_size - offset - 1)) / 4 * 4 + 4;
    if (offset + length > device_size) continue;
    std::vector<uint8_t> data = Pattern(length, round);
    auto pieces = RandomPieces(length, 1 + random() % 12, &random);
    std::shuffle(pieces.begin(), pieces.end(), random);
    SplitWriteAssembler assembler(kBlock, 4);
    RecordingDevice device(device_size);
    for (auto [begin, end] : pieces) {
      device.Apply(assembler.AddPiece(offset + begin, data.data() + begin, end - begin, 1), offset + begin,
                   data.data() + begin);
    }
    Drained rest = assembler.TakeOwnedBy(1);
    ASSERT_TRUE(rest.dropped.empty()) << rest.dropped[0];
    device.Write(rest);
    for (uint64_t b = 0; b < device_size / kBlock; ++b) {
      const bool touched = b * kBlock < offset + length && (b + 1) * kBlock > offset;
      ASSERT_EQ(device.sends()[b], touched ? 1 : 0) << "round " << round << " block " << b;
    }
    ASSERT_EQ(memcmp(device.bytes().data() + offset, data.data(), length), 0);
    ASSERT_EQ(assembler.pending_blocks(), 0u);
  }
}

TEST(SplitWriteAssembler, ConcurrentPiecesArriveExactlyOnce) {
  const uint64_t device_size = 1024 * kBlock;
  std::mt19937 random(7);
  std::vector<uint8_t> data = Pattern(device_size, 9);
  auto pieces = RandomPieces(device_size, 3000, &random);
  std::shuffle(pieces.begin(), pieces.end(), random);
  SplitWriteAssembler assembler(kBlock, 4);
  RecordingDevice device(device_size);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < pieces.size(); i += 4) {
        auto [begin, end] = pieces[i];
        device.Apply(assembler.AddPiece(begin, data.data() + begin, end - begin, 1), begin, data.data() + begin);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(assembler.pending_blocks(), 0u);
  EXPECT_EQ(device.sends(), std::vector<int>(device_size / kBlock, 1));
  EXPECT_EQ(device.bytes(), data);
}

}  // namespace
}  // namespace blkps
