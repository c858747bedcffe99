// The 16-bit wire's conversions (wire/include/blkps/wire_dtype.hpp; the
// bulk ones of wire_convert.h with the process's kernel):
// every 16-bit pattern round-trips, and narrowing rounds to nearest even as a
// reference computed in double does.
#include "blkps/wire_dtype.hpp"

#include "blkps/wire_convert.h"

#include <gtest/gtest.h>

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace {

using blkps::wire::BitsFloat;
using blkps::wire::Dtype;
using blkps::wire::FloatBits;

// The type's geometry for the reference.
struct Geometry {
  int mantissa_bits;  // explicit fraction bits
  int min_exponent;   // exponent of the smallest normal
  double max_finite;
};
Geometry GeometryOf(Dtype t) {
  if (t == Dtype::kBfloat16) return {7, -126, std::ldexp(255.0 / 128.0, 127)};
  return {10, -14, 65504.0};
}

uint16_t Narrow1(Dtype t, float f) {
  return t == Dtype::kBfloat16 ? blkps::wire::FloatToBfloat16(f) : blkps::wire::FloatToFloat16(f);
}
float Widen1(Dtype t, uint16_t h) {
  return t == Dtype::kBfloat16 ? blkps::wire::Bfloat16ToFloat(h) : blkps::wire::Float16ToFloat(h);
}

// The value f rounds to in type t, by arithmetic in double: the spacing of t
// at f's magnitude, then nearbyint (ties to even in the default rounding
// mode). An unbounded-exponent result above the largest finite value is Inf.
double ReferenceRound(Dtype t, float f) {
  const Geometry g = GeometryOf(t);
  const double x = f;
  if (x == 0) return x;
  int e = std::ilogb(x);
  if (e < g.min_exponent) e = g.min_exponent;
  const double ulp = std::ldexp(1.0, e - g.mantissa_bits);
  const double r = std::nearbyint(x / ulp) * ulp;  // x / ulp is exact
  if (std::fabs(r) > g.max_finite) return std::copysign(std::numeric_limits<double>::infinity(), x);
  return r;
}

void ExpectRoundsAsReference(Dtype t, float f) {
  const float got = Widen1(t, Narrow1(t, f));
  const double want = ReferenceRound(t, f);
  ASSERT_EQ(static_cast<double>(got), want)
      << blkps::wire::DtypeName(t) << " of " << f << " (bits 0x" << std::hex << FloatBits(f) << ")";
  ASSERT_EQ(std::signbit(got), std::signbit(f)) << f;
}

class WireDtype : public ::testing::TestWithParam<Dtype> {};

TEST_P(WireDtype, EveryBitPatternRoundTrips) {
  const Dtype t = GetParam();
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const float f = Widen1(t, bits);
    const uint16_t back = Narrow1(t, f);
    if (std::isnan(f)) {
      // A NaN stays NaN, with its sign and payload, made quiet.
      const uint16_t quiet = t == Dtype::kBfloat16 ? 0x0040 : 0x0200;
      ASSERT_EQ(back, bits | quiet) << std::hex << h;
      ASSERT_TRUE(blkps::wire::IsNonFinite16(t, bits));
    } else {
      ASSERT_EQ(back, bits) << std::hex << h;
      ASSERT_EQ(blkps::wire::IsNonFinite16(t, bits), std::isinf(f)) << std::hex << h;
    }
  }
}

// For every pair of neighbouring finite 16-bit values: the float32 exactly
// half way (a tie), one float32 step either side of it, and the values
// themselves.
TEST_P(WireDtype, TiesAndNeighboursRoundToNearestEven) {
  const Dtype t = GetParam();
  for (uint32_t h = 0; h < 0xffff; ++h) {
    const float a = Widen1(t, static_cast<uint16_t>(h));
    const float b = Widen1(t, static_cast<uint16_t>(h + 1));
    if (!std::isfinite(a) || !std::isfinite(b) || std::signbit(a) != std::signbit(b)) continue;
    const double mid = (static_cast<double>(a) + b) / 2;
    const float tie = static_cast<float>(mid);
    if (static_cast<double>(tie) != mid) continue;  // not a float32 (never for these types)
    for (float f : {a, tie, std::nextafter(tie, 0.0f), std::nextafter(tie, 2 * tie), b}) {
      ExpectRoundsAsReference(t, f);
    }
  }
}

TEST_P(WireDtype, RandomFloatsRoundToNearestEven) {
  const Dtype t = GetParam();
  std::mt19937 rng(14);
  for (int i = 0; i < 2000000; ++i) {
    const float f = BitsFloat(rng());
    if (std::isnan(f)) continue;
    ExpectRoundsAsReference(t, f);
  }
}

TEST_P(WireDtype, SmallIntegersAreExact) {
  const Dtype t = GetParam();
  for (int i = -256; i <= 256; ++i) {
    const float f = static_cast<float>(i);
    EXPECT_EQ(Widen1(t, Narrow1(t, f)), f) << i;
  }
}

