// libFuzzer harness: the --bsopts parser (target-plugin/lu_options.h) on any
// bytes. Contract checked: it returns OK, or an error whose message is one
// line; it never crashes, leaks or hits undefined behaviour (ASan, UBSan).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "lu_options.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  blkps::server::LuOptions options;
  const blkps::server::Status s =
      blkps::server::ParseLuOptions(std::string(reinterpret_cast<const char*>(data), size), &options);
  if (!s.ok() && (s.message().empty() || s.message().find('\n') != std::string::npos)) std::abort();
  return 0;
}
