// Job: consistency control, liveness, checkpoints and controls, without tgt
// (the integration tests drive the same through a real tgtd).
#include "job.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>

#include "blkps/control_lun.h"
#include "json_check.h"
#include "next_generation.h"
#include "temp_dir.h"

namespace blkps::server {
namespace {

JobOptions Options(uint64_t params, const std::string& mode, uint64_t block_bytes = 64) {
  JobOptions o;
  o.model.num_params = params;
  o.model.block_bytes = block_bytes;
  o.model.rule.lr = 1.0f;
  EXPECT_TRUE(ParseConsistency(mode, &o.consistency).ok());
  return o;
}

// Counts wake calls; lets a test wait for one without sleeping blindly.
class Waker {
 public:
  std::function<void()> Callback() {
    return [this] {
      std::lock_guard<std::mutex> lock(mu_);
      ++wakes_;
      cv_.notify_all();
    };
  }
  bool WaitForWake(double seconds) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return wakes_ > 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int wakes_ = 0;
};

std::vector<float> ReadAll(const Job& job, uint64_t params) {
  std::vector<float> w(params);
  EXPECT_TRUE(job.ReadWeights(0, w.data(), params * 4).ok());
  return w;
}

// Writes g through the job as one write at device byte `offset` (Admit,
// then Write).
void Push(Job& job, size_t slot, uint64_t offset, const std::vector<float>& g) {
  ASSERT_EQ(job.Admit(slot, true, offset, g.size() * 4, nullptr), Job::Admission::kRun);
  ASSERT_TRUE(job.Write(slot, offset, g.data(), g.size() * 4).ok());
}

// Writes g through the job in random pieces (Admit, then Write).
void PushInPieces(Job& job, size_t slot, const std::vector<float>& g, std::mt19937& rng) {
  uint64_t at = 0;
  while (at < g.size()) {
    const uint64_t n = std::min<uint64_t>(g.size() - at, 1 + rng() % 40);
    ASSERT_EQ(job.Admit(slot, true, at * 4, n * 4, nullptr), Job::Admission::kRun);
    ASSERT_TRUE(job.Write(slot, at * 4, g.data() + at, n * 4).ok());
    at += n;
  }
}

TEST(Job, BspWithFourLearnersMatchesASequentialReference) {
  const uint64_t params = 100;  // 7 blocks of 16 parameters, the last of 4
  std::shared_ptr<Job> job;
  ASSERT_TRUE(Job::Create("m", Options(params, "bsp"), nullptr, &job).ok());
  std::vector<size_t> slots;
  for (int l = 0; l < 4; ++l) slots.push_back(job->AddLearner(l + 1, [] {}));
  std::vector<float> reference(params, 0.0f);
  std::mt19937 rng(3);
  for (int round = 0; round < 5; ++round) {
    std::vector<float> sum(params, 0.0f);
    std::vector<int> order{0, 1, 2, 3};
    std::shuffle(order.begin(), order.end(), rng);
    for (int l : order) {
      std::vector<float> g(params);
      for (uint64_t i = 0; i < params; ++i) g[i] = static_cast<float>(static_cast<int>(rng() % 17) - 8);
      for (uint64_t i = 0; i < params; ++i) sum[i] += g[i];
      PushInPieces(*job, slots[l], g, rng);
    }
    for (uint64_t i = 0; i < params; ++i) reference[i] -= sum[i] / 4.0f;
    for (size_t slot : slots) EXPECT_EQ(job->Admit(slot, false, 0, params * 4, nullptr), Job::Admission::kRun);
    ASSERT_EQ(ReadAll(*job, params), reference) << "round " << round;
  }
}

// Staleness-aware steps (doc/server.md "Asynchronous training") leave bsp exactly
// as it was: the same pushes give bit-identical weights with and without.
TEST(Job, BspIsTheSameWithAndWithoutStalenessAwareness) {
  const uint64_t params = 40;
  std::vector<float> weights[2];
  for (int aware = 0; aware < 2; ++aware) {
    JobOptions o = Options(params, "bsp");
    o.model.rule.name = "momentum";
    o.model.rule.lr = 0.1f;
    o.staleness_aware = aware == 1;
    std::shared_ptr<Job> job;
    ASSERT_TRUE(Job::Create("m", o, nullptr, &job).ok());
    const size_t a = job->AddLearner(1, [] {}), b = job->AddLearner(2, [] {});
    std::mt19937 rng(9);
    for (int round = 0; round < 4; ++round) {
      for (size_t slot : {a, b}) ASSERT_EQ(job->Admit(slot, false, 0, params * 4, nullptr), Job::Admission::kRun);
      for (size_t slot : {a, b}) {
        std::vector<float> g(params);
        for (float& x : g) x = static_cast<float>(static_cast<int>(rng() % 17) - 8) / 8.0f;
        PushInPieces(*job, slot, g, rng);
      }
    }
    weights[aware] = ReadAll(*job, params);
  }
  EXPECT_EQ(weights[0], weights[1]);
}

// One learner in async or ssp: every push is fresh (staleness 0) and is
// applied exactly as the rule applies it, bit for bit, with or without
// staleness awareness, for every rule.
TEST(Job, OneAsyncLearnerGetsEveryRuleExactlyAsWritten) {
  const uint64_t params = 40;  // 3 blocks
  for (const char* rule : {"sgd", "momentum", "adagrad", "adam", "sum", "average"}) {
    for (const char* mode : {"async", "ssp:2"}) {
      RuleOptions ro;
      ro.name = rule;
      ro.lr = 0.05f;
      std::unique_ptr<UpdateRule> reference;
      ASSERT_TRUE(MakeUpdateRule(ro, params, &reference).ok());
      std::vector<float> expected(params, 0.0f);
      std::vector<float> got[2];
      for (int aware = 0; aware < 2; ++aware) {
        JobOptions o = Options(params, mode);
        o.model.rule = ro;
        o.staleness_aware = aware == 1;
        std::shared_ptr<Job> job;
        ASSERT_TRUE(Job::Create("m", o, nullptr, &job).ok());
        const size_t slot = job->AddLearner(1, [] {});
        std::mt19937 rng(4);
        for (int step = 0; step < 6; ++step) {
          // Reads now and then: its own pushes since are not stale to it.
          if (step % 3 == 0) {
            ASSERT_EQ(job->Admit(slot, false, 0, params * 4, nullptr), Job::Admission::kRun);
          }
          std::vector<float> g(params);
          for (float& x : g) x = static_cast<float>(static_cast<int>(rng() % 17) - 8) / 8.0f;
          ASSERT_EQ(job->Admit(slot, true, 0, params * 4, nullptr), Job::Admission::kRun);
          ASSERT_TRUE(job->Write(slot, 0, g.data(), params * 4).ok());
          for (uint64_t first = 0; aware == 0 && first < params; first += 16) {  // as the model: block by block
            const uint64_t n = std::min<uint64_t>(16, params - first);
            reference->Apply(first, expected.data() + first, g.data() + first, n);
          }
        }
        got[aware] = ReadAll(*job, params);
        EXPECT_NE(job->StatusJson().find("\"push_staleness_max\": 0,"), std::string::npos) << rule << " " << mode;
      }
      EXPECT_EQ(got[0], expected) << rule << " " << mode;
      EXPECT_EQ(got[1], expected) << rule << " " << mode;
    }
  }
}

// Two learners taking part (N = 2: both have pushed, here to block 1) read
// block 0. With staleness awareness a push is applied at 1/max(N, 1+τ) of
// its size (doc/async.md "Gradient mode: staleness-aware steps in the
// server"): b's two fresh pushes (its own do not count) at 1/2, a's push,
// two updates stale, at 1/3.
TEST(Job, AsyncPushIsAtMostOneLearnersShareAndStalerPushesLess) {
  for (const char* mode : {"async", "ssp:2"}) {
    for (int aware = 0; aware < 2; ++aware) {
      JobOptions o = Options(32, mode);  // sgd, lr 1, 2 blocks
      o.staleness_aware = aware == 1;
      std::shared_ptr<Job> job;
      ASSERT_TRUE(Job::Create("m", o, nullptr, &job).ok());
      const size_t a = job->AddLearner(1, [] {}), b = job->AddLearner(2, [] {});
      const std::vector<float> g(16, 1.0f);
      for (size_t slot : {a, b}) Push(*job, slot, 64, g);
      ASSERT_EQ(job->Admit(a, false, 0, 64, nullptr), Job::Admission::kRun);
      ASSERT_EQ(job->Admit(b, false, 0, 64, nullptr), Job::Admission::kRun);
      for (size_t slot : {b, b, a}) Push(*job, slot, 0, g);
      const float want = aware ? -(0.5f + 0.5f + 1.0f / 3.0f) : -3.0f;
      const std::vector<float> w = ReadAll(*job, 32);
      for (int i = 0; i < 16; ++i) EXPECT_FLOAT_EQ(w[i], want) << mode << " aware " << aware;
      const std::string status = job->StatusJson();
      EXPECT_NE(status.find("\"push_staleness_max\": 2, \"push_staleness_mean\": 2.000"), std::string::npos) << status;
    }
  }
}

// N is the learners that push, not the LUNs: with a third, read-only LUN
// (a spare slot, an evaluator) two pushing learners' fresh pushes are
// applied at 1/2 each, not 1/3; status and the counters say N = 2.
TEST(Job, AsyncStepIsNotDividedByALunThatDoesNotPush) {
  JobOptions o = Options(16, "async");  // sgd, lr 1, staleness-aware
  std::shared_ptr<Job> job;
  ASSERT_TRUE(Job::Create("m", o, nullptr, &job).ok());
  const size_t a = job->AddLearner(1, [] {}), b = job->AddLearner(2, [] {}), reader = job->AddLearner(3, [] {});
  const std::vector<float> g(16, 1.0f);
  for (size_t slot : {a, b}) Push(*job, slot, 0, g);  // both take part: each has pushed once
  ASSERT_EQ(job->Admit(reader, false, 0, 64, nullptr), Job::Admission::kRun);
  const std::vector<float> before = ReadAll(*job, 16);
  ASSERT_EQ(job->Admit(a, false, 0, 64, nullptr), Job::Admission::kRun);
  Push(*job, a, 0, g);  // fresh: τ = 0
  const std::vector<float> after = ReadAll(*job, 16);
  for (int i = 0; i < 16; ++i) EXPECT_FLOAT_EQ(after[i] - before[i], -0.5f) << i;
  EXPECT_NE(job->StatusJson().find("\"pushing_learners\": 2,"), std::string::npos) << job->StatusJson();
  EXPECT_EQ(job->GetCounters().pushing_learners, 2u);
}

// A learner that stops pushing leaves N once its last push is dead_after
// old (doc/async.md "One N: the learners that push"): the other's next
// fresh push is applied whole, no longer as half of a round.
TEST(Job, AsyncStepGrowsWhenALearnerStopsPushing) {
  JobOptions o = Options(16, "async");  // sgd, lr 1, staleness-aware
  o.dead_after_s = 0.2;
  std::mutex mu;
  std::condition_variable cv;
  bool b_dead = false;
  auto log = [&](const std::string& line) {
    if (line.find("lun 2 is dead") == std::string::npos) return;
    std::lock_guard<std::mutex> lock(mu);
    b_dead = true;
    cv.notify_all();
  };
  std::shared_ptr<Job> job;
  ASSERT_TRUE(Job::Create("m", o, log, &job).ok());
  const size_t a = job->AddLearner(1, [] {}), b = job->AddLearner(2, [] {});
  const std::vector<float> g(16, 1.0f);
  for (size_t slot : {a, b}) Push(*job, slot, 0, g);
  EXPECT_EQ(job->GetCounters().pushing_learners, 2u);
  {
    std::unique_lock<std::mutex> lock(mu);  // b's last push is dead_after old when it is declared dead
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return b_dead; }));
  }
  const std::vector<float> before = ReadAll(*job, 16);
  ASSERT_EQ(job->Admit(a, false, 0, 64, nullptr), Job::Admission::kRun);
  Push(*job, a, 0, g);  // fresh: τ = 0
  const std::vector<float> after = ReadAll(*job, 16);
  for (int i = 0; i < 16; ++i) EXPECT_FLOAT_EQ(after[i] - before[i], -1.0f) << i;
  EXPECT_EQ(job->GetCounters().pushing_learners, 1u);
}

