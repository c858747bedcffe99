// Engine: double-buffered push/pull with adaptive pulling (engine.hpp).
//
// Threads and hand-offs. The caller's thread ("compute") owns the iteration
// counter, the scheduler and the metrics. Per iteration it posts one push job
// and one pull job under mu_; the push thread and the pull thread each take
// their job, run it on their own Model (own iSCSI connection) and mark it done
// under mu_. Step() waits for both jobs of the iteration to be done before it
// posts the next pair, so a buffer is in the hands of exactly one side at a
// time:
//   iteration t:  compute  reads W[t%2], writes G[t%2]
//                 push     reads G[(t-1)%2]       (job posted at Step(t-1))
//                 pull     writes W[(t+1)%2]      (job posted at Step(t-1))
// and the mutex hand-off orders every buffer access of one side before the
// other side's next access.

#include "blkps/engine.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>
#include <vector>

#include "device.h"
#include "gradient_dropper.h"
#include "pull_scheduler.h"
#include "status.h"

namespace blkps {
namespace {

using Clock = std::chrono::steady_clock;
using ull = unsigned long long;

constexpr size_t kBufferAlignment = 4096;  // O_DIRECT-friendly

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// libblkps messages start with "blkps: "; drop it when nesting one.
std::string Inner(const std::string& message) {
  const std::string prefix = "blkps: ";
  return message.rfind(prefix, 0) == 0 ? message.substr(prefix.size()) : message;
}

// An initiator name per connection: sessions of one initiator name (and
// ISID) would log each other out.
std::string ConnectionName(const std::string& given, const char* role) {
  if (!given.empty()) return given + "-" + role;
  static std::atomic<uint64_t> engines{0};
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  std::string name = "iqn.2026-11.io.blkps:engine-";
  for (const char* c = host; *c != '\0'; ++c) {
    const unsigned char ch = static_cast<unsigned char>(*c);
    name += (isalnum(ch) || ch == '.' || ch == '-') ? static_cast<char>(tolower(ch)) : '-';
  }
  return name + "-" + std::to_string(getpid()) + "-" + std::to_string(engines++) + "-" + role;
}

struct FreeDeleter {
  void operator()(float* p) const { free(p); }
};
using FloatBuffer = std::unique_ptr<float[], FreeDeleter>;

// count floats, zeroed, page-aligned, padded to whole pages.
FloatBuffer AllocateFloats(uint64_t count) {
  const uint64_t bytes = (count * sizeof(float) + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment;
  void* p = nullptr;
  if (posix_memalign(&p, kBufferAlignment, bytes) != 0) return nullptr;
  memset(p, 0, bytes);
  return FloatBuffer(static_cast<float*>(p));
}

// The text of top-level key `key` in the control LUN's status object
// (doc/server.md "Status and control": one key per line, `  "key": value,`),
// without a string's quotes; empty if absent. Reads two flat keys only.
std::string StatusValue(const char* json, const std::string& key) {
  const std::string needle = "\n  \"" + key + "\": ";
  const char* at = strstr(json, needle.c_str());
  if (at == nullptr) return "";
  at += needle.size();
  const bool quoted = *at == '"';
  if (quoted) ++at;
  const char* end = at;
  while (*end != '\0' && *end != '\n' && (quoted ? *end != '"' : *end != ',')) {
    ++end;
  }
  return std::string(at, end);
}

}  // namespace

// Hidden: a nested class of an exported class would otherwise be exported
// with it, and Impl is no part of libblkps's interface.
class __attribute__((visibility("hidden"))) Engine::Impl {
 public:
  ~Impl();

  Status Start(const std::string& target, const EngineOptions& options);
  int Step();
  int Finish();
  // A fresh read of the counters' stop; false without a control LUN.
  bool StopRequested();

