// Fault tests against a real tgtd: learners push through connections that a
// CuttingProxy cuts at random (seeded) points of their byte stream, and every
// parameter must end at its exact integer sum — no gradient applied twice, none
// lost — with bsp clocks exact and no learner stuck.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "blkps/control_lun.h"
#include "blkps/engine.hpp"
#include "blkps/model.hpp"
#include "cutting_proxy.h"
#include "target_process.h"

namespace {

using blkps_test::CuttingProxy;
using blkps_test::TargetProcess;
using blkps_test::TempDir;

constexpr uint64_t kParams = 1 << 20;  // 4 MiB of float32
constexpr uint64_t kModelBytes = kParams * sizeof(float);
// Small requests put many commands in flight at each cut.
constexpr uint32_t kRequestBytes = 256 << 10;

// `url` with its portal's port replaced by `port`.
std::string ViaPort(const std::string& url, int port) {
  const size_t host = url.find("://") + 3;
  const size_t colon = url.find(':', host), slash = url.find('/', host);
  return url.substr(0, colon < slash ? colon : slash) + ":" + std::to_string(port) + url.substr(slash);
}

std::unique_ptr<blkps::Model> Open(const std::string& url, const std::string& who, std::string* error) {
  blkps::OpenOptions o;
  o.request_bytes = kRequestBytes;
  o.queue_depth = 16;
  o.initiator_name = "iqn.2026-11.io.blkps:fault-test-" + who + "-" + std::to_string(getpid());
  return blkps::Model::Open(url, o, error);
}

// Every weight of the model behind `url`.
std::vector<float> Weights(const std::string& url) {
  std::string error;
  auto m = Open(url, "reader", &error);
  std::vector<float> w(kParams, -1.0f);
  if (!m) {
    ADD_FAILURE() << error;
  } else if (m->Pull(0, w.data(), kParams) != 0) {
    ADD_FAILURE() << m->last_error();
  }
  return w;
}

// How many weights differ from `want`, and a description of the first.
std::string CountWrong(const std::vector<float>& w, float want) {
  uint64_t wrong = 0, first = 0;
  for (uint64_t i = 0; i < w.size(); ++i) {
    if (w[i] != want && wrong++ == 0) first = i;
  }
  if (wrong == 0) return "";
  return std::to_string(wrong) + " of " + std::to_string(w.size()) + " parameters are not " + std::to_string(want) +
         " (parameter " + std::to_string(first) + " is " + std::to_string(w[first]) + ")";
}

// `cuts` positions spread at random over the first `bytes` of a stream.
std::vector<uint64_t> RandomCuts(uint32_t seed, int cuts, uint64_t bytes) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<uint64_t> at(1, bytes);
  std::vector<uint64_t> positions;
  for (int k = 0; k < cuts; ++k) positions.push_back(at(rng));
  return positions;
}

// The status object's learner at LUN `lun`, through the control LUN.
std::string LearnerStatus(const std::string& control_url, int lun) {
  std::string error;
  auto m = Open(control_url, "status", &error);
  if (!m) return "cannot open the control LUN: " + error;
  std::vector<char> buf(BLKPS_CONTROL_STATUS_BYTES + 1, '\0');
  if (m->ReadBytes(0, buf.data(), BLKPS_CONTROL_STATUS_BYTES) != 0) return m->last_error();
  const std::string json(buf.data());
  const size_t at = json.find("{\"lun\": " + std::to_string(lun) + ",");
  return at == std::string::npos ? json : json.substr(at, json.find('}', at) - at + 1);
}

std::string Field(const std::string& object, const std::string& key) {
  const std::string k = "\"" + key + "\": ";
  const size_t at = object.find(k);
  if (at == std::string::npos) return "";
  return object.substr(at + k.size(), object.find_first_of(",}", at + k.size()) - at - k.size());
}

// bsopts of a rule=sum model of `params` checkpointed to `checkpoint`
// every `every` seconds.
std::string SumCheckpointed(uint64_t params, const std::string& checkpoint, const std::string& every) {
  return "params=" + std::to_string(params) + ";rule=sum;checkpoint=" + checkpoint + ";checkpoint_every=" + every;
}

// Kills tgtd with SIGKILL (kill number `k`) and starts it again with the
// same options; a torn or corrupt checkpoint fails the start (its CRC is
// checked). Counts the restart in *restarts, and in *loads if `checkpoint`
// existed at the kill: then tgtd must have logged loading it.
void KillAndRestart(TargetProcess& target, const std::string& checkpoint, int k, int* restarts, int* loads) {
  std::string why;
  ASSERT_TRUE(target.KillTgtd(&why)) << "kill " << k << ": " << why;
  const bool checkpointed = access(checkpoint.c_str(), F_OK) == 0;
  ASSERT_TRUE(target.Restart()) << "restart " << k << ": " << target.start_output();
  ++*restarts;
  if (checkpointed) {
    EXPECT_NE(target.Log().find("loaded checkpoint"), std::string::npos) << "restart " << k << ": " << target.Log();
    ++*loads;
  }
}