// One pipelined learner (pipeline=<lun>:1;
// doc/async.md "Pipelined learners") reads, pushes, reads, pushes: its second gradient was taken on
// the weights of its first read, so its own first push is one update stale
// to it (τ = 1) and, staleness-aware, applied at 1/2; status counts it.
void PushTwiceReadingBeforeEach(Job& job, size_t slot, const std::vector<float>& g) {
  for (int step = 0; step < 2; ++step) {
    ASSERT_EQ(job.Admit(slot, false, 0, g.size() * 4, nullptr), Job::Admission::kRun);
    Push(job, slot, 0, g);
  }
}

TEST(Job, PipelinedLearnerCountsItsPreviousStepsPushAsStale) {
  JobOptions o = Options(16, "async");  // sgd, lr 1, staleness-aware
  std::shared_ptr<Job> job;
  ASSERT_TRUE(Job::Create("m", o, nullptr, &job).ok());
  const size_t slot = job->AddLearner(1, [] {});
  ASSERT_TRUE(job->Control("pipeline=1:1", "learner", Job::ControlRights::kLearner).ok());
  PushTwiceReadingBeforeEach(*job, slot, std::vector<float>(16, 1.0f));
  for (float w : ReadAll(*job, 16)) EXPECT_FLOAT_EQ(w, -(1.0f + 0.5f));
  const std::string status = job->StatusJson();
  EXPECT_NE(status.find("\"push_staleness_max\": 1, \"push_staleness_mean\": 0.500, \"stale_pushes\": 0, "
                        "\"pipeline_depth\": 1}"),
            std::string::npos)
      << status;
}

