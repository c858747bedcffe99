// The 16-bit wire: how a learner LUN with --bsopts dtype=bfloat16|float16
// presents the float32 model. A contract between the server (the plugin
// converts at the LUN boundary) and libblkps (which converts float32 arrays
// for Push/Pull): both include this header, and nothing else converts.
//
// On a 16-bit LUN parameter i lives at device byte 2*i (little-endian). A
// READ returns each float32 weight rounded to the LUN's type with
// round-to-nearest, ties to even; a WRITE carries 16-bit gradients that the
// server widens (exactly) to float32 before its NaN/Inf check and the rule.
//   bfloat16: the top 16 bits of a float32 (8-bit exponent, 7-bit mantissa);
//             same range as float32, no overflow; NaN stays a quiet NaN.
//   float16:  IEEE 754 binary16 (5-bit exponent, 10-bit mantissa, max
//             65504); larger magnitudes round to Inf, small ones to
//             subnormals or zero; NaN stays a quiet NaN.
// Widening is exact, so every 16-bit value survives a round trip through
// float32 (a NaN comes back quiet with its sign and payload).
//
// Plain functions of values: thread-safe, no state.
#ifndef BLKPS_WIRE_DTYPE_HPP_
#define BLKPS_WIRE_DTYPE_HPP_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace blkps::wire {

enum class Dtype { kFloat32, kBfloat16, kFloat16 };

// Bytes one parameter takes on a LUN of this type.
inline constexpr uint64_t BytesPerParam(Dtype t) { return t == Dtype::kFloat32 ? 4 : 2; }

// The --bsopts / open-option spelling.
inline const char* DtypeName(Dtype t) {
  return t == Dtype::kFloat32 ? "float32" : t == Dtype::kBfloat16 ? "bfloat16" : "float16";
}
inline constexpr const char* kDtypeNames = "float32, bfloat16, float16";
// Parses a name DtypeName() gives; false for anything else.
inline bool ParseDtype(const std::string& name, Dtype* out) {
  for (Dtype t : {Dtype::kFloat32, Dtype::kBfloat16, Dtype::kFloat16}) {
    if (name == DtypeName(t)) {
      *out = t;
      return true;
    }
  }
  return false;
}

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// The conversions are branch-free (every case computed, one selected): the
// SIMD kernels of blkps/wire_convert.h compute the same cases in lanes.

inline uint16_t FloatToBfloat16(float f) {
  const uint32_t x = FloatBits(f);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;  // ties to even; a carry into
                                                                    // the exponent is right (up to Inf)
  const uint32_t quiet_nan = (x >> 16) | 0x0040u;
  return static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

inline float Bfloat16ToFloat(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }

inline uint16_t FloatToFloat16(float f) {
  const uint32_t x = FloatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7fffffffu;
  const uint32_t quiet_nan = 0x7e00u | ((a >> 13) & 0x3ffu);
  // Normal (a >= 2^-14): round to 10 fraction bits, rebias 127 -> 15.
  const uint32_t normal = (a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u) >> 13;
  // Subnormal or zero (a < 2^-14): the value in units of 2^-24, rounded to
  // nearest even; it may round up to 0x400, the smallest normal, which is
  // its right encoding. The shift is 14..24 where the result is not 0;
  // clamped to 31 it gives 0 for everything smaller (2^-25, the tie between
  // 0 and 2^-24, rounds to even: 0).
  const uint32_t exponent = a >> 23;
  const uint32_t shift = exponent >= 112 ? 14 : exponent <= 95 ? 31 : 126 - exponent;
  const uint32_t mantissa = (a & 0x7fffffu) | 0x800000u;
  const uint32_t q = mantissa >> shift;
  const uint32_t rest = mantissa & ((1u << shift) - 1), half = 1u << (shift - 1);
  const uint32_t subnormal = q + ((rest > half) | ((rest == half) & q & 1u));
  const uint32_t r = a > 0x7f800000u    ? quiet_nan
                     : a >= 0x477ff000u ? 0x7c00u  // >= 65520 (the tie above 65504): Inf
                     : a >= 0x38800000u ? normal
                                        : subnormal;
  return static_cast<uint16_t>(sign | r);
}

inline float Float16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  const uint32_t inf_nan = 0x7f800000u | (mantissa << 13);
  const uint32_t normal = ((exponent + 112) << 23) | (mantissa << 13);
  const uint32_t subnormal = FloatBits(static_cast<float>(mantissa) * BitsFloat(0x33800000u));  // m * 2^-24, exact
  return BitsFloat(sign | (exponent == 0x1f ? inf_nan : exponent != 0 ? normal : subnormal));
}

// Whether a 16-bit value is NaN or infinite (all exponent bits set).
inline bool IsNonFinite16(Dtype t, uint16_t h) {
  return t == Dtype::kBfloat16 ? (h & 0x7f80u) == 0x7f80u : (h & 0x7c00u) == 0x7c00u;
}

// The bulk conversions of arrays are blkps/wire_convert.h's (SIMD kernels
// chosen at run time; these functions are their reference).

}  // namespace blkps::wire

#endif  // BLKPS_WIRE_DTYPE_HPP_
