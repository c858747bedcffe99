// The AVX-512F kernels: 32 values per step (two 16-lane vectors). Compiled
// for any x86-64 (function target attributes), run only where
// wire_convert.cc found the instructions.
#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>

#include "kernels.h"

#define BLKPS_AVX512 __attribute__((target("avx512f,avx2,f16c")))

namespace blkps::wire::kernels {
namespace {

// 16 float32 to 16 values of type T (in 16-bit lanes, in order); sets the
// lanes of *bad whose result is NaN or infinite.
template <Dtype T>
BLKPS_AVX512 inline __m256i Narrow16(const float* src, __mmask16* bad) {
  const __m512i x = _mm512_loadu_si512(src);
  if constexpr (T == Dtype::kBfloat16) {
    // As FloatToBfloat16.
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
    const __m512i rounded =
        _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __m512i quiet_nan = _mm512_or_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40));
    const __mmask16 nan =
        _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    const __m512i h = _mm512_mask_blend_epi32(nan, rounded, quiet_nan);
    *bad |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(h, _mm512_set1_epi32(0x7f80)), _mm512_set1_epi32(0x7f80));
    return _mm512_cvtepi32_epi16(h);
  } else {
    // As the AVX2 kernel: the hardware's rounding is FloatToFloat16's.
    const __m256i h = _mm512_cvtps_ph(_mm512_castsi512_ps(x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512i wide = _mm512_cvtepu16_epi32(h);
    *bad |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(wide, _mm512_set1_epi32(0x7c00)), _mm512_set1_epi32(0x7c00));
    return h;
  }
}

// 16 16-bit values (zero-extended to 32-bit lanes) of type T to float32 bits.
template <Dtype T>
BLKPS_AVX512 inline __m512i Widen16(__m512i h) {
  if constexpr (T == Dtype::kBfloat16) {
    return _mm512_slli_epi32(h, 16);
  } else {
    // As Float16ToFloat, in integers (see the AVX2 kernel).
    const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(h, _mm512_set1_epi32(0x8000)), 16);
    const __m512i exponent = _mm512_and_si512(_mm512_srli_epi32(h, 10), _mm512_set1_epi32(0x1f));
    const __m512i mantissa = _mm512_and_si512(h, _mm512_set1_epi32(0x3ff));
    const __m512i fraction = _mm512_slli_epi32(mantissa, 13);
    const __m512i inf_nan = _mm512_or_si512(_mm512_set1_epi32(0x7f800000), fraction);
    const __m512i normal =
        _mm512_or_si512(_mm512_slli_epi32(_mm512_add_epi32(exponent, _mm512_set1_epi32(112)), 23), fraction);
    const __m512i subnormal =
        _mm512_castps_si512(_mm512_mul_ps(_mm512_cvtepi32_ps(mantissa), _mm512_set1_ps(0x1p-24f)));
    const __mmask16 zero_exponent = _mm512_cmpeq_epi32_mask(exponent, _mm512_setzero_si512());
    const __mmask16 max_exponent = _mm512_cmpeq_epi32_mask(exponent, _mm512_set1_epi32(0x1f));
    const __m512i finite = _mm512_mask_blend_epi32(zero_exponent, normal, subnormal);
    return _mm512_or_si512(sign, _mm512_mask_blend_epi32(max_exponent, finite, inf_nan));
  }
}

template <Dtype T>
BLKPS_AVX512 size_t Narrow(const float* src, uint16_t* dst, size_t n) {
  size_t first_bad = n, i = 0;
  while (n - i >= 32) {
    const size_t start = i, end = i + std::min(kCheckBlock, (n - i) / 32 * 32);
    __mmask16 bad = 0;
    for (; i < end; i += 32) {
      const __m256i lo = Narrow16<T>(src + i, &bad);
      const __m256i hi = Narrow16<T>(src + i + 16, &bad);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), lo);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i + 16), hi);
    }
    if (first_bad == n && bad != 0) first_bad = start + FirstNonFiniteScalar(T, dst + start, end - start);
  }
  const size_t tail_bad = NarrowScalar(T, src + i, dst + i, n - i);
  return first_bad != n ? first_bad : i + tail_bad;
}

template <Dtype T>
BLKPS_AVX512 void Widen(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; n - i >= 16; i += 16) {
    const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    _mm512_storeu_si512(dst + i, Widen16<T>(h));
  }
  WidenScalar(T, src + i, dst + i, n - i);
}

}  // namespace

size_t NarrowAvx512(Dtype t, const float* src, uint16_t* dst, size_t n) {
  return t == Dtype::kBfloat16 ? Narrow<Dtype::kBfloat16>(src, dst, n) : Narrow<Dtype::kFloat16>(src, dst, n);
}

void WidenAvx512(Dtype t, const uint16_t* src, float* dst, size_t n) {
  if (t == Dtype::kBfloat16) {
    Widen<Dtype::kBfloat16>(src, dst, n);
  } else {
    Widen<Dtype::kFloat16>(src, dst, n);
  }
}

}  // namespace blkps::wire::kernels
#endif  // __x86_64__