// pipeline=<lun>:0 is the default: τ counts from the learner's last read,
// its own pushes are never stale to it, and each push is applied whole.
TEST(Job, PipelineDepthZeroCountsFromTheLastRead) {
  JobOptions o = Options(16, "async");
  std::shared_ptr<Job> job;
  ASSERT_TRUE(Job::Create("m", o, nullptr, &job).ok());
  const size_t slot = job->AddLearner(1, [] {});
  ASSERT_TRUE(job->Control("pipeline=1:1").ok());
  ASSERT_TRUE(job->Control("pipeline=1:0").ok());
  PushTwiceReadingBeforeEach(*job, slot, std::vector<float>(16, 1.0f));
  for (float w : ReadAll(*job, 16)) EXPECT_FLOAT_EQ(w, -2.0f);
  const std::string status = job->StatusJson();
  EXPECT_NE(status.find("\"push_staleness_max\": 0, \"push_staleness_mean\": 0.000, \"stale_pushes\": 0, "
                        "\"pipeline_depth\": 0}"),
            std::string::npos)
      << status;
}

// pipeline= takes one of the model's learner LUNs and a depth of 0 or 1,
// and says so in one line otherwise; nothing of the write is done.
TEST(Job, ControlPipelineRefusesAnotherLunOrDepth) {
  std::shared_ptr<Job> job;
  ASSERT_TRUE(Job::Create("m", Options(16, "async"), nullptr, &job).ok());
  job->AddLearner(1, [] {});
  for (const char* bad : {"pipeline=2:1", "pipeline=1:2", "pipeline=1", "pipeline=:1", "pipeline=1:1\nlr=-1"}) {
    const Status s = job->Control(bad);
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << bad;
    if (std::string(bad).find("lr") == std::string::npos) {
      EXPECT_NE(s.message().find("expected pipeline=<the LUN of a learner of this model>:<its pipeline depth, 0 or 1>"),
                std::string::npos)
          << s.message();
    }
  }
  EXPECT_NE(job->StatusJson().find("\"pipeline_depth\": 0}"), std::string::npos) << job->StatusJson();
}