  uint64_t first_ = 0;
  uint64_t count_ = 0;
  FloatBuffer weights_[2];
  FloatBuffer grads_[2];
  int current_ = 0;  // index of this iteration's W and G
  IterationMetrics metrics_;
  std::string last_error_;
  std::atomic<uint64_t> pushed_{0};
  std::atomic<uint64_t> params_pushed_{0};
  // Null unless options.drop_ratio > 0; used by whichever thread pushes.
  std::unique_ptr<GradientDropper> dropper_;
  uint64_t pushed_bytes_lost() const { return push_model_ ? push_model_->pushed_bytes_lost() : 0; }

 private:
  struct PushJob {
    // In: the gradient to push (null: none this iteration) and whether to
    // read the server's update count first.
    float* grad = nullptr;
    bool flush = false;  // with dropping: push the whole residual too
    bool read_updates = false;
    // Out.
    bool done = true;
    Clock::time_point started, ended;  // of the push
    double seconds = 0;
    double updates = -1;  // at the start of the iteration; -1 unknown
    Status status;
  };
  struct PullJob {
    float* dest = nullptr;
    Clock::time_point iteration_start;
    double delay_s = 0;
    bool concurrent = true;
    bool done = true;  // also when cancelled by Finish() or the destructor
    double bubble_s = 0;
    Clock::time_point started, ended;  // of the pull
    double seconds = 0;
    double updates = -1;  // at the start of the pull; -1 unknown
    Status status;
  };

  Status Fail(Status status);
  int Failed(Status status) {
    status = Fail(std::move(status));
    return -status.code();
  }
  // Pushes `grad` (all of it, or with dropping the runs dropper_ selects
  // after adding the residual to it in place; `flush`: all of it plus the
  // whole residual) / pulls into `dest` on `model`; errors name the
  // iteration.
  Status PushOn(Model& model, float* grad, bool flush, uint64_t iteration, double* seconds,
                Clock::time_point* ended = nullptr);
  Status PullOn(Model& model, float* dest, uint64_t iteration, double* seconds, Clock::time_point* ended = nullptr);
  // Finish's last step: Sync() on the push connection, so that every push is
  // durable (the server checkpoints) or counted in pushed_bytes_lost().
  Status SyncPushes();
  // The server's update count in model updates (the control LUN's counters
  // record: updates / blocks), or -1 when there is no control LUN or the read
  // fails.
  double ServerUpdates();
  // Compute thread, double buffering: waits until this iteration's jobs are
  // done; posts the next iteration's jobs.
  void WaitForJobs(std::unique_lock<std::mutex>& lock);
  void PostJobs(float* grad, float* dest);
  // Sets up dropper_ for options_.drop_*; first_ and count_ are known.
  Status StartDropping(const std::string& target);
  void PushLoop();
  void PullLoop();
  void StopThreads();
  int StepBaseline(double compute_s, Clock::time_point step_start);
  static int64_t Staleness(double at_use, double at_pull);

  EngineOptions options_;
  std::unique_ptr<Model> push_model_;
  std::unique_ptr<Model> pull_model_;  // null without double buffering
  std::unique_ptr<Model> control_;     // null without control_target
  std::mutex control_mu_;              // control_ and counters_error_said_
  bool counters_error_said_ = false;

  // The compute thread's own state; iteration_ is also read by the push and
  // pull threads, under mu_ (it changes under mu_ too).
  PullScheduler scheduler_{0.25};
  PullScheduler::Plan plan_;
  uint64_t iteration_ = 0;
  Clock::time_point iteration_start_;
  double weights_pull_updates_ = -1;  // at the pull of this iteration's W
  int64_t baseline_staleness_ = -1;   // of this iteration's W, baseline only
  Status failure_;
  bool finished_ = false;

