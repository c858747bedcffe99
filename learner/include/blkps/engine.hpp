// blkps::Engine: a learner's training loop against a blkps model, with double
// buffering and adaptive pulling (as in iRDMA). C++ API.
//
// The engine owns two weight buffers W[0], W[1] and two gradient buffers
// G[0], G[1] for the parameter range it serves. During iteration t the
// caller's compute reads W[t%2] (weights()) and writes G[t%2] (gradient());
// meanwhile a push thread sends G[(t-1)%2], the previous gradient, and a pull
// thread reads the newest weights into W[(t+1)%2]. Step() ends iteration t:
// it waits for that communication (the wait is the "stall"), hands G[t%2] to
// the push thread and swaps: no copy of the model is made.
//
//   std::string error;
//   auto engine = blkps::Engine::Open(url, blkps::EngineOptions(), &error);
//   if (!engine) { fprintf(stderr, "%s\n", error.c_str()); return 1; }
//   for (int t = 0; t < iterations; ++t) {
//     ComputeGradient(engine->weights(), engine->gradient(), engine->count());
//     if (engine->Step() != 0) { ... engine->last_error() ...; break; }
//   }
//   engine->Finish();  // pushes the last gradient
//
// So the weights used in iteration t+1 were pulled during iteration t, after
// (or, when push and pull run concurrently, while) the gradient of iteration
// t-1 was pushed: the learner's own last gradient may be missing from them
// (one iteration of delay, the price of overlapping communication).
//
// Adaptive pulling: a PullScheduler (learner/src/pull_scheduler.h) keeps
// moving averages of compute, push and pull time. When push then pull fit in
// the predicted compute time, the pull starts after the push, delayed (the
// bubble) so that it ends just before compute is predicted to end: the
// freshest weights without a stall. When compute is shorter than push plus
// pull, the push and the pull run at the same time, each on its own iSCSI
// connection and thread, and the pull starts at once. With
// double_buffering = false, Step() instead pushes the gradient and then
// pulls the weights itself, on the caller's thread (the baseline: every
// transfer is a stall).
//
// Gradients: each gradient handed to Step() is pushed exactly once, in
// order (with drop_ratio, the parts of it that are dropped are pushed later,
// exactly once, added to a later gradient); the engine never drops one
// silently and never resends one (below it, an iSCSI reconnect resends the
// commands in flight, see Model). When a push or a pull fails, Step() (or
// Finish()) returns the error and the engine is failed: every later Step()/Finish() returns that error again, nothing
// more is pushed, and gradients_pushed() says how many gradients reached the
// server whole. The gradient whose push failed may be partly applied (the
// device cannot say which requests of a failed transfer arrived); the
// gradient passed to the failing Step() is never pushed.
//
// Thread-safety: an Engine is driven by one thread (the caller's "compute
// thread"); its methods are not safe to call concurrently. The engine runs
// its own push and pull threads, which touch only the buffers the contract
// above gives them. No method throws.

#ifndef BLKPS_ENGINE_HPP_
#define BLKPS_ENGINE_HPP_

#include <cstdint>
#include <memory>
#include <string>

#include "blkps/export.h"
#include "blkps/model.hpp"

