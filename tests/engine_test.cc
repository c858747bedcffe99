// The learner engine (blkps/engine.hpp): its bubble estimator on synthetic
// timing traces (PullScheduler, no I/O), the engine and its C API on a plain
// file, and against a real tgtd with the built plugin (TargetProcess): the
// double-buffer swap never lets compute see a buffer being written and never
// pushes a gradient being written, and N iterations of integer gradients
// through engines in async, bsp and ssp give exactly the expected weights.
//
// No assertion here depends on timing: sleeps only vary the interleaving.

#include <blkps/blkps.h>
#include <blkps/control_lun.h>
#include <unistd.h>
#include <blkps/engine.hpp>
#include <blkps/model.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "pull_scheduler.h"
#include "target_process.h"

namespace blkps_test {
namespace {

// ---- The bubble estimator on synthetic traces --------------------------------

TEST(PullScheduler, ConstantTraceIsPredictedExactlyWithNoDeviation) {
  blkps::MovingAverage average(0.25);
  for (int i = 0; i < 50; ++i) average.Add(0.040);
  EXPECT_DOUBLE_EQ(average.mean(), 0.040);
  EXPECT_DOUBLE_EQ(average.deviation(), 0.0);
  EXPECT_EQ(average.samples(), 50u);
}

TEST(PullScheduler, StepChangeConvergesGeometricallyToTheNewLevel) {
  const double smoothing = 0.25;
  blkps::MovingAverage average(smoothing);
  for (int i = 0; i < 20; ++i) average.Add(0.010);
  for (int n = 1; n <= 40; ++n) {
    average.Add(0.050);
    // After n samples of the new level the error is (1 - a)^n of the step.
    const double expected_error = 0.040 * std::pow(1 - smoothing, n);
    EXPECT_NEAR(0.050 - average.mean(), expected_error, 1e-12) << "after " << n << " samples";
  }
  EXPECT_NEAR(average.mean(), 0.050, 1e-6);
}

TEST(PullScheduler, NoisyTraceIsTrackedWithinTheNoise) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> noise(-0.2, 0.2);  // +-20 % around 30 ms
  blkps::MovingAverage average(0.25);
  double sum_of_means = 0;
  int counted = 0;
  for (int i = 0; i < 1000; ++i) {
    average.Add(0.030 * (1 + noise(rng)));
    if (i >= 100) {
      // Every prediction stays inside the noise band...
      EXPECT_GT(average.mean(), 0.030 * 0.8) << "sample " << i;
      EXPECT_LT(average.mean(), 0.030 * 1.2) << "sample " << i;
      sum_of_means += average.mean();
      ++counted;
    }
  }
  // ...and is unbiased: on average within 1 % of the true level.
  EXPECT_NEAR(sum_of_means / counted, 0.030, 0.030 * 0.01);
  // The deviation estimates the noise: E|U(-0.2, 0.2) * 30 ms| = 3 ms.
  EXPECT_GT(average.deviation(), 0.0015);
  EXPECT_LT(average.deviation(), 0.0060);
}

TEST(PullScheduler, WithoutSamplesThePullStartsAtOnceConcurrently) {
  blkps::PullScheduler scheduler(0.25);
  scheduler.RecordCompute(0.1);  // no transfers measured yet
  const blkps::PullScheduler::Plan plan = scheduler.Next();
  EXPECT_EQ(plan.pull_delay_s, 0.0);
  EXPECT_TRUE(plan.concurrent);
}

// Sequential iterations: push 20 ms, pull 30 ms; compute 100 ms.
TEST(PullScheduler, LongComputeGetsSequentialTransfersAndABubbleEndingWithCompute) {
  blkps::PullScheduler scheduler(0.25);
  for (int i = 0; i < 10; ++i) {
    scheduler.RecordCompute(0.100);
    scheduler.RecordTransfers(false, 0.020, 0.030, 0.050);
  }
  const blkps::PullScheduler::Plan plan = scheduler.Next();
  EXPECT_FALSE(plan.concurrent);
  EXPECT_NEAR(plan.pull_delay_s, 0.070, 1e-12);  // 30 ms of pull end at 100 ms
}

TEST(PullScheduler, ComputeShorterThanPushPlusPullRunsThemConcurrentlyAtOnce) {
  blkps::PullScheduler scheduler(0.25);
  for (int i = 0; i < 10; ++i) {
    scheduler.RecordCompute(0.030);
    scheduler.RecordTransfers(false, 0.020, 0.020, 0.040);
  }
  const blkps::PullScheduler::Plan plan = scheduler.Next();
  EXPECT_TRUE(plan.concurrent);
  EXPECT_EQ(plan.pull_delay_s, 0.0);  // no slack: pull at once
}

TEST(PullScheduler, BubbleFollowsAStepChangeInPullTime) {
  blkps::PullScheduler scheduler(0.25);
  for (int i = 0; i < 20; ++i) {
    scheduler.RecordCompute(0.200);
    scheduler.RecordTransfers(false, 0.010, 0.020, 0.030);
  }
  EXPECT_NEAR(scheduler.Next().pull_delay_s, 0.180, 1e-9);
  for (int i = 0; i < 60; ++i) {
    scheduler.RecordCompute(0.200);
    scheduler.RecordTransfers(false, 0.010, 0.060, 0.070);  // the network got slower
  }
  // The margin decays with the deviation; the delay converges to 140 ms.
  EXPECT_NEAR(scheduler.Next().pull_delay_s, 0.140, 1e-4);
  EXPECT_FALSE(scheduler.Next().concurrent);
}

TEST(PullScheduler, NoisyTimesStartThePullEarlierByTheMargin) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> noise(-0.3, 0.3);
  blkps::PullScheduler quiet(0.25), noisy(0.25);
  for (int i = 0; i < 200; ++i) {
    quiet.RecordCompute(0.100);
    quiet.RecordTransfers(false, 0.020, 0.020, 0.040);
    noisy.RecordCompute(0.100);
    const double pull = 0.020 * (1 + noise(rng));
    noisy.RecordTransfers(false, 0.020, pull, 0.020 + pull);
  }
  EXPECT_NEAR(quiet.Next().pull_delay_s, 0.080, 1e-12);
  const double margin =
      blkps::PullScheduler::kMarginDeviations * (noisy.compute().deviation() + noisy.pull().deviation());
  EXPECT_GT(margin, 0.0);
  EXPECT_NEAR(noisy.Next().pull_delay_s, 0.100 - noisy.pull().mean() - margin, 1e-12);
  EXPECT_LT(noisy.Next().pull_delay_s, quiet.Next().pull_delay_s);
}

