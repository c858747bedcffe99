// The 16-bit wire's bulk conversions: float32 arrays to and from bfloat16 or
// float16, as blkps/wire_dtype.hpp defines each value's rounding. libblkps
// runs them on a 16-bit LUN's Push and Pull, the plugin on its READs and
// WRITEs; nothing else converts arrays.
//
// Each conversion has kernels for several instruction sets; the scalar one
// loops over wire_dtype.hpp's value functions and is the reference every
// other kernel matches bit for bit (tests/wire_convert_test.cc checks every
// 16-bit pattern and a sweep of float32 ones on each kernel the CPU has).
// The kernel is chosen once per process, at the first call: the best the
// CPU and OS support (AVX-512F, else AVX2 with F16C, else scalar), or the
// one environment variable BLKPS_WIRE_KERNEL names (scalar, avx2, avx512;
// one the CPU lacks falls back to the best it has), for benchmarks.
//
// Plain functions of their arguments: thread-safe. The results do not depend
// on the floating-point environment (rounding mode, MXCSR's FTZ/DAZ).
#ifndef BLKPS_WIRE_CONVERT_H_
#define BLKPS_WIRE_CONVERT_H_

#include <cstddef>
#include <cstdint>

#include "blkps/wire_dtype.hpp"

namespace blkps::wire {

enum class Kernel { kScalar, kAvx2, kAvx512 };

// "scalar", "avx2", "avx512".
const char* KernelName(Kernel k);
// Whether this CPU (and OS) can run kernel k; kScalar always.
bool KernelSupported(Kernel k);
// The kernel Narrow, Widen and FirstNonFinite16 use in this process.
Kernel ActiveKernel();

// n float32 values to the 16-bit type t, rounded as wire_dtype.hpp says.
// Returns the index of the first value whose result is NaN or infinite in t
// (a NaN or Inf input, or a float16 overflow), or n if there is none; every
// value is converted either way. REQUIRES: t != kFloat32; src and dst do not
// overlap.
size_t Narrow(Dtype t, const float* src, uint16_t* dst, size_t n);

// n 16-bit values of type t to float32, exactly. REQUIRES: t != kFloat32;
// src and dst do not overlap.
void Widen(Dtype t, const uint16_t* src, float* dst, size_t n);

// Index of the first value in v[0..n) that is NaN or infinite in type t (its
// exponent bits all ones), or n if there is none: a check of 16-bit values
// themselves, half the bytes of their float32 (Narrow finds this itself, in
// the same pass). The plugin refuses a 16-bit WRITE with it before widening
// any of it; libblkps checks a Push16 with it. REQUIRES: t != kFloat32.
size_t FirstNonFinite16(Dtype t, const uint16_t* v, size_t n);

// Index of the first value in v[0..n) that is NaN or infinite (its exponent
// bits all ones), or n if there is none: the check every float32 gradient
// passes before it is applied (the plugin, a write or a row window's push)
// or sent (libblkps's push_rows). Branch-free within chunks, so the compiler
// vectorises it; clones for AVX2 and AVX-512 are picked at load time.
size_t FirstNonFinite32(const float* v, size_t n);

// The same with a chosen kernel, for tests and benchmarks.
// REQUIRES: KernelSupported(k).
size_t NarrowWith(Kernel k, Dtype t, const float* src, uint16_t* dst, size_t n);
void WidenWith(Kernel k, Dtype t, const uint16_t* src, float* dst, size_t n);
size_t FirstNonFinite16With(Kernel k, Dtype t, const uint16_t* v, size_t n);

}  // namespace blkps::wire

#endif  // BLKPS_WIRE_CONVERT_H_