// A learner's staleness_last is the lead of its latest read over the
// slowest live learner, beside the most and the mean of all its reads.
TEST(Job, StalenessLastIsTheLatestReadsLead) {
  std::shared_ptr<Job> job;
  ASSERT_TRUE(Job::Create("m", Options(16, "ssp:3"), nullptr, &job).ok());
  const size_t a = job->AddLearner(1, [] {}), b = job->AddLearner(2, [] {});
  const std::vector<float> g(16, 1.0f);
  auto push = [&](size_t slot) {
    ASSERT_EQ(job->Admit(slot, true, 0, 64, nullptr), Job::Admission::kRun);
    ASSERT_TRUE(job->Write(slot, 0, g.data(), 64).ok());
  };
  auto read = [&](size_t slot) { ASSERT_EQ(job->Admit(slot, false, 0, 64, nullptr), Job::Admission::kRun); };
  push(a);
  push(a);
  read(a);  // two iterations ahead of b
  push(b);
  read(a);  // one ahead
  const std::string status = job->StatusJson();
  EXPECT_NE(status.find("\"staleness_last\": 1, \"staleness_max\": 2, \"staleness_mean\": 1.500"), std::string::npos)
      << status;
}

// The guard rail: a push staler than stale_bound is counted in the status and
// its learner is told so in one log line, once until its pushes are fresh.
TEST(Job, PushBeyondTheStaleBoundIsCountedAndLoggedOnce) {
  JobOptions o = Options(16, "async");
  o.stale_bound = 1;
  std::vector<std::string> log;
  std::mutex log_mu;
  std::shared_ptr<Job> job;
  ASSERT_TRUE(Job::Create(
                  "m", o,
                  [&](const std::string& line) {
                    std::lock_guard<std::mutex> lock(log_mu);
                    log.push_back(line);
                  },
                  &job)
                  .ok());
  const size_t slow = job->AddLearner(7, [] {}), fast = job->AddLearner(8, [] {});
  const std::vector<float> g(16, 1.0f);
  ASSERT_EQ(job->Admit(slow, false, 0, 64, nullptr), Job::Admission::kRun);
  for (int push = 0; push < 6; ++push) {
    if (push % 3 == 0) {
      ASSERT_EQ(job->Admit(slow, true, 0, 64, nullptr), Job::Admission::kRun);
      ASSERT_TRUE(job->Write(slow, 0, g.data(), 64).ok());  // staleness 0, then 3
      ASSERT_EQ(job->Admit(slow, false, 0, 64, nullptr), Job::Admission::kRun);
    }
    ASSERT_EQ(job->Admit(fast, false, 0, 64, nullptr), Job::Admission::kRun);
    ASSERT_EQ(job->Admit(fast, true, 0, 64, nullptr), Job::Admission::kRun);
    ASSERT_TRUE(job->Write(fast, 0, g.data(), 64).ok());
  }
  ASSERT_EQ(job->Admit(slow, true, 0, 64, nullptr), Job::Admission::kRun);
  ASSERT_TRUE(job->Write(slow, 0, g.data(), 64).ok());  // staleness 3
  const std::string status = job->StatusJson();
  EXPECT_NE(status.find("\"lun\": 7"), std::string::npos);
  EXPECT_NE(status.find("\"push_staleness_max\": 3, \"push_staleness_mean\": 2.000, \"stale_pushes\": 2"),
            std::string::npos)
      << status;
  std::lock_guard<std::mutex> lock(log_mu);
  ASSERT_EQ(std::count_if(log.begin(), log.end(),
                          [](const std::string& line) { return line.find("stale") != std::string::npos; }),
            1)
      << ::testing::PrintToString(log);
  EXPECT_NE(log[0].find("learner at lun 7: push 3 updates stale (bound 1)"), std::string::npos) << log[0];
}

TEST(Job, BspHeldReadIsReleasedWhenTheRoundCompletes) {
  std::shared_ptr<Job> job;
  ASSERT_TRUE(Job::Create("m", Options(16, "bsp"), nullptr, &job).ok());
  Waker waker;
  const size_t a = job->AddLearner(1, waker.Callback());
  const size_t b = job->AddLearner(2, [] {});
  std::vector<float> g(16, 2.0f);
  std::mt19937 rng(1);
  PushInPieces(*job, a, g, rng);
  int cmd = 0;
  ASSERT_EQ(job->Admit(a, false, 0, 64, &cmd), Job::Admission::kHold);
  EXPECT_TRUE(job->TakeReleased(a).empty());
  PushInPieces(*job, b, g, rng);
  ASSERT_TRUE(waker.WaitForWake(5));
  std::vector<Job::Released> released = job->TakeReleased(a);
  ASSERT_EQ(released.size(), 1u);
  EXPECT_EQ(released[0].cmd, &cmd);
  EXPECT_TRUE(released[0].status.ok());
  EXPECT_EQ(ReadAll(*job, 16), std::vector<float>(16, -2.0f));
}

