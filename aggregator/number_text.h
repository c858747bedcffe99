// How the server writes numbers as text: in status JSON, log lines and
// checkpoint metadata.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace blkps::server {

// x with `digits` decimals: "0.250".
inline std::string Fixed(double x, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  return buf;
}

// Exact: a float printed with 9 significant digits reads back bit for bit.
inline std::string FloatText(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

// For people: 0.005, not 0.00499999989.
inline std::string FloatShort(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.7g", x);
  return buf;
}

// Reads a number as the server writes it in checkpoint headers and file
// names: unsigned decimal, no sign, no leading zeros, at most 18 digits.
// False (and *out untouched) for anything else.
inline bool ParseDecimal(const std::string& s, uint64_t* out) {
  if (s.empty() || s.size() > 18 || (s.size() > 1 && s[0] == '0')) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  *out = v;
  return true;
}

}  // namespace blkps::server