// One learner pushes +1 200 times through 16 cuts; `extra` goes to `blkps
// target start`.
void ExpectExactAsyncSumAfterCuts(const std::string& extra) {
  TargetProcess target("params=" + std::to_string(kParams) + ";rule=sum", extra);
  ASSERT_TRUE(target.ok()) << target.start_output();
  CuttingProxy proxy(target.port());
  ASSERT_TRUE(proxy.ok()) << proxy.error();
  const std::vector<float> before = Weights(target.url());
  ASSERT_EQ(CountWrong(before, 0.0f), "");

  constexpr int kPushes = 200, kCuts = 16;
  proxy.CutAt(RandomCuts(15, kCuts, kPushes * kModelBytes));
  std::string error;
  auto m = Open(ViaPort(target.url(), proxy.port()), "learner", &error);
  ASSERT_NE(m, nullptr) << error;
  const std::vector<float> ones(kParams, 1.0f);
  for (int t = 0; t < kPushes; ++t)
    ASSERT_EQ(m->Push(0, ones.data(), kParams), 0) << "push " << t << ": " << m->last_error();
  m.reset();
  EXPECT_EQ(proxy.cuts(), kCuts);
  EXPECT_EQ(CountWrong(Weights(target.url()), kPushes), "");
  EXPECT_EQ(Field(LearnerStatus(target.control_url(), 1), "iteration"), std::to_string(kPushes));
}

TEST(CutConnections, AsyncSumIsExactAfterManyCuts) { ExpectExactAsyncSumAfterCuts(""); }

// A table's push_rows through the row windows (control_lun.h "Row
// windows"): a batch in flight at a cut is sent again after the reconnect,
// as it was, and the server's receipt per batch (sequence and tag) applies
// it once: 60 pushes of -1 to every row through 12 cuts leave every row at
// exactly 60 (sgd, lr 1, zeros to start).
TEST(CutConnections, RowPushesThroughWindowsAreExactAfterManyCuts) {
  constexpr uint64_t kRows = 2048, kWidth = 32;
  TargetProcess target("table=" + std::to_string(kRows) + ":" + std::to_string(kWidth) + ";rule=sgd;lr=1;init=zeros");
  ASSERT_TRUE(target.ok()) << target.start_output();
  CuttingProxy proxy(target.port());
  ASSERT_TRUE(proxy.ok()) << proxy.error();
  constexpr int kPushes = 60, kCuts = 12;
  const uint64_t batch_bytes = kRows * kWidth * sizeof(float);  // its rows: less than its stream
  proxy.CutAt(RandomCuts(38, kCuts, kPushes * batch_bytes));
  std::string error;
  auto m = Open(ViaPort(target.url(), proxy.port()), "rows", &error);
  ASSERT_NE(m, nullptr) << error;
  std::vector<uint64_t> ids(kRows);
  for (uint64_t k = 0; k < kRows; ++k) ids[k] = (k * 997) % kRows;  // every row, scattered
  const std::vector<float> minus_one(kRows * kWidth, -1.0f);
  for (int t = 0; t < kPushes; ++t) {
    ASSERT_EQ(m->PushRows(ids.data(), kRows, kWidth, minus_one.data()), 0) << "push " << t << ": " << m->last_error();
  }
  EXPECT_GT(m->reconnects(), 0u);
  m.reset();
  // Two positions inside one forwarded chunk (a window's write is one) cut once.
  EXPECT_GT(proxy.cuts(), kCuts / 2);
  auto reader = Open(target.url(), "rows-reader", &error);
  ASSERT_NE(reader, nullptr) << error;
  std::vector<float> rows(kRows * kWidth);
  ASSERT_EQ(reader->Pull(0, rows.data(), rows.size()), 0) << reader->last_error();
  EXPECT_EQ(CountWrong(rows, kPushes), "");
}

// Exchanges through cuts (doc/libblkps.md "Exchange"): a write in flight at a
// cut is resent only if the receipt lacks it, and its read, held back until
// the write is done, starts after the reconnect either way; reads in flight
// are resent. Every exchange returns exactly the model with its own push,
// 100 times through 16 cuts.
TEST(CutConnections, ExchangeReturnsExactWeightsAfterManyCuts) {
  TargetProcess target("params=" + std::to_string(kParams) + ";rule=sum");
  ASSERT_TRUE(target.ok()) << target.start_output();
  CuttingProxy proxy(target.port());
  ASSERT_TRUE(proxy.ok()) << proxy.error();
  constexpr int kExchanges = 100, kCuts = 16;
  proxy.CutAt(RandomCuts(16, kCuts, kExchanges * kModelBytes));  // learner-to-target bytes
  std::string error;
  auto m = Open(ViaPort(target.url(), proxy.port()), "learner", &error);
  ASSERT_NE(m, nullptr) << error;
  const std::vector<float> ones(kParams, 1.0f);
  std::vector<float> w(kParams);
  for (int t = 1; t <= kExchanges; ++t) {
    ASSERT_EQ(m->Exchange(0, ones.data(), w.data(), kParams), 0) << "exchange " << t << ": " << m->last_error();
    ASSERT_EQ(CountWrong(w, static_cast<float>(t)), "") << "exchange " << t;
  }
  m.reset();
  EXPECT_EQ(proxy.cuts(), kCuts);
  EXPECT_EQ(CountWrong(Weights(target.url()), kExchanges), "");
}