TEST(Job, HeldReadFailsClearlyAtTheHoldLimit) {
  JobOptions o = Options(16, "bsp");
  o.hold_limit_s = 0.2;
  std::shared_ptr<Job> job;
  std::vector<std::string> log;
  std::mutex log_mu;
  ASSERT_TRUE(Job::Create(
                  "m", o,
                  [&](const std::string& line) {
                    std::lock_guard<std::mutex> lock(log_mu);
                    log.push_back(line);
                  },
                  &job)
                  .ok());
  Waker waker;
  const size_t a = job->AddLearner(1, waker.Callback());
  job->AddLearner(2, [] {});
  std::mt19937 rng(1);
  PushInPieces(*job, a, std::vector<float>(16, 1.0f), rng);
  int cmd = 0;
  ASSERT_EQ(job->Admit(a, false, 0, 64, &cmd), Job::Admission::kHold);
  ASSERT_TRUE(waker.WaitForWake(5));
  std::vector<Job::Released> released = job->TakeReleased(a);
  ASSERT_EQ(released.size(), 1u);
  EXPECT_EQ(released[0].status.code(), Status::Code::kDeadlineExceeded);
  EXPECT_NE(released[0].status.message().find("hold_limit"), std::string::npos) << released[0].status.message();
  EXPECT_NE(released[0].status.message().find("lun 2 at 0"), std::string::npos) << released[0].status.message();
  std::lock_guard<std::mutex> lock(log_mu);
  ASSERT_FALSE(log.empty());
}

TEST(Job, DeadLearnerIsDeclaredAndBspGoesOnWithTheLive) {
  JobOptions o = Options(16, "bsp");
  o.dead_after_s = 0.2;
  std::shared_ptr<Job> job;
  ASSERT_TRUE(Job::Create("m", o, nullptr, &job).ok());
  Waker waker;
  const size_t a = job->AddLearner(1, waker.Callback());
  job->AddLearner(2, [] {});  // never does I/O
  std::mt19937 rng(1);
  PushInPieces(*job, a, std::vector<float>(16, 3.0f), rng);
  int cmd = 0;
  ASSERT_EQ(job->Admit(a, false, 0, 64, &cmd), Job::Admission::kHold);
  ASSERT_TRUE(waker.WaitForWake(5));
  std::vector<Job::Released> released = job->TakeReleased(a);
  ASSERT_EQ(released.size(), 1u);
  EXPECT_TRUE(released[0].status.ok()) << released[0].status.message();
  EXPECT_EQ(ReadAll(*job, 16), std::vector<float>(16, -3.0f));  // the average of the one given
  EXPECT_NE(job->StatusJson().find("\"state\": \"dead\""), std::string::npos) << job->StatusJson();
}

TEST(Job, ReachingMaxDeadFailsTheJob) {
  JobOptions o = Options(16, "async");
  o.dead_after_s = 0.1;
  o.max_dead = 1;
  std::shared_ptr<Job> job;
  ASSERT_TRUE(Job::Create("m", o, nullptr, &job).ok());
  const size_t a = job->AddLearner(1, [] {});
  std::vector<float> w(16);
  Status s;
  for (int i = 0; i < 200 && s.ok(); ++i) {
    usleep(10000);
    s = job->Read(a, 0, w.data(), 64);
  }
  EXPECT_EQ(s.code(), Status::Code::kUnavailable);
  EXPECT_NE(s.message().find("max_dead=1"), std::string::npos) << s.message();
  EXPECT_NE(job->StatusJson().find("\"failed\": true"), std::string::npos);
  ASSERT_TRUE(job->Control("resume=1").ok());
  EXPECT_TRUE(job->Read(a, 0, w.data(), 64).ok());
}

TEST(Job, ControlSetsRuleParametersAndRefusesBadLines) {
  std::shared_ptr<Job> job;
  ASSERT_TRUE(Job::Create("m", Options(16, "async"), nullptr, &job).ok());
  ASSERT_TRUE(job->Control(std::string("lr=0.25\n") + std::string(10, '\0')).ok());
  EXPECT_FLOAT_EQ(job->options().model.rule.lr, 1.0f);  // options are what it started with
  EXPECT_NE(job->StatusJson().find("\"lr\": 0.25"), std::string::npos) << job->StatusJson();
  EXPECT_EQ(job->Control("lr=-1").message().rfind("control: lr:", 0), 0u);
  EXPECT_EQ(job->Control("bogus").message().rfind("control: expected", 0), 0u);
  EXPECT_FALSE(job->Control("momentum=0.5").ok());  // sgd has no momentum
}

// The keys of every object in a JSON text, in order of first appearance, by
// the key that holds the object ("" for the outermost; an object in an array
// goes by the array's key).
std::map<std::string, std::vector<std::string>> KeysByObject(const std::string& json) {
  std::map<std::string, std::vector<std::string>> keys;
  struct Open {
    std::string holder;
    bool array;
  };
  std::vector<Open> open;
  std::string last_key;
  for (size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (c == '"') {
      std::string text;
      for (++i; i < json.size() && json[i] != '"'; ++i) text += json[i] == '\\' ? json[++i] : json[i];
      const size_t next = json.find_first_not_of(" \n", i + 1);
      if (next != std::string::npos && json[next] == ':' && !open.empty()) {
        std::vector<std::string>& mine = keys[open.back().holder];
        if (std::find(mine.begin(), mine.end(), text) == mine.end()) mine.push_back(text);
        last_key = text;
      }
    } else if (c == '{' || c == '[') {
      const std::string holder = open.empty() ? "" : open.back().array ? open.back().holder : last_key;
      open.push_back({holder, c == '['});
    } else if (c == '}' || c == ']') {
      open.pop_back();
    }
  }
  return keys;
}

