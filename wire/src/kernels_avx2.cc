// The AVX2 + F16C kernels: 16 values per step. Compiled for any x86-64
// (function target attributes), run only where wire_convert.cc found the
// instructions.
#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>

#include "kernels.h"

#define BLKPS_AVX2 __attribute__((target("avx2,f16c")))

namespace blkps::wire::kernels {
namespace {

// 8 float32 bit patterns to bfloat16 (in the low half of each 32-bit lane),
// as FloatToBfloat16.
BLKPS_AVX2 inline __m256i Bfloat16Of(__m256i x) {
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
  // |x| > Inf as signed 32-bit numbers: both sides are below 2^31.
  const __m256i nan =
      _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  return _mm256_blendv_epi8(rounded, quiet_nan, nan);
}

// 16 float32 to 16 values of type T, in order.
template <Dtype T>
BLKPS_AVX2 inline __m256i Narrow16(const float* src) {
  if constexpr (T == Dtype::kBfloat16) {
    const __m256i lo = Bfloat16Of(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
    const __m256i hi = Bfloat16Of(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 8)));
    // packus interleaves the 128-bit halves: lo0 hi0 lo1 hi1; put them back.
    return _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8);
  } else {
    // F16C rounds to nearest even, keeps a NaN's sign and top payload bits
    // and makes it quiet, as FloatToFloat16 does; float32 subnormals (the
    // only inputs DAZ would touch) round to zero either way.
    const __m128i lo = _mm256_cvtps_ph(_mm256_loadu_ps(src), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m128i hi = _mm256_cvtps_ph(_mm256_loadu_ps(src + 8), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm256_set_m128i(hi, lo);
  }
}

// Lanes (16-bit) whose value is NaN or infinite in T: all ones.
template <Dtype T>
BLKPS_AVX2 inline __m256i NonFinite16(__m256i h) {
  const __m256i exponent = _mm256_set1_epi16(static_cast<short>(T == Dtype::kBfloat16 ? 0x7f80 : 0x7c00));
  return _mm256_cmpeq_epi16(_mm256_and_si256(h, exponent), exponent);
}

// 8 16-bit values (zero-extended to 32-bit lanes) of type T to float32 bits.
template <Dtype T>
BLKPS_AVX2 inline __m256i Widen8(__m256i h) {
  if constexpr (T == Dtype::kBfloat16) {
    return _mm256_slli_epi32(h, 16);
  } else {
    // As Float16ToFloat, in integers (no dependence on DAZ): subnormals
    // through an exact float multiply whose result is a float32 normal.
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(0x8000)), 16);
    const __m256i exponent = _mm256_and_si256(_mm256_srli_epi32(h, 10), _mm256_set1_epi32(0x1f));
    const __m256i mantissa = _mm256_and_si256(h, _mm256_set1_epi32(0x3ff));
    const __m256i fraction = _mm256_slli_epi32(mantissa, 13);
    const __m256i inf_nan = _mm256_or_si256(_mm256_set1_epi32(0x7f800000), fraction);
    const __m256i normal =
        _mm256_or_si256(_mm256_slli_epi32(_mm256_add_epi32(exponent, _mm256_set1_epi32(112)), 23), fraction);
    const __m256i subnormal =
        _mm256_castps_si256(_mm256_mul_ps(_mm256_cvtepi32_ps(mantissa), _mm256_set1_ps(0x1p-24f)));
    const __m256i zero_exponent = _mm256_cmpeq_epi32(exponent, _mm256_setzero_si256());
    const __m256i max_exponent = _mm256_cmpeq_epi32(exponent, _mm256_set1_epi32(0x1f));
    const __m256i finite = _mm256_blendv_epi8(normal, subnormal, zero_exponent);
    return _mm256_or_si256(sign, _mm256_blendv_epi8(finite, inf_nan, max_exponent));
  }
}

template <Dtype T>
BLKPS_AVX2 size_t Narrow(const float* src, uint16_t* dst, size_t n) {
  size_t first_bad = n, i = 0;
  while (n - i >= 16) {
    const size_t start = i, end = i + std::min(kCheckBlock, (n - i) / 16 * 16);
    __m256i bad = _mm256_setzero_si256();
    for (; i < end; i += 16) {
      const __m256i h = Narrow16<T>(src + i);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), h);
      bad = _mm256_or_si256(bad, NonFinite16<T>(h));
    }
    if (first_bad == n && !_mm256_testz_si256(bad, bad)) {
      first_bad = start + FirstNonFiniteScalar(T, dst + start, end - start);
    }
  }
  const size_t tail_bad = NarrowScalar(T, src + i, dst + i, n - i);
  return first_bad != n ? first_bad : i + tail_bad;
}

template <Dtype T>
BLKPS_AVX2 void Widen(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; n - i >= 8; i += 8) {
    const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), Widen8<T>(h));
  }
  WidenScalar(T, src + i, dst + i, n - i);
}

}  // namespace

// 16 values a step: a value is not finite where its exponent bits are all
// ones (0x7f80 bfloat16, 0x7c00 float16). Collected over a check block, then
// the scalar loop finds the first in the block that has one.
BLKPS_AVX2 size_t FirstNonFinite16Avx2(Dtype t, const uint16_t* v, size_t n) {
  const __m256i exponent = _mm256_set1_epi16(static_cast<int16_t>(t == Dtype::kBfloat16 ? 0x7f80 : 0x7c00));
  size_t i = 0;
  while (n - i >= 16) {
    const size_t start = i, end = i + std::min(kCheckBlock, (n - i) / 16 * 16);
    __m256i bad = _mm256_setzero_si256();
    for (; i < end; i += 16) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + i));
      bad = _mm256_or_si256(bad, _mm256_cmpeq_epi16(_mm256_and_si256(h, exponent), exponent));
    }
    if (!_mm256_testz_si256(bad, bad)) return start + FirstNonFiniteScalar(t, v + start, end - start);
  }
  return i + FirstNonFiniteScalar(t, v + i, n - i);
}

size_t NarrowAvx2(Dtype t, const float* src, uint16_t* dst, size_t n) {
  return t == Dtype::kBfloat16 ? Narrow<Dtype::kBfloat16>(src, dst, n) : Narrow<Dtype::kFloat16>(src, dst, n);
}

void WidenAvx2(Dtype t, const uint16_t* src, float* dst, size_t n) {
  if (t == Dtype::kBfloat16) {
    Widen<Dtype::kBfloat16>(src, dst, n);
  } else {
    Widen<Dtype::kFloat16>(src, dst, n);
  }
}

}  // namespace blkps::wire::kernels
#endif  // __x86_64__