// Streamed exchanges through cuts (doc/libblkps.md "Streaming"): each
// round submits the model as 8 buckets and completes them; the batches the
// stream joins carry writes of several submissions at each cut, and each
// is still resent only where the receipt lacks it. Every bucket's ticket
// completes GOOD holding exactly the model with its own push, 60 rounds
// through 16 cuts.
TEST(CutConnections, StreamedExchangesReturnExactWeightsAfterManyCuts) {
  TargetProcess target("params=" + std::to_string(kParams) + ";rule=sum");
  ASSERT_TRUE(target.ok()) << target.start_output();
  CuttingProxy proxy(target.port());
  ASSERT_TRUE(proxy.ok()) << proxy.error();
  constexpr int kRounds = 60, kCuts = 16, kBuckets = 8;
  proxy.CutAt(RandomCuts(17, kCuts, kRounds * kModelBytes));  // learner-to-target bytes
  std::string error;
  auto m = Open(ViaPort(target.url(), proxy.port()), "learner", &error);
  ASSERT_NE(m, nullptr) << error;
  const std::vector<float> ones(kParams, 1.0f);
  std::vector<float> w(kParams);
  constexpr uint64_t kBucket = kParams / kBuckets;
  for (int t = 1; t <= kRounds; ++t) {
    for (uint64_t first = 0; first < kParams; first += kBucket) {
      blkps::Model::Ticket ticket = 0;
      ASSERT_EQ(m->SubmitExchange(first, ones.data() + first, w.data() + first, kBucket, &ticket), 0)
          << m->last_error();
    }
    int completed = 0;
    while (m->outstanding() > 0) {
      std::vector<blkps::Model::Completion> ended;
      ASSERT_GE(m->Complete(&ended, kBuckets, -1), 0);
      for (const blkps::Model::Completion& c : ended) {
        ASSERT_EQ(c.result, 0) << "round " << t << ", ticket " << c.ticket << ": " << c.error;
        ++completed;
      }
    }
    ASSERT_EQ(completed, kBuckets) << "round " << t;
    ASSERT_EQ(CountWrong(w, static_cast<float>(t)), "") << "round " << t;
  }
  m.reset();
  EXPECT_EQ(proxy.cuts(), kCuts);
  EXPECT_EQ(CountWrong(Weights(target.url()), kRounds), "");
}

// With CHAP (every reconnect logs in again with BLKPS_CHAP_FILE's
// credentials) and the learners' control LUN restricted to what learners
// send (--operator), a learner's own fence= after each reconnect is still
// taken: sums stay exact.
TEST(CutConnections, AsyncSumIsExactWithChapAndOnlyAnOperatorWritingTheControlLun) {
  TempDir dir;
  const std::string chap = dir.path + "/chap";
  std::ofstream(chap) << "user=learner\nsecret=fault-Secret-01\n";
  chmod(chap.c_str(), 0600);
  setenv("BLKPS_CHAP_FILE", chap.c_str(), 1);
  ExpectExactAsyncSumAfterCuts("--operator --chap-file " + chap);
  unsetenv("BLKPS_CHAP_FILE");
}

// The learner engine (double-buffered push and pull on two connections)
// through the same cuts: every parameter exactly the number of steps.
TEST(CutConnections, EngineSumIsExactAfterManyCuts) {
  TargetProcess target("params=" + std::to_string(kParams) + ";rule=sum");
  ASSERT_TRUE(target.ok()) << target.start_output();
  CuttingProxy proxy(target.port());
  ASSERT_TRUE(proxy.ok()) << proxy.error();
  constexpr int kSteps = 100, kCuts = 10;
  // Each step pushes the model and pulls it: cut both streams' bytes.
  proxy.CutAt(RandomCuts(1500, kCuts, kSteps * kModelBytes));
  blkps::EngineOptions options;
  options.open.request_bytes = kRequestBytes;
  std::string error;
  auto engine = blkps::Engine::Open(ViaPort(target.url(), proxy.port()), options, &error);
  ASSERT_NE(engine, nullptr) << error;
  for (int t = 0; t < kSteps; ++t) {
    std::fill_n(engine->gradient(), engine->count(), 1.0f);
    ASSERT_EQ(engine->Step(), 0) << "step " << t << ": " << engine->last_error();
  }
  std::fill_n(engine->gradient(), engine->count(), 1.0f);
  ASSERT_EQ(engine->Finish(), 0) << engine->last_error();  // pushes the last gradient
  EXPECT_EQ(engine->gradients_pushed(), static_cast<uint64_t>(kSteps + 1));
  EXPECT_EQ(engine->pushed_bytes_lost(), 0u);
  engine.reset();
  EXPECT_EQ(proxy.cuts(), kCuts);
  EXPECT_EQ(CountWrong(Weights(target.url()), kSteps + 1), "");
}

