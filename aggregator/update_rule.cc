#include "update_rule.h"

#include "page_buffer.h"

#include <cblas.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

namespace blkps::server {
namespace {

StateArray Describe(const char* name, const PageBuffer& buffer) {
  return StateArray{name, buffer.as<void>(), buffer.bytes()};
}

// Runs body(i) for i in [0, n). GCC at -O2 vectorises a loop only when its
// trip count is a known multiple of the vector width, so the body runs over
// fixed chunks and then the tail. Keep bodies branch-free.
template <typename Body>
inline void ForEachParameter(size_t n, Body body) {
  constexpr size_t kChunk = 16;
  size_t i = 0;
  for (; i + kChunk <= n; i += kChunk) {
    for (size_t k = i; k < i + kChunk; ++k) body(k);
  }
  for (; i < n; ++i) body(i);
}

// w -= lr·g
class SgdRule final : public UpdateRule {
 public:
  explicit SgdRule(const RuleOptions& o) : UpdateRule({{kLr, o.lr}}) {}
  const char* name() const override { return "sgd"; }
  size_t state_bytes_per_param() const override { return 0; }
  void ApplyScaled(uint64_t, float* __restrict w, const float* __restrict g, size_t n, float scale) override {
    if (scale == 1.0f) return cblas_saxpy(static_cast<blasint>(n), -lr(), g, 1, w, 1);
    const float lr = this->lr();
    // A plain loop over the __restrict parameters: through ForEachParameter's
    // lambda (whose captured pointers lose __restrict) GCC unrolled each
    // chunk into scalar code, and perf saw this step take 3.5× saxpy's time.
    for (size_t i = 0; i < n; ++i) w[i] -= lr * (scale * g[i]);
  }
};

// v = μ·v + g; then w -= lr·v, or with Nesterov w -= lr·(g + μ·v).
//
// A push `staleness` updates old (N = 1 + staleness; about the number of
// learners in async and ssp) is taken as 1/N of a round of N pushes, and a
// round as one step of one process on the total batch:
//   v = d·v + c·g;  w -= (lr/N)·v,  d = μ^(1/N), c = (1-d)/(1-μ)
// N pushes decay v by μ, and with a steady gradient g a round moves w by
// lr·g/(1-μ), one process's momentum step (c ≈ 1/N: Zhang et al.'s 2016
// staleness-aware step g/N). The delay that makes momentum unstable in
// async (asynchrony is itself momentum: Mitliagkas et al. 2016) is
// compensated in the learner: blkps.torch takes the gradient at a
// look-ahead point (doc/async.md "Look-ahead"). The rule before,
// v = μ^N·v + g/N; w -= lr·v, moved w (1-μ)/(1-μ^N) as far per round: 5.7
// times less with 8 learners, whose CNN reached 0.75 against 0.87.
class MomentumRule final : public UpdateRule {
 public:
  MomentumRule(const RuleOptions& o, PageBuffer v)
      : UpdateRule({{kLr, o.lr}, {kMomentum, o.momentum}}), nesterov_(o.nesterov), v_(std::move(v)) {}
  const char* name() const override { return "momentum"; }
  size_t state_bytes_per_param() const override { return sizeof(float); }
  // One fused pass (measured faster than saxpby + saxpy: v is read once).
  void ApplyScaled(uint64_t first, float* __restrict w, const float* __restrict g, size_t n, float scale) override {
    const float lr = this->lr();
    const float mu = param(kMomentum);
    float* __restrict v = v_.as<float>() + first;
    if (nesterov_) {
      ForEachParameter(n, [=](size_t i) {
        const float gi = scale * g[i];
        const float vi = mu * v[i] + gi;
        v[i] = vi;
        w[i] -= lr * (gi + mu * vi);
      });
    } else {
      ForEachParameter(n, [=](size_t i) {
        const float vi = mu * v[i] + scale * g[i];
        v[i] = vi;
        w[i] -= lr * vi;
      });
    }
  }
  void ApplyStale(uint64_t first, float* __restrict w, const float* __restrict g, size_t n,
                  uint64_t staleness) override {
    if (staleness == 0) return Apply(first, w, g, n);
    const double pushes = 1.0 + static_cast<double>(staleness);
    const double mu_round = param(kMomentum), d = std::pow(mu_round, 1.0 / pushes);
    const float lr = static_cast<float>(this->lr() / pushes);
    const float mu = static_cast<float>(d);
    const float c = static_cast<float>(mu_round < 1.0 ? (1.0 - d) / (1.0 - mu_round) : 1.0 / pushes);
    float* __restrict v = v_.as<float>() + first;
    const bool nesterov = nesterov_;
    ForEachParameter(n, [=](size_t i) {
      const float gi = c * g[i];
      const float vi = mu * v[i] + gi;
      v[i] = vi;
      w[i] -= lr * (nesterov ? gi + mu * vi : vi);
    });
  }
  std::vector<StateArray> state() override { return {Describe("momentum.v", v_)}; }