// On a shared link (loopback) concurrent push and pull each take about the
// whole span; push + pull of those durations (90 ms) would overstate the
// sequential time (the span, 50 ms) and keep the transfers concurrent.
TEST(PullScheduler, ConcurrentSpanThatFitsComputeSwitchesToSequential) {
  blkps::PullScheduler scheduler(0.25);
  for (int i = 0; i < 10; ++i) {
    scheduler.RecordCompute(0.100);
    scheduler.RecordTransfers(true, 0.045, 0.045, 0.050);
  }
  const blkps::PullScheduler::Plan plan = scheduler.Next();
  EXPECT_FALSE(plan.concurrent);
  // The pull's concurrent duration stands for its own: pessimistic, early.
  EXPECT_NEAR(plan.pull_delay_s, 0.055, 1e-12);
}

// On a duplex link the concurrent span (40 ms) understates push then pull
// (80 ms): one sequential iteration measures it, and the transfers go back
// to concurrent, with one sequential probe every kProbeEvery iterations.
TEST(PullScheduler, SequentialIterationThatDoesNotFitGoesBackToConcurrent) {
  blkps::PullScheduler scheduler(0.25);
  scheduler.RecordCompute(0.060);
  scheduler.RecordTransfers(true, 0.040, 0.040, 0.041);
  ASSERT_FALSE(scheduler.Next().concurrent);
  for (int probe = 0; probe < 3; ++probe) {
    scheduler.RecordCompute(0.060);
    scheduler.RecordTransfers(false, 0.040, 0.040, 0.080);
    EXPECT_TRUE(scheduler.Next().concurrent);
    for (uint64_t i = 1; i <= blkps::PullScheduler::kProbeEvery; ++i) {
      scheduler.RecordCompute(0.060);
      scheduler.RecordTransfers(true, 0.040, 0.040, 0.041);
      EXPECT_EQ(scheduler.Next().concurrent, i < blkps::PullScheduler::kProbeEvery)
          << "probe " << probe << ", concurrent iteration " << i;
    }
  }
}