// Two learners in bsp on `bsopts` (a rule=sum model of kParams) push, each
// iteration, their gradient's parts (learner l part p: every parameter
// parts[l][p], each part one Push of the whole model) and pull, through
// 12 cuts at seeded points; every pull must see exactly step·(t + 1), and
// the clocks end at `iterations`.
void ExpectExactBspThroughCuts(const std::string& bsopts, uint32_t seed, int iterations,
                               const std::vector<float> (&parts)[2], float step) {
  TargetProcess target(bsopts, "--luns 2");
  ASSERT_TRUE(target.ok()) << target.start_output();
  CuttingProxy proxy(target.port());
  ASSERT_TRUE(proxy.ok()) << proxy.error();

  constexpr int kCuts = 12;
  proxy.CutAt(RandomCuts(seed, kCuts, 2 * parts[0].size() * iterations * kModelBytes));
  std::string errors[2];
  auto learner = [&](int l) {
    std::string error;
    auto m = Open(ViaPort(target.url(l + 1), proxy.port()), "learner" + std::to_string(l), &error);
    if (!m) {
      errors[l] = error;
      return;
    }
    std::vector<std::vector<float>> g;
    for (float value : parts[l]) g.emplace_back(kParams, value);
    std::vector<float> w(kParams);
    for (int t = 0; t < iterations; ++t) {
      bool ok = true;
      for (const std::vector<float>& part : g) ok = ok && m->Push(0, part.data(), kParams) == 0;
      if (!ok || m->Pull(0, w.data(), kParams) != 0) {
        errors[l] = "iteration " + std::to_string(t) + ": " + m->last_error();
        return;
      }
      const std::string wrong = CountWrong(w, step * (t + 1));
      if (!wrong.empty()) {
        errors[l] = "iteration " + std::to_string(t) + ": " + wrong;
        return;
      }
    }
  };
  std::thread a(learner, 0), b(learner, 1);
  a.join();
  b.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  EXPECT_GT(proxy.cuts(), 0);
  EXPECT_EQ(CountWrong(Weights(target.url()), step * iterations), "");
  for (int lun = 1; lun <= 2; ++lun) {
    EXPECT_EQ(Field(LearnerStatus(target.control_url(), lun), "iteration"), std::to_string(iterations));
  }
}

// Two learners in bsp push g_l = 2l + 1 (1 and 3) and pull; the round's
// average, 2, is added per iteration. Each pull must see exactly 2(t + 1).
TEST(CutConnections, BspTwoLearnersExactAndNeverStuck) {
  ExpectExactBspThroughCuts("params=" + std::to_string(kParams) + ";rule=sum;mode=bsp", 1515, 30, {{1.0f}, {3.0f}},
                            2.0f);
}

// The same with the whole model's gradient in two parts a round
// (doc/server.md "A gradient in parts"): learner l pushes l + 1, then l + 2,
// then pulls; the round's average of the summed parts, 4, is added once per
// iteration, however the cuts fall between and inside the parts.
TEST(CutConnections, BspGradientInTwoPartsIsExactAfterCuts) {
  ExpectExactBspThroughCuts(
      "params=" + std::to_string(kParams) + ";rule=sum;mode=bsp;parts=0:" + std::to_string(kParams) + ":2", 3737, 15,
      {{1.0f, 2.0f}, {2.0f, 3.0f}}, 4.0f);
}

// Opening a model ends by reading the initiator's receipt; an open whose
// connection is cut there fails instead of going on without exactly-once.
TEST(CutConnections, AnOpenThatCannotReadItsReceiptFails) {
  TargetProcess target("params=" + std::to_string(1 << 14) + ";rule=sum");
  ASSERT_TRUE(target.ok()) << target.start_output();
  CuttingProxy proxy(target.port());
  ASSERT_TRUE(proxy.ok()) << proxy.error();
  std::string error;
  auto clean = Open(ViaPort(target.url(), proxy.port()), "open-a", &error);
  ASSERT_NE(clean, nullptr) << error;
  const uint64_t open_bytes = proxy.bytes_to_target();
  clean.reset();
  // The same open (a name as long) again, cut inside its last command's
  // request: the receipt read.
  proxy.CutAt({proxy.bytes_to_target() + open_bytes - 8});
  auto cut = Open(ViaPort(target.url(), proxy.port()), "open-b", &error);
  EXPECT_EQ(cut, nullptr);
  EXPECT_NE(error.find("receipt: blkps: read of LUN 2"), std::string::npos) << error;
  EXPECT_NE(error.find("exactly-once pushes need it, so the open fails"), std::string::npos) << error;
}

