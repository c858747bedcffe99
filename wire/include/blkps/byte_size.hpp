// ParseByteSize: the one size syntax of blkps, parsed in one place: --bsopts
// sizes (block=1M, target-plugin/lu_options.cc) and the command-line tools'
// (blkps-iobench, blkps-mount, blkps-layout, blkps-engine-bench). A decimal
// number, optionally followed by K, M or G (any case; powers of 1024):
// "4096", "64K", "1M", "2g". Header-only, so that the server and libblkps
// share it without linking each other.

#ifndef BLKPS_WIRE_BYTE_SIZE_HPP_
#define BLKPS_WIRE_BYTE_SIZE_HPP_

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace blkps {

// Stores the size in *bytes and returns true; returns false (and leaves
// *bytes) for anything else, including overflow, signs and spaces.
inline bool ParseByteSize(const std::string& text, uint64_t* bytes) {
  if (text.empty() || !isdigit(static_cast<unsigned char>(text[0]))) {
    return false;
  }
  errno = 0;
  char* end = nullptr;
  const unsigned long long number = strtoull(text.c_str(), &end, 10);
  if (errno != 0) return false;
  int shift = 0;
  if (*end != '\0') {
    const int suffix = toupper(static_cast<unsigned char>(*end++));
    shift = suffix == 'K' ? 10 : suffix == 'M' ? 20 : suffix == 'G' ? 30 : -1;
  }
  if (shift < 0 || *end != '\0' || number > (UINT64_MAX >> shift)) {
    return false;
  }
  *bytes = static_cast<uint64_t>(number) << shift;
  return true;
}

}  // namespace blkps

#endif  // BLKPS_WIRE_BYTE_SIZE_HPP_
