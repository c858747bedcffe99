// Server semantics end to end: a real tgtd with the built bs_blkps plugin on
// loopback (TargetProcess), learners reaching it through libblkps over
// iSCSI, and raw SCSI commands (libiscsi) where a test must see the sense
// data. What is checked here is the server's contract: bsp gives exactly the
// sequential weights, ssp bounds how far a reader runs ahead, async never
// waits, dead learners are declared and let the others go on, max_dead fails
// the job until resume=1, held commands fail at hold_limit, fsync checkpoints
// survive a kill -9 of tgtd bit for bit, bad checkpoints are refused, and the
// control LUN sets and shows the job with plain block I/O.
//
// The model of every test: params=3000;block=4K, i.e. model blocks of 1024,
// 1024 and 952 parameters, on a device of 24 logical blocks of 512 bytes.
#include <blkps/control_lun.h>
#include <iscsi/iscsi.h>
#include <iscsi/scsi-lowlevel.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <blkps/model.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "next_generation.h"
#include "raw_lun.h"
#include "target_process.h"

namespace blkps_test {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kParams = 3000;
constexpr uint64_t kLbaBytes = 512;
constexpr uint64_t kLbaParams = kLbaBytes / 4;                       // 128
constexpr uint64_t kLbas = (kParams + kLbaParams - 1) / kLbaParams;  // 24
// The control LUN's layout (blkps/control_lun.h).
constexpr uint64_t kStatusBytes = BLKPS_CONTROL_STATUS_BYTES;
constexpr uint64_t kControlOffset = BLKPS_CONTROL_COMMANDS_OFFSET;
constexpr uint64_t kWeightsOffset = BLKPS_CONTROL_WEIGHTS_OFFSET;

// Sense data as the raw helpers print it: "sense <key> <asc><ascq>".
const char kJobFailedSense[] = "sense 0x2 0x0403";     // NOT READY, MANUAL INTERVENTION REQUIRED
const char kHoldTimeoutSense[] = "sense 0xb 0x2e00";   // ABORTED COMMAND, INSUFFICIENT TIME FOR OPERATION
const char kWriteProtectSense[] = "sense 0x7 0x2700";  // DATA PROTECT, WRITE PROTECTED
const char kBadDataSense[] = "sense 0x5 0x2600";       // ILLEGAL REQUEST, INVALID FIELD IN PARAMETER LIST

std::string Bsopts(const std::string& more) { return "params=3000;block=4K;" + more; }

// A distinct initiator name per session: sessions of one name and ISID
// would reinstate (log out) each other.
std::string InitiatorName(const std::string& who) {
  static std::atomic<int> counter{0};
  return "iqn.2026-11.io.blkps:sst-" + who + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
}

std::unique_ptr<blkps::Model> OpenModel(const std::string& url, const std::string& who, std::string* error,
                                        uint32_t request_bytes = 0) {
  blkps::OpenOptions o;
  o.request_bytes = request_bytes;
  o.initiator_name = InitiatorName(who);
  return blkps::Model::Open(url, o, error);
}

// Learner l's gradient for parameter i at iteration t: a small integer, so
// that sums, and averages over 1, 2 or 4 learners, are exact in float.
float IntGradient(int l, int t, uint64_t i) {
  return static_cast<float>(static_cast<int>(((l + 1) * (i % 7) + 3 * t + 2 * l + i / 1000) % 9) - 4);
}
std::vector<float> IntGradients(int l, int t) {
  std::vector<float> g(kParams);
  for (uint64_t i = 0; i < kParams; ++i) g[i] = IntGradient(l, t, i);
  return g;
}

// Pushes g (kParams gradients) as pieces of whole logical blocks, of random
// sizes (1 to 8 logical blocks: some within a model block, some across two)
// and in random order. Whole logical blocks, because the library pads a
// ragged piece with zero gradients and the server would count those as part
// of the learner's gradient. Returns 0 or the failing Push's value.
int PushInRandomPieces(blkps::Model& m, const std::vector<float>& g, std::mt19937& rng) {
  std::vector<std::pair<uint64_t, uint64_t>> pieces;  // [first, end) parameters
  for (uint64_t lba = 0; lba < kLbas;) {
    const uint64_t n = std::min<uint64_t>(kLbas - lba, 1 + rng() % 8);
    pieces.emplace_back(lba * kLbaParams, std::min(kParams, (lba + n) * kLbaParams));
    lba += n;
  }
  std::shuffle(pieces.begin(), pieces.end(), rng);
  for (const auto& [first, end] : pieces) {
    const int rc = m.Push(first, g.data() + first, end - first);
    if (rc != 0) return rc;
  }
  return 0;
}

// Index of the first parameter where a and b differ bitwise, or -1.
int64_t FirstBitDifference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<int64_t>(i);
  }
  return -1;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// ---- The control LUN's status JSON -----------------------------------------

// Reads bytes [0, 64 KiB) of the control LUN through libblkps, as any
// program would with pread: NUL-terminated JSON text.
std::string ReadStatus(const std::string& control_url) {
  std::string error;
  auto m = OpenModel(control_url, "status", &error);
  if (!m) {
    ADD_FAILURE() << "cannot open the control LUN: " << error;
    return "";
  }
  std::vector<char> buf(kStatusBytes + 1, '\0');
  if (m->ReadBytes(0, buf.data(), kStatusBytes) != 0) {
    ADD_FAILURE() << "cannot read the status: " << m->last_error();
    return "";
  }
  return std::string(buf.data());
}

// The status object of the learner served by LUN `lun` ("" if none).
std::string LearnerStatus(const std::string& json, int lun) {
  const size_t at = json.find("{\"lun\": " + std::to_string(lun) + ",");
  if (at == std::string::npos) return "";
  return json.substr(at, json.find('}', at) - at + 1);
}

// The text of the first value of "key" in `json`: a number, true/false, or
// a string with its quotes. "" if there is none.
std::string JsonValue(const std::string& json, const std::string& key) {
  const std::string k = "\"" + key + "\": ";
  size_t at = json.find(k);
  if (at == std::string::npos) return "";
  at += k.size();
  if (json[at] == '"') {
    size_t end = at + 1;
    while (end < json.size() && json[end] != '"') end += json[end] == '\\' ? 2 : 1;
    return json.substr(at, end - at + 1);
  }
  return json.substr(at, json.find_first_of(",}\n", at) - at);
}

// ---- Raw SCSI ----------------------------------------------------------------

