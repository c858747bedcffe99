// Crc32c: the checksum of checkpoint files (checkpoint_file.h).
#pragma once

#include <cstddef>
#include <cstdint>

namespace blkps::server {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, as in iSCSI and
// ext4) of data[0, len), extending `crc`, the CRC32C of the bytes before:
//   Crc32c(Crc32c(0, a, na), b, nb) == CRC32C of a followed by b.
// Crc32c(0, "123456789", 9) == 0xE3069283. Uses the SSE4.2 crc32 instruction
// where the CPU has it (three interleaved streams, > 10 GB/s), a portable
// slicing-by-8 loop elsewhere. Thread-safe.
uint32_t Crc32c(uint32_t crc, const void* data, size_t len);

// The CRC32C of a followed by b from Crc32c(0, a, ...), Crc32c(0, b, ...)
// and b's length: what lets parts of a file be checked in parallel.
uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

namespace detail {
// The two implementations behind Crc32c(), exposed for tests.
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t len);
// REQUIRES: CpuHasCrc32cInstruction(). Off x86-64 it is the portable loop.
uint32_t Crc32cSse42(uint32_t crc, const void* data, size_t len);
bool CpuHasCrc32cInstruction();
}  // namespace detail

}  // namespace blkps::server
