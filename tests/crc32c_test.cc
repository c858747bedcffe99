// Crc32c: published vectors, hardware against portable at awkward lengths
// and alignments, and extending a CRC.
#include "crc32c.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace blkps::server {
namespace {

std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// The vector every CRC catalogue gives, and those of RFC 3720, B.4 (iSCSI).
TEST(Crc32cTest, MatchesPublishedVectors) {
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending += static_cast<char>(i);
    descending += static_cast<char>(31 - i);
  }
  const std::vector<std::pair<std::string, uint32_t>> vectors = {
      {"123456789", 0xE3069283},
      {"", 0x00000000},
      {std::string(32, '\0'), 0x8A9136AA},
      {std::string(32, '\xff'), 0x62A8AB43},
      {ascending, 0x46DD794E},
      {descending, 0x113FDB5C},
  };
  for (const auto& [data, crc] : vectors) {
    EXPECT_EQ(Crc32c(0, data.data(), data.size()), crc) << data.size() << " bytes";
    EXPECT_EQ(detail::Crc32cPortable(0, data.data(), data.size()), crc) << data.size() << " bytes";
    if (detail::CpuHasCrc32cInstruction()) {
      EXPECT_EQ(detail::Crc32cSse42(0, data.data(), data.size()), crc) << data.size() << " bytes";
    }
  }
}

TEST(Crc32cTest, HardwareMatchesPortableAtOddLengthsAndAlignments) {
  if (!detail::CpuHasCrc32cInstruction()) GTEST_SKIP() << "this CPU has no SSE4.2";
  const std::string buf = RandomBytes((1 << 20) + 64, 7);
  // Around the hardware loop's joints: 3 x 256 and 3 x 8192 byte runs.
  const std::vector<size_t> lengths = {0,   1,   2,    3,    5,     7,     8,     9,     15,    17,    255,    767,
                                       768, 769, 1543, 8191, 24575, 24576, 24577, 49153, 50000, 98311, 1 << 20};
  std::mt19937 rng(11);
  for (size_t offset = 0; offset < 16; ++offset) {
    for (size_t len : lengths) {
      const uint32_t start = offset % 2 ? static_cast<uint32_t>(rng()) : 0;
      const char* p = buf.data() + offset;
      EXPECT_EQ(detail::Crc32cSse42(start, p, len), detail::Crc32cPortable(start, p, len))
          << "offset " << offset << ", length " << len;
    }
  }
}

TEST(Crc32cTest, ExtendingEqualsOneCall) {
  const std::string buf = RandomBytes(100000, 3);
  const uint32_t whole = Crc32c(0, buf.data(), buf.size());
  for (size_t split : {size_t{0}, size_t{1}, size_t{4095}, size_t{24577}, buf.size()}) {
    const uint32_t first = Crc32c(0, buf.data(), split);
    EXPECT_EQ(Crc32c(first, buf.data() + split, buf.size() - split), whole) << split;
  }
}

TEST(Crc32cTest, CombiningEqualsOneCall) {
  const std::string buf = RandomBytes(100000, 4);
  const uint32_t whole = Crc32c(0, buf.data(), buf.size());
  for (size_t split : {size_t{0}, size_t{1}, size_t{4095}, size_t{24577}, buf.size()}) {
    const uint32_t a = Crc32c(0, buf.data(), split);
    const uint32_t b = Crc32c(0, buf.data() + split, buf.size() - split);
    EXPECT_EQ(Crc32cCombine(a, b, buf.size() - split), whole) << split;
  }
}

// Not a pass/fail test: prints the rate, which a checkpoint's CRC costs.
TEST(Crc32cTest, ThroughputOn64MiB) {
  const std::string buf = RandomBytes(64 << 20, 5);
  auto rate = [&buf](uint32_t (*crc)(uint32_t, const void*, size_t)) {
    double best = 1e9;
    uint32_t sink = 0;
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      sink ^= crc(0, buf.data(), buf.size());
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    EXPECT_NE(sink, 0x12345678u);  // keeps the calls
    return buf.size() / best / 1e6;
  };
  std::printf("Crc32c: %.0f MB/s (%s); portable: %.0f MB/s\n", rate(&Crc32c),
              detail::CpuHasCrc32cInstruction() ? "SSE4.2" : "no SSE4.2", rate(&detail::Crc32cPortable));
}

}  // namespace
}  // namespace blkps::server