std::vector<std::string> Words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

TEST(Job, StatusHasExactlyTheKeysTheControlLunHeaderLists) {
  std::shared_ptr<Job> job;
  ASSERT_TRUE(Job::Create("m", Options(16, "async"), nullptr, &job).ok());
  job->AddLearner(1, [] {});
  ASSERT_TRUE(job->Control("rank=0:ab12").ok());
  const auto keys = KeysByObject(job->StatusJson());
  EXPECT_EQ(keys.at(""), Words(BLKPS_STATUS_KEYS));
  EXPECT_EQ(keys.at("checkpoint"), Words(BLKPS_STATUS_CHECKPOINT_KEYS));
  EXPECT_EQ(keys.at("learners"), Words(BLKPS_STATUS_LEARNER_KEYS));
  EXPECT_EQ(keys.at("ranks"), Words(BLKPS_STATUS_RANK_KEYS));
}

// A collective rank's heartbeat (rank=<rank>:<run>, from the learners'
// control LUN too) shows in status "ranks", one entry per rank, the
// latest run's; a malformed one is refused in one line and changes nothing.
TEST(Job, RankHeartbeatsShowInStatusOnePerRank) {
  std::shared_ptr<Job> job;
  ASSERT_TRUE(Job::Create("m", Options(16, "async"), nullptr, &job).ok());
  EXPECT_NE(job->StatusJson().find("\"ranks\": []"), std::string::npos) << job->StatusJson();
  ASSERT_TRUE(job->Control("rank=1:0a", "", Job::ControlRights::kLearner).ok());
  ASSERT_TRUE(job->Control("rank=0:0a", "", Job::ControlRights::kLearner).ok());
  ASSERT_TRUE(job->Control("rank=1:ff", "", Job::ControlRights::kLearner).ok());
  const std::string status = job->StatusJson();
  EXPECT_NE(status.find("{\"rank\": 0, \"run\": \"0a\", \"state\": \"live\""), std::string::npos) << status;
  EXPECT_NE(status.find("{\"rank\": 1, \"run\": \"ff\", \"state\": \"live\""), std::string::npos) << status;
  EXPECT_EQ(status.find("\"run\": \"0a\""), status.rfind("\"run\": \"0a\"")) << status;  // rank 1's is ff now
  for (const char* bad : {"rank=1", "rank=x:0a", "rank=65536:0a", "rank=1:0A", "rank=1:"}) {
    const Status s = job->Control(bad, "", Job::ControlRights::kLearner);
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("rank: expected rank=<rank below 65536>:<run"), std::string::npos) << s.message();
  }
  EXPECT_EQ(job->StatusJson().find("\"rank\": 65536"), std::string::npos);
}

TEST(Job, CountersMatchTheStatus) {
  std::shared_ptr<Job> job;
  ASSERT_TRUE(Job::Create("m", Options(40, "async", 64), nullptr, &job).ok());  // 3 blocks
  const size_t slot = job->AddLearner(1, [] {});
  std::vector<float> g(40, 1.0f);
  std::mt19937 rng(5);
  PushInPieces(*job, slot, g, rng);
  PushInPieces(*job, slot, g, rng);
  const float nan = std::nanf("");
  EXPECT_FALSE(job->Write(slot, 0, &nan, 4).ok());
  const Job::Counters c = job->GetCounters();
  EXPECT_EQ(c.params, 40u);
  EXPECT_EQ(c.blocks, 3u);
  EXPECT_EQ(c.global_step, 2u);
  EXPECT_EQ(c.updates, 6u);  // two complete gradients on each of 3 blocks
  EXPECT_EQ(c.rejected_writes, 1u);
  EXPECT_FALSE(c.failed);
  const std::string status = job->StatusJson();
  EXPECT_NE(status.find("\"updates\": 6,"), std::string::npos) << status;
  EXPECT_NE(status.find("\"global_step\": 2,"), std::string::npos) << status;
}

// A control write's caller sees only a SCSI error; the reason is in the
// status JSON until a later control write succeeds.
TEST(Job, RefusedControlWriteLeavesItsReasonInTheStatus) {
  std::shared_ptr<Job> job;
  ASSERT_TRUE(Job::Create("m", Options(16, "async"), nullptr, &job).ok());
  EXPECT_NE(job->StatusJson().find("\"control_error\": \"\""), std::string::npos) << job->StatusJson();
  const Status refused = job->Control("foo=1");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(job->StatusJson().find("\"control_error\": \"" + refused.message() + "\""), std::string::npos)
      << job->StatusJson();
  ASSERT_TRUE(job->Control("lr=0.5").ok());
  EXPECT_NE(job->StatusJson().find("\"control_error\": \"\""), std::string::npos) << job->StatusJson();
}