  std::mutex mu_;
  std::condition_variable cv_;
  bool push_posted_ = false;  // under mu_, with the jobs
  bool pull_posted_ = false;
  bool no_more_pulls_ = false;
  bool stopping_ = false;
  PushJob push_;
  PullJob pull_;
  std::thread push_thread_;
  std::thread pull_thread_;
};

Status Engine::Impl::Fail(Status status) {
  if (failure_.ok()) failure_ = status;
  last_error_ = status.message();
  return status;
}

Status Engine::Impl::PushOn(Model& model, float* grad, bool flush, uint64_t iteration, double* seconds,
                            Clock::time_point* ended) {
  const Clock::time_point start = Clock::now();
  int rc = 0;
  if (dropper_ == nullptr) {
    rc = model.Push(first_, grad, count_);
    if (rc == 0) params_pushed_ += count_;
  } else {
    const auto& runs = flush ? dropper_->SelectAll(grad) : dropper_->Select(grad);
    for (const GradientDropper::Range& run : runs) {
      rc = model.Push(first_ + run.first, grad + run.first, run.count);
      if (rc != 0) break;
      params_pushed_ += run.count;
    }
  }
  const Clock::time_point end = Clock::now();
  *seconds = Seconds(end - start);
  if (ended != nullptr) *ended = end;
  if (rc != 0) {
    return Status::Error(-rc,
                         "push of iteration %llu's gradient failed (it may be "
                         "partly applied; the engine stops): %s",
                         static_cast<ull>(iteration), Inner(model.last_error()).c_str());
  }
  ++pushed_;
  return Status();
}

Status Engine::Impl::PullOn(Model& model, float* dest, uint64_t iteration, double* seconds, Clock::time_point* ended) {
  const Clock::time_point start = Clock::now();
  const int rc = model.Pull(first_, dest, count_);
  const Clock::time_point end = Clock::now();
  *seconds = Seconds(end - start);
  if (ended != nullptr) *ended = end;
  if (rc != 0) {
    return Status::Error(-rc, "pull of iteration %llu's weights failed: %s", static_cast<ull>(iteration),
                         Inner(model.last_error()).c_str());
  }
  return Status();
}

double Engine::Impl::ServerUpdates() {
  if (control_ == nullptr) return -1;
  std::lock_guard<std::mutex> lock(control_mu_);
  blkps_control_counters counters;
  if (control_->ReadControlCounters(&counters) == 0 && counters.blocks > 0) {
    return static_cast<double>(counters.updates) / static_cast<double>(counters.blocks);
  }
  if (!counters_error_said_) {
    counters_error_said_ = true;
    fprintf(stderr,
            "blkps: engine: cannot read the server's counters from %s (%s); "
            "staleness is unknown (-1) from now on where it fails\n",
            MaskTarget(options_.control_target).c_str(),
            control_->last_error().empty() ? "a model of 0 blocks" : control_->last_error().c_str());
  }
  return -1;
}

int64_t Engine::Impl::Staleness(double at_use, double at_pull) {
  if (at_use < 0 || at_pull < 0) return -1;
  return std::max<int64_t>(0, std::llround(at_use - at_pull));
}

Status Engine::Impl::Start(const std::string& target, const EngineOptions& options) {
  options_ = options;
  if (!(options.smoothing > 0 && options.smoothing <= 1)) {
    return Status::Error(EINVAL, "engine: smoothing must be in (0, 1], got %g", options.smoothing);
  }
  scheduler_ = PullScheduler(options.smoothing);
  if (!(options.drop_ratio >= 0 && options.drop_ratio < 1)) {
    return Status::Error(EINVAL, "engine: drop_ratio must be in [0, 1), got %g", options.drop_ratio);
  }

  auto open = [&](const std::string& url, const char* role, std::unique_ptr<Model>* out) {
    OpenOptions o = options.open;
    o.initiator_name = ConnectionName(options.open.initiator_name, role);
    std::string error;
    int code = -EIO;
    *out = Model::Open(url, o, &error, &code);
    return *out != nullptr ? Status() : Status::Error(-code, "%s", Inner(error).c_str());
  };
  Status status = open(target, "push", &push_model_);
  if (!status.ok()) return status;

  const uint64_t params_on_device = push_model_->param_capacity();
  if (options.first_param >= params_on_device || options.param_count > params_on_device - options.first_param) {
    if (options.param_count == 0) {
      return Status::Error(ERANGE,
                           "engine: first_param %llu is past the end of %s, "
                           "which holds %llu parameters",
                           static_cast<ull>(options.first_param), MaskTarget(target).c_str(),
                           static_cast<ull>(params_on_device));
    }
    return Status::Error(ERANGE, "engine: parameters [%llu, %llu) are not on %s, which holds %llu",
                         static_cast<ull>(options.first_param),
                         static_cast<ull>(options.first_param + options.param_count), MaskTarget(target).c_str(),
                         static_cast<ull>(params_on_device));
  }
  first_ = options.first_param;
  count_ = options.param_count != 0 ? options.param_count : params_on_device - first_;

  const int buffers = options.double_buffering ? 2 : 1;
  for (int i = 0; i < buffers; ++i) {
    weights_[i] = AllocateFloats(count_);
    grads_[i] = AllocateFloats(count_);
    if (!weights_[i] || !grads_[i]) {
      return Status::Error(ENOMEM, "engine: cannot allocate %d buffers of %llu bytes", 2 * buffers,
                           static_cast<ull>(count_ * sizeof(float)));
    }
  }

  if (!options.control_target.empty()) {
    status = open(options.control_target, "control", &control_);
    if (!status.ok()) return status;
    blkps_control_counters unused;
    if (control_->ReadControlCounters(&unused) != 0) {
      return Status::Error(EINVAL, "engine: control_target %s: %s", MaskTarget(options.control_target).c_str(),
                           Inner(control_->last_error()).c_str());
    }
  }

  status = StartDropping(target);
  if (!status.ok()) return status;

  // The first weights, pulled before Open() returns.
  weights_pull_updates_ = ServerUpdates();
  double seconds = 0;
  status = PullOn(*push_model_, weights_[0].get(), 0, &seconds);
  if (!status.ok()) return status;

  if (options.double_buffering) {
    status = open(target, "pull", &pull_model_);
    if (!status.ok()) return status;
    push_thread_ = std::thread([this] { PushLoop(); });
    pull_thread_ = std::thread([this] { PullLoop(); });
    PostJobs(nullptr, weights_[1].get());
  } else {
    baseline_staleness_ = Staleness(ServerUpdates(), weights_pull_updates_);
    iteration_start_ = Clock::now();
  }
  return Status();
}

Status Engine::Impl::StartDropping(const std::string& target) {
  if (options_.drop_ratio == 0) return Status();
  std::string mode;
  uint64_t block_params = 0;
  if (control_ != nullptr) {
    std::vector<char> status_json(BLKPS_CONTROL_STATUS_BYTES + 1, '\0');
    if (control_->ReadBytes(BLKPS_CONTROL_STATUS_OFFSET, status_json.data(), BLKPS_CONTROL_STATUS_BYTES) != 0) {
      return Status::Error(EIO, "engine: control_target %s: %s", MaskTarget(options_.control_target).c_str(),
                           Inner(control_->last_error()).c_str());
    }
    mode = StatusValue(status_json.data(), "mode");
    block_params = strtoull(StatusValue(status_json.data(), "block_bytes").c_str(), nullptr, 10) / sizeof(float);
  }
  if (mode == "bsp") {
    return Status::Error(EINVAL,
                         "engine: drop_ratio %g: gradient dropping needs mode "
                         "async or ssp (a bsp round waits for every learner's "
                         "whole gradient); the model at %s is in bsp",
                         options_.drop_ratio, MaskTarget(target).c_str());
  }
  const uint64_t unit = push_model_->logical_block_size() / sizeof(float);
  uint64_t group = options_.drop_group_params;
  // In ssp every block must get the same share of its runs from every
  // learner in every iteration, so that its clocks tick alike (doc/server.md "Learner slots").
  if (group == 0 && mode.rfind("ssp", 0) == 0) {
    group = block_params;
    if (group == 0 || first_ % group != 0) {
      return Status::Error(EINVAL,
                           "engine: drop_ratio in ssp needs first_param (%llu) "
                           "on a model block boundary (%llu parameters)",
                           static_cast<ull>(first_), static_cast<ull>(group));
    }
  }
  uint64_t run = options_.drop_run_params;
  if (run == 0 && group == 0) {
    run = push_model_->request_bytes() / sizeof(float);
  } else if (run == 0) {
    // Enough runs per group that 1 - drop_ratio of them is about one run:
    // a power of two at least 1 / (1 - drop_ratio), whole logical blocks.
    uint64_t runs_per_group = 1;
    while (runs_per_group * (1 - options_.drop_ratio) < 1) runs_per_group *= 2;
    run = std::max(group / runs_per_group / unit * unit, unit);
  }
  if (run % unit != 0) {
    return Status::Error(EINVAL,
                         "engine: drop_run_params %llu is not a multiple of "
                         "%s's logical block (%llu parameters)",
                         static_cast<ull>(run), MaskTarget(target).c_str(), static_cast<ull>(unit));
  }
  if (group % run != 0) {
    return Status::Error(EINVAL,
                         "engine: drop_group_params %llu is not a multiple of "
                         "the run of %llu parameters%s",
                         static_cast<ull>(group), static_cast<ull>(run),
                         options_.drop_group_params == 0 ? " (the group is the server's block, in ssp)" : "");
  }
  dropper_ = std::make_unique<GradientDropper>(count_, run, group, options_.drop_ratio);
  const uint64_t group_runs = (group != 0 ? group : count_ + run - 1) / run;
  if (dropper_->RunsKept(group_runs) == group_runs) {
    return Status::Error(EINVAL,
                         "engine: drop_ratio %g keeps every run of %llu "
                         "parameters in groups of %llu runs: nothing would "
                         "be dropped; give a smaller drop_run_params",
                         options_.drop_ratio, static_cast<ull>(run), static_cast<ull>(group_runs));
  }
  return Status();
}

Engine::Impl::~Impl() { StopThreads(); }

void Engine::Impl::StopThreads() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    no_more_pulls_ = true;
  }
  cv_.notify_all();
  if (push_thread_.joinable()) push_thread_.join();
  if (pull_thread_.joinable()) pull_thread_.join();
}