// `text` NUL-padded to whole logical blocks, as a control write.
std::vector<uint8_t> ControlText(const std::string& text) {
  std::vector<uint8_t> bytes((text.size() + kLbaBytes) / kLbaBytes * kLbaBytes, 0);
  std::memcpy(bytes.data(), text.data(), text.size());
  return bytes;
}

// ---- A learner in a child process, to be killed ------------------------------

// Forks a learner on `url` that opens the model, pulls, reports 'R', waits
// for Go(), pushes `gradient` once, reports 'P', and then does nothing until
// it is killed. The destructor kills (SIGKILL) and reaps it if the test has
// not, so no child outlives a failing test.
class ChildLearner {
 public:
  ChildLearner(const std::string& url, const std::vector<float>& gradient) {
    int up[2], down[2];
    if (pipe(up) != 0 || pipe(down) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      close(up[0]);
      close(down[1]);
      auto report = [&](const std::string& msg) {
        ssize_t ignored = write(up[1], msg.data(), msg.size());
        (void)ignored;
        if (msg[0] == 'E') _exit(1);
      };
      std::string error;
      auto m = OpenModel(url, "child", &error);
      std::vector<float> w(kParams);
      if (!m) report("E" + error);
      if (m->Pull(0, w.data(), kParams) != 0) report("E" + m->last_error());
      report("R");
      char go = 0;
      if (read(down[0], &go, 1) != 1) _exit(1);
      if (m->Push(0, gradient.data(), kParams) != 0) report("E" + m->last_error());
      report("P");
      for (;;) pause();
    }
    close(up[1]);
    close(down[0]);
    up_ = up[0];
    down_ = down[1];
  }
  ~ChildLearner() {
    Kill();
    if (up_ >= 0) close(up_);
    if (down_ >= 0) close(down_);
  }
  ChildLearner(const ChildLearner&) = delete;
  ChildLearner& operator=(const ChildLearner&) = delete;

  // Waits until the child has reported `what` ('R' or 'P'), calling
  // keep_alive() about every 5 ms meanwhile (the parent's learner keeps doing
  // I/O, so that the server never takes it for dead). Returns "" or why not.
  std::string WaitFor(char what, const std::function<std::string()>& keep_alive, double timeout_s = 20) {
    if (pid_ <= 0) return "fork failed";
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
    while (reports_.find(what) == std::string::npos) {
      if (!reports_.empty() && reports_.find('E') != std::string::npos) {
        return "child learner failed: " + reports_.substr(reports_.find('E') + 1);
      }
      if (Clock::now() > deadline) return std::string("child learner did not report '") + what + "' in time";
      pollfd pfd{up_, POLLIN, 0};
      if (poll(&pfd, 1, 5) > 0) {
        char buf[4096];
        const ssize_t n = read(up_, buf, sizeof buf);
        if (n <= 0) return "child learner exited; it reported '" + reports_ + "'";
        reports_.append(buf, n);
      }
      const std::string err = keep_alive();
      if (!err.empty()) return "keep-alive I/O failed: " + err;
    }
    return "";
  }
  void Go() {
    ssize_t ignored = write(down_, "G", 1);
    (void)ignored;
  }
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  int up_ = -1, down_ = -1;
  std::string reports_;
};

// ---- 1. bsp ------------------------------------------------------------------

// reference[t]: the weights of a rule=sgd;lr=1 model after t rounds, each
// applying the mean over `learners` of gradient(l, t, i) (sums of small
// integers over a power of two: exact).
std::vector<std::vector<float>> SequentialReference(int iterations, int learners,
                                                    const std::function<float(int, int, uint64_t)>& gradient) {
  std::vector<std::vector<float>> reference(iterations + 1, std::vector<float>(kParams, 0.0f));
  for (int t = 0; t < iterations; ++t) {
    for (uint64_t i = 0; i < kParams; ++i) {
      float sum = 0;
      for (int l = 0; l < learners; ++l) sum += gradient(l, t, i);
      reference[t + 1][i] = reference[t][i] - sum / static_cast<float>(learners);
    }
  }
  return reference;
}

// One bsp learner against a sequential reference, on 1 KiB requests (every
// pull and push is several commands in flight, each covering part of a model
// block): at iteration t it pulls and must see exactly reference[t], bsp's
// read guarantee, then, before the last, pushes with push(m, t) (0 or the
// failing Push's value). Returns "" or what went wrong.
std::string FollowTheReference(const std::string& url, const std::string& who,
                               const std::vector<std::vector<float>>& reference,
                               const std::function<int(blkps::Model&, int)>& push) {
  std::string error;
  auto m = OpenModel(url, who, &error, 1024);
  if (!m) return error;
  std::vector<float> w(kParams);
  for (int t = 0;; ++t) {
    if (m->Pull(0, w.data(), kParams) != 0) return "iteration " + std::to_string(t) + ": pull: " + m->last_error();
    const int64_t bad = FirstBitDifference(w, reference[t]);
    if (bad >= 0) {
      return "iteration " + std::to_string(t) + ": parameter " + std::to_string(bad) + " is " + std::to_string(w[bad]) +
             ", the sequential reference after " + std::to_string(t) + " rounds has " +
             std::to_string(reference[t][bad]);
    }
    if (t + 1 == static_cast<int>(reference.size())) return "";
    if (push(*m, t) != 0) return "iteration " + std::to_string(t) + ": push: " + m->last_error();
  }
}

TEST(ServerSemantics, BspWithFourLearnersGivesExactlyTheSequentialWeights) {
  constexpr int kLearners = 4, kIterations = 8;
  TargetProcess target(Bsopts("mode=bsp;rule=sgd;lr=1"), "--luns 4");
  ASSERT_TRUE(target.ok()) << target.start_output();

  const std::vector<std::vector<float>> reference = SequentialReference(kIterations, kLearners, IntGradient);

  std::vector<std::string> errors(kLearners);
  std::vector<std::thread> threads;
  for (int l = 0; l < kLearners; ++l) {
    threads.emplace_back([&, l] {
      std::mt19937 rng(1000 + l);
      errors[l] =
          FollowTheReference(target.url(l + 1), "bsp" + std::to_string(l), reference,
                             [&](blkps::Model& m, int t) { return PushInRandomPieces(m, IntGradients(l, t), rng); });
    });
  }
  for (std::thread& t : threads) t.join();
  for (int l = 0; l < kLearners; ++l) EXPECT_EQ(errors[l], "") << "learner " << l << " (LUN " << l + 1 << ")";

  // The weights window of the control LUN (no consistency gate) agrees.
  RawLun control(target.control_url(), InitiatorName("raw"));
  ASSERT_TRUE(control.connected()) << control.error();
  std::vector<uint8_t> bytes;
  ASSERT_EQ(control.Read(kWeightsOffset / kLbaBytes, kLbas, &bytes), "GOOD");
  std::vector<float> w(kParams);
  std::memcpy(w.data(), bytes.data(), kParams * sizeof(float));
  EXPECT_EQ(FirstBitDifference(w, reference[kIterations]), -1);
  const std::string status = ReadStatus(target.control_url());
  EXPECT_EQ(JsonValue(status, "global_step"), std::to_string(kIterations)) << status;
  for (int lun = 1; lun <= kLearners; ++lun) {
    EXPECT_EQ(JsonValue(LearnerStatus(status, lun), "iteration"), std::to_string(kIterations)) << status;
  }
}