// Every refused control write counts in the status's control_refused (a
// monitor's counter, blkps_control_refused_total); a later success does
// not reset it.
TEST(Job, RefusedControlWritesAreCountedInTheStatus) {
  std::shared_ptr<Job> job;
  ASSERT_TRUE(Job::Create("m", Options(16, "async"), nullptr, &job).ok());
  job->AddLearner(1, [] {});
  EXPECT_NE(job->StatusJson().find("\"control_refused\": 0,"), std::string::npos) << job->StatusJson();
  EXPECT_FALSE(job->Control("foo=1").ok());
  EXPECT_FALSE(job->Control("fence=7").ok());
  EXPECT_FALSE(job->Control("lr=0.5", "", Job::ControlRights::kLearner).ok());
  ASSERT_TRUE(job->Control("lr=0.5").ok());
  EXPECT_NE(job->StatusJson().find("\"control_refused\": 3,"), std::string::npos) << job->StatusJson();
}

TEST(Job, ControlTagShowsInStatusAndRefusesOddText) {
  std::shared_ptr<Job> job;
  ASSERT_TRUE(Job::Create("m", Options(16, "async"), nullptr, &job).ok());
  EXPECT_NE(job->StatusJson().find("\"tag\": \"\""), std::string::npos) << job->StatusJson();
  ASSERT_TRUE(job->Control("tag=torch:1a2b:b=0\n").ok());
  EXPECT_NE(job->StatusJson().find("\"tag\": \"torch:1a2b:b=0\""), std::string::npos) << job->StatusJson();
  EXPECT_EQ(job->Control("tag=has space").message().rfind("control: tag:", 0), 0u);
  EXPECT_FALSE(job->Control("tag=" + std::string(257, 'a')).ok());
  EXPECT_NE(job->StatusJson().find("\"tag\": \"torch:1a2b:b=0\""), std::string::npos);  // kept
  ASSERT_TRUE(job->Control("tag=").ok());
  EXPECT_NE(job->StatusJson().find("\"tag\": \"\""), std::string::npos);
}

// D1: whatever a client writes, the status stays one JSON object in valid
// UTF-8 for every reader.
TEST(Job, StatusStaysValidUtf8JsonWhateverAClientWrites) {
  std::shared_ptr<Job> job;
  ASSERT_TRUE(Job::Create("m\xff\xc3\xa9", Options(16, "async"), nullptr, &job).ok());
  for (const std::string& block :
       std::vector<std::string>{"tag=\xff", "lr=\xc3", "\x80\xfe=1\n", "tag=a\"b\\c\x01", "tag=\xed\xa0\x80"}) {
    EXPECT_FALSE(job->Control(block).ok());
    const std::string status = job->StatusJson();
    EXPECT_EQ(blkps_test::JsonCheck::Problem(status), "") << status;
  }
  EXPECT_NE(job->StatusJson().find("\"model\": \"m\\ufffd\xc3\xa9\""), std::string::npos) << job->StatusJson();
}

// The rule parameters and tag as the status shows them.
std::string ParamsAndTag(const Job& job) {
  const std::string status = job.StatusJson();
  const size_t tag = status.find("\"tag\"");
  const size_t end = status.find("\"global_step\"");
  return status.substr(tag, end - tag);
}

// D2: a refused block changes nothing, whatever came before the bad line.
TEST(Job, RefusedControlBlockChangesNothing) {
  std::shared_ptr<Job> job;
  JobOptions o = Options(16, "async");
  o.model.rule.name = "momentum";
  o.model.rule.momentum = 0.5f;
  ASSERT_TRUE(Job::Create("m", o, nullptr, &job).ok());
  job->AddLearner(1, [] {});
  ASSERT_TRUE(job->Control("tag=before\n").ok());
  const std::string before = ParamsAndTag(*job);
  for (const std::string& block : std::vector<std::string>{
           "lr=0.3\nfoo=1\n", "lr=0.4\nlr=nan\n", "lr=0.4\nmomentum=2\n", "tag=after\nlr=x\n",
           "momentum=0.1\nresume=0\n", "lr=0.2\nfence=7\n", "lr=0.2\nlr=0.3\n", "tag=after\ntag=again\n"}) {
    EXPECT_FALSE(job->Control(block).ok()) << block;
    EXPECT_EQ(ParamsAndTag(*job), before) << block;
  }
  ASSERT_TRUE(job->Control("lr=0.3\nmomentum=0.25\ntag=after\n").ok());
  EXPECT_NE(job->StatusJson().find("\"lr\": 0.3, \"momentum\": 0.25"), std::string::npos) << job->StatusJson();
}

