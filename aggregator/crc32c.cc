// CRC32C: a portable slicing-by-8 loop, and three interleaved streams of the
// SSE4.2 crc32 instruction where the CPU has it (contract in crc32c.h).
#include "crc32c.h"

#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace blkps::server {

namespace {

constexpr uint32_t kCrc32cPoly = 0x82F63B78;  // reflected Castagnoli

// The 3-way hardware loop CRCs three adjacent blocks of kLong (or kShort)
// bytes at once, the second and third from a zero register, then joins them:
// crc(A B) = Shift(crc(A), |B|) ^ crc0(B), where Shift appends |B| zero bytes.
constexpr size_t kLong = 8192;
constexpr size_t kShort = 256;

struct Crc32cTables {
  uint32_t slice[8][256];       // slicing-by-8: slice[k][b] = b followed by k zero bytes
  uint32_t shift_long[4][256];  // appends kLong zero bytes to byte k of a register
  uint32_t shift_short[4][256];
};

uint32_t AppendZeroBytes(const uint32_t table[256], uint32_t reg, size_t n) {
  for (size_t i = 0; i < n; ++i) reg = table[reg & 0xff] ^ (reg >> 8);
  return reg;
}

// Appending zeros is linear in the register: build it from the 32 one-bit
// registers.
void BuildShiftTable(const uint32_t table[256], size_t n, uint32_t out[4][256]) {
  uint32_t bit_op[32];
  for (int b = 0; b < 32; ++b) bit_op[b] = AppendZeroBytes(table, uint32_t{1} << b, n);
  for (int k = 0; k < 4; ++k) {
    for (uint32_t v = 0; v < 256; ++v) {
      uint32_t r = 0;
      for (int b = 0; b < 8; ++b) {
        if (v & (1u << b)) r ^= bit_op[8 * k + b];
      }
      out[k][v] = r;
    }
  }
}

const Crc32cTables& Tables() {
  static const Crc32cTables* const tables = [] {
    auto* t = new Crc32cTables;
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t r = b;
      for (int i = 0; i < 8; ++i) r = (r >> 1) ^ (kCrc32cPoly & (0u - (r & 1)));
      t->slice[0][b] = r;
    }
    for (int k = 1; k < 8; ++k) {
      for (int b = 0; b < 256; ++b) {
        const uint32_t prev = t->slice[k - 1][b];
        t->slice[k][b] = (prev >> 8) ^ t->slice[0][prev & 0xff];
      }
    }
    BuildShiftTable(t->slice[0], kLong, t->shift_long);
    BuildShiftTable(t->slice[0], kShort, t->shift_short);
    return t;
  }();
  return *tables;
}

inline uint32_t LoadLe32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

#if defined(__x86_64__)

inline uint32_t Shift(const uint32_t table[4][256], uint32_t crc) {
  return table[0][crc & 0xff] ^ table[1][(crc >> 8) & 0xff] ^ table[2][(crc >> 16) & 0xff] ^ table[3][crc >> 24];
}

__attribute__((target("sse4.2"))) inline uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// CRCs whole runs of 3 * kBlock bytes from *p, advancing *p and *len.
template <size_t kBlock>
__attribute__((target("sse4.2"))) uint64_t ThreeStreams(uint64_t crc0, const uint32_t shift[4][256], const uint8_t** p,
                                                        size_t* len) {
  const uint8_t* next = *p;
  while (*len >= 3 * kBlock) {
    uint64_t crc1 = 0, crc2 = 0;
    const uint8_t* const end = next + kBlock;
    do {
      crc0 = _mm_crc32_u64(crc0, Load64(next));
      crc1 = _mm_crc32_u64(crc1, Load64(next + kBlock));
      crc2 = _mm_crc32_u64(crc2, Load64(next + 2 * kBlock));
      next += 8;
    } while (next < end);
    crc0 = Shift(shift, static_cast<uint32_t>(crc0)) ^ crc1;
    crc0 = Shift(shift, static_cast<uint32_t>(crc0)) ^ crc2;
    next += 2 * kBlock;
    *len -= 3 * kBlock;
  }
  *p = next;
  return crc0;
}

#endif  // __x86_64__

}  // namespace

namespace detail {

uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t len) {
  const auto& t = Tables().slice;
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  while (len > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    crc = t[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    --len;
  }
  for (; len >= 8; p += 8, len -= 8) {
    const uint32_t lo = crc ^ LoadLe32(p);
    const uint32_t hi = LoadLe32(p + 4);
    crc = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^ t[3][hi & 0xff] ^
          t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
  }
  while (len-- > 0) crc = t[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
  return ~crc;
}

#if defined(__x86_64__)

__attribute__((target("sse4.2"))) uint32_t Crc32cSse42(uint32_t crc, const void* data, size_t len) {
  const Crc32cTables& t = Tables();
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t crc0 = ~crc;
  while (len > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    crc0 = _mm_crc32_u8(static_cast<uint32_t>(crc0), *p++);
    --len;
  }
  crc0 = ThreeStreams<kLong>(crc0, t.shift_long, &p, &len);
  crc0 = ThreeStreams<kShort>(crc0, t.shift_short, &p, &len);
  for (; len >= 8; p += 8, len -= 8) crc0 = _mm_crc32_u64(crc0, Load64(p));
  for (; len > 0; --len) crc0 = _mm_crc32_u8(static_cast<uint32_t>(crc0), *p++);
  return ~static_cast<uint32_t>(crc0);
}

bool CpuHasCrc32cInstruction() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2");
}

#else

uint32_t Crc32cSse42(uint32_t crc, const void* data, size_t len) { return Crc32cPortable(crc, data, len); }

bool CpuHasCrc32cInstruction() { return false; }

#endif  // __x86_64__

}  // namespace detail

namespace {

// Polynomials over GF(2) modulo the CRC's, reflected (bit 31 is x^0):
// a * b mod P.
uint32_t MultiplyModP(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t m = uint32_t{1} << 31; m != 0; m >>= 1) {
    if (a & m) product ^= b;
    b = (b & 1) ? (b >> 1) ^ kCrc32cPoly : b >> 1;
  }
  return product;
}

// x^(8n) mod P: appending n zero bytes multiplies the register by it.
uint32_t ZeroBytesOperator(uint64_t n) {
  uint32_t result = uint32_t{1} << 31;  // x^0
  uint32_t square = uint32_t{1} << 23;  // x^8 (one byte)
  for (; n != 0; n >>= 1) {
    if (n & 1) result = MultiplyModP(square, result);
    square = MultiplyModP(square, square);
  }
  return result;
}

}  // namespace

uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  return MultiplyModP(ZeroBytesOperator(len_b), crc_a) ^ crc_b;
}

uint32_t Crc32c(uint32_t crc, const void* data, size_t len) {
  static const bool hardware = detail::CpuHasCrc32cInstruction();
  return hardware ? detail::Crc32cSse42(crc, data, len) : detail::Crc32cPortable(crc, data, len);
}

}  // namespace blkps::server
