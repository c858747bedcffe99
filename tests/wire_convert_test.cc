// The 16-bit wire's bulk conversions (wire/include/blkps/wire_convert.h):
// every kernel this CPU can run gives, bit for bit, what the scalar value
// functions of blkps/wire_dtype.hpp give (the reference; wire_dtype_test.cc
// checks those against arithmetic in double): all 65,536 16-bit patterns
// widened, and a sweep of float32 patterns narrowed (every value a 16-bit
// type holds, the ties between neighbours and one step either side, NaNs
// with payloads, Inf, float32 subnormals, the float16 overflow threshold,
// a stride through all 2^32 patterns and random ones), at every alignment
// and length the kernels' tails see, and with FTZ and DAZ set.
#include <gtest/gtest.h>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include <cmath>
#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "blkps/wire_convert.h"
#include "blkps/wire_dtype.hpp"

namespace {

using blkps::wire::BitsFloat;
using blkps::wire::Dtype;
using blkps::wire::FloatBits;
using blkps::wire::Kernel;

uint16_t Narrow1(Dtype t, float f) {
  return t == Dtype::kBfloat16 ? blkps::wire::FloatToBfloat16(f) : blkps::wire::FloatToFloat16(f);
}
float Widen1(Dtype t, uint16_t h) {
  return t == Dtype::kBfloat16 ? blkps::wire::Bfloat16ToFloat(h) : blkps::wire::Float16ToFloat(h);
}

// The float32 patterns the narrowing kernels are checked on.
std::vector<float> Float32Sweep(Dtype t) {
  std::vector<uint32_t> bits;
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float a = Widen1(t, static_cast<uint16_t>(h));
    bits.push_back(FloatBits(a));
    const float b = Widen1(t, static_cast<uint16_t>(h + 1));
    if (h == 0xffff || !std::isfinite(a) || !std::isfinite(b) || std::signbit(a) != std::signbit(b)) continue;
    const uint32_t tie = FloatBits(static_cast<float>((static_cast<double>(a) + b) / 2));
    for (uint32_t u : {tie - 1, tie, tie + 1}) bits.push_back(u);
  }
  for (uint32_t sign : {0u, 0x80000000u}) {
    for (uint32_t u : {0x7f800000u, 0x7f800001u, 0x7fbfffffu, 0x7fc00000u, 0x7fc00001u, 0x7fffffffu, 0x7fa5a5a5u,
                       0x00000001u, 0x007fffffu, 0x00400000u, 0x00800000u, 0x477fefffu, 0x477ff000u, 0x477ff001u,
                       0x33000000u, 0x33000001u, 0x33800000u, 0x387fffffu, 0x38800000u, 0x7f7fffffu}) {
      bits.push_back(sign | u);
    }
    for (uint32_t u = 0; u < 0x00800000u; u += 4093) bits.push_back(sign | u);  // float32 subnormals
  }
  for (uint64_t u = 0; u <= 0xffffffffu; u += 1021) bits.push_back(static_cast<uint32_t>(u));
  std::mt19937 rng(24);
  for (int i = 0; i < 1000000; ++i) bits.push_back(rng());
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = BitsFloat(bits[i]);
  return out;
}

struct Case {
  Kernel kernel;
  Dtype dtype;
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << blkps::wire::KernelName(c.kernel) << " " << blkps::wire::DtypeName(c.dtype);
}