// Two learners push g_l = l + 1 to a rule=sum model with periodic
// checkpoints while tgtd is killed with SIGKILL at 20 random points and
// started again with the same options. Every restart must load the
// checkpoint (a torn or corrupt one fails the start), both learners must
// finish, and the weights must hold exactly what was pushed minus what the
// learners were told was lost. Kills whose push count is already reached
// when the learners end (a loaded machine) come after their last pushes:
// their Sync() is what makes those pushes durable or counted.
TEST(KillTgtd, TwentyRestartsLoseExactlyWhatTheLearnersAreTold) {
  constexpr uint64_t kSmallParams = 1 << 18;  // 1 MiB
  constexpr int kIterations = 150, kKills = 20;
  const TempDir scratch("blkps-fault");
  const std::string& dir = scratch.path;
  TargetProcess target(SumCheckpointed(kSmallParams, dir + "/model.ckpt", "0.05"), "--luns 2");
  ASSERT_TRUE(target.ok()) << target.start_output();

  std::atomic<int> pushes{0}, opens{0};
  std::string errors[2];
  uint64_t lost_bytes[2] = {0, 0};
  auto learner = [&](int l) {
    std::string error;
    blkps::OpenOptions o;
    o.request_bytes = 64 << 10;
    o.initiator_name = "iqn.2026-11.io.blkps:kill-test-" + std::to_string(l) + "-" + std::to_string(getpid());
    auto m = blkps::Model::Open(target.url(l + 1), o, &error);
    ++opens;
    if (!m) {
      errors[l] = error;
      return;
    }
    const std::vector<float> g(kSmallParams, static_cast<float>(l + 1));
    for (int t = 0; t < kIterations; ++t, ++pushes) {
      if (m->Push(0, g.data(), kSmallParams) != 0) {
        errors[l] = "push " + std::to_string(t) + ": " + m->last_error();
        return;
      }
    }
    // A learner hears of a restart at its next I/O: its pushes are durable
    // or counted lost only once Sync() returns (kills may come after).
    if (m->Sync() != 0) {
      errors[l] = "sync: " + m->last_error();
      return;
    }
    lost_bytes[l] = m->pushed_bytes_lost();
  };
  std::thread a(learner, 0), b(learner, 1);
  // The kill points: after a random number of pushes, spread over the run.
  std::mt19937 rng(20);
  std::vector<int> at;
  for (int k = 0; k < kKills; ++k) at.push_back(std::uniform_int_distribution<int>(1, 2 * kIterations - 20)(rng));
  std::sort(at.begin(), at.end());
  int restarts = 0, loads = 0;
  while (opens.load() < 2) std::this_thread::yield();  // an open during a kill fails
  for (int k = 0; k < kKills; ++k) {
    while (pushes.load() < at[k]) std::this_thread::yield();
    ASSERT_NO_FATAL_FAILURE(KillAndRestart(target, dir + "/model.ckpt", k, &restarts, &loads));
  }
  a.join();
  b.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  EXPECT_EQ(restarts, kKills);
  // Exact: each learner pushed kIterations gradients of l + 1 over every
  // parameter; the lost bytes are whole writes of l + 1 each.
  std::string error;
  blkps::OpenOptions o;
  o.initiator_name = "iqn.2026-11.io.blkps:kill-test-reader-" + std::to_string(getpid());
  auto reader = blkps::Model::Open(target.url(1), o, &error);
  ASSERT_NE(reader, nullptr) << error;
  std::vector<float> w(kSmallParams);
  ASSERT_EQ(reader->Pull(0, w.data(), kSmallParams), 0) << reader->last_error();
  double sum = 0;
  for (float v : w) sum += v;
  double expected = 0;
  for (int l = 0; l < 2; ++l) {
    expected += (l + 1) * (static_cast<double>(kIterations) * kSmallParams - lost_bytes[l] / sizeof(float));
  }
  EXPECT_EQ(sum, expected) << "lost bytes: " << lost_bytes[0] << ", " << lost_bytes[1];
  std::printf("kill -9 trials: %d restarts, %d from a checkpoint; pushed bytes lost: %llu, %llu\n", restarts, loads,
              static_cast<unsigned long long>(lost_bytes[0]), static_cast<unsigned long long>(lost_bytes[1]));
}