 private:
  const bool nesterov_;
  PageBuffer v_;
};

// s += g²; w -= lr·g / (sqrt(s) + ε)
class AdagradRule final : public UpdateRule {
 public:
  AdagradRule(const RuleOptions& o, PageBuffer s)
      : UpdateRule({{kLr, o.lr}, {kEps, o.adagrad_eps}}), s_(std::move(s)) {}
  const char* name() const override { return "adagrad"; }
  size_t state_bytes_per_param() const override { return sizeof(float); }
  void ApplyScaled(uint64_t first, float* __restrict w, const float* __restrict g, size_t n, float scale) override {
    const float lr = this->lr();
    const float eps = param(kEps);
    float* __restrict s = s_.as<float>() + first;
    ForEachParameter(n, [=](size_t i) {
      const float gi = scale * g[i];
      const float si = s[i] + gi * gi;
      s[i] = si;
      w[i] -= lr * gi / (std::sqrt(si) + eps);
    });
  }
  std::vector<StateArray> state() override { return {Describe("adagrad.s", s_)}; }

 private:
  PageBuffer s_;
};

// One run of Adam over parameters that all take step `step`:
// w -= step_size·m / (sqrt(v)·inv_sqrt_c2 + ε), with step_size = lr/(1-β1^t)
// and inv_sqrt_c2 = 1/sqrt(1-β2^t), which is lr·m̂/(sqrt(v̂) + ε). Out of
// line: inlined into AdamRule::Apply's loop, GCC loses the __restrict and will
// not vectorise at -O2 (it would need a runtime alias check). Built twice,
// picked at load time: AVX2 (8 lanes; no FMA, so every operation rounds as in
// the SSE2 build and results are bit-identical) where the CPU has it. The
// divide and square root bound Adam's rate: AVX2 took it from 1.1 to 2.1 GB/s
// of gradient on a 2-core EPYC VM.
#if defined(__SANITIZE_THREAD__)
// One version under GCC's ThreadSanitizer (-DBLKPS_SANITIZE=thread): the
// clones' ifunc resolver runs while the program is relocated, before TSan's
// runtime is up, and its instrumentation crashed every test at load.
__attribute__((noinline))
#elif defined(__clang__)  // clang (and clang-tidy) refuses noinline beside target_clones
__attribute__((target_clones("avx2", "default")))
#else
__attribute__((noinline, target_clones("avx2", "default")))
#endif
void AdamRun(float b1, float b2, float eps, uint32_t step, float step_size, float inv_sqrt_c2,
             float* __restrict w, const float* __restrict g, float scale, float* __restrict m,
             float* __restrict v, uint32_t* __restrict t,
             size_t n) {
  const float one_minus_b1 = 1.0f - b1, one_minus_b2 = 1.0f - b2;  // exact for b in [0.5, 1)
  std::fill_n(t, n, step);
  ForEachParameter(n, [=](size_t i) {
    const float gi = scale * g[i];
    const float mi = b1 * m[i] + one_minus_b1 * gi;
    const float vi = b2 * v[i] + one_minus_b2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    w[i] -= step_size * mi / (std::sqrt(vi) * inv_sqrt_c2 + eps);
  });
}

// Per parameter: t += 1; m = β1·m + (1-β1)·g; v = β2·v + (1-β2)·g²;
// w -= lr·m̂ / (sqrt(v̂) + ε) with m̂ = m/(1-β1^t), v̂ = v/(1-β2^t).
//
// The bias corrections depend on t, which is per parameter. Parameters in a
// range usually share t (a learner writes whole ranges), so Apply() splits
// the range into runs of equal t, computes the corrections once per run (in
// double), and runs a branch-free loop over each run. A ragged history costs
// more runs, never a wrong answer. Every run uses the β's read once at the
// start of Apply(), so a concurrent SetParam() cannot split a call.
class AdamRule final : public UpdateRule {
 public:
  AdamRule(const RuleOptions& o, PageBuffer m, PageBuffer v, PageBuffer t)
      : UpdateRule({{kLr, o.lr}, {kBeta1, o.beta1}, {kBeta2, o.beta2}, {kEps, o.eps}}),
        m_(std::move(m)),
        v_(std::move(v)),
        t_(std::move(t)) {}
  const char* name() const override { return "adam"; }
  size_t state_bytes_per_param() const override { return 2 * sizeof(float) + sizeof(uint32_t); }