// One slow sequential iteration must not keep the transfers concurrent for
// good once the link is fast again.
TEST(PullScheduler, SlowSequentialSampleIsRetriedAfterConcurrentIterations) {
  blkps::PullScheduler scheduler(0.25);
  scheduler.RecordCompute(0.100);
  scheduler.RecordTransfers(false, 0.080, 0.080, 0.160);  // a noisy moment
  ASSERT_TRUE(scheduler.Next().concurrent);
  uint64_t concurrent = 0;
  while (scheduler.Next().concurrent && concurrent < 100) {
    scheduler.RecordCompute(0.100);
    scheduler.RecordTransfers(true, 0.030, 0.030, 0.040);  // fast again
    ++concurrent;
  }
  EXPECT_EQ(concurrent, blkps::PullScheduler::kProbeEvery);
  scheduler.RecordCompute(0.100);
  scheduler.RecordTransfers(false, 0.020, 0.020, 0.040);  // the probe fits
  EXPECT_FALSE(scheduler.Next().concurrent);
}

// ---- The engine on a plain file (no server) ----------------------------------

// A scratch file of `bytes` zero bytes, removed at the end of the test.
struct TempFile {
  std::string path;
  explicit TempFile(uint64_t bytes) {
    char tmpl[] = "/tmp/blkps-engine-XXXXXX";
    const int fd = mkstemp(tmpl);
    path = tmpl;
    if (fd >= 0) {
      EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
      close(fd);
    }
  }
  ~TempFile() { unlink(path.c_str()); }
};

TEST(EngineOnFile, ParameterRangePastTheEndIsRefusedInOneLine) {
  TempFile file(4096);  // 1024 parameters
  blkps::EngineOptions options;
  options.first_param = 1000;
  options.param_count = 100;
  std::string error;
  int code = 0;
  EXPECT_EQ(blkps::Engine::Open(file.path, options, &error, &code), nullptr);
  EXPECT_EQ(code, -ERANGE);
  EXPECT_NE(error.find("parameters [1000, 1100) are not on"), std::string::npos) << error;
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
}

TEST(EngineOnFile, SmoothingOutsideZeroToOneIsRefused) {
  TempFile file(4096);
  blkps::EngineOptions options;
  options.smoothing = 0;
  std::string error;
  int code = 0;
  EXPECT_EQ(blkps::Engine::Open(file.path, options, &error, &code), nullptr);
  EXPECT_EQ(code, -EINVAL);
  EXPECT_NE(error.find("smoothing must be in (0, 1]"), std::string::npos) << error;
}

TEST(EngineOnFile, DropRatioOutsideZeroToOneIsRefused) {
  TempFile file(4096);
  for (double ratio : {-0.1, 1.0, std::nan("")}) {
    blkps::EngineOptions options;
    options.drop_ratio = ratio;
    std::string error;
    int code = 0;
    EXPECT_EQ(blkps::Engine::Open(file.path, options, &error, &code), nullptr);
    EXPECT_EQ(code, -EINVAL);
    EXPECT_NE(error.find("drop_ratio must be in [0, 1)"), std::string::npos) << error;
  }
}

TEST(EngineOnFile, DropRunThatIsNotWholeBlocksIsRefused) {
  TempFile file(1 << 16);
  blkps::EngineOptions options;
  options.drop_ratio = 0.5;
  options.drop_run_params = 100;  // 400 bytes: not whole 512-byte blocks
  std::string error;
  int code = 0;
  EXPECT_EQ(blkps::Engine::Open(file.path, options, &error, &code), nullptr);
  EXPECT_EQ(code, -EINVAL);
  EXPECT_NE(error.find("drop_run_params 100 is not a multiple"), std::string::npos) << error;
}