// Two learners train a one-block rule=sum model in `mode` (one write per
// push, so a lost write is a lost gradient): each pushes g_l = 2l + 1 and
// pulls. tgtd is killed with SIGKILL `kills` times, each a random number of
// pushes after the last restart, and started again with the same options.
// Then both learners are given a goal: push until the server holds exactly
// `goal` of their gradients, i.e. pushes made minus the gradients libblkps
// said were lost. Both must get there (none stuck: a hold fails after
// hold_limit); each learner's clock must be exactly the goal and every
// parameter exactly `weight_per_iteration` times it: a loss said too small
// leaves a clock short, one said too large makes a bsp learner wait for a
// round that never comes, or overshoots in ssp. Status is read through the
// control LUN. The learners never go idle long enough to be declared dead
// (dead_after): a bsp round that went on without one of them would not be
// their average.
void KillDuringTwoLearnerTraining(const std::string& mode, int kills, uint32_t seed, float weight_per_iteration,
                                  int steps_per_iteration) {
  constexpr uint64_t kTinyParams = 1 << 14;  // 64 KiB: one block (1 MiB), one write
  constexpr uint64_t kTinyBytes = kTinyParams * sizeof(float);
  const TempDir scratch("blkps-fault");
  const std::string& dir = scratch.path;
  TargetProcess target(SumCheckpointed(kTinyParams, dir + "/model.ckpt", "0.05") + ";mode=" + mode + ";dead_after=3600",
                       "--luns 2");
  ASSERT_TRUE(target.ok()) << target.start_output();

  std::atomic<int> goal{std::numeric_limits<int>::max()};
  std::atomic<int> made[2] = {0, 0};
  std::atomic<int> finished{0};
  std::string errors[2];
  uint64_t lost_bytes[2] = {0, 0};
  auto learner = [&](int l) {
    std::string error;
    blkps::OpenOptions o;
    o.request_bytes = kTinyBytes;
    o.initiator_name = "iqn.2026-11.io.blkps:kill-" + mode + "-" + std::to_string(l) + "-" + std::to_string(getpid());
    auto m = blkps::Model::Open(target.url(l + 1), o, &error);
    const std::vector<float> g(kTinyParams, static_cast<float>(2 * l + 1));
    std::vector<float> w(kTinyParams);
    // The gradients of this learner the server holds, as far as it knows.
    auto held = [&] { return made[l].load() - static_cast<int>(m->pushed_bytes_lost() / kTinyBytes); };
    while (m) {
      if (held() < goal.load()) {
        if (m->Push(0, g.data(), kTinyParams) != 0 || m->Pull(0, w.data(), kTinyParams) != 0) {
          errors[l] = "push " + std::to_string(made[l]) + ": " + m->last_error();
          break;
        }
        ++made[l];
        continue;
      }
      // A restart after the last push is heard of at the next I/O.
      if (m->Sync() != 0) {
        errors[l] = "sync: " + m->last_error();
        break;
      }
      if (held() < goal.load()) continue;
      lost_bytes[l] = m->pushed_bytes_lost();
      if (lost_bytes[l] % kTinyBytes != 0)
        errors[l] = "lost bytes not whole gradients: " + std::to_string(lost_bytes[l]);
      break;
    }
    if (!m) errors[l] = error;
    ++finished;
  };
  std::thread a(learner, 0), b(learner, 1);
  auto pushes = [&] { return made[0].load() + made[1].load(); };
  std::mt19937 rng(seed);
  int loads = 0, restarts = 0;
  // Kills come once both learners are open (an open during a kill fails).
  while ((made[0].load() == 0 || made[1].load() == 0) && finished.load() == 0) std::this_thread::yield();
  for (int k = 0; k < kills && finished.load() == 0; ++k) {
    const int at = pushes() + std::uniform_int_distribution<int>(1, 40)(rng);
    while (pushes() < at && finished.load() == 0) std::this_thread::yield();
    ASSERT_NO_FATAL_FAILURE(KillAndRestart(target, dir + "/model.ckpt", k, &restarts, &loads));
  }
  goal = std::max(made[0].load(), made[1].load()) + 10;
  a.join();
  b.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  EXPECT_EQ(restarts, kills);
  const int iterations = goal.load();
  for (int l = 0; l < 2; ++l) {
    EXPECT_EQ(made[l] - static_cast<int>(lost_bytes[l] / kTinyBytes), iterations) << "learner " << l;
    EXPECT_EQ(Field(LearnerStatus(target.control_url(), l + 1), "iteration"), std::to_string(iterations))
        << "learner " << l << " made " << made[l] << " pushes, " << lost_bytes[l] / kTinyBytes << " said lost";
  }
  std::string error;
  auto control = Open(target.control_url(), "status", &error);
  ASSERT_NE(control, nullptr) << error;
  std::vector<char> status(BLKPS_CONTROL_STATUS_BYTES + 1, '\0');
  ASSERT_EQ(control->ReadBytes(0, status.data(), BLKPS_CONTROL_STATUS_BYTES), 0) << control->last_error();
  EXPECT_EQ(Field(status.data(), "global_step"), std::to_string(steps_per_iteration * iterations));
  EXPECT_EQ(Field(status.data(), "held_now"), "0");
  control.reset();
  auto reader = blkps::Model::Open(target.url(1), blkps::OpenOptions(), &error);
  ASSERT_NE(reader, nullptr) << error;
  std::vector<float> w(kTinyParams);
  ASSERT_EQ(reader->Pull(0, w.data(), kTinyParams), 0) << reader->last_error();
  EXPECT_EQ(CountWrong(w, weight_per_iteration * iterations), "");
  std::printf("%s: %d restarts, %d from a checkpoint; %d iterations; pushes made %d, %d; said lost %llu, %llu\n",
              mode.c_str(), restarts, loads, iterations, made[0].load(), made[1].load(),
              static_cast<unsigned long long>(lost_bytes[0] / kTinyBytes),
              static_cast<unsigned long long>(lost_bytes[1] / kTinyBytes));
}

// bsp: every round is the average of one gradient per learner, (1 + 3) / 2.
TEST(KillTgtd, BspLearnersResumeWithExactClocks) { KillDuringTwoLearnerTraining("bsp", 8, 88, 2.0f, 1); }

// ssp: every gradient is applied on arrival, 1 + 3 per iteration.
TEST(KillTgtd, SspLearnersResumeWithExactClocks) { KillDuringTwoLearnerTraining("ssp:1", 6, 66, 4.0f, 2); }

// A learner whose target stays away gives up at BLKPS_RECONNECT_SECONDS and
// says how long it tried; a bad value fails the open.
TEST(KillTgtd, ALearnerGivesUpAtTheReconnectDeadline) {
  TargetProcess target("params=" + std::to_string(1 << 14) + ";rule=sum");
  ASSERT_TRUE(target.ok()) << target.start_output();
  std::string error;
  setenv("BLKPS_RECONNECT_SECONDS", "soon", 1);
  EXPECT_EQ(Open(target.url(), "bad-deadline", &error), nullptr);
  EXPECT_NE(error.find("BLKPS_RECONNECT_SECONDS=soon: expected seconds"), std::string::npos) << error;
  setenv("BLKPS_RECONNECT_SECONDS", "2", 1);
  auto m = Open(target.url(), "deadline", &error);
  unsetenv("BLKPS_RECONNECT_SECONDS");
  ASSERT_NE(m, nullptr) << error;
  const std::vector<float> ones(1 << 14, 1.0f);
  ASSERT_EQ(m->Push(0, ones.data(), ones.size()), 0) << m->last_error();
  std::string why;
  ASSERT_TRUE(target.KillTgtd(&why)) << why;
  EXPECT_NE(m->Push(0, ones.data(), ones.size()), 0);
  EXPECT_NE(m->last_error().find("gave up reconnecting after"), std::string::npos) << m->last_error();
  EXPECT_NE(m->last_error().find("(deadline 2 s, BLKPS_RECONNECT_SECONDS)"), std::string::npos) << m->last_error();
}

