// GradientDropper: gradient dropping with a residual (Aji & Heafield 2017,
// Marian's multi-node SGD), in units a block device pushes well: runs of
// consecutive parameters.
//
// The engine's range of `count` parameters is cut into runs of `run_params`
// (the last may be shorter), and the runs into groups of `group_params`
// (0: one group, the whole range). Each iteration Select() adds the residual
// to the new gradient (the "accumulated gradient"), and in every group keeps
// the runs whose accumulated gradient has the largest L2 norm: a fraction
// 1 - drop_ratio of the group's runs, at least one. Those runs are pushed, the
// others are kept as the residual, added to the next gradient. So a gradient
// is never lost, only delayed: at any time
//
//   sum of every gradient given == sum of every run pushed + residual()
//
// (exactly, when the values are small integers), and each value of the
// residual is pushed exactly once, with the run that carries it.
//
// Runs whose accumulated gradient holds a NaN or an infinity (or whose
// squared norm overflows a float) are always selected: the server refuses a
// non-finite gradient loudly instead of the residual hiding it.
//
// Thread-safety: none; one thread calls Select() at a time (the engine's push
// thread).

#ifndef BLKPS_LEARNER_GRADIENT_DROPPER_H_
#define BLKPS_LEARNER_GRADIENT_DROPPER_H_

#include <cstdint>
#include <vector>

namespace blkps {

class GradientDropper {
 public:
  // Parameters [first, first + count) of the engine's range.
  struct Range {
    uint64_t first;
    uint64_t count;
  };

  // REQUIRES: count > 0; run_params > 0; 0 <= drop_ratio < 1.
  // group_params: 0 or a multiple of run_params. Throws std::bad_alloc.
  GradientDropper(uint64_t count, uint64_t run_params, uint64_t group_params, double drop_ratio);

  GradientDropper(const GradientDropper&) = delete;
  GradientDropper& operator=(const GradientDropper&) = delete;

  // Adds the residual to `grad` (count floats, modified in place: it becomes
  // the accumulated gradient), selects the runs to push and moves the others
  // into the residual (their values in `grad` are left as they are, and are
  // not to be pushed). Returns the selected runs, adjacent ones merged, in
  // increasing order; valid until the next Select(). The caller pushes
  // exactly those ranges of `grad`.
  const std::vector<Range>& Select(float* grad);

  // Adds the residual to `grad` and empties it: the caller pushes all of
  // `grad` (the returned single range), so nothing stays behind.
  const std::vector<Range>& SelectAll(float* grad);

  // What has been dropped and not pushed yet; count floats.
  const float* residual() const { return residual_.data(); }
  uint64_t count() const { return count_; }
  // Runs selected per group of `runs` runs: (1 - drop_ratio) of them,
  // rounded to the nearest, at least one.
  uint64_t RunsKept(uint64_t runs) const;

 private:
  const uint64_t count_;
  const uint64_t run_params_;
  const uint64_t group_runs_;  // runs per group
  const double drop_ratio_;
  std::vector<float> residual_;
  std::vector<double> norms_;    // per run, of the accumulated gradient
  std::vector<uint64_t> order_;  // run indices of one group, for selection
  std::vector<bool> selected_;   // per run
  std::vector<Range> ranges_;
};

}  // namespace blkps

#endif  // BLKPS_LEARNER_GRADIENT_DROPPER_H_
