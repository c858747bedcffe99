// PullScheduler: moving averages of compute, push and pull time, and the plan
// of the next iteration's pull.

#include "pull_scheduler.h"

#include <algorithm>
#include <cmath>

namespace blkps {

void MovingAverage::Add(double sample) {
  if (samples_++ == 0) {
    mean_ = sample;
    deviation_ = 0;
    return;
  }
  const double error = sample - mean_;
  mean_ += smoothing_ * error;
  deviation_ += smoothing_ * (std::fabs(error) - deviation_);
}

void PullScheduler::RecordTransfers(bool concurrent, double push_s, double pull_s, double span_s) {
  if (concurrent) {
    concurrent_pull_.Add(pull_s);
    concurrent_span_.Add(span_s);
    ++concurrent_run_;
  } else {
    if (concurrent_run_ >= kProbeEvery) {  // a probe: the averages are stale
      push_.Reset();
      pull_.Reset();
    }
    push_.Add(push_s);
    pull_.Add(pull_s);
    concurrent_run_ = 0;
  }
}

PullScheduler::Plan PullScheduler::Next() const {
  Plan plan;
  const bool probe = concurrent_run_ >= kProbeEvery;
  const bool sequential_known = !push_.empty() && !pull_.empty() && !probe;
  if (compute_.empty() || (!sequential_known && concurrent_span_.empty())) {
    return plan;
  }
  const double transfers = sequential_known ? push_.mean() + pull_.mean() : concurrent_span_.mean();
  const MovingAverage& pull = sequential_known ? pull_ : concurrent_pull_;
  const double margin = kMarginDeviations * (compute_.deviation() + pull.deviation());
  plan.concurrent = transfers + margin > compute_.mean();
  if (!plan.concurrent) {
    plan.pull_delay_s = std::max(0.0, compute_.mean() - pull.mean() - margin);
  }
  return plan;
}

}  // namespace blkps