void Engine::Impl::PostJobs(float* grad, float* dest) {
  plan_ = scheduler_.Next();
  std::lock_guard<std::mutex> lock(mu_);
  iteration_start_ = Clock::now();
  push_ = PushJob();
  push_.grad = grad;
  push_.read_updates = control_ != nullptr;
  push_.done = false;
  pull_ = PullJob();
  pull_.dest = dest;
  pull_.iteration_start = iteration_start_;
  pull_.delay_s = options_.adaptive_pull ? plan_.pull_delay_s : 0;
  pull_.concurrent = plan_.concurrent;
  pull_.done = false;
  push_posted_ = pull_posted_ = true;
  cv_.notify_all();
}

void Engine::Impl::WaitForJobs(std::unique_lock<std::mutex>& lock) {
  cv_.wait(lock, [this] { return push_.done && pull_.done; });
}

// A posted push always runs, also while stopping: the gradient was handed
// over and must reach the server.
void Engine::Impl::PushLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return push_posted_ || stopping_; });
    if (!push_posted_) return;
    push_posted_ = false;
    const PushJob job = push_;
    const uint64_t iteration = iteration_;  // the gradient's: iteration_ - 1
    lock.unlock();
    const double updates = job.read_updates ? ServerUpdates() : -1;
    double seconds = 0;
    Status status;
    const Clock::time_point started = Clock::now();
    Clock::time_point ended = started;
    if (job.grad != nullptr) {
      status = PushOn(*push_model_, job.grad, job.flush, iteration - 1, &seconds, &ended);
    }
    lock.lock();
    push_.started = started;
    push_.ended = ended;
    push_.updates = updates;
    push_.seconds = seconds;
    push_.status = std::move(status);
    push_.done = true;
    cv_.notify_all();
  }
}