// D4: one strict grammar.
TEST(Job, ControlGrammarIsStrict) {
  std::shared_ptr<Job> job;
  ASSERT_TRUE(Job::Create("m", Options(16, "async"), nullptr, &job).ok());
  job->AddLearner(1, [] {});
  for (const std::string& block : std::vector<std::string>{"resume=0",
                                                           "resume=2",
                                                           "resume=-1",
                                                           "resume=",
                                                           "resume=1 ",
                                                           "fence=0",
                                                           "fence=99",
                                                           "fence=-1",
                                                           "fence=+1",
                                                           "fence= 1",
                                                           "lr= 0.1",
                                                           "lr=0.1 ",
                                                           " lr=0.1",
                                                           "lr =0.1",
                                                           "lr=0.1\r\n",
                                                           "lr=0.1\n\nlr=0.2",
                                                           std::string("tag=ok\0lr=0.5", 13),
                                                           std::string("tag=ok\n\0\0x\0", 11),
                                                           "lr=0x1p-3z",
                                                           "=1",
                                                           "lr"}) {
    EXPECT_FALSE(job->Control(block).ok()) << blkps_test::JsonCheck::Problem("\"" + block + "\"");
  }
  EXPECT_NE(job->StatusJson().find("\"lr\": 1"), std::string::npos) << job->StatusJson();
  EXPECT_NE(job->StatusJson().find("\"tag\": \"\""), std::string::npos) << job->StatusJson();
  for (const std::string& block : std::vector<std::string>{
           "resume=1", "fence=1\n", std::string("lr=0.5\n") + std::string(500, '\0'), "tag=x\nlr=0.25"}) {
    EXPECT_TRUE(job->Control(block).ok()) << block;
  }
}

class JobCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override { path_ = dir_.path + "/model.ckpt"; }

  JobOptions AdamOptions() {
    JobOptions o = Options(300, "bsp");
    o.model.rule.name = "adam";
    o.model.rule.lr = 0.01f;
    o.checkpoint = path_;
    return o;
  }
  static std::string Slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  blkps_test::TempDir dir_{"blkps-job-test"};
  std::string path_;
};

TEST_F(JobCheckpoint, RestartRestoresWeightsStateAndClocksBitForBit) {
  std::string first;
  std::vector<float> weights;
  {
    std::shared_ptr<Job> job;
    ASSERT_TRUE(Job::Create("m", AdamOptions(), nullptr, &job).ok());
    const size_t a = job->AddLearner(1, [] {}), b = job->AddLearner(2, [] {});
    std::mt19937 rng(5);
    std::vector<float> g(300);
    for (int round = 0; round < 3; ++round) {
      for (size_t slot : {a, b}) {
        for (float& x : g) x = static_cast<float>(rng() % 100) / 10.0f - 5.0f;
        PushInPieces(*job, slot, g, rng);
      }
    }
    PushInPieces(*job, a, g, rng);  // half a round: in the accumulator
    ASSERT_TRUE(job->Control("lr=0.005").ok());
    ASSERT_TRUE(job->Checkpoint().ok());
    first = Slurp(path_);
    weights = ReadAll(*job, 300);
  }
  std::shared_ptr<Job> job;
  ASSERT_TRUE(Job::Create("m", AdamOptions(), nullptr, &job).ok());
  job->AddLearner(1, [] {});
  job->AddLearner(2, [] {});
  EXPECT_EQ(ReadAll(*job, 300), weights);
  ASSERT_TRUE(job->Checkpoint().ok());
  EXPECT_TRUE(blkps_test::SameStateAsTheNextGeneration(first, Slurp(path_), 1))
      << "the state after loading differs from the state saved";
  EXPECT_NE(job->StatusJson().find("\"lr\": 0.005"), std::string::npos);
}

TEST_F(JobCheckpoint, CorruptCheckpointIsRefusedAndKept) {
  {
    std::shared_ptr<Job> job;
    ASSERT_TRUE(Job::Create("m", AdamOptions(), nullptr, &job).ok());
    ASSERT_TRUE(job->Checkpoint().ok());
  }
  std::string bytes = Slurp(path_);
  bytes[bytes.size() / 2] ^= 0x10;
  std::ofstream(path_, std::ios::binary | std::ios::trunc) << bytes;
  std::shared_ptr<Job> job;
  Status s = Job::Create("m", AdamOptions(), nullptr, &job);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("checksum"), std::string::npos) << s.message();
  EXPECT_EQ(Slurp(path_), bytes);  // never replaced
}

TEST_F(JobCheckpoint, CheckpointOfAnotherRuleIsRefused) {
  {
    std::shared_ptr<Job> job;
    ASSERT_TRUE(Job::Create("m", AdamOptions(), nullptr, &job).ok());
    ASSERT_TRUE(job->Checkpoint().ok());
  }
  JobOptions o = AdamOptions();
  o.model.rule.name = "sgd";
  std::shared_ptr<Job> job;
  Status s = Job::Create("m", o, nullptr, &job);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rule=adam"), std::string::npos) << s.message();
}

// A round's clocks count a block's parts (doc/server.md "A gradient in parts"):
// a file written with parts= and a job without them refuse each other.
TEST_F(JobCheckpoint, CheckpointWithOtherGradientPartsIsRefusedEitherWay) {
  for (const bool parts_written : {true, false}) {
    JobOptions written = AdamOptions(), loaded = AdamOptions();
    written.checkpoint = loaded.checkpoint = dir_.path + (parts_written ? "/written-in-parts" : "/loaded-in-parts");
    (parts_written ? written : loaded).parts = GradientParts{0, 32, 2};
    const std::string named = parts_written ? "parts=0:32:2 but" : "parts=(none) but";
    {
      std::shared_ptr<Job> job;
      ASSERT_TRUE(Job::Create("m", written, nullptr, &job).ok());
      ASSERT_TRUE(job->Checkpoint().ok());
    }
    std::shared_ptr<Job> job;
    Status s = Job::Create("m", loaded, nullptr, &job);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find(named), std::string::npos) << s.message();
  }
}

}  // namespace
}  // namespace blkps::server