// `target`'s tgtd stopped (SIGSTOP) for the scope: it runs again however
// the test ends, so that it can be stopped.
class FrozenTgtd {
 public:
  explicit FrozenTgtd(TargetProcess* target) : target_(target), ok_(target->StopTgtd(&why_)) {}
  ~FrozenTgtd() { target_->ContinueTgtd(); }
  FrozenTgtd(const FrozenTgtd&) = delete;
  FrozenTgtd& operator=(const FrozenTgtd&) = delete;
  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }

 private:
  TargetProcess* target_;
  std::string why_;
  bool ok_;
};

// D5: a target that accepts connections and never answers (tgtd stopped
// with SIGSTOP, the connections cut) must not hold a reconnect past
// BLKPS_RECONNECT_SECONDS: the login and every command of the reconnect are
// bounded by what is left of it. The one timing bound in this file, on
// purpose: the issue asks for the deadline plus a second (the broken code
// took 15 to 30 s), and nothing here waits but the deadline itself.
TEST(StoppedTgtd, AHangingLoginEndsAtTheReconnectDeadline) {
  TargetProcess target("params=" + std::to_string(1 << 14) + ";rule=sum");
  ASSERT_TRUE(target.ok()) << target.start_output();
  CuttingProxy proxy(target.port());
  ASSERT_TRUE(proxy.ok()) << proxy.error();
  std::string error;
  setenv("BLKPS_RECONNECT_SECONDS", "2", 1);
  auto m = Open(ViaPort(target.url(), proxy.port()), "stopped", &error);
  unsetenv("BLKPS_RECONNECT_SECONDS");
  ASSERT_NE(m, nullptr) << error;
  const std::vector<float> ones(1 << 14, 1.0f);
  ASSERT_EQ(m->Push(0, ones.data(), ones.size()), 0) << m->last_error();
  const FrozenTgtd frozen(&target);
  ASSERT_TRUE(frozen.ok()) << frozen.why();
  proxy.CutAll();
  const auto start = std::chrono::steady_clock::now();
  const int pushed = m->Push(0, ones.data(), ones.size());
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(pushed, 0) << "a push to a stopped target succeeded";
  EXPECT_NE(m->last_error().find("gave up reconnecting after"), std::string::npos) << m->last_error();
  EXPECT_LT(took, 2.0 + 1.0) << m->last_error();
  std::printf("a push to a stopped tgtd failed after %.2f s (BLKPS_RECONNECT_SECONDS=2): %s\n", took,
              m->last_error().c_str());
}

// An open of a target that accepts the connection and never answers the
// login (tgtd stopped with SIGSTOP) fails in one line once the command
// timeout has passed, instead of waiting for ever.
TEST(StoppedTgtd, AnOpenWhoseLoginIsNeverAnsweredFails) {
  TargetProcess target("params=" + std::to_string(1 << 14) + ";rule=sum");
  ASSERT_TRUE(target.ok()) << target.start_output();
  const FrozenTgtd frozen(&target);
  ASSERT_TRUE(frozen.ok()) << frozen.why();
  std::string error;
  auto m = Open(target.url(), "stopped-open", &error);
  EXPECT_EQ(m, nullptr) << "an open of a stopped target succeeded";
  EXPECT_NE(error.find("did not answer the login within 30 s"), std::string::npos) << error;
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
}

// tgtd is killed after a learner's last push, before any checkpoint has
// them: the learner is told only at its next I/O, so its Sync() must
// reconnect, count exactly the pushes since the last checkpoint as lost, and
// leave the rest durable. The model is not a whole number of blocks: the
// count is of gradient bytes, the padding to the last block aside.
TEST(KillTgtd, AfterTheLastPushSyncCountsWhatWasLost) {
  constexpr uint64_t kSmallParams = (1 << 18) - 3;  // 1 MiB less 12 bytes
  constexpr int kDurable = 3, kUnsynced = 5;
  const TempDir scratch("blkps-fault");
  const std::string& dir = scratch.path;
  // No periodic checkpoint within the test: only Sync() writes one.
  TargetProcess target(SumCheckpointed(kSmallParams, dir + "/model.ckpt", "3600"));
  ASSERT_TRUE(target.ok()) << target.start_output();
  std::string error;
  blkps::OpenOptions o;
  o.request_bytes = 64 << 10;
  o.initiator_name = "iqn.2026-11.io.blkps:last-push-test-" + std::to_string(getpid());
  auto m = blkps::Model::Open(target.url(), o, &error);
  ASSERT_NE(m, nullptr) << error;
  const std::vector<float> ones(kSmallParams, 1.0f);
  for (int t = 0; t < kDurable; ++t) ASSERT_EQ(m->Push(0, ones.data(), kSmallParams), 0) << m->last_error();
  ASSERT_EQ(m->Sync(), 0) << m->last_error();
  for (int t = 0; t < kUnsynced; ++t) ASSERT_EQ(m->Push(0, ones.data(), kSmallParams), 0) << m->last_error();
  std::string why;
  ASSERT_TRUE(target.KillTgtd(&why)) << why;
  ASSERT_TRUE(target.Restart()) << target.start_output();
  EXPECT_EQ(m->pushed_bytes_lost(), 0u);  // not told yet: no I/O since
  ASSERT_EQ(m->Sync(), 0) << m->last_error();
  EXPECT_EQ(m->pushed_bytes_lost(), kUnsynced * kSmallParams * sizeof(float));
  std::vector<float> w(kSmallParams);
  ASSERT_EQ(m->Pull(0, w.data(), kSmallParams), 0) << m->last_error();
  EXPECT_EQ(CountWrong(w, kDurable), "");
}

