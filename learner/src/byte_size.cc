#include "byte_size.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>

namespace blkps {

bool ParseByteSize(const std::string& text, uint64_t* bytes) {
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
