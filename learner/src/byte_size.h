// ParseByteSize: the size syntax of libblkps's command-line tools
// (blkps-iobench, blkps-mount): a decimal number, optionally followed by K, M
// or G (any case; powers of 1024): "4096", "64K", "1M", "2g".

#ifndef BLKPS_LEARNER_BYTE_SIZE_H_
#define BLKPS_LEARNER_BYTE_SIZE_H_

#include <cstdint>
#include <string>

namespace blkps {

// Stores the size in *bytes and returns true; returns false (and leaves
// *bytes) for anything else, including overflow, signs and spaces.
bool ParseByteSize(const std::string& text, uint64_t* bytes);

}  // namespace blkps

#endif  // BLKPS_LEARNER_BYTE_SIZE_H_