// Engine::Finish() ends with a Sync(): once it returns, every push is in a
// checkpoint (or counted lost), so a kill -9 right after loses nothing.
TEST(KillTgtd, AfterEngineFinishEveryPushIsDurable) {
  constexpr uint64_t kSmallParams = 1 << 18;  // 1 MiB
  constexpr int kSteps = 5;
  const TempDir scratch("blkps-fault");
  const std::string& dir = scratch.path;
  // No periodic checkpoint within the test: only a sync writes one.
  TargetProcess target(SumCheckpointed(kSmallParams, dir + "/model.ckpt", "3600"));
  ASSERT_TRUE(target.ok()) << target.start_output();
  blkps::EngineOptions options;
  options.open.initiator_name = "iqn.2026-11.io.blkps:finish-test-" + std::to_string(getpid());
  std::string error;
  auto engine = blkps::Engine::Open(target.url(), options, &error);
  ASSERT_NE(engine, nullptr) << error;
  for (int t = 0; t < kSteps; ++t) {
    std::fill_n(engine->gradient(), engine->count(), 1.0f);
    ASSERT_EQ(engine->Step(), 0) << "step " << t << ": " << engine->last_error();
  }
  std::fill_n(engine->gradient(), engine->count(), 1.0f);
  ASSERT_EQ(engine->Finish(), 0) << engine->last_error();
  EXPECT_EQ(engine->pushed_bytes_lost(), 0u);
  engine.reset();
  std::string why;
  ASSERT_TRUE(target.KillTgtd(&why)) << why;
  ASSERT_TRUE(target.Restart()) << target.start_output();
  EXPECT_NE(target.Log().find("loaded checkpoint"), std::string::npos) << target.Log();
  std::vector<float> w(kSmallParams);
  auto m = Open(target.url(), "after-finish", &error);
  ASSERT_NE(m, nullptr) << error;
  ASSERT_EQ(m->Pull(0, w.data(), kSmallParams), 0) << m->last_error();
  EXPECT_EQ(CountWrong(w, kSteps + 1), "");
}

// A large model checkpointed over and over; tgtd is killed while a
// checkpoint is being written (its temporary file exists) and started again:
// the old or the new checkpoint loads, never a torn one, and the weights
// hold exactly the pushes minus what the learner was told was lost.
TEST(KillTgtd, DuringACheckpointWriteTheOldOrNewFileLoads) {
  constexpr uint64_t kLargeParams = 16 << 20;  // 64 MiB
  constexpr int kKills = 4;
  const TempDir scratch("blkps-fault");
  const std::string& dir = scratch.path;
  const std::string checkpoint = dir + "/model.ckpt";
  TargetProcess target(SumCheckpointed(kLargeParams, checkpoint, "0.05"));
  ASSERT_TRUE(target.ok()) << target.start_output();
  std::string error;
  blkps::OpenOptions o;
  o.initiator_name = "iqn.2026-11.io.blkps:ckpt-test-" + std::to_string(getpid());
  auto m = blkps::Model::Open(target.url(), o, &error);
  ASSERT_NE(m, nullptr) << error;
  const std::vector<float> ones(kLargeParams, 1.0f);
  std::vector<float> w(kLargeParams);
  int pushes = 0;
  for (int k = 0; k < kKills; ++k) {
    // Push on while a watcher kills tgtd the moment a checkpoint is being
    // written over an earlier one (the temporary file exists beside the
    // checkpoint; polled every millisecond, not
    // between pushes, which a checkpoint's write gate may fall between), and
    // starts it again; the push in flight rides through the restart.
    const std::string tmp = checkpoint + ".tmp";
    std::atomic<bool> restarted{false}, give_up{false};
    std::string why;
    bool killed = false, started = false;
    std::thread watcher([&] {
      // A checkpoint is there to fall back to, and the next is being written.
      while (access(checkpoint.c_str(), F_OK) != 0 || access(tmp.c_str(), F_OK) != 0) {
        if (give_up) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      killed = target.KillTgtd(&why);
      started = killed && target.Restart();
      restarted = true;
    });
    while (!restarted) {
      if (m->Push(0, ones.data(), kLargeParams) != 0) {
        ADD_FAILURE() << "push " << pushes << ": " << m->last_error();
        give_up = true;
        break;
      }
      ++pushes;
    }
    watcher.join();
    ASSERT_TRUE(killed) << "kill " << k << ": " << why;
    ASSERT_TRUE(started) << "restart " << k << " (a torn checkpoint fails it): " << target.start_output();
    EXPECT_NE(target.Log().find("loaded checkpoint"), std::string::npos) << target.Log();
  }
  ASSERT_FALSE(HasFailure());
  ASSERT_EQ(m->Sync(), 0) << m->last_error();
  ASSERT_EQ(m->Pull(0, w.data(), kLargeParams), 0) << m->last_error();
  double sum = 0;
  for (float v : w) sum += v;
  EXPECT_EQ(sum, static_cast<double>(pushes) * kLargeParams - m->pushed_bytes_lost() / sizeof(float))
      << pushes << " pushes, " << m->pushed_bytes_lost() << " bytes lost";
}

}  // namespace