void Engine::Impl::PullLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return pull_posted_ || stopping_; });
    if (!pull_posted_) return;
    pull_posted_ = false;
    const PullJob job = pull_;
    const uint64_t iteration = iteration_ + 1;  // whose weights are pulled
    const auto start_at =
        job.iteration_start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(job.delay_s));
    cv_.wait_until(lock, start_at, [this] { return no_more_pulls_; });
    if (!job.concurrent) {
      cv_.wait(lock, [this] { return push_.done || no_more_pulls_; });
    }
    if (no_more_pulls_) {
      pull_.done = true;
      cv_.notify_all();
      continue;
    }
    lock.unlock();
    const double bubble_s = Seconds(Clock::now() - job.iteration_start);
    const double updates = ServerUpdates();
    double seconds = 0;
    const Clock::time_point started = Clock::now();
    Clock::time_point ended = started;
    Status status = PullOn(*pull_model_, job.dest, iteration, &seconds, &ended);
    lock.lock();
    pull_.started = started;
    pull_.ended = ended;
    pull_.bubble_s = bubble_s;
    pull_.updates = updates;
    pull_.seconds = seconds;
    pull_.status = std::move(status);
    pull_.done = true;
    cv_.notify_all();
  }
}

int Engine::Impl::Step() {
  const Clock::time_point step_start = Clock::now();
  const double compute_s = Seconds(step_start - iteration_start_);
  if (finished_) {
    return Failed(Status::Error(EINVAL, "engine: Step() after Finish()"));
  }
  if (!failure_.ok()) {
    last_error_ = failure_.message();
    return -failure_.code();
  }
  if (!options_.double_buffering) return StepBaseline(compute_s, step_start);

  PushJob push;
  PullJob pull;
  {
    std::unique_lock<std::mutex> lock(mu_);
    WaitForJobs(lock);
    push = push_;
    pull = pull_;
  }
  const double stall_s = Seconds(Clock::now() - step_start);
  if (!push.status.ok()) return Failed(push.status);
  if (!pull.status.ok()) return Failed(pull.status);

  IterationMetrics m;
  m.iteration = iteration_;
  m.compute_s = compute_s;
  m.stall_s = stall_s;
  m.push_s = push.seconds;
  m.pull_s = pull.seconds;
  m.bubble_s = pull.bubble_s;
  m.staleness = Staleness(push.updates, weights_pull_updates_);
  m.concurrent = plan_.concurrent;
  metrics_ = m;

  scheduler_.RecordCompute(compute_s);
  if (push.grad != nullptr) {
    const double span_s = Seconds(std::max(push.ended, pull.ended) - std::min(push.started, pull.started));
    scheduler_.RecordTransfers(plan_.concurrent, push.seconds, pull.seconds, span_s);
  }
  weights_pull_updates_ = pull.updates;

  // Swap: the weights pulled during this iteration become current; this
  // iteration's W and G go to the pull and the push threads.
  const int done = current_;
  current_ ^= 1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++iteration_;
  }
  PostJobs(grads_[done].get(), weights_[done].get());
  return 0;
}

