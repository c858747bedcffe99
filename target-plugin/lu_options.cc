#include "lu_options.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <set>

namespace blkps {
namespace {

Status Bad(const std::string& key, const std::string& expected, const std::string& got) {
  return Status::InvalidArgument(key + ": expected " + expected + ", got '" + got + "'");
}

// A decimal integer with an optional K, M or G suffix (powers of 1024).
bool ParseSize(const std::string& text, bool allow_suffix, uint64_t* out) {
  if (text.empty() || text[0] < '0' || text[0] > '9') return false;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (errno != 0) return false;
  std::string suffix(end);
  unsigned shift = 0;
  if (suffix.empty()) {
    shift = 0;
  } else if (!allow_suffix) {
    return false;
  } else if (suffix == "K" || suffix == "k") {
    shift = 10;
  } else if (suffix == "M" || suffix == "m") {
    shift = 20;
  } else if (suffix == "G" || suffix == "g") {
    shift = 30;
  } else {
    return false;
  }
  if (shift && (v >> (64 - shift)) != 0) return false;
  *out = static_cast<uint64_t>(v) << shift;
  return true;
}

bool ParseFloat(const std::string& text, float* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  float v = std::strtof(text.c_str(), &end);
  if (*end != '\0' || errno != 0 || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

}  // namespace

Status ParseLuOptions(const std::string& bsopts, LuOptions* out) {
  LuOptions opts;
  std::set<std::string> seen;
  float eps = 0;  // eps= goes to the named rule's ε, known only at the end
  bool has_eps = false;
  size_t start = 0;
  while (start <= bsopts.size()) {
    size_t end = bsopts.find(';', start);
    if (end == std::string::npos) end = bsopts.size();
    const std::string item = bsopts.substr(start, end - start);
    start = end + 1;
    if (item.empty()) continue;

    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      return Status::InvalidArgument("bsopts: expected key=value, got '" + item + "'");
    }
    const std::string key = item.substr(0, eq);
    const std::string value = item.substr(eq + 1);
    if (!seen.insert(key).second) {
      return Status::InvalidArgument(key + ": given more than once");
    }

    if (key == "params") {
      if (!ParseSize(value, false, &opts.model.num_params) || opts.model.num_params == 0) {
        return Bad(key, "a positive integer count of float32 parameters", value);
      }
    } else if (key == "block") {
      if (!ParseSize(value, true, &opts.model.block_bytes) || opts.model.block_bytes == 0 ||
          opts.model.block_bytes % 4 != 0) {
        return Bad(key, "a size in bytes, a positive multiple of 4 (K/M suffix allowed)", value);
      }
    } else if (key == "rule") {
      opts.model.rule.name = value;
    } else if (key == "lr") {
      if (!ParseFloat(value, &opts.model.rule.lr) || opts.model.rule.lr <= 0) {
        return Bad(key, "a finite number > 0", value);
      }
    } else if (key == "momentum" || key == "beta1" || key == "beta2" || key == "eps") {
      float v = 0;
      if (!ParseFloat(value, &v)) return Bad(key, "a finite number", value);
      RuleOptions& r = opts.model.rule;
      (key == "momentum" ? r.momentum : key == "beta1" ? r.beta1 : key == "beta2" ? r.beta2 : eps) = v;
      has_eps = has_eps || key == "eps";
    } else if (key == "nesterov") {
      if (value != "0" && value != "1") return Bad(key, "0 or 1", value);
      opts.model.rule.nesterov = value == "1";
    } else if (key == "init") {
      Status s = ParseInitSpec(value, &opts.model.init);
      if (!s.ok()) return s;
    } else if (key == "seed") {
      if (!ParseSize(value, false, &opts.model.init.seed)) {
        return Bad(key, "a non-negative integer", value);
      }
    } else {
      return Status::InvalidArgument(key + ": unknown option (known: " + kLuOptionKeys + ")");
    }
  }
  if (has_eps) {
    (opts.model.rule.name == "adagrad" ? opts.model.rule.adagrad_eps : opts.model.rule.eps) = eps;
  }
  if (opts.model.num_params == 0) {
    return Status::InvalidArgument("params: required (the number of float32 parameters), e.g. params=1000000");
  }
  *out = opts;
  return Status::OK();
}

}  // namespace blkps
