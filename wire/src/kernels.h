// The kernels behind blkps/wire_convert.h, one set per instruction set.
// Each takes what the public function of its name takes and returns the
// same; the SIMD ones convert whole vectors and hand the rest of the array
// to the scalar kernel. Only wire_convert.cc calls them, after checking
// that the CPU has the instructions (a kernel for a missing instruction set
// crashes with SIGILL).
#ifndef BLKPS_WIRE_SRC_KERNELS_H_
#define BLKPS_WIRE_SRC_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "blkps/wire_dtype.hpp"

namespace blkps::wire::kernels {

// Values per block over which a SIMD kernel collects "some result was not
// finite" before it looks for the first one (in the block just written).
inline constexpr size_t kCheckBlock = 4096;

size_t NarrowScalar(Dtype t, const float* src, uint16_t* dst, size_t n);
void WidenScalar(Dtype t, const uint16_t* src, float* dst, size_t n);
size_t FirstNonFiniteScalar(Dtype t, const uint16_t* v, size_t n);

// AVX2 and F16C.
size_t NarrowAvx2(Dtype t, const float* src, uint16_t* dst, size_t n);
void WidenAvx2(Dtype t, const uint16_t* src, float* dst, size_t n);
// Also the avx512 kernel's: AVX-512F has no 16-bit compares (that is
// AVX-512BW), and the check is one read of the data, bound by memory.
size_t FirstNonFinite16Avx2(Dtype t, const uint16_t* v, size_t n);

// AVX-512F (with AVX2 and F16C, which every AVX-512 CPU has).
size_t NarrowAvx512(Dtype t, const float* src, uint16_t* dst, size_t n);
void WidenAvx512(Dtype t, const uint16_t* src, float* dst, size_t n);

}  // namespace blkps::wire::kernels

#endif  // BLKPS_WIRE_SRC_KERNELS_H_
