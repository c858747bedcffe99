// A 16-bit LUN's WRITE (target-plugin/wire16.cc) through the job, without
// tgt: the model widens it piece by piece as it applies it, and the result
// must be the bits a float32 LUN gives for the same values widened first,
// for every rule and consistency mode (doc/data-path.md "The 16-bit wire's
// conversion").
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "blkps/wire_dtype.hpp"
#include "job.h"
#include "lu_core.h"

namespace blkps::server {
namespace {

using wire::Dtype;

constexpr uint64_t kParams = 10000;  // 3 blocks of 4096 and a short last one
constexpr uint64_t kBlockBytes = 4096 * 4;

struct Case {
  const char* rule;
  bool nesterov;
  const char* mode;
  Dtype dtype;
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.rule << (c.nesterov ? " nesterov " : " ") << c.mode << " " << wire::DtypeName(c.dtype);
}

std::shared_ptr<Job> MakeJob(const Case& c) {
  JobOptions o;
  o.model.num_params = kParams;
  o.model.block_bytes = kBlockBytes;
  o.model.rule.name = c.rule;
  o.model.rule.lr = 0.05f;
  o.model.rule.nesterov = c.nesterov;
  EXPECT_TRUE(ParseConsistency(c.mode, &o.consistency).ok());
  std::shared_ptr<Job> job;
  EXPECT_TRUE(Job::Create("m", o, nullptr, &job).ok());
  return job;
}

uint16_t Narrow1(Dtype t, float f) {
  return t == Dtype::kBfloat16 ? wire::FloatToBfloat16(f) : wire::FloatToFloat16(f);
}
float Widen1(Dtype t, uint16_t h) { return t == Dtype::kBfloat16 ? wire::Bfloat16ToFloat(h) : wire::Float16ToFloat(h); }

// Finite 16-bit gradients over many magnitudes, subnormals and zeros of
// both signs included.
std::vector<uint16_t> Gradient(Dtype t, std::mt19937& rng) {
  std::vector<uint16_t> g(kParams);
  for (uint16_t& h : g) {
    const float f =
        std::ldexp(static_cast<float>(static_cast<int>(rng() % 2001) - 1000), -static_cast<int>(rng() % 34));
    h = Narrow1(t, f);
    if (wire::IsNonFinite16(t, h)) h = 0;
  }
  return g;
}

class Wire16Write : public ::testing::TestWithParam<Case> {};

// Two jobs, one fed through a float32 LUN's path (Job::Write of the values
// widened by the scalar reference), the other through the 16-bit LUN's
// (lu_core::WireWrite of the 16-bit values), the same pushes and reads in
// the same order from two learners, in pieces that start and end anywhere
// (mid-block, mid-chunk, across blocks): the weights and the counters
// must be the same bits after every round.
TEST_P(Wire16Write, GivesTheBitsOfItsWidenedValuesOnAFloat32Lun) {
  const Case c = GetParam();
  std::shared_ptr<Job> wide = MakeJob(c), narrow = MakeJob(c);
  ASSERT_TRUE(wide && narrow);
  const size_t learners = 2;
  const bool bsp = std::string(c.mode) == "bsp";
  std::vector<blkps_lu> lus(learners);
  for (size_t l = 0; l < learners; ++l) {
    ASSERT_EQ(wide->AddLearner(l + 1, [] {}), narrow->AddLearner(l + 1, [] {}));
    lus[l].options.dtype = c.dtype;
    lus[l].job = narrow;
    lus[l].slot = l;
    lus[l].lun = l + 1;
  }
  std::mt19937 rng(24);
  for (int round = 0; round < 4; ++round) {
    for (size_t l = 0; l < learners; ++l) {
      const std::vector<uint16_t> g = Gradient(c.dtype, rng);
      std::vector<float> widened(kParams);
      for (uint64_t i = 0; i < kParams; ++i) widened[i] = Widen1(c.dtype, g[i]);
      for (uint64_t at = 0; at < kParams;) {
        const uint64_t n = std::min<uint64_t>(kParams - at, 1 + rng() % 6000);
        for (Job* job : {wide.get(), narrow.get()}) {
          ASSERT_EQ(job->Admit(l, true, at * 4, n * 4, nullptr), Job::Admission::kRun);
        }
        ASSERT_TRUE(wide->Write(l, at * 4, widened.data() + at, n * 4).ok());
        const Status s = lu_core::WireWrite(&lus[l], at * 2, g.data() + at, n * 2, "");
        ASSERT_TRUE(s.ok()) << s.message();
        at += n;
      }
      // async, ssp: learner 0 reads after each push, learner 1 every other
      // round, so its pushes are stale (ApplyStale's scaled path).
      if (!bsp && (l == 0 || round % 2 == 0)) {
        for (Job* job : {wide.get(), narrow.get()}) {
          ASSERT_EQ(job->Admit(l, false, 0, kParams * 4, nullptr), Job::Admission::kRun);
        }
      }
    }
    for (size_t l = 0; bsp && l < learners; ++l) {  // the round is complete: every read runs
      for (Job* job : {wide.get(), narrow.get()}) {
        ASSERT_EQ(job->Admit(l, false, 0, kParams * 4, nullptr), Job::Admission::kRun);
      }
    }
    std::vector<float> a(kParams), b(kParams);
    ASSERT_TRUE(wide->ReadWeights(0, a.data(), kParams * 4).ok());
    ASSERT_TRUE(narrow->ReadWeights(0, b.data(), kParams * 4).ok());
    ASSERT_EQ(std::memcmp(a.data(), b.data(), kParams * 4), 0) << "round " << round;
    const Job::Counters ca = wide->GetCounters(), cb = narrow->GetCounters();
    EXPECT_EQ(ca.updates, cb.updates);
    EXPECT_EQ(ca.global_step, cb.global_step);
    EXPECT_EQ(cb.rejected_writes, 0u);
  }
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  const std::pair<const char*, bool> rules[] = {{"sgd", false},     {"momentum", false}, {"momentum", true},
                                                {"adagrad", false}, {"adam", false},     {"sum", false},
                                                {"average", false}};
  for (const auto& [rule, nesterov] : rules) {
    for (const char* mode : {"async", "bsp", "ssp:1"}) {
      for (Dtype t : {Dtype::kBfloat16, Dtype::kFloat16}) cases.push_back({rule, nesterov, mode, t});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(RulesModesTypes, Wire16Write, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string name = std::string(info.param.rule) +
                                              (info.param.nesterov ? "_nesterov_" : "_") + info.param.mode + "_" +
                                              wire::DtypeName(info.param.dtype);
                           for (char& ch : name) {
                             if (ch == ':') ch = '_';
                           }
                           return name;
                         });

// A value that is NaN or Inf in the 16-bit type, anywhere in a write that
// spans blocks, refuses the whole write before any of it is applied: no
// weight changes, nothing is counted but the rejection, and the message
// names the parameter.
TEST(Wire16WriteRefusal, ANonFiniteValueRefusesTheWholeWrite) {
  for (Dtype t : {Dtype::kBfloat16, Dtype::kFloat16}) {
    const uint16_t inf = t == Dtype::kBfloat16 ? 0x7f80 : 0x7c00;
    for (uint16_t poison : {inf, static_cast<uint16_t>(inf | 1), static_cast<uint16_t>(inf | 0x8000)}) {
      std::shared_ptr<Job> job = MakeJob({"sgd", false, "async", t});
      ASSERT_TRUE(job);
      blkps_lu lu;
      lu.options.dtype = t;
      lu.job = job;
      lu.slot = job->AddLearner(1, [] {});
      std::vector<float> before(kParams), after(kParams);
      ASSERT_TRUE(job->ReadWeights(0, before.data(), kParams * 4).ok());
      std::vector<uint16_t> g(kParams, Narrow1(t, 1.0f));
      g[9000] = poison;  // in the last block: the blocks before it would be applied first
      ASSERT_EQ(job->Admit(lu.slot, true, 0, kParams * 4, nullptr), Job::Admission::kRun);
      const Status s = lu_core::WireWrite(&lu, 0, g.data(), kParams * 2, "");
      EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
      EXPECT_EQ(s.message(), std::string("gradient for parameter 9000 is ") + (poison & 1 ? "NaN" : "infinite") +
                                 "; the whole write was rejected");
      ASSERT_TRUE(job->ReadWeights(0, after.data(), kParams * 4).ok());
      EXPECT_EQ(std::memcmp(before.data(), after.data(), kParams * 4), 0) << "a refused write changed weights";
      const Job::Counters counters = job->GetCounters();
      EXPECT_EQ(counters.rejected_writes, 1u);
      EXPECT_EQ(counters.updates, 0u);
    }
  }
}

}  // namespace
}  // namespace blkps::server
