// UpdateRule: how a model block's weights change when a gradient arrives.
//
// The model calls Apply() once per model block touched by a write, holding
// that block's write lock, so a rule sees each parameter from one thread at a
// time and needs no locking for per-parameter state it keeps (momentum, Adam
// moments: indexed by the absolute parameter index `first`). Different blocks
// are applied concurrently from different threads.
//
// The rules (g: the gradient a learner wrote; every operation is per
// parameter; state starts at zero; lr, μ, β1, β2 and ε are the parameters
// params() calls lr, momentum, beta1, beta2 and eps):
//   sgd       w -= lr·g
//   momentum  v = μ·v + g;  w -= lr·v
//             with nesterov: v = μ·v + g;  w -= lr·(g + μ·v)
//   adagrad   s += g²;  w -= lr·g / (sqrt(s) + ε)    (ε: RuleOptions::adagrad_eps)
//   adam      t += 1;  m = β1·m + (1-β1)·g;  v = β2·v + (1-β2)·g²;
//             w -= lr·m̂ / (sqrt(v̂) + ε)  where m̂ = m/(1-β1^t), v̂ = v/(1-β2^t)
//   (a stale gradient in async/ssp: see ApplyStale)
//   sum       w += g            no parameters (lr is ignored): for learners
//                               that run their own optimizer and write the
//                               step they want added.
//   average   w += lr·g         a scaled accumulate, nothing more: with lr =
//                               1/L and each of L learners writing its update
//                               once, w gains the mean of the L updates. The
//                               rule neither counts learners nor waits for
//                               them; averaging across learners per iteration
//                               (BSP) belongs to consistency control.
//
// Adam's step count t is kept per parameter, not per model: a write carries
// the gradient of one parameter range, so it is one step for those parameters
// only. Learners write different ranges at different rates (and a range may
// cover part of a model block), so a global count would over-correct the bias
// of parameters that are updated rarely. t saturates at 2^32-1, where the
// bias corrections are exactly 1.
//
// Hyperparameters change at run time (a learner's learning-rate schedule, a
// checkpoint restoring them): SetParam() takes effect from the next Apply()
// on and applies to the state as it stands. Momentum's v and Adam's m, v and
// t are kept, not reset, and Adam's bias corrections use the β's of the
// Apply() call with each parameter's own t. nesterov is fixed at creation.
//
// Adding a rule: subclass UpdateRule in update_rule.cc (implement
// ApplyScaled()), add its name to MakeUpdateRule() and kUpdateRuleNames.
// Nothing else changes.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "status.h"

namespace blkps::server {

// The rules MakeUpdateRule() knows, for error messages and docs.
inline constexpr const char* kUpdateRuleNames = "sgd, momentum, adagrad, adam, sum, average";

// Each field is named as its --bsopts key; MakeUpdateRule() checks every
// field whichever rule is named (a bad value is refused even where the rule
// does not use it).
struct RuleOptions {
  std::string name = "sgd";
  float lr = 0.01f;            // learning rate (not used by sum); finite and > 0
  float momentum = 0.9f;       // momentum: μ, in [0, 1)
  bool nesterov = false;       // momentum: take Nesterov's look-ahead step
  float beta1 = 0.9f;          // adam: decay of the first moment, in [0, 1)
  float beta2 = 0.999f;        // adam: decay of the second moment, in [0, 1)
  float eps = 1e-8f;           // adam: ε added to sqrt(v̂); finite and > 0
  float adagrad_eps = 1e-10f;  // adagrad: ε added to sqrt(s); finite and > 0.
                               // Its own field: adagrad's customary default
                               // (1e-10) differs from adam's (1e-8).
};

// One array of a rule's per-parameter state: element i belongs to parameter
// i, bytes / num_params bytes each, in host byte order.
struct StateArray {
  const char* name;  // "<rule>.<array>", e.g. "adam.m"; stable, for checkpoints
  void* data;        // owned by the rule, valid while it lives; page-aligned
                     // (nullptr for a model of 0 parameters)
  size_t bytes;      // num_params × element size, exactly
};

class UpdateRule {
 public:
  virtual ~UpdateRule() = default;
  UpdateRule(const UpdateRule&) = delete;
  UpdateRule& operator=(const UpdateRule&) = delete;

  virtual const char* name() const = 0;

  // Bytes of state the rule keeps per parameter, exactly (memory accounting):
  // the sum of state()'s bytes divided by the number of parameters.
  virtual size_t state_bytes_per_param() const = 0;

  // The parameters this rule uses, named by their --bsopts keys, with their
  // current values, in a fixed order:
  //   sgd: lr; momentum: lr, momentum; adagrad: lr, eps; adam: lr, beta1,
  //   beta2, eps; sum: (none); average: lr.
  // adagrad's "eps" is RuleOptions::adagrad_eps.
  //
  // Thread-safe: SetParam() may be called from any thread while others
  // Apply(). Each Apply() call reads every parameter once at its start, so
  // one call applies its whole range with one set of values; a call that
  // starts after SetParam() returns uses the new value. SetParam() changes
  // one parameter at a time: a call that overlaps changes to two may see
  // only one of them.
  std::vector<std::pair<std::string, float>> params() const;