TEST(EngineOnFile, DropRatioThatWouldKeepEveryRunIsRefused) {
  TempFile file(4096);  // 1024 parameters: one run of the 1 MiB request size
  blkps::EngineOptions options;
  options.drop_ratio = 0.9;
  std::string error;
  int code = 0;
  EXPECT_EQ(blkps::Engine::Open(file.path, options, &error, &code), nullptr);
  EXPECT_EQ(code, -EINVAL);
  EXPECT_NE(error.find("nothing would be dropped"), std::string::npos) << error;
}

TEST(EngineOnFile, ControlTargetWithoutCountersIsRefused) {
  // Too short to hold the record, and long enough but all zeros.
  for (uint64_t size : {uint64_t{1} << 16, BLKPS_CONTROL_WEIGHTS_OFFSET}) {
    TempFile file(4096), not_control(size);
    blkps::EngineOptions options;
    options.control_target = not_control.path;
    std::string error;
    EXPECT_EQ(blkps::Engine::Open(file.path, options, &error), nullptr);
    EXPECT_NE(error.find("is this the model's control LUN"), std::string::npos) << error;
  }
}

// On a file a push stores the gradient's bytes (no server applies them):
// after Finish() the file holds the last gradient handed over.
TEST(EngineOnFile, CApiPushesEveryGradientOnceAndFinishPushesTheLast) {
  constexpr uint64_t kCount = 1024;
  TempFile file(kCount * 4);
  for (int double_buffering = 0; double_buffering <= 1; ++double_buffering) {
    blkps_engine_options options;
    blkps_engine_options_init(&options);
    EXPECT_EQ(options.double_buffering, 1);
    EXPECT_EQ(options.adaptive_pull, 1);
    options.double_buffering = double_buffering;
    blkps_engine* engine = nullptr;
    char error[256] = "";
    ASSERT_EQ(blkps_engine_open(file.path.c_str(), &options, &engine, error, sizeof error), 0) << error;
    ASSERT_EQ(blkps_engine_param_count(engine), kCount);
    constexpr int kIterations = 20;
    for (int t = 0; t < kIterations; ++t) {
      float* g = blkps_engine_gradient(engine);
      for (uint64_t i = 0; i < kCount; ++i) g[i] = static_cast<float>(t * 10000 + i);
      ASSERT_EQ(blkps_engine_step(engine), 0) << blkps_engine_last_error(engine);
      blkps_engine_metrics metrics;
      blkps_engine_last_metrics(engine, &metrics);
      EXPECT_EQ(metrics.iteration, static_cast<uint64_t>(t));
      EXPECT_EQ(metrics.staleness, -1);  // no control target
    }
    float* g = blkps_engine_gradient(engine);
    for (uint64_t i = 0; i < kCount; ++i) g[i] = static_cast<float>(-1.0 * i);
    ASSERT_EQ(blkps_engine_finish(engine), 0) << blkps_engine_last_error(engine);
    EXPECT_EQ(blkps_engine_gradients_pushed(engine), kIterations + 1u);
    EXPECT_EQ(blkps_engine_step(engine), -EINVAL);
    EXPECT_NE(std::string(blkps_engine_last_error(engine)).find("after Finish"), std::string::npos);
    blkps_engine_close(engine);

    std::string open_error;
    auto model = blkps::Model::Open(file.path, blkps::OpenOptions(), &open_error);
    ASSERT_NE(model, nullptr) << open_error;
    std::vector<float> stored(kCount);
    ASSERT_EQ(model->Pull(0, stored.data(), kCount), 0) << model->last_error();
    for (uint64_t i = 0; i < kCount; ++i) {
      ASSERT_EQ(stored[i], static_cast<float>(-1.0 * i)) << "parameter " << i;
    }
  }
}

// ---- Against a real target ---------------------------------------------------

struct Setup {
  const char* name;
  bool double_buffering;
  bool adaptive_pull;
};

// Test names show the setup's name ("# GetParam() = adaptive").
void PrintTo(const Setup& setup, std::ostream* out) { *out << setup.name; }