TEST_P(WireDtype, ArrayConversionsMatchTheScalarOnes) {
  const Dtype t = GetParam();
  std::vector<float> in = {0.0f, -0.0f, 1.0f, 3.14159f, -1e-7f, 1e30f, std::numeric_limits<float>::infinity()};
  std::vector<uint16_t> narrow(in.size());
  blkps::wire::Narrow(t, in.data(), narrow.data(), in.size());
  std::vector<float> wide(in.size());
  blkps::wire::Widen(t, narrow.data(), wide.data(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(narrow[i], Narrow1(t, in[i])) << i;
    EXPECT_EQ(FloatBits(wide[i]), FloatBits(Widen1(t, narrow[i]))) << i;
  }
}

TEST_P(WireDtype, FirstNonFiniteFindsTheFirstNanOrInf) {
  const Dtype t = GetParam();
  std::vector<uint16_t> v(10000, Narrow1(t, 1.0f));
  EXPECT_EQ(blkps::wire::FirstNonFinite16(t, v.data(), v.size()), v.size());
  v[9000] = Narrow1(t, std::numeric_limits<float>::quiet_NaN());
  v[5000] = Narrow1(t, -std::numeric_limits<float>::infinity());
  EXPECT_EQ(blkps::wire::FirstNonFinite16(t, v.data(), v.size()), 5000u);
  EXPECT_EQ(blkps::wire::FirstNonFinite16(t, v.data(), 5000), 5000u);
}

// float32, the check of every gradient before the server applies it and
// before libblkps sends a push_rows batch: the first NaN or infinity, in any
// place of a chunk, or n; the largest finite values and the smallest
// subnormals pass.
TEST(WireFloat32, FirstNonFiniteFindsTheFirstNanOrInf) {
  std::vector<float> v(5000, 1.0f);
  v[10] = std::numeric_limits<float>::max();
  v[11] = -std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(blkps::wire::FirstNonFinite32(v.data(), v.size()), v.size());
  for (size_t at : {size_t{0}, size_t{1023}, size_t{1024}, size_t{4999}}) {
    std::vector<float> w = v;
    w[at] = std::numeric_limits<float>::quiet_NaN();
    if (at + 1 < w.size()) w[at + 1] = std::numeric_limits<float>::infinity();
    EXPECT_EQ(blkps::wire::FirstNonFinite32(w.data(), w.size()), at) << at;
    EXPECT_EQ(blkps::wire::FirstNonFinite32(w.data(), at), at) << "stops at n";
    w[at] = -std::numeric_limits<float>::infinity();
    EXPECT_EQ(blkps::wire::FirstNonFinite32(w.data(), w.size()), at) << at;
  }
}

INSTANTIATE_TEST_SUITE_P(Types, WireDtype, ::testing::Values(Dtype::kBfloat16, Dtype::kFloat16),
                         [](const ::testing::TestParamInfo<Dtype>& info) {
                           return std::string(blkps::wire::DtypeName(info.param));
                         });

TEST(WireDtypeFloat16, KnownValues) {
  EXPECT_EQ(blkps::wire::FloatToFloat16(65504.0f), 0x7bff);
  EXPECT_EQ(blkps::wire::FloatToFloat16(65519.99f), 0x7bff);
  EXPECT_EQ(blkps::wire::FloatToFloat16(65520.0f), 0x7c00);  // the tie rounds to even: Inf
  EXPECT_EQ(blkps::wire::FloatToFloat16(-1e10f), 0xfc00);
  EXPECT_EQ(blkps::wire::FloatToFloat16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(blkps::wire::FloatToFloat16(std::ldexp(1.0f, -25)), 0x0000);  // the tie: to even, zero
  EXPECT_EQ(blkps::wire::FloatToFloat16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(blkps::wire::FloatToFloat16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie below: even
  EXPECT_EQ(blkps::wire::FloatToFloat16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie above: even
}

TEST(WireDtypeBfloat16, KnownValues) {
  EXPECT_EQ(blkps::wire::FloatToBfloat16(1.0f), 0x3f80);
  EXPECT_EQ(blkps::wire::FloatToBfloat16(BitsFloat(0x3f808000u)), 0x3f80);             // tie, even below
  EXPECT_EQ(blkps::wire::FloatToBfloat16(BitsFloat(0x3f818000u)), 0x3f82);             // tie, even above
  EXPECT_EQ(blkps::wire::FloatToBfloat16(std::numeric_limits<float>::max()), 0x7f80);  // rounds to Inf
  EXPECT_EQ(blkps::wire::FloatToBfloat16(BitsFloat(0x7f800001u)), 0x7fc0);             // signalling NaN made quiet
}

TEST(WireDtypeNames, ParseWhatNameGives) {
  for (Dtype t : {Dtype::kFloat32, Dtype::kBfloat16, Dtype::kFloat16}) {
    Dtype parsed = Dtype::kFloat32;
    EXPECT_TRUE(blkps::wire::ParseDtype(blkps::wire::DtypeName(t), &parsed));
    EXPECT_EQ(parsed, t);
  }
  Dtype parsed;
  EXPECT_FALSE(blkps::wire::ParseDtype("fp16", &parsed));
  EXPECT_FALSE(blkps::wire::ParseDtype("", &parsed));
}

}  // namespace
