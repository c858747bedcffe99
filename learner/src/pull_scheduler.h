// PullScheduler: the learner engine's bubble estimator. From exponential
// moving averages of the last iterations' compute, push and pull times it
// decides, for the next iteration, when the pull of the next weights starts
// (the "bubble": a delay after the iteration starts, chosen so that the pull
// ends just as compute ends, giving the freshest weights without a stall)
// and whether the push and the pull run concurrently (when compute is too
// short for push then pull) or one after the other.
//
// Pure arithmetic on the durations it is given: no clock, no I/O, no threads.
// Thread-safety: none; one thread uses a scheduler (the engine's caller, in
// Engine::Step).

#ifndef BLKPS_LEARNER_PULL_SCHEDULER_H_
#define BLKPS_LEARNER_PULL_SCHEDULER_H_

#include <cstdint>

namespace blkps {

// An exponential moving average of a duration, and of its absolute deviation
// from that average (a cheap measure of its noise).
class MovingAverage {
 public:
  // REQUIRES: 0 < smoothing <= 1 (the weight of the newest sample).
  explicit MovingAverage(double smoothing) : smoothing_(smoothing) {}

  // The first sample sets the average; each later one moves it by
  // smoothing * (sample - average).
  void Add(double sample);
  // Forgets every sample (the next one sets the average).
  void Reset() {
    samples_ = 0;
    mean_ = deviation_ = 0;
  }

  bool empty() const { return samples_ == 0; }
  uint64_t samples() const { return samples_; }
  double mean() const { return mean_; }            // 0 while empty
  double deviation() const { return deviation_; }  // 0 while empty

 private:
  double smoothing_;
  uint64_t samples_ = 0;
  double mean_ = 0;
  double deviation_ = 0;
};

class PullScheduler {
 public:
  // What to do during the next iteration.
  struct Plan {
    // Seconds after the iteration starts at which the pull starts (>= 0).
    // When !concurrent the pull also waits for the push to end.
    double pull_delay_s = 0;
    // Whether the push and the pull run at the same time, on two threads.
    bool concurrent = true;
  };

  // The deviation margin: the pull is planned to end this many mean absolute
  // deviations (of compute plus pull time) before compute is predicted to
  // end, so that ordinary noise does not turn into a stall.
  static constexpr double kMarginDeviations = 2.0;

  // After this many concurrent iterations in a row, the sequential estimate
  // (which only sequential iterations refresh) is retried when the
  // concurrent span says push-then-pull would fit: one probe iteration runs
  // sequentially, and its push and pull times replace the stale sequential
  // averages. It keeps one slow sequential measurement from holding the
  // transfers concurrent for good; on a duplex link where they must be
  // concurrent, it costs one late pull per this many iterations.
  static constexpr uint64_t kProbeEvery = 16;

  // REQUIRES: 0 < smoothing <= 1.
  explicit PullScheduler(double smoothing)
      : compute_(smoothing),
        push_(smoothing),
        pull_(smoothing),
        concurrent_pull_(smoothing),
        concurrent_span_(smoothing) {}

  // The compute time of one iteration, in seconds.
  void RecordCompute(double seconds) { compute_.Add(seconds); }
  // The transfers of one iteration that pushed a gradient: push and pull
  // durations, whether they ran concurrently, and the span from the start of
  // the first to the end of the last. Durations measured while the two
  // overlapped are not those of push-then-pull: where push and pull share
  // one link (loopback, one CPU-bound server) each takes about the whole
  // span; on a full-duplex link each takes about its own time. So
  // sequential iterations feed the push and pull averages, and concurrent
  // ones feed a separate pull average and the span average.
  void RecordTransfers(bool concurrent, double push_s, double pull_s, double span_s);

  // The plan for the next iteration. With C the compute average, S the
  // predicted push-then-pull time (P + L, the push and pull averages of
  // sequential iterations; before any, and every kProbeEvery concurrent
  // iterations, the span of concurrent ones, which equals P + L on a shared
  // link and is optimistic on a duplex one: one sequential iteration then
  // measures P + L), L the predicted pull time
  // (sequential, else the concurrent pull average, which is pessimistic) and
  // m = kMarginDeviations * (deviation of C + deviation of L):
  //   - while C or S is unknown: start the pull at once, concurrently with
  //     the push (nothing is known; do not risk a stall);
  //   - S + m > C (push then pull would not fit in compute): concurrent,
  //     and the pull starts at once: there is no slack to spend on fresher
  //     weights;
  //   - else sequential, and the pull starts at pull_delay_s = C - L - m
  //     (or when the push ends, if later): it is predicted to end m before
  //     compute does.
  // Without adaptive pulling (Engine's adaptive_pull = false) the engine uses
  // `concurrent` only and starts the pull as soon as it may.
  Plan Next() const;

  const MovingAverage& compute() const { return compute_; }
  const MovingAverage& push() const { return push_; }  // sequential
  const MovingAverage& pull() const { return pull_; }  // sequential
  const MovingAverage& concurrent_pull() const { return concurrent_pull_; }
  const MovingAverage& concurrent_span() const { return concurrent_span_; }

 private:
  MovingAverage compute_, push_, pull_, concurrent_pull_, concurrent_span_;
  uint64_t concurrent_run_ = 0;  // concurrent iterations since a sequential one
};

}  // namespace blkps

#endif  // BLKPS_LEARNER_PULL_SCHEDULER_H_