  void ApplyScaled(uint64_t first, float* w, const float* g, size_t n, float scale) override {
    const double lr = this->lr();
    const float beta1 = param(kBeta1), beta2 = param(kBeta2), eps = param(kEps);
    float* m = m_.as<float>() + first;
    float* v = v_.as<float>() + first;
    uint32_t* t = t_.as<uint32_t>() + first;
    size_t start = 0;
    while (start < n) {
      const uint32_t count = t[start];
      size_t end = start + 1;
      while (end < n && t[end] == count) ++end;
      const uint32_t step = count == std::numeric_limits<uint32_t>::max() ? count : count + 1;
      const double correction1 = 1.0 - std::pow(static_cast<double>(beta1), step);
      const double correction2 = 1.0 - std::pow(static_cast<double>(beta2), step);
      AdamRun(beta1, beta2, eps, step, static_cast<float>(lr / correction1),
              static_cast<float>(1.0 / std::sqrt(correction2)), w + start, g + start, scale, m + start, v + start,
              t + start, end - start);
      start = end;
    }
  }

  std::vector<StateArray> state() override {
    return {Describe("adam.m", m_), Describe("adam.v", v_), Describe("adam.t", t_)};
  }

 private:
  PageBuffer m_, v_, t_;
};

// w += g; no parameters (the learning rate is ignored).
class SumRule final : public UpdateRule {
 public:
  SumRule() : UpdateRule({}) {}
  const char* name() const override { return "sum"; }
  size_t state_bytes_per_param() const override { return 0; }
  void ApplyScaled(uint64_t, float* w, const float* g, size_t n, float scale) override {
    cblas_saxpy(static_cast<blasint>(n), scale, g, 1, w, 1);
  }
  // An exact accumulator: a push is added as written, however stale.
  void ApplyStale(uint64_t first, float* w, const float* g, size_t n, uint64_t) override { Apply(first, w, g, n); }
};

// w += lr·g: a scaled accumulate (see the header for what it is not).
class AverageRule final : public UpdateRule {
 public:
  explicit AverageRule(const RuleOptions& o) : UpdateRule({{kLr, o.lr}}) {}
  const char* name() const override { return "average"; }
  size_t state_bytes_per_param() const override { return 0; }
  void ApplyScaled(uint64_t, float* __restrict w, const float* __restrict g, size_t n, float scale) override {
    if (scale == 1.0f) return cblas_saxpy(static_cast<blasint>(n), lr(), g, 1, w, 1);
    const float lr = this->lr();
    ForEachParameter(n, [=](size_t i) { w[i] += lr * (scale * g[i]); });
  }
  // An exact accumulator, as sum: a push is added as written, however stale.
  void ApplyStale(uint64_t first, float* w, const float* g, size_t n, uint64_t) override { Apply(first, w, g, n); }
};

// "1.5", "1e-08", "nan": as a person writes numbers, not std::to_string's "1.500000".
std::string FormatFloat(float x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(x));
  return buf;
}

// The range of a tunable parameter or RuleOptions field, by its name: the
// decays (momentum, beta1, beta2) in [0, 1); lr, eps and adagrad_eps finite
// and > 0. The message starts with the name. One check for MakeUpdateRule()
// and SetParam(), so a value is refused the same way at creation and later.
Status CheckParam(const std::string& name, float x) {
  if (name == "momentum" || name == "beta1" || name == "beta2") {
    if (x >= 0 && x < 1) return Status::OK();  // false for NaN
    return Status::InvalidArgument(name + ": expected a number in [0, 1), got " + FormatFloat(x));
  }
  if (std::isfinite(x) && x > 0) return Status::OK();
  return Status::InvalidArgument(name + ": expected a finite number > 0, got " + FormatFloat(x));
}

Status CheckOptions(const RuleOptions& o) {
  const std::pair<const char*, float> fields[] = {{"lr", o.lr},       {"momentum", o.momentum},
                                                  {"beta1", o.beta1}, {"beta2", o.beta2},
                                                  {"eps", o.eps},     {"adagrad_eps", o.adagrad_eps}};
  for (const auto& [field, x] : fields) {
    Status s = CheckParam(field, x);
    if (!s.ok()) return s;
  }
  return Status::OK();
}

}  // namespace