int Engine::Impl::StepBaseline(double compute_s, Clock::time_point step_start) {
  IterationMetrics m;
  m.iteration = iteration_;
  m.compute_s = compute_s;
  m.concurrent = false;
  m.staleness = baseline_staleness_;
  Status status = PushOn(*push_model_, grads_[0].get(), false, iteration_, &m.push_s);
  if (!status.ok()) return Failed(status);
  const double at_pull = ServerUpdates();
  status = PullOn(*push_model_, weights_[0].get(), iteration_ + 1, &m.pull_s);
  if (!status.ok()) return Failed(status);
  baseline_staleness_ = Staleness(ServerUpdates(), at_pull);
  m.stall_s = Seconds(Clock::now() - step_start);
  metrics_ = m;
  ++iteration_;
  iteration_start_ = Clock::now();
  return 0;
}

int Engine::Impl::Finish() {
  if (finished_) {
    return Failed(Status::Error(EINVAL, "engine: Finish() called twice"));
  }
  if (!failure_.ok()) {
    last_error_ = failure_.message();
    return -failure_.code();
  }
  finished_ = true;
  if (!options_.double_buffering) {
    double seconds = 0;
    Status status = PushOn(*push_model_, grads_[0].get(), true, iteration_, &seconds);
    if (status.ok()) status = SyncPushes();
    return status.ok() ? 0 : Failed(status);
  }
  PushJob push;
  {
    std::unique_lock<std::mutex> lock(mu_);
    no_more_pulls_ = true;  // the pull in flight is not needed any more
    cv_.notify_all();
    WaitForJobs(lock);
    push = push_;
    if (push.status.ok()) {
      push_ = PushJob();
      push_.grad = grads_[current_].get();
      push_.flush = true;
      push_.done = false;
      push_posted_ = true;
      ++iteration_;  // the push thread names the gradient iteration_ - 1
      cv_.notify_all();
      WaitForJobs(lock);
      push = push_;
    }
  }
  StopThreads();
  if (push.status.ok()) push.status = SyncPushes();
  return push.status.ok() ? 0 : Failed(push.status);
}