// A tied weight's gradient in two parts a round
// (doc/server.md "A gradient in parts"): blocks 0 and 1 take the head's
// part (pushed with the rest of the model's gradient), then the rows' part;
// the weights equal one process's sgd steps on the average of the learners'
// summed parts.
TEST(ServerSemantics, BspGradientInTwoPartsEqualsTheOneProcessSteps) {
  constexpr int kLearners = 2, kIterations = 6;
  constexpr uint64_t kTied = 2048;  // model blocks 0 and 1
  TargetProcess target(Bsopts("mode=bsp;rule=sgd;lr=1;parts=0:2048:2"), "--luns 2");
  ASSERT_TRUE(target.ok()) << target.start_output();
  // Learner l's parts at iteration t: IntGradients(l, t) on the whole model
  // (the head's, and the rest's), then IntGradients(l + kLearners, t) on the
  // tied blocks (the rows').
  const std::vector<std::vector<float>> reference =
      SequentialReference(kIterations, kLearners, [](int l, int t, uint64_t i) {
        return IntGradient(l, t, i) + (i < kTied ? IntGradient(l + kLearners, t, i) : 0.0f);
      });
  std::vector<std::string> errors(kLearners);
  std::vector<std::thread> threads;
  for (int l = 0; l < kLearners; ++l) {
    threads.emplace_back([&, l] {
      errors[l] =
          FollowTheReference(target.url(l + 1), "parts" + std::to_string(l), reference, [&](blkps::Model& m, int t) {
            const std::vector<float> head = IntGradients(l, t), rows = IntGradients(l + kLearners, t);
            const int rc = m.Push(0, head.data(), kParams);
            return rc != 0 ? rc : m.Push(0, rows.data(), kTied);
          });
    });
  }
  for (std::thread& t : threads) t.join();
  for (int l = 0; l < kLearners; ++l) EXPECT_EQ(errors[l], "") << "learner " << l << " (LUN " << l + 1 << ")";
  // One update a round of each of the 3 blocks: sgd would not tell a round
  // of the summed parts from two rounds of one part each.
  const std::string status = ReadStatus(target.control_url());
  EXPECT_EQ(JsonValue(status, "updates"), std::to_string(3 * kIterations)) << status;
}

// ---- 2. ssp ------------------------------------------------------------------

struct ScheduleResult {
  int64_t max_lead = std::numeric_limits<int64_t>::min();
  std::string first_violation;  // the first lead above the bound
  std::vector<std::string> errors;
};

