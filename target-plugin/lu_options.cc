#include "lu_options.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "blkps/byte_size.hpp"

namespace blkps::server {
namespace {

constexpr double kMaxHoldSeconds = 25;

Status Bad(const std::string& key, const std::string& expected, const std::string& got) {
  return Status::InvalidArgument(key + ": expected " + expected + ", got '" + got + "'");
}

// A decimal integer; with allow_suffix, blkps's size syntax (K, M or G,
// powers of 1024: blkps/byte_size.hpp).
bool ParseSize(const std::string& text, bool allow_suffix, uint64_t* out) {
  if (!allow_suffix && text.find_first_not_of("0123456789") != std::string::npos) return false;
  return ParseByteSize(text, out);
}

// Seconds: a finite number in [min, max] (min excluded if open_min).
bool ParseSeconds(const std::string& text, double min, bool open_min, double max, double* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (*end != '\0' || errno != 0 || !std::isfinite(v) || v < min || (open_min && v == min) || v > max) return false;
  *out = v;
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

Status SplitLuOptions(const std::string& bsopts, LuOptionPairs* pairs) {
  pairs->clear();
  // Errors quote what they refuse, and go to tgtd's log as one line: a
  // control character would break that line (found by tests/fuzz).
  for (size_t i = 0; i < bsopts.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(bsopts[i]);
    if (c < 0x20 || c == 0x7f) {
      char byte[8];
      std::snprintf(byte, sizeof(byte), "0x%02x", c);
      return Status::InvalidArgument("bsopts: control character " + std::string(byte) + " at byte " +
                                     std::to_string(i) + "; --bsopts is one line of key=value;key=value");
    }
  }
  if (bsopts.find(',') != std::string::npos) {
    return Status::InvalidArgument("',' is not an option separator: tgtadm cuts --bsopts at the first ',' and drops "
                                   "the rest; separate options with ';', e.g. \"params=1000;lr=0.1\"");
  }
  std::set<std::string> seen;
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
    if (!seen.insert(key).second) {
      return Status::InvalidArgument(key + ": given more than once");
    }
    pairs->emplace_back(key, item.substr(eq + 1));
  }
  return Status::OK();
}

Status ParseLuOptions(const std::string& bsopts, LuOptions* out) {
  LuOptions opts;
  LuOptionPairs pairs;
  Status split = SplitLuOptions(bsopts, &pairs);
  if (!split.ok()) return split;
  std::set<std::string> seen;
  float eps = 0;  // eps= goes to the named rule's ε, known only at the end
  bool has_eps = false;
  for (const auto& [key, value] : pairs) {
    seen.insert(key);
    if (key != "dtype") opts.model_bsopts += (opts.model_bsopts.empty() ? "" : ";") + key + "=" + value;

    if (key == "params") {
      if (!ParseSize(value, false, &opts.job.model.num_params) || opts.job.model.num_params == 0) {
        return Bad(key, "a positive integer count of float32 parameters", value);
      }
    } else if (key == "table") {
      TableShape& t = opts.job.model.table;
      const size_t colon = value.find(':');
      if (colon == std::string::npos || !ParseSize(value.substr(0, colon), false, &t.rows) ||
          !ParseSize(value.substr(colon + 1), false, &t.width) || t.rows == 0 || t.width == 0 ||
          t.width > (uint64_t{1} << 28) || t.rows > (uint64_t{1} << 61) / t.width) {
        return Bad(key, "<rows>:<width>, positive counts of rows and of float32 values per row (e.g. 1000000:128)",
                   value);
      }
    } else if (key == "block") {
      if (!ParseSize(value, true, &opts.job.model.block_bytes) || opts.job.model.block_bytes == 0 ||
          opts.job.model.block_bytes % 4 != 0) {
        return Bad(key, "a size in bytes, a positive multiple of 4 (K/M suffix allowed)", value);
      }
    } else if (key == "rule") {
      opts.job.model.rule.name = value;
    } else if (key == "lr") {
      if (!ParseFloat(value, &opts.job.model.rule.lr) || opts.job.model.rule.lr <= 0) {
        return Bad(key, "a finite number > 0", value);
      }
    } else if (key == "momentum" || key == "beta1" || key == "beta2" || key == "eps") {
      float v = 0;
      if (!ParseFloat(value, &v)) return Bad(key, "a finite number", value);
      RuleOptions& r = opts.job.model.rule;
      (key == "momentum" ? r.momentum : key == "beta1" ? r.beta1 : key == "beta2" ? r.beta2 : eps) = v;
      has_eps = has_eps || key == "eps";
    } else if (key == "nesterov") {
      if (value != "0" && value != "1") return Bad(key, "0 or 1", value);
      opts.job.model.rule.nesterov = value == "1";
    } else if (key == "init") {
      Status s = ParseInitSpec(value, &opts.job.model.init);
      if (!s.ok()) return s;
    } else if (key == "seed") {
      if (!ParseSize(value, false, &opts.job.model.init.seed)) {
        return Bad(key, "a non-negative integer", value);
      }
    } else if (key == "mode") {
      Status s = ParseConsistency(value, &opts.job.consistency);
      if (!s.ok()) return s;
    } else if (key == "dead_after") {
      if (!ParseSeconds(value, 0, true, 86400, &opts.job.dead_after_s)) {
        return Bad(key, "seconds, > 0", value);
      }
    } else if (key == "hold_limit") {
      if (!ParseSeconds(value, 0, true, kMaxHoldSeconds, &opts.job.hold_limit_s)) {
        return Bad(key, "seconds in (0, 25]: initiators abort a command after about 30 s", value);
      }
    } else if (key == "max_dead") {
      uint64_t n = 0;
      if (!ParseSize(value, false, &n) || n > 1000000) return Bad(key, "a count of learners, 0 for never", value);
      opts.job.max_dead = static_cast<uint32_t>(n);
    } else if (key == "staleness_aware") {
      if (value != "0" && value != "1") return Bad(key, "1 (scale a push by 1/(1+staleness)) or 0", value);
      opts.job.staleness_aware = value == "1";
    } else if (key == "stale_bound") {
      if (!ParseSize(value, false, &opts.job.stale_bound)) return Bad(key, "a count of updates", value);
    } else if (key == "checkpoint") {
      if (value.empty() || value[0] != '/') return Bad(key, "an absolute file path", value);
      opts.job.checkpoint = value;
    } else if (key == "checkpoint_every") {
      if (!ParseSeconds(value, 0, false, 1e9, &opts.job.checkpoint_every_s)) {
        return Bad(key, "seconds, >= 0 (0: only on fsync)", value);
      }
    } else if (key == "dtype") {
      if (!wire::ParseDtype(value, &opts.dtype)) return Bad(key, std::string("one of ") + wire::kDtypeNames, value);
    } else if (key == "access") {
      if (value != "learners") return Bad(key, "learners", value);
      opts.learners_access = true;
    } else if (key == "operators") {
      return Status::InvalidArgument(
          "operators: no longer taken: an initiator name proves nothing (a client picks its own); give the "
          "learners' control LUN access=learners and serve role=control on a target with its own CHAP account "
          "(blkps target start --operator)");
    } else if (key == "role") {
      if (value != "control") return Bad(key, "control", value);
      opts.control = true;
    } else {
      return Status::InvalidArgument(key + ": unknown option (known: " + kLuOptionKeys + ")");
    }
  }
  if (has_eps) {
    (opts.job.model.rule.name == "adagrad" ? opts.job.model.rule.adagrad_eps : opts.job.model.rule.eps) = eps;
  }
  if (opts.learners_access && !opts.control) {
    return Status::InvalidArgument("access: only for the control LUN (role=control;access=learners)");
  }
  if (opts.control) {
    if (seen.size() != 1 + (opts.learners_access ? 1 : 0)) {
      return Status::InvalidArgument("role: a control LUN takes no other option but access; it shows the model "
                                     "its --backing-store names");
    }
    *out = opts;
    return Status::OK();
  }
  if (opts.job.checkpoint_every_s > 0 && opts.job.checkpoint.empty()) {
    return Status::InvalidArgument("checkpoint_every: needs checkpoint=<path>");
  }
  TableShape& table = opts.job.model.table;
  if (table.is_table()) {
    if (seen.count("params")) {
      return Status::InvalidArgument("params: a table's parameters are its rows x width; give table= or params=");
    }
    opts.job.model.num_params = table.rows * table.width;
    if (!seen.count("block")) opts.job.model.block_bytes = TableBlockBytes(table.row_bytes());
    if (opts.job.model.block_bytes % table.row_bytes() != 0) {
      return Bad("block", "a multiple of the table's row of " + std::to_string(table.row_bytes()) + " bytes",
                 std::to_string(opts.job.model.block_bytes));
    }
    if (!seen.count("staleness_aware")) opts.job.staleness_aware = false;
    Status s = CheckTableJob(opts.job);
    if (!s.ok()) return s;
  }
  if (opts.job.model.num_params == 0) {
    return Status::InvalidArgument("params: required (the number of float32 parameters), e.g. params=1000000");
  }
  *out = opts;
  return Status::OK();
}

}  // namespace blkps::server