void ZeroStateRow(const std::vector<StateArray>& state, uint64_t rows, uint64_t row) {
  for (const StateArray& a : state) {
    const uint64_t row_bytes = a.bytes / rows;
    std::memset(static_cast<char*>(a.data) + row * row_bytes, 0, row_bytes);
  }
}

// g/N scaled inside the rule's own loop: one pass over g, no copy.
void UpdateRule::ApplyStale(uint64_t first, float* w, const float* g, size_t n, uint64_t staleness) {
  if (staleness == 0) return Apply(first, w, g, n);
  ApplyScaled(first, w, g, n, static_cast<float>(1.0 / (1.0 + static_cast<double>(staleness))));
}

UpdateRule::UpdateRule(std::initializer_list<std::pair<Param, float>> tuned) {
  for (const auto& [p, value] : tuned) {
    values_[p].store(value);
    tuned_[p] = true;
  }
}

std::vector<std::pair<std::string, float>> UpdateRule::params() const {
  std::vector<std::pair<std::string, float>> out;
  for (int p = 0; p < kNumParams; ++p) {
    if (tuned_[p]) out.emplace_back(kParamKeys[p], param(static_cast<Param>(p)));
  }
  return out;
}

Status UpdateRule::SetParam(const std::string& key, float value) {
  Status s = CheckParam(key, value);
  if (!s.ok()) return s;
  for (int p = 0; p < kNumParams; ++p) {
    if (tuned_[p] && key == kParamKeys[p]) values_[p].store(value);
  }
  return s;
}

Status UpdateRule::CheckParam(const std::string& key, float value) const {
  for (int p = 0; p < kNumParams; ++p) {
    if (tuned_[p] && key == kParamKeys[p]) return blkps::server::CheckParam(key, value);
  }
  std::string known;
  for (const auto& [k, v] : params()) known += (known.empty() ? "" : ", ") + k;
  return Status::InvalidArgument(key + ": rule " + name() + " has no parameter '" + key + "' (" +
                                 (known.empty() ? "it has none" : "its parameters: " + known) + ")");
}

Status MakeUpdateRule(const RuleOptions& opts, uint64_t num_params, std::unique_ptr<UpdateRule>* out) {
  Status s = CheckOptions(opts);
  if (!s.ok()) return s;

  const std::string& name = opts.name;
  if (name == "sgd") {
    *out = std::make_unique<SgdRule>(opts);
  } else if (name == "momentum") {
    PageBuffer v;
    if (!(s = PageBuffer::Allocate(num_params, sizeof(float), "the momentum state", &v)).ok()) return s;
    *out = std::make_unique<MomentumRule>(opts, std::move(v));
  } else if (name == "adagrad") {
    PageBuffer sq;
    if (!(s = PageBuffer::Allocate(num_params, sizeof(float), "the adagrad state", &sq)).ok()) return s;
    *out = std::make_unique<AdagradRule>(opts, std::move(sq));
  } else if (name == "adam") {
    PageBuffer m, v, t;
    if (!(s = PageBuffer::Allocate(num_params, sizeof(float), "the adam state", &m)).ok() ||
        !(s = PageBuffer::Allocate(num_params, sizeof(float), "the adam state", &v)).ok() ||
        !(s = PageBuffer::Allocate(num_params, sizeof(uint32_t), "the adam state", &t)).ok()) {
      return s;
    }
    *out = std::make_unique<AdamRule>(opts, std::move(m), std::move(v), std::move(t));
  } else if (name == "sum") {
    *out = std::make_unique<SumRule>();
  } else if (name == "average") {
    *out = std::make_unique<AverageRule>(opts);
  } else {
    return Status::InvalidArgument("rule: unknown update rule '" + name + "' (known: " + kUpdateRuleNames + ")");
  }
  return Status::OK();
}

}  // namespace blkps::server
