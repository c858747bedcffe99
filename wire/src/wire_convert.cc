// blkps/wire_convert.h: the scalar kernel (the reference) and the choice of
// kernel.
#include "blkps/wire_convert.h"

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "kernels.h"

namespace blkps::wire {
namespace kernels {

size_t NarrowScalar(Dtype t, const float* src, uint16_t* dst, size_t n) {
  if (t == Dtype::kBfloat16) {
    for (size_t i = 0; i < n; ++i) dst[i] = FloatToBfloat16(src[i]);
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = FloatToFloat16(src[i]);
  }
  return FirstNonFiniteScalar(t, dst, n);
}

void WidenScalar(Dtype t, const uint16_t* src, float* dst, size_t n) {
  if (t == Dtype::kBfloat16) {
    for (size_t i = 0; i < n; ++i) dst[i] = Bfloat16ToFloat(src[i]);
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = Float16ToFloat(src[i]);
  }
}

size_t FirstNonFiniteScalar(Dtype t, const uint16_t* v, size_t n) {
  for (size_t start = 0; start < n; start += kCheckBlock) {
    const size_t end = n - start < kCheckBlock ? n : start + kCheckBlock;
    unsigned bad = 0;  // branch-free within a block, so that it vectorises
    for (size_t i = start; i < end; ++i) bad |= IsNonFinite16(t, v[i]);
    if (bad) {
      for (size_t i = start; i < end; ++i) {
        if (IsNonFinite16(t, v[i])) return i;
      }
    }
  }
  return n;
}

}  // namespace kernels

namespace {

Kernel Best() {
#if defined(__x86_64__)
  if (KernelSupported(Kernel::kAvx512)) return Kernel::kAvx512;
  if (KernelSupported(Kernel::kAvx2)) return Kernel::kAvx2;
#endif
  return Kernel::kScalar;
}

Kernel Choose() {
  const char* wanted = std::getenv("BLKPS_WIRE_KERNEL");
  for (Kernel k : {Kernel::kScalar, Kernel::kAvx2, Kernel::kAvx512}) {
    if (wanted != nullptr && std::strcmp(wanted, KernelName(k)) == 0 && KernelSupported(k)) return k;
  }
  return Best();
}

#if defined(__x86_64__)
// CPUID leaf 1, ECX bit 29 (F16C: VCVTPH2PS, VCVTPS2PH).
bool CpuHasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}
#endif

}  // namespace

const char* KernelName(Kernel k) { return k == Kernel::kScalar ? "scalar" : k == Kernel::kAvx2 ? "avx2" : "avx512"; }

bool KernelSupported(Kernel k) {
  switch (k) {
    case Kernel::kScalar: return true;
#if defined(__x86_64__)
    // GCC's and clang's checks include the OS's saving of the registers
    // (XGETBV), not only CPUID. F16C is asked of CPUID itself: clang 14's
    // __builtin_cpu_supports does not know it.
    case Kernel::kAvx2: return __builtin_cpu_supports("avx2") && CpuHasF16c();
    case Kernel::kAvx512: return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") && CpuHasF16c();
#endif
    default: return false;
  }
}

Kernel ActiveKernel() {
  static const Kernel active = Choose();  // thread-safe initialisation
  return active;
}

size_t NarrowWith(Kernel k, Dtype t, const float* src, uint16_t* dst, size_t n) {
  switch (k) {
#if defined(__x86_64__)
    case Kernel::kAvx2: return kernels::NarrowAvx2(t, src, dst, n);
    case Kernel::kAvx512: return kernels::NarrowAvx512(t, src, dst, n);
#endif
    default: return kernels::NarrowScalar(t, src, dst, n);
  }
}

void WidenWith(Kernel k, Dtype t, const uint16_t* src, float* dst, size_t n) {
  switch (k) {
#if defined(__x86_64__)
    case Kernel::kAvx2: return kernels::WidenAvx2(t, src, dst, n);
    case Kernel::kAvx512: return kernels::WidenAvx512(t, src, dst, n);
#endif
    default: return kernels::WidenScalar(t, src, dst, n);
  }
}

size_t Narrow(Dtype t, const float* src, uint16_t* dst, size_t n) { return NarrowWith(ActiveKernel(), t, src, dst, n); }

void Widen(Dtype t, const uint16_t* src, float* dst, size_t n) { WidenWith(ActiveKernel(), t, src, dst, n); }

size_t FirstNonFinite16With(Kernel k, Dtype t, const uint16_t* v, size_t n) {
  switch (k) {
#if defined(__x86_64__)
    case Kernel::kAvx2:
    case Kernel::kAvx512: return kernels::FirstNonFinite16Avx2(t, v, n);
#endif
    default: return kernels::FirstNonFiniteScalar(t, v, n);
  }
}

size_t FirstNonFinite16(Dtype t, const uint16_t* v, size_t n) { return FirstNonFinite16With(ActiveKernel(), t, v, n); }

namespace {

// The exponent bits' test, branch-free within a chunk. In the baseline's SSE2
// it cost tgtd as much CPU per byte as sgd's saxpy; the clones for AVX2 and
// AVX-512 halve that (bench/server-cpu.py; doc/performance.md). One version
// under GCC's ThreadSanitizer, whose runtime is not up when ifunc resolvers
// run. Internal: GCC gives a target_clones dispatcher of an external
// function default visibility whatever -fvisibility says, and libblkps.so
// exports none of wire's functions (tests/install/install_test.sh).
#if !defined(__SANITIZE_THREAD__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
size_t
FirstNonFinite32Cloned(const float* v, size_t n) {
  constexpr uint32_t kExponent = 0x7f800000u;
  constexpr size_t kChunk = 1024;
  for (size_t start = 0; start < n; start += kChunk) {
    const size_t end = n - start < kChunk ? n : start + kChunk;
    uint32_t bad = 0;
    for (size_t i = start; i < end; ++i) {
      uint32_t bits;
      std::memcpy(&bits, v + i, sizeof bits);
      bad |= ((bits & kExponent) == kExponent);
    }
    if (bad) {
      for (size_t i = start; i < end; ++i) {
        uint32_t bits;
        std::memcpy(&bits, v + i, sizeof bits);
        if ((bits & kExponent) == kExponent) return i;
      }
    }
  }
  return n;
}

}  // namespace

size_t FirstNonFinite32(const float* v, size_t n) { return FirstNonFinite32Cloned(v, n); }

}  // namespace blkps::wire