namespace blkps {

struct EngineOptions {
  // Request size, queue depth and initiator name of the engine's
  // connections. The engine opens up to three connections to the target
  // (push, pull, and one to control_target); an empty initiator_name gives
  // each its own generated name, a given one gets "-push", "-pull" and
  // "-control" appended (iSCSI sessions of one name would log each other out).
  OpenOptions open;
  // The parameter range [first_param, first_param + param_count) the engine
  // pushes and pulls; param_count = 0: up to the end of the device.
  uint64_t first_param = 0;
  uint64_t param_count = 0;
  // false: the baseline, no overlap. Step() pushes then pulls, synchronously.
  bool double_buffering = true;
  // false: each pull starts as soon as it may (at once when push and pull run
  // concurrently, else when the push is done); no bubble.
  bool adaptive_pull = true;
  // Weight of the newest sample in the moving averages, in (0, 1].
  double smoothing = 0.25;
  // Gradient dropping (doc/libblkps.md "Gradient dropping"): 0 pushes every gradient
  // whole. A ratio in (0, 1) pushes only the runs of drop_run_params
  // parameters whose accumulated gradient (this gradient plus what was
  // dropped before) has the largest L2 norm, 1 - drop_ratio of the runs of
  // each group of drop_group_params (at least one), and keeps the rest as a
  // residual added to the next gradient: delayed, never lost. Finish()
  // pushes the last gradient whole, with the residual.
  // Refused in bsp (seen through control_target), and where it would keep
  // every run. drop_run_params: a multiple of the device's logical block;
  // 0 = the request size, or with groups 1/2^k of the group, 2^k at least
  // 1 / (1 - drop_ratio). drop_group_params: a multiple of the run; 0 = the
  // whole range, or in ssp (seen through control_target) the server's model
  // block, so that every block's clocks tick alike for every learner.
  double drop_ratio = 0;
  uint64_t drop_run_params = 0;
  uint64_t drop_group_params = 0;
  // Optional: the model's control LUN (`blkps target start`'s control URL). When set,
  // the engine measures staleness (IterationMetrics::staleness) by reading the
  // control LUN's counters record (blkps/control_lun.h) at the start of each
  // pull and when the weights start being used.
  std::string control_target;
};

// What one iteration cost; Step() for iteration t fills it for t.
struct IterationMetrics {
  uint64_t iteration = 0;
  // From the return of the previous Step() (or of Open()) to this Step().
  double compute_s = 0;
  // Time this Step() waited for communication (the compute thread idle).
  double stall_s = 0;
  // The push of the previous iteration's gradient (0 in iteration 0), and
  // the pull of the next iteration's weights; with double_buffering = false,
  // this iteration's gradient and the next weights, both inside stall_s.
  double push_s = 0;
  double pull_s = 0;
  // From the start of this iteration to the start of that pull: the bubble
  // the scheduler chose, plus any wait for the push to end (0 without
  // double buffering).
  double bubble_s = 0;
  // Age of the weights used in this iteration, in model updates: the rise of
  // the server's counters "updates" divided by "blocks" (complete gradients
  // applied, from any learner, in async/ssp; bsp rounds in bsp), from the
  // start of the pull that fetched them to the moment this iteration's
  // compute started using them (read by the push thread before it pushes
  // anything of this iteration). Rounded to the nearest integer. -1 without
  // control_target or when a counters read failed (the message goes to stderr
  // once; it does not fail the engine).
  int64_t staleness = -1;
  // Whether push and pull ran concurrently in this iteration.
  bool concurrent = false;
};

class BLKPS_EXPORT Engine {
 public:
  // Opens the model at `target` (a path, iscsi:// or iser:// URL, as
  // Model::Open) and control_target if set, allocates the buffers, pulls the
  // first weights (so weights() is ready) and, with double buffering, starts
  // the push and pull threads. On failure returns nullptr, stores a one-line
  // message in *error and, when error_code is not null, the negative errno
  // in *error_code.
  static std::unique_ptr<Engine> Open(const std::string& target, const EngineOptions& options, std::string* error,
                                      int* error_code = nullptr);

  // Stops the threads. Gradients already handed to Step() are pushed before
  // it returns (unless the engine has failed); the gradient being computed
  // is not: call Finish() to push it.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // The number of parameters served: the length of both buffers below.
  uint64_t count() const;
  uint64_t first_param() const;

  // This iteration's weights: valid, and unchanged, until Step() returns.
  const float* weights() const;
  // This iteration's gradient buffer, count() floats for the caller to fill
  // before Step(); its contents at the start of an iteration are unspecified
  // (with drop_ratio, the accumulated gradient of its last push).
  // Valid until Step() returns.
  float* gradient();

  // The gradient is complete: hands it over to be pushed, waits until the
  // next iteration's weights are ready, swaps buffers. Returns 0 or a
  // negative errno (then last_error() says what failed; see "Gradients"
  // above). After Finish(): -EINVAL.
  int Step();

  // Pushes the current gradient (as if it were handed to Step(); with
  // dropping, whole and with the residual), waits for
  // every push to end, stops the threads and syncs (Model::Sync(): the
  // server checkpoints, if it keeps one), so that every push is durable or
  // counted in pushed_bytes_lost(); no further pull is made. After
  // it, weights() and gradient() stay readable; Step() and Finish() return
  // -EINVAL. Returns 0 or a negative errno.
  int Finish();

  // The metrics of the iteration that the last successful Step() ended.
  const IterationMetrics& last_metrics() const;
  // How many gradients have reached the server whole so far (pushes that
  // ended without error).
  uint64_t gradients_pushed() const;
  // Whether the job is asked to stop (control stop=1, doc/pytorch.md "Early
  // stopping across learners"): a fresh read of the control LUN's counters.
  // False without control_target or when the read fails.
  bool stop_requested();
  // Parameters sent to the server so far (the pushes' length: with
  // dropping, only the runs pushed; padding to whole blocks not counted).
  uint64_t params_pushed() const;
  // With drop_ratio > 0: count() floats, the gradient dropped and not yet
  // pushed; all zeros after a successful Finish(). Readable after Finish()
  // or a failure, and between Step()s with double_buffering = false (the
  // push thread updates it otherwise). nullptr without dropping.
  const float* residual() const;
  // Bytes of gradients the server acknowledged and then lost with a restart
  // from its checkpoint (Model::pushed_bytes_lost()); 0 if none. Complete
  // after a successful Finish().
  uint64_t pushed_bytes_lost() const;
  // The message of the last failure; empty if none.
  const std::string& last_error() const;

  class Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace blkps

#endif  // BLKPS_ENGINE_HPP_
