// UpdateRule: how a model block's weights change when a gradient arrives.
//
// The model calls Apply() once per model block touched by a write, holding
// that block's write lock, so a rule sees each parameter from one thread at a
// time and needs no locking for per-parameter state it keeps (momentum, Adam
// moments: indexed by the absolute parameter index `first`). Different blocks
// are applied concurrently from different threads.
//
// Adding a rule: subclass UpdateRule in update_rule.cc and add its name to
// MakeUpdateRule(). Nothing else changes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "status.h"

namespace blkps {

// The rules MakeUpdateRule() knows, for error messages and docs.
inline constexpr const char* kUpdateRuleNames = "sgd";

struct RuleOptions {
  std::string name = "sgd";
  float lr = 0.01f;  // learning rate; finite and > 0
};

class UpdateRule {
 public:
  virtual ~UpdateRule() = default;

  virtual const char* name() const = 0;

  // Bytes of state the rule keeps per parameter (for memory accounting).
  virtual size_t state_bytes_per_param() const = 0;

  // Applies gradient g[0..n) to weights w[0..n), which are parameters
  // [first, first + n). REQUIRES: the caller holds the write lock of the
  // model block containing them; g is finite.
  virtual void Apply(uint64_t first, float* w, const float* g, size_t n) = 0;
};

// Creates the rule named in `opts` for a model of `num_params` parameters.
// On failure returns non-OK (unknown name, bad learning rate) and leaves *out
// untouched.
Status MakeUpdateRule(const RuleOptions& opts, uint64_t num_params,
                      std::unique_ptr<UpdateRule>* out);

}  // namespace blkps
