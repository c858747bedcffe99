// GradientDropper (gradient_dropper.h): top runs by L2 norm, residual kept.

#include "gradient_dropper.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace blkps {

GradientDropper::GradientDropper(uint64_t count, uint64_t run_params, uint64_t group_params, double drop_ratio)
    : count_(count),
      run_params_(run_params),
      group_runs_(group_params == 0 ? (count + run_params - 1) / run_params : group_params / run_params),
      drop_ratio_(drop_ratio),
      residual_(count, 0.0f),
      norms_((count + run_params - 1) / run_params),
      selected_(norms_.size()) {
  order_.reserve(std::min<uint64_t>(group_runs_, norms_.size()));
}

uint64_t GradientDropper::RunsKept(uint64_t runs) const {
  const long long kept = std::llround((1.0 - drop_ratio_) * static_cast<double>(runs));
  return std::clamp<uint64_t>(static_cast<uint64_t>(std::max(kept, 1LL)), 1, runs);
}

const std::vector<GradientDropper::Range>& GradientDropper::Select(float* grad) {
  const uint64_t runs = norms_.size();
  // One pass: the accumulated gradient (gradient + residual) goes into both
  // `grad` and the residual, and each run's squared L2 norm is taken. A
  // non-finite run gets +inf: always selected.
  for (uint64_t r = 0; r < runs; ++r) {
    const uint64_t begin = r * run_params_;
    const uint64_t end = std::min(begin + run_params_, count_);
    float* g = grad + begin;
    float* res = residual_.data() + begin;
    const uint64_t n = end - begin;
    // Two 4-float vectors of partial sums (GCC/Clang vector extension; the
    // compiler does not reorder a float sum by itself).
    typedef float Float4 __attribute__((vector_size(16)));
    Float4 sum0 = {0, 0, 0, 0}, sum1 = {0, 0, 0, 0};
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      Float4 a0, a1, r0, r1;
      memcpy(&a0, g + i, 16);
      memcpy(&a1, g + i + 4, 16);
      memcpy(&r0, res + i, 16);
      memcpy(&r1, res + i + 4, 16);
      a0 += r0;
      a1 += r1;
      memcpy(g + i, &a0, 16);
      memcpy(g + i + 4, &a1, 16);
      memcpy(res + i, &a0, 16);
      memcpy(res + i + 4, &a1, 16);
      sum0 += a0 * a0;
      sum1 += a1 * a1;
    }
    const Float4 sum = sum0 + sum1;
    float partial[4];
    memcpy(partial, &sum, 16);
    double norm = 0;
    for (; i < n; ++i) {
      const float a = g[i] + res[i];
      g[i] = a;
      res[i] = a;
      norm += static_cast<double>(a) * a;
    }
    for (float p : partial) norm += p;
    norms_[r] = std::isfinite(norm) ? norm : std::numeric_limits<double>::infinity();
  }

  // Per group: the RunsKept() runs of largest norm (ties: the lower index).
  for (uint64_t first = 0; first < runs; first += group_runs_) {
    const uint64_t last = std::min(first + group_runs_, runs);
    order_.clear();
    for (uint64_t r = first; r < last; ++r) {
      order_.push_back(r);
      selected_[r] = false;
    }
    const uint64_t kept = RunsKept(last - first);
    auto larger = [this](uint64_t a, uint64_t b) { return norms_[a] != norms_[b] ? norms_[a] > norms_[b] : a < b; };
    if (kept < order_.size()) {
      std::nth_element(order_.begin(), order_.begin() + kept, order_.end(), larger);
    }
    for (uint64_t k = 0; k < kept; ++k) selected_[order_[k]] = true;
  }

  // Selected runs leave the residual: their value travels with the push.
  ranges_.clear();
  for (uint64_t r = 0; r < runs; ++r) {
    if (!selected_[r]) continue;
    const uint64_t begin = r * run_params_;
    const uint64_t n = std::min(begin + run_params_, count_) - begin;
    memset(residual_.data() + begin, 0, n * sizeof(float));
    if (!ranges_.empty() && ranges_.back().first + ranges_.back().count == begin) {
      ranges_.back().count += n;
    } else {
      ranges_.push_back(Range{begin, n});
    }
  }
  return ranges_;
}

const std::vector<GradientDropper::Range>& GradientDropper::SelectAll(float* grad) {
  for (uint64_t i = 0; i < count_; ++i) grad[i] += residual_[i];
  std::fill(residual_.begin(), residual_.end(), 0.0f);
  ranges_.assign(1, Range{0, count_});
  return ranges_;
}

}  // namespace blkps