  // Sets parameter `key` to `value`. On failure returns InvalidArgument with
  // a one-line message starting with the key, and changes nothing:
  //   a key this rule does not use (the message lists the ones it does);
  //   a value out of range, checked and worded as MakeUpdateRule() checks
  //   RuleOptions (lr, eps: finite and > 0; momentum, beta1, beta2: [0, 1)).
  Status SetParam(const std::string& key, float value);
  // What SetParam(key, value) would return, changing nothing.
  Status CheckParam(const std::string& key, float value) const;

  // The learning rate, "lr" in params(); 0 for a rule without one (sum).
  float lr() const { return param(kLr); }

  // Applies gradient g[0..n) to weights w[0..n), which are parameters
  // [first, first + n). REQUIRES: the caller holds the write lock of the
  // model block containing them; first + n <= num_params; g is finite.
  void Apply(uint64_t first, float* w, const float* g, size_t n) { ApplyScaled(first, w, g, n, 1.0f); }

  // Applies a gradient that is `staleness` updates old (async and ssp: the
  // updates applied to these parameters between the pusher's read and its
  // push; doc/server.md "Asynchronous training"). Staleness 0 is exactly Apply().
  // Otherwise, with N = 1 + staleness, the default is Zhang et al.'s (2016)
  // staleness-aware step: Apply() to g/N. momentum overrides it: v =
  // μ^N·v + g/N, its momentum corrected for the momentum asynchrony itself
  // brings (Mitliagkas et al. 2016; see MomentumRule). sum and average are
  // exact accumulators (delta mode, exactly-once counts): they add every push
  // as written, whatever its staleness. Same REQUIRES as Apply().
  virtual void ApplyStale(uint64_t first, float* w, const float* g, size_t n, uint64_t staleness);

  // What a rule implements: Apply() to the gradient scale·g[0..n), the scale
  // taken in the rule's own loop (g is read once, never copied). The product
  // scale·g[i] is formed first and used as Apply() uses g[i], so scale 1 is
  // Apply() bit for bit. Same REQUIRES as Apply(); scale > 0.
  virtual void ApplyScaled(uint64_t first, float* w, const float* g, size_t n, float scale) = 0;

  // The rule's per-parameter state, for checkpoints: empty for rules without
  // state, otherwise one entry per array, in a fixed order. A checkpoint saves
  // the bytes and restores them by writing them back. REQUIRES while reading
  // or writing them: no Apply() runs (hold every block's write lock).
  virtual std::vector<StateArray> state() { return {}; }

 protected:
  // Every parameter a rule may tune, in params() order; kParamKeys names them.
  enum Param { kLr, kMomentum, kBeta1, kBeta2, kEps, kNumParams };
  static constexpr const char* kParamKeys[kNumParams] = {"lr", "momentum", "beta1", "beta2", "eps"};

  // A rule that tunes the parameters in `tuned`, each with its value at
  // creation. REQUIRES: the values are in range (MakeUpdateRule checks them).
  explicit UpdateRule(std::initializer_list<std::pair<Param, float>> tuned);

  // The current value of p (0 where the rule does not tune p). Apply() reads
  // each parameter it uses once, into a local, before its loops.
  float param(Param p) const { return values_[p].load(); }

 private:
  static_assert(std::atomic<float>::is_always_lock_free, "parameters are read on the data path");
  std::atomic<float> values_[kNumParams] = {};
  bool tuned_[kNumParams] = {};  // fixed at creation
};

// Creates the rule named in `opts` for a model of `num_params` parameters,
// with its state zeroed. State is mapped like the weights (anonymous,
// page-aligned), so memory is committed as parameters are first written.
// On failure returns non-OK with a one-line message starting with the option
// at fault and leaves *out untouched:
//   InvalidArgument    unknown rule name (the message lists the known ones),
//                      or a field out of range (named as in RuleOptions);
//   ResourceExhausted  the state cannot be mapped.
Status MakeUpdateRule(const RuleOptions& opts, uint64_t num_params, std::unique_ptr<UpdateRule>* out);

// A table's row made: writes zeros over row `row` of each array of `state`,
// whose bytes are `rows` equal rows. The state of a row not made is zero
// already; written before the rule reads it, a page first touched here is
// committed by that write, where a read first would map the shared zero
// page and the write after it copy that page and flush the TLB of every
// CPU running the process's threads (an interprocessor interrupt each,
// costly in a VM).
void ZeroStateRow(const std::vector<StateArray>& state, uint64_t rows, uint64_t row);

}  // namespace blkps::server