class EngineAgainstTarget : public ::testing::TestWithParam<Setup> {};

std::string InitiatorName(const std::string& who) {
  static std::atomic<int> counter{0};
  return "iqn.2026-11.io.blkps:engine-test-" + who + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
}

blkps::EngineOptions Options(const Setup& setup, const std::string& who) {
  blkps::EngineOptions options;
  options.double_buffering = setup.double_buffering;
  options.adaptive_pull = setup.adaptive_pull;
  options.open.initiator_name = InitiatorName(who);
  return options;
}

// The model is one model block, read and written in one SCSI command, so
// that every pull is a snapshot. A second learner keeps adding 1 to every
// parameter, so that successive pulls return different uniform values. The
// engine's gradients are uniform too (a different value each iteration), so
// the weights stay uniform as long as no gradient is pushed half-written.
// Compute checks that its weights are uniform and do not change from the
// start to the end of its compute, which is spread over several sleeps, and
// fills its gradient slowly. At the end the server holds exactly the sum of
// every gradient: nothing lost, nothing pushed twice.
TEST_P(EngineAgainstTarget, SwapNeverExposesABufferBeingWritten) {
  constexpr uint64_t kParams = 65536;  // 256 KiB: one block, one command
  constexpr int kIterations = 200;
  TargetProcess target("params=65536;block=256K;rule=sum", "--luns 2");
  ASSERT_TRUE(target.ok()) << target.start_output();

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> other_pushes{0};
  std::string other_error;
  std::thread other([&] {
    blkps::OpenOptions o;
    o.initiator_name = InitiatorName("other");
    auto model = blkps::Model::Open(target.url(2), o, &other_error);
    if (!model) return;
    std::vector<float> ones(kParams, 1.0f);
    while (!stop) {
      if (model->Push(0, ones.data(), kParams) != 0) {
        other_error = model->last_error();
        return;
      }
      ++other_pushes;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  // Stops the other learner also when an assertion below returns early.
  struct Joiner {
    std::atomic<bool>& stop;
    std::thread& thread;
    ~Joiner() {
      stop = true;
      if (thread.joinable()) thread.join();
    }
  } joiner{stop, other};

  std::string error;
  blkps::EngineOptions options = Options(GetParam(), "swap");
  options.control_target = target.control_url();
  auto engine = blkps::Engine::Open(target.url(1), options, &error);
  ASSERT_NE(engine, nullptr) << error;
  ASSERT_EQ(engine->count(), kParams);

  std::mt19937 rng(3);
  double expected_from_engine = 0;
  int weight_changes_seen = 0;
  float previous = -1;
  for (int t = 0; t <= kIterations; ++t) {
    const float* w = engine->weights();
    float* g = engine->gradient();
    const float w0 = w[0];
    if (w0 != previous) ++weight_changes_seen;
    previous = w0;
    const float value = static_cast<float>(t % 5 + 1);
    // Compute: the gradient is written in 4 slices with sleeps between them
    // (0 to 3 ms each, so that compute is sometimes shorter and sometimes
    // longer than the transfers).
    for (int slice = 0; slice < 4; ++slice) {
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
      std::fill(g + slice * kParams / 4, g + (slice + 1) * kParams / 4, value);
    }
    for (uint64_t i = 0; i < kParams; ++i) {
      ASSERT_EQ(w[i], w0) << "iteration " << t << ": parameter " << i
                          << " changed or is not uniform while compute used the weights";
    }
    expected_from_engine += value;
    if (t == kIterations) {
      ASSERT_EQ(engine->Finish(), 0) << engine->last_error();
    } else {
      ASSERT_EQ(engine->Step(), 0) << engine->last_error();
      ASSERT_EQ(engine->last_metrics().iteration, static_cast<uint64_t>(t));
      ASSERT_GE(engine->last_metrics().staleness, 0) << "iteration " << t;
    }
  }
  stop = true;
  other.join();
  ASSERT_EQ(other_error, "");
  EXPECT_EQ(engine->gradients_pushed(), kIterations + 1u);
  // The other learner's pushes were seen: pulls returned new values.
  EXPECT_GT(weight_changes_seen, 1);

  auto reader = blkps::Model::Open(target.url(1), blkps::OpenOptions(), &error);
  ASSERT_NE(reader, nullptr) << error;
  std::vector<float> final_weights(kParams);
  ASSERT_EQ(reader->Pull(0, final_weights.data(), kParams), 0) << reader->last_error();
  const float expected = static_cast<float>(expected_from_engine + other_pushes.load());
  for (uint64_t i = 0; i < kParams; ++i) {
    ASSERT_EQ(final_weights[i], expected)
        << "parameter " << i << ": the server's sum is not the sum of every gradient handed in ("
        << expected_from_engine << " from the engine + " << other_pushes.load() << " from the other learner)";
  }
}

// Learner l's gradient for parameter i at iteration t: a small integer, so
// that sums and averages of two are exact in float.
float IntGradient(int l, int t, uint64_t i) {
  return static_cast<float>(static_cast<int>(((l + 1) * (i % 7) + 3 * t + 2 * l + i / 1000) % 9) - 4);
}

// Two engines (learners on LUNs 1 and 2) run kIterations through the server
// in each consistency mode; the final weights are exactly the sum of every
// gradient (async, ssp) or of every round's average (bsp), rule "sum".
// With drop_ratio > 0 the engines drop gradient runs (of 256 parameters) and
// Finish() pushes the residual: the sums are still exact.
void RunTwoLearners(const Setup& setup, const std::string& mode, double drop_ratio = 0) {
  // Not whole blocks; with dropping, 3 blocks of 4 whole runs.
  const uint64_t kParams = drop_ratio > 0 ? 3072 : 3000;
  constexpr int kLearners = 2, kIterations = 30;
  TargetProcess target("params=" + std::to_string(kParams) + ";block=4K;rule=sum;mode=" + mode, "--luns 2");
  ASSERT_TRUE(target.ok()) << target.start_output();

  std::vector<std::string> errors(kLearners);
  std::vector<uint64_t> pushed(kLearners);
  std::vector<std::thread> learners;
  for (int l = 0; l < kLearners; ++l) {
    learners.emplace_back([&, l] {
      blkps::EngineOptions options = Options(setup, "e2e" + std::to_string(l));
      options.control_target = target.control_url();
      options.open.request_bytes = 2048;  // several commands per transfer
      options.drop_ratio = drop_ratio;
      options.drop_run_params = 256;
      auto engine = blkps::Engine::Open(target.url(l + 1), options, &errors[l]);
      if (!engine) return;
      std::mt19937 rng(100 + l);
      for (int t = 0; t < kIterations; ++t) {
        float* g = engine->gradient();
        for (uint64_t i = 0; i < kParams; ++i) g[i] = IntGradient(l, t, i);
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
        const int rc = t + 1 < kIterations ? engine->Step() : engine->Finish();
        if (rc != 0) {
          errors[l] = "iteration " + std::to_string(t) + ": " + engine->last_error();
          return;
        }
      }
      pushed[l] = engine->gradients_pushed();
    });
  }
  for (std::thread& t : learners) t.join();
  for (int l = 0; l < kLearners; ++l) {
    ASSERT_EQ(errors[l], "") << "learner " << l;
    EXPECT_EQ(pushed[l], static_cast<uint64_t>(kIterations)) << "learner " << l;
  }

  // The control LUN's weights window (no consistency gate).
  std::string error;
  blkps::OpenOptions o;
  o.initiator_name = InitiatorName("check");
  auto control = blkps::Model::Open(target.control_url(), o, &error);
  ASSERT_NE(control, nullptr) << error;
  std::vector<float> w(3072);
  ASSERT_EQ(control->ReadBytes(BLKPS_CONTROL_WEIGHTS_OFFSET, w.data(), w.size() * 4), 0) << control->last_error();
  for (uint64_t i = 0; i < kParams; ++i) {
    double sum = 0;
    for (int t = 0; t < kIterations; ++t) {
      for (int l = 0; l < kLearners; ++l) sum += IntGradient(l, t, i);
    }
    const float expected = static_cast<float>(mode == "bsp" ? sum / kLearners : sum);
    ASSERT_EQ(w[i], expected) << "mode " << mode << ", parameter " << i;
  }
}

// What the server holds now: the weights window of the control LUN.
std::vector<float> ServerWeights(const TargetProcess& target, uint64_t params) {
  std::string error;
  blkps::OpenOptions o;
  o.initiator_name = InitiatorName("check");
  auto control = blkps::Model::Open(target.control_url(), o, &error);
  EXPECT_NE(control, nullptr) << error;
  std::vector<float> w((params * 4 + 4095) / 4096 * 1024);
  if (control == nullptr) return w;
  EXPECT_EQ(control->ReadBytes(BLKPS_CONTROL_WEIGHTS_OFFSET, w.data(), w.size() * 4), 0) << control->last_error();
  w.resize(params);
  return w;
}

// One engine drops 90% of its gradient runs in async, rule sum: after every
// step the server's weights plus the engine's residual are exactly the sum
// of every gradient handed in (checked between steps where the engine allows
// reading the residual: without double buffering), and after Finish() the
// server holds exactly that sum and the residual is empty. While it runs,
// most of each gradient is held back.
TEST_P(EngineAgainstTarget, DroppedGradientIsDelayedNeverLostAsync) {
  constexpr uint64_t kParams = 8192;  // 32 runs of 256
  constexpr int kIterations = 40;
  TargetProcess target("params=8192;block=4K;rule=sum;mode=async", "--luns 1");
  ASSERT_TRUE(target.ok()) << target.start_output();
  blkps::EngineOptions options = Options(GetParam(), "drop");
  options.control_target = target.control_url();
  options.drop_ratio = 0.9;  // 3 runs of 32 pushed per step
  options.drop_run_params = 256;
  std::string error;
  auto engine = blkps::Engine::Open(target.url(1), options, &error);
  ASSERT_NE(engine, nullptr) << error;

  std::vector<double> given(kParams);
  bool residual_seen = false;
  for (int t = 0; t < kIterations; ++t) {
    float* g = engine->gradient();
    for (uint64_t i = 0; i < kParams; ++i) {
      g[i] = IntGradient(0, t, i);
      given[i] += g[i];
    }
    if (t + 1 == kIterations) {
      ASSERT_EQ(engine->Finish(), 0) << engine->last_error();
      break;
    }
    ASSERT_EQ(engine->Step(), 0) << engine->last_error();
    if (GetParam().double_buffering) continue;
    const std::vector<float> server = ServerWeights(target, kParams);
    const float* residual = engine->residual();
    ASSERT_NE(residual, nullptr);
    uint64_t held = 0;
    for (uint64_t i = 0; i < kParams; ++i) {
      ASSERT_EQ(server[i] + residual[i], given[i])
          << "after step " << t << ", parameter " << i
          << ": the server's weights plus the residual are not the sum of the gradients";
      held += residual[i] != 0;
    }
    residual_seen = residual_seen || held > kParams / 2;
  }
  if (!GetParam().double_buffering) {
    EXPECT_TRUE(residual_seen) << "nothing was ever dropped";
  }
  EXPECT_EQ(engine->gradients_pushed(), static_cast<uint64_t>(kIterations));
  const std::vector<float> server = ServerWeights(target, kParams);
  for (uint64_t i = 0; i < kParams; ++i) {
    ASSERT_EQ(engine->residual()[i], 0.0f) << "parameter " << i;
    ASSERT_EQ(server[i], given[i]) << "parameter " << i << ": a gradient was lost or pushed twice";
  }
}

TEST_P(EngineAgainstTarget, TwoLearnersDroppingGiveExactlyTheExpectedWeightsAsync) {
  RunTwoLearners(GetParam(), "async", 0.9);
}
// In ssp each model block of 4 runs gets one run from each learner per
// step: every block's clocks tick alike, once per 4 steps.
TEST_P(EngineAgainstTarget, TwoLearnersDroppingGiveExactlyTheExpectedWeightsSsp) {
  RunTwoLearners(GetParam(), "ssp:2", 0.75);
}

// The iteration (least clock over the blocks) of the model's first learner,
// from the control LUN's status; -1 if it cannot be read.
int64_t FirstLearnerIteration(const TargetProcess& target) {
  std::string error;
  blkps::OpenOptions o;
  o.initiator_name = InitiatorName("status");
  auto control = blkps::Model::Open(target.control_url(), o, &error);
  if (control == nullptr) return -1;
  std::string json(BLKPS_CONTROL_STATUS_BYTES, '\0');
  if (control->ReadBytes(BLKPS_CONTROL_STATUS_OFFSET, json.data(), json.size()) != 0) return -1;
  const size_t learners = json.find("\"learners\"");
  const std::string key = "\"iteration\": ";
  const size_t at = json.find(key, learners == std::string::npos ? 0 : learners);
  if (learners == std::string::npos || at == std::string::npos) return -1;
  return std::strtoll(json.c_str() + at + key.size(), nullptr, 10);
}

// In ssp the engine drops per model block (read from the control LUN): with
// 4 runs per block and 1 kept, every block gets one run per step, so after 8
// steps every block's clock has ticked twice, even though block 0's
// gradient is 100 times larger than the others' (a selection over the whole
// model would push only block 0's runs, and the others' clocks would stay
// at 0, holding ssp readers back).
TEST(EngineAgainstTargetDropping, InSspEveryBlockGetsItsShareSoClocksTickTogether) {
  constexpr uint64_t kParams = 4096;  // 4 blocks of 1024 = 4 runs of 256 each
  TargetProcess target("params=4096;block=4K;rule=sum;mode=ssp:2", "--luns 1");
  ASSERT_TRUE(target.ok()) << target.start_output();
  blkps::EngineOptions options;
  options.double_buffering = false;
  options.open.initiator_name = InitiatorName("ssp-drop");
  options.control_target = target.control_url();
  options.drop_ratio = 0.75;
  options.drop_run_params = 256;
  std::string error;
  auto engine = blkps::Engine::Open(target.url(1), options, &error);
  ASSERT_NE(engine, nullptr) << error;
  for (int t = 0; t < 8; ++t) {
    float* g = engine->gradient();
    for (uint64_t i = 0; i < kParams; ++i) g[i] = i < 1024 ? 100 : 1;
    ASSERT_EQ(engine->Step(), 0) << engine->last_error();
  }
  EXPECT_EQ(engine->params_pushed(), 8u * 4 * 256);
  EXPECT_EQ(FirstLearnerIteration(target), 2);
}

TEST(EngineAgainstTargetDropping, DroppingIsRefusedInBspInOneLine) {
  TargetProcess target("params=4096;block=4K;rule=sum;mode=bsp", "--luns 1");
  ASSERT_TRUE(target.ok()) << target.start_output();
  blkps::EngineOptions options;
  options.open.initiator_name = InitiatorName("bsp-drop");
  options.control_target = target.control_url();
  options.drop_ratio = 0.9;
  std::string error;
  int code = 0;
  EXPECT_EQ(blkps::Engine::Open(target.url(1), options, &error, &code), nullptr);
  EXPECT_EQ(code, -EINVAL);
  EXPECT_NE(error.find("gradient dropping needs mode async or ssp"), std::string::npos) << error;
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
}

TEST_P(EngineAgainstTarget, TwoLearnersGiveExactlyTheExpectedWeightsAsync) { RunTwoLearners(GetParam(), "async"); }
TEST_P(EngineAgainstTarget, TwoLearnersGiveExactlyTheExpectedWeightsBsp) { RunTwoLearners(GetParam(), "bsp"); }
TEST_P(EngineAgainstTarget, TwoLearnersGiveExactlyTheExpectedWeightsSsp) { RunTwoLearners(GetParam(), "ssp:2"); }

INSTANTIATE_TEST_SUITE_P(Setups, EngineAgainstTarget,
                         ::testing::Values(Setup{"adaptive", true, true}, Setup{"eager", true, false},
                                           Setup{"baseline", false, false}),
                         [](const ::testing::TestParamInfo<Setup>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace blkps_test
