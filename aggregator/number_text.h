// How the server writes numbers as text: in status JSON, log lines and
// checkpoint metadata.
#pragma once

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

}  // namespace blkps::server