class WireConvert : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!blkps::wire::KernelSupported(GetParam().kernel)) {
      GTEST_SKIP() << "this CPU has no " << blkps::wire::KernelName(GetParam().kernel);
    }
  }
  Kernel kernel() const { return GetParam().kernel; }
  Dtype dtype() const { return GetParam().dtype; }

  // Narrows `in` with the kernel and checks each value and the index of the
  // first non-finite result against the reference.
  void ExpectNarrowMatches(const std::vector<float>& in, size_t offset, size_t n) {
    std::vector<uint16_t> out(offset + n + 1, 0xabcd);
    const size_t bad = blkps::wire::NarrowWith(kernel(), dtype(), in.data() + offset, out.data() + offset, n);
    size_t want_bad = n;
    for (size_t i = 0; i < n; ++i) {
      const uint16_t want = Narrow1(dtype(), in[offset + i]);
      ASSERT_EQ(out[offset + i], want) << "value " << i << " of " << n << ", float32 bits 0x" << std::hex
                                       << FloatBits(in[offset + i]);
      if (want_bad == n && blkps::wire::IsNonFinite16(dtype(), want)) want_bad = i;
    }
    ASSERT_EQ(out[offset + n], 0xabcd) << "wrote past the end";
    if (offset > 0) {
      ASSERT_EQ(out[offset - 1], 0xabcd) << "wrote before the start";
    }
    ASSERT_EQ(bad, want_bad) << "n " << n;
  }

  void ExpectWidenMatches(const std::vector<uint16_t>& in, size_t offset, size_t n) {
    std::vector<float> out(offset + n + 1, 42.0f);
    blkps::wire::WidenWith(kernel(), dtype(), in.data() + offset, out.data() + offset, n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(FloatBits(out[offset + i]), FloatBits(Widen1(dtype(), in[offset + i])))
          << "16-bit 0x" << std::hex << in[offset + i];
    }
    ASSERT_EQ(out[offset + n], 42.0f) << "wrote past the end";
  }
};

TEST_P(WireConvert, WidensEvery16BitPatternAsTheReference) {
  std::vector<uint16_t> all(0x10000);
  for (uint32_t h = 0; h <= 0xffff; ++h) all[h] = static_cast<uint16_t>(h);
  ExpectWidenMatches(all, 0, all.size());
}

TEST_P(WireConvert, NarrowsTheFloat32SweepAsTheReference) {
  const std::vector<float> sweep = Float32Sweep(dtype());
  ExpectNarrowMatches(sweep, 0, sweep.size());
}

TEST_P(WireConvert, EveryAlignmentAndTailLength) {
  std::mt19937 rng(7);
  std::vector<float> floats(200);
  std::vector<uint16_t> halves(200);
  for (float& f : floats) f = std::ldexp(static_cast<float>(rng() % 2001) - 1000.0f, -static_cast<int>(rng() % 40));
  for (uint16_t& h : halves) h = static_cast<uint16_t>(rng());
  for (size_t offset = 0; offset < 4; ++offset) {
    for (size_t n = 0; n <= 130; ++n) {
      ExpectNarrowMatches(floats, offset, n);
      ExpectWidenMatches(halves, offset, n);
    }
  }
}

TEST_P(WireConvert, ReportsTheFirstNonFiniteResultAnywhere) {
  // Positions in the first check block, a later block, and the scalar tail.
  const size_t n = 3 * 4096 + 21;
  for (size_t at : {size_t{0}, size_t{4095}, size_t{4096}, size_t{9000}, n - 5, n - 1}) {
    for (float poison : {std::nanf(""), -INFINITY, 1e30f}) {
      std::vector<float> in(n, 0.5f);
      in[at] = poison;
      if (at + 3 < n) in[at + 3] = std::nanf("");  // a later one does not count
      std::vector<uint16_t> out(n);
      const size_t want = dtype() == Dtype::kBfloat16 && poison == 1e30f ? n : at;  // 1e30 overflows float16 only
      EXPECT_EQ(blkps::wire::NarrowWith(kernel(), dtype(), in.data(), out.data(), n),
                want == n && at + 3 < n ? at + 3 : want)
          << "at " << at << " poison " << poison;
    }
  }
}

// The 16-bit check a WRITE of a 16-bit LUN gets before any of it is widened:
// every pattern, at a position that moves with it, in arrays of lengths
// that end in every tail, against IsNonFinite16.
TEST_P(WireConvert, FindsEveryNonFinite16BitPatternAsTheReference) {
  const uint16_t one = dtype() == Dtype::kBfloat16 ? 0x3f80 : 0x3c00;
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const size_t n = 1 + h % 70, at = h % n;
    std::vector<uint16_t> v(n, one);
    v[at] = static_cast<uint16_t>(h);
    const size_t want = blkps::wire::IsNonFinite16(dtype(), v[at]) ? at : n;
    ASSERT_EQ(blkps::wire::FirstNonFinite16With(kernel(), dtype(), v.data(), n), want) << std::hex << "0x" << h;
  }
}

