// blkps-engine-bench: what the learner engine (blkps/engine.hpp) buys.
//
// 1. Stall and staleness. Every learner LUN given gets one learner thread
//    with its own engine; compute is a sleep. Before each row the
//    communication time T is measured: the median push + pull of the model
//    with all learners running the baseline with no compute. For compute =
//    0.5, 1 and 2 T each setup runs --iterations iterations (the first
//    --warmup are not counted): the baseline (Step pushes then pulls),
//    double buffering with eager pulls (adaptive_pull off), and double
//    buffering with adaptive pulling. Learners run out of phase. Printed as
//    a markdown table: stall fraction (stall time / iteration time, over all
//    learners) and mean staleness (model updates between the pull of the
//    weights and their use, from the control LUN).
// 2. Push + pull rate of the model through the engine (no compute: push and
//    pull run concurrently) against the same transfers through tgt's null
//    store (two plain connections, one pushing while the other pulls, same
//    request size and queue depth), rounds interleaved, medians, the ratio;
//    also the engine on the null store, which shows the engine's own cost.
//
// bench/engine-bench.sh starts a target with a null LUN, runs this, stops it.

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "blkps/byte_size.hpp"
#include "blkps/engine.hpp"
#include "blkps/model.hpp"

namespace {

using Clock = std::chrono::steady_clock;

constexpr char kUsage[] = "usage: blkps-engine-bench --urls 'URL1 URL2 ...' [--control URL] "
                          "[--null URL] [options]\n"
                          "  --urls        learner LUNs of one model, one learner thread each (2+ "
                          "for staleness)\n"
                          "  --control     the model's control LUN (CONTROL_URL): staleness\n"
                          "  --null        tgt's null LUN (NULL_URL): the rate ceiling; without it "
                          "the rate part is skipped\n"
                          "  --params N    parameters per learner (default: the whole device)\n"
                          "  --iterations  iterations per setup in the stall table (default 20)\n"
                          "  --warmup      first iterations not counted (default 4)\n"
                          "  --rounds      interleaved rounds of the rate part (default 5)\n"
                          "  --rate-iterations  transfers per round and store (default 6)\n"
                          "  --bs, --qd    request bytes and requests in flight (default 1M, 16)\n"
                          "  --only stall|rate  run one part\n"
                          "  --trace       print every counted iteration's metrics on stderr\n";

struct Options {
  std::vector<std::string> urls;
  std::string control, null;
  uint64_t params = 0;
  int iterations = 20, warmup = 4, rounds = 5, rate_iterations = 6;
  uint32_t bs = 1 << 20, qd = 16;
  bool stall = true, rate = true;
  bool trace = false;
};

[[noreturn]] void Fail(const std::string& message) {
  fprintf(stderr, "blkps-engine-bench: %s\n", message.c_str());
  exit(2);
}

// A count or a size: blkps's size syntax (blkps/byte_size.hpp).
uint64_t Number(const std::string& name, const std::string& value) {
  uint64_t n = 0;
  if (!blkps::ParseByteSize(value, &n)) {
    Fail(name + ": expected a non-negative integer (K, M, G suffixes allowed), got '" + value + "'");
  }
  return n;
}

Options ParseOptions(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string name = argv[i];
    if (name == "--help" || name == "-h") {
      fputs(kUsage, stdout);
      exit(0);
    }
    if (name == "--trace") {
      o.trace = true;
      continue;
    }
    if (i + 1 >= argc) Fail(name + ": missing value (see --help)");
    const std::string value = argv[++i];
    if (name == "--urls") {
      std::istringstream in(value);
      std::string url;
      while (in >> url) o.urls.push_back(url);
    } else if (name == "--control") {
      o.control = value;
    } else if (name == "--null") {
      o.null = value;
    } else if (name == "--params") {
      o.params = Number(name, value);
    } else if (name == "--iterations") {
      o.iterations = static_cast<int>(Number(name, value));
    } else if (name == "--warmup") {
      o.warmup = static_cast<int>(Number(name, value));
    } else if (name == "--rounds") {
      o.rounds = static_cast<int>(Number(name, value));
    } else if (name == "--rate-iterations") {
      o.rate_iterations = static_cast<int>(Number(name, value));
    } else if (name == "--bs") {
      o.bs = static_cast<uint32_t>(Number(name, value));
    } else if (name == "--qd") {
      o.qd = static_cast<uint32_t>(Number(name, value));
    } else if (name == "--only") {
      if (value != "stall" && value != "rate") {
        Fail("--only: expected stall or rate, got '" + value + "'");
      }
      o.stall = value == "stall";
      o.rate = value == "rate";
    } else {
      Fail("unknown option '" + name + "' (see --help)");
    }
  }
  if (o.urls.empty()) Fail("--urls is required (see --help)");
  if (o.iterations <= o.warmup) Fail("--iterations must exceed --warmup");
  if (o.rounds < 1 || o.rate_iterations < 1) {
    Fail("--rounds and --rate-iterations must be at least 1");
  }
  if (o.bs == 0 || o.qd == 0) Fail("--bs and --qd must be positive");
  return o;
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void SleepFor(double seconds) {
  if (seconds > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  }
}

struct Setup {
  const char* name;
  bool double_buffering;
  bool adaptive_pull;
};
constexpr Setup kBaseline{"baseline", false, false};
constexpr Setup kEager{"double-buffered", true, false};
constexpr Setup kAdaptive{"double-buffered + adaptive", true, true};

blkps::EngineOptions EngineOptionsFor(const Options& o, const Setup& setup, uint64_t params, bool control) {
  blkps::EngineOptions e;
  e.open.request_bytes = o.bs;
  e.open.queue_depth = o.qd;
  e.param_count = params;
  e.double_buffering = setup.double_buffering;
  e.adaptive_pull = setup.adaptive_pull;
  if (control) e.control_target = o.control;
  return e;
}

// Every learner's metrics of the counted iterations.
std::vector<blkps::IterationMetrics> RunLearners(const Options& o, const Setup& setup, uint64_t params,
                                                 double compute_s, int iterations) {
  std::mutex mu;
  std::vector<blkps::IterationMetrics> all;
  std::string failure;
  std::vector<std::thread> threads;
  for (size_t l = 0; l < o.urls.size(); ++l) {
    threads.emplace_back([&, l] {
      const std::string& url = o.urls[l];
      std::string error;
      auto engine = blkps::Engine::Open(url, EngineOptionsFor(o, setup, params, !o.control.empty()), &error);
      // Learners out of phase (learner l starts l/N of a compute later), as
      // learners of a real job are: the others' pushes then land at
      // different points of an iteration, which is what staleness measures.
      SleepFor(compute_s * l / o.urls.size());
      std::vector<blkps::IterationMetrics> mine;
      for (int t = 0; engine && t < iterations; ++t) {
        SleepFor(compute_s);  // the compute
        if (engine->Step() != 0) {
          error = engine->last_error();
          break;
        }
        if (t < o.warmup) continue;
        const blkps::IterationMetrics& m = engine->last_metrics();
        mine.push_back(m);
        if (o.trace) {
          fprintf(stderr,
                  "    %s %s t=%llu compute=%.1f stall=%.1f push=%.1f "
                  "pull=%.1f bubble=%.1f staleness=%lld concurrent=%d (ms)\n",
                  setup.name, url.c_str(), static_cast<unsigned long long>(m.iteration), m.compute_s * 1e3,
                  m.stall_s * 1e3, m.push_s * 1e3, m.pull_s * 1e3, m.bubble_s * 1e3,
                  static_cast<long long>(m.staleness), m.concurrent ? 1 : 0);
        }
      }
      if (engine && error.empty() && engine->Finish() != 0) {
        error = engine->last_error();
      }
      std::lock_guard<std::mutex> lock(mu);
      if (!error.empty()) failure = url + ": " + error;
      all.insert(all.end(), mine.begin(), mine.end());
    });
  }
  for (std::thread& t : threads) t.join();
  if (!failure.empty()) Fail(failure);
  return all;
}

struct Summary {
  double comm_s = 0;  // median push + pull
  double stall_fraction = 0;
  double staleness = -1;  // mean; -1 unknown
  double concurrent = 0;  // fraction of iterations
};

Summary Summarize(const std::vector<blkps::IterationMetrics>& metrics) {
  Summary s;
  double stall = 0, total = 0, staleness = 0, concurrent = 0;
  uint64_t known = 0;
  std::vector<double> comm;
  for (const blkps::IterationMetrics& m : metrics) {
    comm.push_back(m.push_s + m.pull_s);
    stall += m.stall_s;
    total += m.compute_s + m.stall_s;
    concurrent += m.concurrent ? 1 : 0;
    if (m.staleness >= 0) {
      staleness += static_cast<double>(m.staleness);
      ++known;
    }
  }
  s.comm_s = Median(comm);
  s.stall_fraction = total > 0 ? stall / total : 0;
  s.staleness = known ? staleness / known : -1;
  s.concurrent = metrics.empty() ? 0 : concurrent / metrics.size();
  return s;
}

std::string Staleness(const Summary& s) {
  if (s.staleness < 0) return "n/a";
  char text[32];
  snprintf(text, sizeof text, "%.2f", s.staleness);
  return text;
}

// T: the median push + pull time of the model with every learner running
// the baseline at once with no compute.
double CommunicationTime(const Options& o, uint64_t params) {
  std::vector<double> comm;
  for (const auto& m : RunLearners(o, kBaseline, params, 0, o.warmup + 4)) {
    comm.push_back(m.push_s + m.pull_s);
  }
  return Median(comm);
}

void StallTable(const Options& o, uint64_t params) {
  printf("\nT: push + pull of the %.1f MiB model with %zu learners at once "
         "(median), measured again before each row (machine load drifts)\n\n",
         params * 4.0 / (1 << 20), o.urls.size());
  printf("| compute | T ms | comm / compute in the baseline run | "
         "stall %% baseline | stall %% double-buffered | "
         "stall %% double-buffered + adaptive | staleness eager | "
         "staleness adaptive |\n");
  printf("|---|---|---|---|---|---|---|---|\n");
  for (double ratio : {0.5, 1.0, 2.0}) {
    const double t = CommunicationTime(o, params);
    const double compute = ratio * t;
    Summary s[3];
    const Setup setups[3] = {kBaseline, kEager, kAdaptive};
    for (int k = 0; k < 3; ++k) {
      s[k] = Summarize(RunLearners(o, setups[k], params, compute, o.iterations));
      fprintf(stderr,
              "  compute %.1f ms, %s: stall %.1f %%, staleness %s, "
              "concurrent %.0f %% of iterations\n",
              compute * 1e3, setups[k].name, s[k].stall_fraction * 100, Staleness(s[k]).c_str(), s[k].concurrent * 100);
    }
    printf("| %.1fx T (%.0f ms) | %.0f | %.2f | %.1f | %.1f | %.1f | %s | %s "
           "|\n",
           ratio, compute * 1e3, t * 1e3, s[0].comm_s / compute, s[0].stall_fraction * 100, s[1].stall_fraction * 100,
           s[2].stall_fraction * 100, Staleness(s[1]).c_str(), Staleness(s[2]).c_str());
    fflush(stdout);
  }
}

// Seconds per push + pull of `params` through an engine with no compute
// (after one warm-up iteration), median over `iterations`.
double EngineIteration(const Options& o, const std::string& url, uint64_t params, int iterations) {
  std::string error;
  auto engine = blkps::Engine::Open(url, EngineOptionsFor(o, kAdaptive, params, false), &error);
  if (!engine) Fail(error);
  std::vector<double> times;
  Clock::time_point last = Clock::now();
  for (int t = 0; t <= iterations; ++t) {
    if (engine->Step() != 0) Fail(engine->last_error());
    const Clock::time_point now = Clock::now();
    if (t > 0) times.push_back(Seconds(now - last));
    last = now;
  }
  if (engine->Finish() != 0) Fail(engine->last_error());
  return Median(times);
}

// The same transfers with plain connections: one pushes `params` while the
// other pulls them; seconds per round, median.
double PlainIteration(const Options& o, const std::string& url, uint64_t params, int iterations) {
  blkps::OpenOptions open;
  open.request_bytes = o.bs;
  open.queue_depth = o.qd;
  std::string error;
  // Two sessions need two initiator names (one name would log the other out).
  open.initiator_name = "iqn.2026-11.io.blkps:engine-bench-push";
  auto pusher = blkps::Model::Open(url, open, &error);
  if (!pusher) Fail(error);
  open.initiator_name = "iqn.2026-11.io.blkps:engine-bench-pull";
  auto puller = blkps::Model::Open(url, open, &error);
  if (!puller) Fail(error);
  std::vector<float> grad(params, 0.0f), weights(params);
  std::vector<double> times;
  for (int t = 0; t <= iterations; ++t) {
    const Clock::time_point start = Clock::now();
    int push_rc = 0;
    std::thread push([&] { push_rc = pusher->Push(0, grad.data(), params); });
    const int pull_rc = puller->Pull(0, weights.data(), params);
    push.join();
    if (push_rc != 0) Fail(pusher->last_error());
    if (pull_rc != 0) Fail(puller->last_error());
    if (t > 0) times.push_back(Seconds(Clock::now() - start));
  }
  return Median(times);
}

void RateComparison(const Options& o, uint64_t params) {
  const double mb = 2.0 * params * 4 / 1e6;  // pushed + pulled per iteration
  std::vector<double> engine_rates, null_rates, engine_null_rates;
  for (int r = 1; r <= o.rounds; ++r) {
    const int k = o.rate_iterations;
    const double e = mb / EngineIteration(o, o.urls[0], params, k);
    const double n = mb / PlainIteration(o, o.null, params, k);
    const double en = mb / EngineIteration(o, o.null, params, k);
    fprintf(stderr,
            "  round %d/%d: engine %.0f MB/s, null %.0f MB/s, engine on null "
            "%.0f MB/s\n",
            r, o.rounds, e, n, en);
    engine_rates.push_back(e);
    null_rates.push_back(n);
    engine_null_rates.push_back(en);
  }
  const double e = Median(engine_rates), n = Median(null_rates), en = Median(engine_null_rates);
  printf("\npush + pull of a %.1f MiB model (bs %u, qd %u, %d rounds, "
         "medians, MB = 1e6 B):\n\n",
         params * 4.0 / (1 << 20), o.bs, o.qd, o.rounds);
  printf("| engine, blkps LUN MB/s | plain push+pull, null LUN MB/s | ratio "
         "| engine, null LUN MB/s (engine's own cost) |\n|---|---|---|---|\n"
         "| %.0f | %.0f | %.2f | %.0f (%.2f) |\n",
         e, n, e / n, en, en / n);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = ParseOptions(argc, argv);
  uint64_t params = o.params;
  {
    std::string error;
    auto probe = blkps::Model::Open(o.urls[0], blkps::OpenOptions(), &error);
    if (!probe) Fail(error);
    const uint64_t on_device = probe->size_bytes() / 4;
    if (params == 0) params = on_device;
    if (params > on_device) {
      Fail("--params " + std::to_string(params) + " is more than the " + std::to_string(on_device) + " on " +
           o.urls[0]);
    }
  }
  printf("engine bench: %zu learners, model %llu parameters (%.1f MiB), bs "
         "%u, qd %u\n",
         o.urls.size(), static_cast<unsigned long long>(params), params * 4.0 / (1 << 20), o.bs, o.qd);
  if (o.stall) StallTable(o, params);
  if (o.rate && !o.null.empty()) RateComparison(o, params);
  return 0;
}