// Runs `sleep_ms.size()` learner threads on LUNs 1..N of `target`, for
// `iterations` each: pull the whole model; check how far the learner is
// ahead of the slowest one; "compute" for a random time in
// [sleep_ms[l].first, sleep_ms[l].second] ms (seeded); push its gradient in
// random pieces. The check: pushes_started[k] counts the gradients learner k
// has begun to push, so when learner l's pull at iteration t (t gradients
// pushed) returns, t - min_k pushes_started[k] is at most how far its read
// was ahead of the slowest learner's clock when the server let it pass.
// `stalled` (or -1): a learner that pulls once and then waits until all the
// others are done.
ScheduleResult RunSchedule(const TargetProcess& target, int iterations, uint32_t seed,
                           const std::vector<std::pair<int, int>>& sleep_ms, int64_t bound, int stalled = -1) {
  const int n = static_cast<int>(sleep_ms.size());
  std::vector<std::atomic<int64_t>> pushes_started(n);
  for (auto& p : pushes_started) p.store(0);
  std::atomic<int> done{0};
  std::mutex mu;
  ScheduleResult result;
  auto fail = [&](int l, const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    result.errors.push_back("learner " + std::to_string(l) + ": " + what);
  };
  std::vector<std::thread> threads;
  for (int l = 0; l < n; ++l) {
    threads.emplace_back([&, l] {
      struct Done {
        std::atomic<int>& d;
        ~Done() { ++d; }
      } mark_done{done};
      std::string error;
      auto m = OpenModel(target.url(l + 1), "ssp" + std::to_string(l), &error);
      if (!m) return fail(l, error);
      std::mt19937 rng(seed * 100 + l);
      std::vector<float> w(kParams);
      for (int t = 0;; ++t) {
        if (m->Pull(0, w.data(), kParams) != 0) return fail(l, "pull: " + m->last_error());
        int64_t slowest = std::numeric_limits<int64_t>::max();
        for (auto& p : pushes_started) slowest = std::min<int64_t>(slowest, p.load());
        const int64_t lead = t - slowest;
        {
          std::lock_guard<std::mutex> lock(mu);
          result.max_lead = std::max(result.max_lead, lead);
          if (lead > bound && result.first_violation.empty()) {
            result.first_violation = "learner " + std::to_string(l) + " read at iteration " + std::to_string(t) +
                                     " while the slowest had started only " + std::to_string(slowest) + " pushes";
          }
        }
        if (t == iterations) return;
        if (l == stalled && t == 0) {
          while (done.load() < n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        const int lo = sleep_ms[l].first, hi = sleep_ms[l].second;
        std::this_thread::sleep_for(std::chrono::milliseconds(lo + static_cast<int>(rng() % (hi - lo + 1))));
        pushes_started[l].fetch_add(1);
        if (PushInRandomPieces(*m, IntGradients(l, t), rng) != 0) return fail(l, "push: " + m->last_error());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return result;
}

TEST(ServerSemantics, SspNeverLetsAReaderRunMoreThanSAhead) {
  constexpr int kStaleness = 2, kIterations = 10;
  uint64_t total_holds = 0;
  for (uint32_t seed : {11u, 12u, 13u}) {
    std::mt19937 rng(seed);
    const int learners = 3 + static_cast<int>(seed % 2);
    // A fast learner, a much slower one, the rest drawn from fast, medium
    // and slow; in a seeded random order of LUNs.
    const std::pair<int, int> kinds[] = {{0, 1}, {0, 20}, {10, 20}};
    std::vector<std::pair<int, int>> sleep_ms{kinds[0], kinds[2]};
    while (static_cast<int>(sleep_ms.size()) < learners) sleep_ms.push_back(kinds[rng() % 3]);
    std::shuffle(sleep_ms.begin(), sleep_ms.end(), rng);
    SCOPED_TRACE("schedule " + std::to_string(seed) + " with " + std::to_string(learners) + " learners");

    TargetProcess target(Bsopts("mode=ssp:2;lr=1;dead_after=20"), "--luns " + std::to_string(learners));
    ASSERT_TRUE(target.ok()) << target.start_output();
    const ScheduleResult r = RunSchedule(target, kIterations, seed, sleep_ms, kStaleness);
    for (const std::string& e : r.errors) ADD_FAILURE() << e;
    EXPECT_LE(r.max_lead, kStaleness) << r.first_violation;

    // The server's own account agrees: no read passed more than s ahead of
    // the slowest live learner, and every learner stayed live.
    const std::string status = ReadStatus(target.control_url());
    for (int lun = 1; lun <= learners; ++lun) {
      const std::string learner = LearnerStatus(status, lun);
      EXPECT_LE(std::atoll(JsonValue(learner, "staleness_max").c_str()), kStaleness) << learner;
      EXPECT_EQ(JsonValue(learner, "state"), "\"live\"") << learner;
      total_holds += std::atoll(JsonValue(learner, "holds").c_str());
    }
  }
  // With a fast learner and a slow one, ssp had to hold reads: the bound
  // above was enforced, not merely never approached.
  EXPECT_GT(total_holds, 0u);

  // The same check catches a reader running ahead: in async, with one
  // learner stalled, the others race past it.
  TargetProcess target(Bsopts("mode=async;lr=1;dead_after=20"), "--luns 3");
  ASSERT_TRUE(target.ok()) << target.start_output();
  const ScheduleResult r = RunSchedule(target, kIterations, 99, {{0, 1}, {0, 1}, {0, 1}}, kStaleness, 2);
  for (const std::string& e : r.errors) ADD_FAILURE() << e;
  EXPECT_GT(r.max_lead, kStaleness) << "async with a stalled learner never showed a reader more than s ahead: "
                                       "the ssp check above could not fail";
}

// ---- 3. async ----------------------------------------------------------------

TEST(ServerSemantics, AsyncMakesProgressWhileALearnerIsStalled) {
  constexpr int kIterations = 30;
  TargetProcess target(Bsopts("mode=async;lr=1;dead_after=20"), "--luns 2");
  ASSERT_TRUE(target.ok()) << target.start_output();
  std::string error;
  auto b = OpenModel(target.url(2), "b", &error);
  ASSERT_TRUE(b) << error;
  std::vector<float> w(kParams), expected(kParams, 0.0f);
  ASSERT_EQ(b->Pull(0, w.data(), kParams), 0) << b->last_error();
  // B now stalls: its session stays open, it does no I/O.

  auto a = OpenModel(target.url(1), "a", &error, 1024);
  ASSERT_TRUE(a) << error;
  std::mt19937 rng(3);
  for (int t = 0; t < kIterations; ++t) {
    ASSERT_EQ(a->Pull(0, w.data(), kParams), 0) << a->last_error();
    ASSERT_EQ(FirstBitDifference(w, expected), -1) << "iteration " << t;
    const std::vector<float> g = IntGradients(0, t);
    ASSERT_EQ(PushInRandomPieces(*a, g, rng), 0) << a->last_error();
    // B only read: A is the one learner taking part, and its fresh pushes
    // are applied whole, not as half of a round of the 2 LUNs (doc/async.md
    // "One N: the learners that push").
    for (uint64_t i = 0; i < kParams; ++i) expected[i] -= g[i];
  }
  ASSERT_EQ(a->Pull(0, w.data(), kParams), 0) << a->last_error();
  EXPECT_EQ(FirstBitDifference(w, expected), -1) << "A's gradients are not all applied";

  const std::string status = ReadStatus(target.control_url());
  EXPECT_EQ(JsonValue(LearnerStatus(status, 1), "holds"), "0") << status;
  EXPECT_EQ(JsonValue(LearnerStatus(status, 1), "iteration"), std::to_string(kIterations)) << status;
  // B was live all along: A went on without waiting for it, not because it
  // was declared dead.
  EXPECT_EQ(JsonValue(LearnerStatus(status, 2), "state"), "\"live\"") << status;
  EXPECT_EQ(JsonValue(LearnerStatus(status, 2), "iteration"), "0") << status;
}

// ---- 4, 5. liveness ------------------------------------------------------------

TEST(ServerSemantics, KilledLearnerIsDeclaredDeadAndBspGoesOn) {
  constexpr int kIterations = 5;
  TargetProcess target(Bsopts("mode=bsp;lr=1;dead_after=3"), "--luns 2");
  ASSERT_TRUE(target.ok()) << target.start_output();
  const std::vector<float> gb = IntGradients(1, 0);
  ChildLearner b(target.url(2), gb);

  std::string error;
  auto a = OpenModel(target.url(1), "a", &error);
  ASSERT_TRUE(a) << error;
  std::vector<float> w(kParams), before(kParams);
  auto pull = [&] { return a->Pull(0, w.data(), kParams) == 0 ? std::string() : a->last_error(); };
  ASSERT_EQ(pull(), "");
  ASSERT_EQ(b.WaitFor('R', pull), "");
  b.Go();
  ASSERT_EQ(b.WaitFor('P', pull), "");
  // B's gradient waits for A's: round 0 is not complete.
  ASSERT_EQ(FirstBitDifference(w, std::vector<float>(kParams, 0.0f)), -1);

  std::mt19937 rng(4);
  std::vector<float> ga = IntGradients(0, 0);
  ASSERT_EQ(PushInRandomPieces(*a, ga, rng), 0) << a->last_error();
  ASSERT_EQ(pull(), "");
  for (uint64_t i = 0; i < kParams; ++i) ASSERT_EQ(w[i], -(ga[i] + gb[i]) / 2.0f) << "parameter " << i;

  b.Kill();
  for (int t = 1; t <= kIterations; ++t) {
    before = w;
    ga = IntGradients(0, t);
    ASSERT_EQ(PushInRandomPieces(*a, ga, rng), 0) << a->last_error();
    // The first of these pulls is held until B is declared dead; then every
    // round is A's alone.
    ASSERT_EQ(pull(), "") << "iteration " << t;
    for (uint64_t i = 0; i < kParams; ++i)
      ASSERT_EQ(w[i], before[i] - ga[i]) << "iteration " << t << " parameter " << i;
  }

  const std::string status = ReadStatus(target.control_url());
  EXPECT_EQ(JsonValue(LearnerStatus(status, 2), "state"), "\"dead\"") << status;
  EXPECT_EQ(JsonValue(LearnerStatus(status, 2), "deaths"), "1") << status;
  EXPECT_EQ(JsonValue(LearnerStatus(status, 1), "state"), "\"live\"") << status;
  EXPECT_EQ(JsonValue(LearnerStatus(status, 1), "iteration"), std::to_string(kIterations + 1)) << status;
  EXPECT_GE(std::atoll(JsonValue(LearnerStatus(status, 1), "holds").c_str()), 1) << status;
  EXPECT_EQ(JsonValue(status, "live_learners"), "1") << status;
  EXPECT_TRUE(Contains(target.Log(), "learner at lun 2 is dead")) << target.Log();
}

TEST(ServerSemantics, ReachingMaxDeadFailsTheJobClearly) {
  TargetProcess target(Bsopts("mode=bsp;lr=1;dead_after=3;max_dead=1"), "--luns 2");
  ASSERT_TRUE(target.ok()) << target.start_output();
  ChildLearner b(target.url(2), IntGradients(1, 0));
  std::string error;
  auto a = OpenModel(target.url(1), "a", &error);
  ASSERT_TRUE(a) << error;
  std::vector<float> w(kParams);
  auto pull = [&] { return a->Pull(0, w.data(), kParams) == 0 ? std::string() : a->last_error(); };
  ASSERT_EQ(pull(), "");
  ASSERT_EQ(b.WaitFor('R', pull), "");
  b.Go();
  ASSERT_EQ(b.WaitFor('P', pull), "");
  b.Kill();

  // A goes on until the job fails under it: its pull, held for B's
  // gradient, is failed when B is declared dead.
  std::mt19937 rng(5);
  std::string failure;
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  for (int t = 0; failure.empty() && Clock::now() < deadline; ++t) {
    if (PushInRandomPieces(*a, IntGradients(0, t), rng) != 0 || a->Pull(0, w.data(), kParams) != 0) {
      failure = a->last_error();
    }
  }
  ASSERT_FALSE(failure.empty()) << "learner I/O never failed after the death of 1 of 2 learners with max_dead=1";
  EXPECT_TRUE(Contains(failure, "0x0403")) << failure;

  RawLun raw(target.url(1), InitiatorName("raw"));
  ASSERT_TRUE(raw.connected()) << raw.error();
  EXPECT_EQ(raw.Read(0, 8), kJobFailedSense);
  EXPECT_EQ(raw.Write(0, FloatBytes(std::vector<float>(kLbaParams, 1.0f))), kJobFailedSense);
  std::string status = ReadStatus(target.control_url());
  EXPECT_EQ(JsonValue(status, "failed"), "true") << status;
  EXPECT_TRUE(Contains(JsonValue(status, "failure"), "max_dead=1")) << status;
  EXPECT_TRUE(Contains(target.Log(), "max_dead=1")) << target.Log();

  RawLun control(target.control_url(), InitiatorName("raw"));
  ASSERT_TRUE(control.connected()) << control.error();
  ASSERT_EQ(control.Write(kControlOffset / kLbaBytes, ControlText("resume=1\n")), "GOOD");
  EXPECT_EQ(raw.Read(0, 8), "GOOD");
  EXPECT_EQ(a->Pull(0, w.data(), kParams), 0) << a->last_error();
  // And the job stays resumed: B is still dead, but nobody else died since
  // the operator resumed it. Watch for a while (several ticks of the job's
  // 50 ms ticker, and longer than dead_after) while A keeps doing I/O.
  const auto watch_until = Clock::now() + std::chrono::milliseconds(3500);
  std::string later;
  while (later.empty() && Clock::now() < watch_until) {
    const std::string r = raw.Read(0, 8);
    if (r != "GOOD") later = r;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(later, "") << "learner I/O failed again after resume=1 with no new death; tgtd's log:\n" << target.Log();
  status = ReadStatus(target.control_url());
  EXPECT_EQ(JsonValue(status, "failed"), "false") << status;
}

// ---- 6. hold limit -------------------------------------------------------------

TEST(ServerSemantics, HeldReadFailsAtTheHoldLimitWithAClearSense) {
  TargetProcess target(Bsopts("mode=bsp;lr=1;hold_limit=1;dead_after=20"), "--luns 2");
  ASSERT_TRUE(target.ok()) << target.start_output();
  RawLun a(target.url(1), InitiatorName("raw"));
  ASSERT_TRUE(a.connected()) << a.error();
  const std::vector<uint8_t> ones = FloatBytes(std::vector<float>(kLbas * kLbaParams, 1.0f));
  ASSERT_EQ(a.Write(0, ones), "GOOD");
  // A's next read waits for B's gradient, which never comes while B stays
  // live (dead_after=20): it fails at hold_limit.
  EXPECT_EQ(a.Read(0, 8), kHoldTimeoutSense);
  const std::string log = target.Log();
  EXPECT_TRUE(Contains(log, "(hold_limit)")) << log;
  EXPECT_TRUE(Contains(log, "lun 2 at 0")) << log;
  const std::string status = ReadStatus(target.control_url());
  EXPECT_EQ(JsonValue(LearnerStatus(status, 1), "hold_timeouts"), "1") << status;
  EXPECT_EQ(JsonValue(LearnerStatus(status, 2), "state"), "\"live\"") << status;

  // Once B gives its gradient, the round completes and A reads its mean.
  RawLun b(target.url(2), InitiatorName("raw"));
  ASSERT_TRUE(b.connected()) << b.error();
  ASSERT_EQ(b.Write(0, ones), "GOOD");
  std::vector<uint8_t> bytes;
  ASSERT_EQ(a.Read(0, kLbas, &bytes), "GOOD");
  std::vector<float> w(kParams);
  std::memcpy(w.data(), bytes.data(), kParams * sizeof(float));
  EXPECT_EQ(FirstBitDifference(w, std::vector<float>(kParams, -1.0f)), -1);
}

// ---- 7, 8. checkpoints -----------------------------------------------------------

// D6: a sense reaches the learner as key, ASC/ASCQ and meaning, never as
// "(null)": here a checkpoint the server cannot write (its folder is gone).
TEST(ServerSemantics, AFailedCheckpointReachesTheLearnerNamedAndExplained) {
  TempDir scratch;
  const std::string folder = scratch.path + "/gone";
  ASSERT_EQ(mkdir(folder.c_str(), 0700), 0);
  TargetProcess target(Bsopts("lr=1;checkpoint=" + folder + "/model.ckpt"));
  ASSERT_TRUE(target.ok()) << target.start_output();
  ASSERT_EQ(rmdir(folder.c_str()), 0);
  std::string error;
  auto a = OpenModel(target.url(), "a", &error);
  ASSERT_TRUE(a) << error;
  const std::vector<float> g(kParams, 1.0f);
  ASSERT_EQ(a->Push(0, g.data(), kParams), 0) << a->last_error();
  EXPECT_NE(a->Sync(), 0);
  EXPECT_TRUE(Contains(a->last_error(),
                       "target returned MEDIUM ERROR / WRITE ERROR (asc/ascq 0x0c00): the server could not write its "
                       "checkpoint (its log and status say why)"))
      << a->last_error();
  EXPECT_FALSE(Contains(a->last_error(), "(null)")) << a->last_error();
}

TEST(ServerSemantics, FsyncCheckpointSurvivesKill9OfTgtd) {
  TempDir scratch;
  const std::string path = scratch.path + "/model.ckpt";
  TargetProcess target(Bsopts("rule=adam;lr=0.01;checkpoint=" + path), "--luns 2");
  ASSERT_TRUE(target.ok()) << target.start_output();
  std::string error;
  auto a = OpenModel(target.url(1), "a", &error);
  ASSERT_TRUE(a) << error;
  auto b = OpenModel(target.url(2), "b", &error);
  ASSERT_TRUE(b) << error;
  // A learning rate set through the control LUN is part of what is saved.
  {
    RawLun control(target.control_url(), InitiatorName("raw"));
    ASSERT_TRUE(control.connected()) << control.error();
    ASSERT_EQ(control.Write(kControlOffset / kLbaBytes, ControlText("lr=0.005\n")), "GOOD");
  }
  std::mt19937 rng(7);
  auto random_gradient = [&] {
    std::vector<float> g(kParams);
    for (float& x : g) x = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 128.0f;
    return g;
  };
  for (int round = 0; round < 3; ++round) {
    ASSERT_EQ(a->Push(0, random_gradient().data(), kParams), 0) << a->last_error();
    ASSERT_EQ(b->Push(0, random_gradient().data(), kParams), 0) << b->last_error();
  }
  ASSERT_EQ(a->Sync(), 0) << a->last_error();
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0) << path << " does not exist after fsync";
  const std::string saved = Slurp(path);
  std::vector<float> synced(kParams), later(kParams), w(kParams);
  ASSERT_EQ(a->Pull(0, synced.data(), kParams), 0) << a->last_error();

  // One more gradient, never checkpointed.
  const std::vector<float> extra = random_gradient();
  ASSERT_EQ(b->Push(0, extra.data(), kParams), 0) << b->last_error();
  ASSERT_EQ(a->Pull(0, later.data(), kParams), 0) << a->last_error();
  ASSERT_NE(FirstBitDifference(later, synced), -1) << "the extra gradient changed nothing";
  b.reset();

  ASSERT_TRUE(target.KillTgtd(&error)) << error;
  EXPECT_EQ(Slurp(path), saved) << "the checkpoint file changed without an fsync";
  ASSERT_TRUE(target.Restart()) << target.start_output();
  EXPECT_TRUE(Contains(target.Log(), "loaded checkpoint " + path)) << target.Log();
  const std::string status = ReadStatus(target.control_url());
  EXPECT_EQ(JsonValue(status, "lr"), "0.005") << status;

  // A's session, open across the crash, reconnects to the restarted target
  // on the same port and reads the checkpointed weights.
  ASSERT_EQ(a->Pull(0, w.data(), kParams), 0) << a->last_error();
  EXPECT_EQ(FirstBitDifference(w, synced), -1) << "the weights after the restart are not the fsynced ones";
  // Weights, adam's state, its parameters and the clocks came back bit for
  // bit: checkpointing again writes the same file, as the next generation.
  ASSERT_EQ(a->Sync(), 0) << a->last_error();
  EXPECT_TRUE(blkps_test::SameStateAsTheNextGeneration(saved, Slurp(path), 1))
      << "the state restored from the checkpoint differs from the state saved";
  // And the restored optimizer state takes the same step as before the crash.
  b = OpenModel(target.url(2), "b2", &error);
  ASSERT_TRUE(b) << error;
  ASSERT_EQ(b->Push(0, extra.data(), kParams), 0) << b->last_error();
  ASSERT_EQ(a->Pull(0, w.data(), kParams), 0) << a->last_error();
  EXPECT_EQ(FirstBitDifference(w, later), -1) << "the same gradient after the restart gave other weights";
}

TEST(ServerSemantics, CorruptCheckpointIsRefusedAtLunCreation) {
  TempDir scratch;
  const std::string path = scratch.path + "/model.ckpt";
  const std::string opts = Bsopts("rule=momentum;lr=0.1;checkpoint=" + path);
  {
    TargetProcess target(opts);
    ASSERT_TRUE(target.ok()) << target.start_output();
    std::string error;
    auto a = OpenModel(target.url(), "a", &error);
    ASSERT_TRUE(a) << error;
    ASSERT_EQ(a->Push(0, IntGradients(0, 0).data(), kParams), 0) << a->last_error();
    ASSERT_EQ(a->Sync(), 0) << a->last_error();
  }
  const std::string good = Slurp(path);
  ASSERT_FALSE(good.empty());
  std::string bad = good;
  bad[bad.size() / 2] ^= 0x10;
  WriteFile(path, bad);
  {
    TargetProcess target(opts);
    EXPECT_FALSE(target.ok()) << "a target started on a corrupt checkpoint";
    const std::string said = target.start_output() + target.Log();
    EXPECT_TRUE(Contains(target.start_output(), path)) << target.start_output();
    EXPECT_TRUE(Contains(said, "checksum")) << said;
    EXPECT_FALSE(target.TgtdAlive());
  }
  EXPECT_TRUE(Slurp(path) == bad) << "the refused checkpoint file was changed";

  // A checkpoint of another geometry is refused, naming the mismatch.
  WriteFile(path, good);
  {
    TargetProcess target("params=4000;block=4K;rule=momentum;lr=0.1;checkpoint=" + path);
    EXPECT_FALSE(target.ok()) << "a target of 4000 parameters loaded a checkpoint of 3000";
    const std::string said = target.start_output();
    EXPECT_TRUE(Contains(said, "params=3000")) << said;
    EXPECT_TRUE(Contains(said, "params=4000")) << said;
    EXPECT_TRUE(Contains(said, path)) << said;
  }
  EXPECT_TRUE(Slurp(path) == good) << "the refused checkpoint file was changed";

  // The intact file is accepted: the refusals above were about the file.
  TargetProcess target(opts);
  ASSERT_TRUE(target.ok()) << target.start_output();
  EXPECT_TRUE(Contains(target.Log(), "loaded checkpoint " + path)) << target.Log();
}

// ---- 9. the control LUN ----------------------------------------------------------

TEST(ServerSemantics, ControlLunSetsTheLearningRateAndWeightsByPlainFileIo) {
  TargetProcess target(Bsopts("lr=1"));
  ASSERT_TRUE(target.ok()) << target.start_output();
  RawLun control(target.control_url(), InitiatorName("raw"));
  ASSERT_TRUE(control.connected()) << control.error();
  std::string error;
  auto a = OpenModel(target.url(), "a", &error);
  ASSERT_TRUE(a) << error;
  std::vector<float> w(kParams);

  // The learning rate.
  ASSERT_EQ(control.Write(kControlOffset / kLbaBytes, ControlText("lr=0.5\n")), "GOOD");
  std::string status = ReadStatus(target.control_url());
  EXPECT_EQ(JsonValue(status, "lr"), "0.5") << status;
  ASSERT_EQ(a->Push(0, std::vector<float>(kParams, 1.0f).data(), kParams), 0) << a->last_error();
  ASSERT_EQ(a->Pull(0, w.data(), kParams), 0) << a->last_error();
  EXPECT_EQ(FirstBitDifference(w, std::vector<float>(kParams, -0.5f)), -1) << "lr=0.5 did not take effect";

  // The weights: all of them, then a range at byte 1 MiB + 4*i.
  std::vector<float> weights(kLbas * kLbaParams, 0.0f);
  for (uint64_t i = 0; i < kParams; ++i) weights[i] = static_cast<float>(i) * 0.25f - 100.0f;
  ASSERT_EQ(control.Write(kWeightsOffset / kLbaBytes, FloatBytes(weights)), "GOOD");
  std::vector<float> range(2 * kLbaParams);  // parameters [256, 512)
  for (size_t k = 0; k < range.size(); ++k) range[k] = 7.0f + static_cast<float>(k);
  ASSERT_EQ(control.Write((kWeightsOffset + 4 * 256) / kLbaBytes, FloatBytes(range)), "GOOD");
  std::copy(range.begin(), range.end(), weights.begin() + 256);
  weights.resize(kParams);
  ASSERT_EQ(a->Pull(0, w.data(), kParams), 0) << a->last_error();
  EXPECT_EQ(FirstBitDifference(w, weights), -1) << "the learner LUN does not see the weights set";
  std::vector<uint8_t> bytes;
  ASSERT_EQ(control.Read(kWeightsOffset / kLbaBytes, kLbas, &bytes), "GOOD");
  std::memcpy(w.data(), bytes.data(), kParams * sizeof(float));
  EXPECT_EQ(FirstBitDifference(w, weights), -1) << "the control LUN's weights window reads other weights";

  // The status region is read-only.
  EXPECT_EQ(control.Write(0, ControlText("lr=9\n")), kWriteProtectSense);
  EXPECT_EQ(control.Write(kControlOffset / kLbaBytes - 1, ControlText(std::string(kLbaBytes, ' ') + "lr=9\n")),
            kWriteProtectSense);
  // Unknown or malformed control lines are refused.
  EXPECT_EQ(control.Write(kControlOffset / kLbaBytes, ControlText("bogus=1\n")), kBadDataSense);
  EXPECT_EQ(control.Write(kControlOffset / kLbaBytes, ControlText("hello\n")), kBadDataSense);
  EXPECT_EQ(control.Write(kControlOffset / kLbaBytes, ControlText("lr=fast\n")), kBadDataSense);
  status = ReadStatus(target.control_url());
  EXPECT_EQ(JsonValue(status, "lr"), "0.5") << status;
  const std::string log = target.Log();
  EXPECT_TRUE(Contains(log, "read-only")) << log;
  EXPECT_TRUE(Contains(log, "bogus")) << log;
}

// D3: operators are proven by a credential, not by a name. With --operator
// the learners' control LUN takes reads, fence=, tag= and rank= from anyone the
// target admits, whatever initiator name it gives (the operator's too); rule
// parameters, resume= and weights go through the operator target, which
// admits only the CHAP account whose secret is in DIR/operator.chap.
// A write of a session that its learner's fence ended (fence=<lun>:<token>,
// the token the session logged in with as its alias: blkps/control_lun.h)
// is refused, also when tgtd reads it only after the fence: the learner
// resends by the receipt it reads after the fence, and a late write must
// not be applied behind it. Other sessions of the name, and the same token
// under another name, go on.
TEST(ServerSemantics, AWriteOfASessionItsLearnersFenceEndedIsRefused) {
  TargetProcess target(Bsopts("rule=sum"));
  ASSERT_TRUE(target.ok()) << target.start_output();
  const std::string name = InitiatorName("fenced");
  const std::string ended_token = "00000000000000a1";
  RawLun ended(target.url(), name, BLKPS_SESSION_ALIAS_PREFIX + ended_token);
  RawLun next(target.url(), name, BLKPS_SESSION_ALIAS_PREFIX "00000000000000a2");
  RawLun control(target.control_url(), name);
  RawLun stranger(target.url(), InitiatorName("stranger"), BLKPS_SESSION_ALIAS_PREFIX + ended_token);
  const std::vector<uint8_t> ones = FloatBytes(std::vector<float>(kLbaParams, 1.0f));
  ASSERT_EQ(ended.Write(0, ones), "GOOD");
  EXPECT_EQ(control.Write(kControlOffset / kLbaBytes, ControlText("fence=1:a1\n")), kBadDataSense);
  ASSERT_EQ(control.Write(kControlOffset / kLbaBytes, ControlText("fence=1:" + ended_token + "\n")), "GOOD");
  EXPECT_EQ(ended.Write(0, ones), kHoldTimeoutSense);
  EXPECT_EQ(next.Write(0, ones), "GOOD");
  EXPECT_EQ(stranger.Write(0, ones), "GOOD");
  std::vector<uint8_t> weights;
  ASSERT_EQ(next.Read(0, 1, &weights), "GOOD");
  float first = 0;
  std::memcpy(&first, weights.data(), sizeof first);
  EXPECT_EQ(first, 3.0f) << "the ended session's late write was applied, or another's was not";
}

TEST(ServerSemantics, OperatorsAreProvenByTheirCredentialNotByTheirName) {
  TargetProcess target(Bsopts("lr=1"), "--operator");
  ASSERT_TRUE(target.ok()) << target.start_output();
  ASSERT_NE(target.operator_url(), "") << target.start_output();
  std::string error;
  auto a = OpenModel(target.url(), "a", &error);
  ASSERT_TRUE(a) << error;
  const std::string operator_name = InitiatorName("operator");
  for (const std::string& name : {InitiatorName("learner"), operator_name}) {
    RawLun learner(target.control_url(), name);
    ASSERT_TRUE(learner.connected()) << learner.error();
    EXPECT_EQ(learner.Write(kControlOffset / kLbaBytes, ControlText("lr=0.5\n")), kWriteProtectSense);
    EXPECT_EQ(learner.Write(kControlOffset / kLbaBytes, ControlText("resume=1\n")), kWriteProtectSense);
    // One forbidden line refuses the whole write: the fence before it is not done either.
    EXPECT_EQ(learner.Write(kControlOffset / kLbaBytes, ControlText("fence=1\nlr=0.5\n")), kWriteProtectSense);
    EXPECT_EQ(learner.Write(kWeightsOffset / kLbaBytes, std::vector<uint8_t>(kLbaBytes, 0)), kWriteProtectSense);
    // What learners send themselves, and reads, stay open.
    EXPECT_EQ(learner.Write(kControlOffset / kLbaBytes, ControlText("fence=1\n")), "GOOD");
    EXPECT_EQ(learner.Write(kControlOffset / kLbaBytes, ControlText("tag=learners-may\n")), "GOOD");
    EXPECT_EQ(learner.Read(0, 1), "GOOD");
    EXPECT_EQ(learner.Read(kWeightsOffset / kLbaBytes, 1), "GOOD");
  }
  std::string status = ReadStatus(target.control_url());
  EXPECT_EQ(JsonValue(status, "lr"), "1") << status;
  std::vector<float> w(kParams);
  ASSERT_EQ(a->Pull(0, w.data(), kParams), 0) << a->last_error();
  EXPECT_EQ(FirstBitDifference(w, std::vector<float>(kParams, 0.0f)), -1) << "a learner changed the weights";

  // Without the secret the operator target admits no one, whatever the name.
  RawLun nameless(target.operator_url(), operator_name);
  EXPECT_FALSE(nameless.connected());
  EXPECT_EQ(OpenModel(target.operator_url(), "operator", &error), nullptr);
  EXPECT_NE(error.find("Authentication failure"), std::string::npos) << error;

  // With it, the operator may do it all.
  setenv("BLKPS_CHAP_FILE", target.operator_chap_file().c_str(), 1);
  auto op = OpenModel(target.operator_url(), "operator", &error);
  unsetenv("BLKPS_CHAP_FILE");
  ASSERT_TRUE(op) << error;
  const std::vector<uint8_t> set = ControlText("lr=0.5\n");
  EXPECT_EQ(op->WriteBytes(kControlOffset, set.data(), set.size()), 0) << op->last_error();
  const std::vector<uint8_t> threes = FloatBytes(std::vector<float>(kLbaParams, 3.0f));
  EXPECT_EQ(op->WriteBytes(kWeightsOffset, threes.data(), threes.size()), 0) << op->last_error();
  status = ReadStatus(target.control_url());
  EXPECT_EQ(JsonValue(status, "lr"), "0.5") << status;
  EXPECT_EQ(JsonValue(status, "tag"), "\"learners-may\"") << status;
  ASSERT_EQ(a->Pull(0, w.data(), kLbaParams), 0) << a->last_error();
  EXPECT_EQ(w[0], 3.0f);
}

TEST(ServerSemantics, ControlLunCountersMatchTheStatusAndAreReadOnly) {
  TargetProcess target(Bsopts("lr=1"));
  ASSERT_TRUE(target.ok()) << target.start_output();
  std::string error;
  auto a = OpenModel(target.url(), "a", &error);
  ASSERT_TRUE(a) << error;
  auto control = OpenModel(target.control_url(), "counters", &error);
  ASSERT_TRUE(control) << error;
  const std::vector<float> g(kParams, 1.0f);
  for (int push = 0; push < 2; ++push) ASSERT_EQ(a->Push(0, g.data(), kParams), 0) << a->last_error();

  blkps_control_counters c;
  ASSERT_EQ(control->ReadControlCounters(&c), 0) << control->last_error();
  EXPECT_EQ(c.format_version, BLKPS_CONTROL_FORMAT_VERSION);
  EXPECT_EQ(c.params, kParams);
  EXPECT_EQ(c.blocks, 3u);
  EXPECT_EQ(c.global_step, 2u);
  EXPECT_EQ(c.updates, 6u);  // two complete gradients on each of 3 blocks
  EXPECT_EQ(c.failed, 0u);
  const std::string status = ReadStatus(target.control_url());
  EXPECT_EQ(JsonValue(status, "updates"), "6") << status;
  EXPECT_EQ(JsonValue(status, "global_step"), "2") << status;

  RawLun raw(target.control_url(), InitiatorName("raw"));
  ASSERT_TRUE(raw.connected()) << raw.error();
  EXPECT_EQ(raw.Write(BLKPS_CONTROL_COUNTERS_OFFSET / kLbaBytes, ControlText("lr=9\n")), kWriteProtectSense);
  // A learner LUN holds no counters: reading them says so.
  EXPECT_EQ(a->ReadControlCounters(&c), -EPROTO);
  EXPECT_TRUE(Contains(a->last_error(), "is this the model's control LUN")) << a->last_error();
}

}  // namespace
}  // namespace blkps_test