TEST_P(WireConvert, Finds16BitNonFiniteInEveryCheckBlockAndTail) {
  const uint16_t one = dtype() == Dtype::kBfloat16 ? 0x3f80 : 0x3c00;
  const uint16_t inf = dtype() == Dtype::kBfloat16 ? 0x7f80 : 0x7c00;
  const size_t n = 3 * 4096 + 21;
  for (size_t offset = 0; offset < 3; ++offset) {
    for (size_t at : {size_t{0}, size_t{15}, size_t{4095}, size_t{4096}, size_t{9000}, n - 5, n - 1}) {
      for (uint16_t poison : {inf, static_cast<uint16_t>(inf | 0x8001), static_cast<uint16_t>(inf | 0x8000)}) {
        std::vector<uint16_t> v(offset + n, one);
        v[offset + at] = poison;
        if (at + 3 < n) v[offset + at + 3] = inf;  // a later one does not count
        EXPECT_EQ(blkps::wire::FirstNonFinite16With(kernel(), dtype(), v.data() + offset, n), at)
            << "at " << at << " offset " << offset << " poison 0x" << std::hex << poison;
        EXPECT_EQ(blkps::wire::FirstNonFinite16With(kernel(), dtype(), v.data() + offset, at), at) << "stops at n";
      }
    }
  }
}

#if defined(__x86_64__)
// PyTorch and others may set FTZ and DAZ (torch.set_flush_denormal): the
// wire's results must not change.
TEST_P(WireConvert, IgnoresFlushToZeroAndDenormalsAreZero) {
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040);  // FTZ | DAZ
  const std::vector<float> sweep = Float32Sweep(dtype());
  std::vector<uint16_t> narrow(sweep.size());
  blkps::wire::NarrowWith(kernel(), dtype(), sweep.data(), narrow.data(), sweep.size());
  std::vector<uint16_t> all(0x10000);
  for (uint32_t h = 0; h <= 0xffff; ++h) all[h] = static_cast<uint16_t>(h);
  std::vector<float> wide(all.size());
  blkps::wire::WidenWith(kernel(), dtype(), all.data(), wide.data(), all.size());
  _mm_setcsr(saved);
  for (size_t i = 0; i < sweep.size(); ++i) {
    ASSERT_EQ(narrow[i], Narrow1(dtype(), sweep[i])) << "float32 bits 0x" << std::hex << FloatBits(sweep[i]);
  }
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    ASSERT_EQ(FloatBits(wide[h]), FloatBits(Widen1(dtype(), static_cast<uint16_t>(h)))) << std::hex << h;
  }
}
#endif

INSTANTIATE_TEST_SUITE_P(
    KernelsAndTypes, WireConvert,
    ::testing::Values(Case{Kernel::kScalar, Dtype::kBfloat16}, Case{Kernel::kScalar, Dtype::kFloat16},
                      Case{Kernel::kAvx2, Dtype::kBfloat16}, Case{Kernel::kAvx2, Dtype::kFloat16},
                      Case{Kernel::kAvx512, Dtype::kBfloat16}, Case{Kernel::kAvx512, Dtype::kFloat16}),
    [](const ::testing::TestParamInfo<Case>& info) {
      return std::string(blkps::wire::KernelName(info.param.kernel)) + "_" + blkps::wire::DtypeName(info.param.dtype);
    });

TEST(WireConvertChoice, TheActiveKernelRunsOnThisCpu) {
  EXPECT_TRUE(blkps::wire::KernelSupported(blkps::wire::ActiveKernel()));
  EXPECT_TRUE(blkps::wire::KernelSupported(Kernel::kScalar));
}

TEST(WireConvertChoice, TheDefaultFunctionsUseTheActiveKernel) {
  const std::vector<float> in = {1.0f, std::nanf(""), 3.0f};
  std::vector<uint16_t> out(in.size());
  EXPECT_EQ(blkps::wire::Narrow(Dtype::kBfloat16, in.data(), out.data(), in.size()), 1u);
  EXPECT_EQ(out[0], 0x3f80);
  std::vector<float> back(in.size());
  blkps::wire::Widen(Dtype::kBfloat16, out.data(), back.data(), out.size());
  EXPECT_EQ(back[2], 3.0f);
}

}  // namespace