Status Engine::Impl::SyncPushes() {
  const int rc = push_model_->Sync();
  if (rc == 0) return Status();
  return Status::Error(-rc, "sync after the last push failed (the pushes may not be durable): %s",
                       Inner(push_model_->last_error()).c_str());
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

std::unique_ptr<Engine> Engine::Open(const std::string& target, const EngineOptions& options, std::string* error,
                                     int* error_code) {
  Status status;
  try {
    auto impl = std::make_unique<Impl>();
    status = impl->Start(target, options);
    if (status.ok()) {
      return std::unique_ptr<Engine>(new Engine(std::move(impl)));
    }
  } catch (const std::bad_alloc&) {
    status = Status::Error(ENOMEM, "engine: out of memory opening %s", MaskTarget(target).c_str());
  } catch (const std::system_error& e) {
    status = Status::Error(EAGAIN, "engine: cannot start its threads: %s", e.what());
  }
  if (error != nullptr) *error = status.message();
  if (error_code != nullptr) *error_code = -status.code();
  return nullptr;
}

uint64_t Engine::count() const { return impl_->count_; }
uint64_t Engine::first_param() const { return impl_->first_; }
const float* Engine::weights() const { return impl_->weights_[impl_->current_].get(); }
float* Engine::gradient() { return impl_->grads_[impl_->current_].get(); }
int Engine::Step() { return impl_->Step(); }
int Engine::Finish() { return impl_->Finish(); }
const IterationMetrics& Engine::last_metrics() const { return impl_->metrics_; }
uint64_t Engine::gradients_pushed() const { return impl_->pushed_.load(); }

bool Engine::Impl::StopRequested() {
  if (control_ == nullptr) return false;
  std::lock_guard<std::mutex> lock(control_mu_);
  blkps_control_counters counters;
  return control_->ReadControlCounters(&counters) == 0 && counters.stop != 0;
}

bool Engine::stop_requested() { return impl_->StopRequested(); }
uint64_t Engine::params_pushed() const { return impl_->params_pushed_.load(); }
const float* Engine::residual() const { return impl_->dropper_ != nullptr ? impl_->dropper_->residual() : nullptr; }

uint64_t Engine::pushed_bytes_lost() const { return impl_->pushed_bytes_lost(); }
const std::string& Engine::last_error() const { return impl_->last_error_; }

}  // namespace blkps
