// Update rules against double-precision references written straight from the
// equations in aggregator/update_rule.h.
#include "update_rule.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace blkps::server {
namespace {

// One parameter as the reference sees it: the weight and every rule's state.
struct RefParam {
  double w = 0, m = 0, v = 0, s = 0;
  uint64_t t = 0;
};

// One update of one parameter with gradient g, with the rule's parameters as
// they are in `o` at that moment.
using RefStep = void (*)(const RuleOptions& o, double g, RefParam* p);

void SgdRef(const RuleOptions& o, double g, RefParam* p) { p->w -= o.lr * g; }

void MomentumRef(const RuleOptions& o, double g, RefParam* p) {
  const double lr = o.lr, mu = o.momentum;
  p->v = mu * p->v + g;
  p->w -= o.nesterov ? lr * (g + mu * p->v) : lr * p->v;
}

void AdagradRef(const RuleOptions& o, double g, RefParam* p) {
  p->s += g * g;
  p->w -= o.lr * g / (std::sqrt(p->s) + o.adagrad_eps);
}

void AdamRef(const RuleOptions& o, double g, RefParam* p) {
  const double lr = o.lr, b1 = o.beta1, b2 = o.beta2;
  p->t += 1;
  p->m = b1 * p->m + (1 - b1) * g;
  p->v = b2 * p->v + (1 - b2) * g * g;
  const double m_hat = p->m / (1 - std::pow(b1, static_cast<double>(p->t)));
  const double v_hat = p->v / (1 - std::pow(b2, static_cast<double>(p->t)));
  p->w -= lr * m_hat / (std::sqrt(v_hat) + o.eps);
}

void SumRef(const RuleOptions&, double g, RefParam* p) { p->w += g; }

void AverageRef(const RuleOptions& o, double g, RefParam* p) { p->w += o.lr * g; }

std::unique_ptr<UpdateRule> Make(const RuleOptions& o, uint64_t num_params) {
  std::unique_ptr<UpdateRule> rule;
  Status s = MakeUpdateRule(o, num_params, &rule);
  EXPECT_TRUE(s.ok()) << s.message();
  return rule;
}

RuleOptions Named(const std::string& name, float lr = 0.01f) {
  RuleOptions o;
  o.name = name;
  o.lr = lr;
  return o;
}

constexpr size_t kParams = 1000;
constexpr int kSteps = 50;

// A SetParam(key, value) made during step `step` of a history, after that
// step's first Apply() call: the step's other ranges already see the value.
struct Change {
  int step;
  std::string key;
  float value;
};

// The *MatchesReference tests' learning-rate change, halfway (sum has none).
const std::vector<Change> kLrHalfway = {{kSteps / 2, "lr", 0.004f}};

// Runs one seeded history through a rule (an UpdateRule or the Reference):
// random starting weights, then kSteps steps of N(0,1) gradients over kParams
// parameters. Each step cuts [0, kParams) at random points into ragged
// ranges (length 1 upwards) and applies each range with its own Apply() call
// in shuffled order, skipping about a quarter of them, so parameters see
// different numbers of updates. `changes` are made as they say. Returns the
// weights.
template <typename Rule>
std::vector<float> RunHistory(Rule* rule, uint32_t seed, const std::vector<Change>& changes) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(kParams);
  for (float& x : w) x = uniform(rng);
  std::vector<float> g(kParams);
  for (int step = 0; step < kSteps; ++step) {
    for (float& x : g) x = normal(rng);
    std::vector<size_t> cuts = {0, kParams};
    const int pieces = std::uniform_int_distribution<int>(1, 12)(rng);
    for (int i = 1; i < pieces; ++i) cuts.push_back(std::uniform_int_distribution<size_t>(1, kParams - 1)(rng));
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    std::vector<size_t> order(cuts.size() - 1);
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    int calls = 0;
    for (size_t r : order) {
      const size_t first = cuts[r], n = cuts[r + 1] - cuts[r];
      if (std::uniform_int_distribution<int>(0, 3)(rng) == 0) continue;  // not updated this step
      rule->Apply(first, w.data() + first, g.data() + first, n);
      if (++calls > 1) continue;
      for (const Change& c : changes) {
        if (c.step != step) continue;
        Status s = rule->SetParam(c.key, c.value);
        EXPECT_TRUE(s.ok()) << c.key << ": " << s.message();
      }
    }
  }
  return w;
}

// Replays a rule's Apply() and SetParam() calls on the reference, so the
// reference sees exactly the history RunHistory() gives the rule under test.
class Reference {
 public:
  Reference(const RuleOptions& o, RefStep step) : opts_(o), step_(step), params_(kParams) {}
  void Apply(uint64_t first, float* w, const float* g, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      RefParam& p = params_[first + i];
      if (!seen_[first + i]) p.w = w[i];  // the starting weight
      seen_[first + i] = true;
      step_(opts_, g[i], &p);
      w[i] = static_cast<float>(p.w);  // the caller's copy; the reference keeps its own in double
    }
  }
  // Sets the option that `key` names in params(): "eps" is adagrad's
  // adagrad_eps. Ranges are the rule's business; the reference takes any value.
  Status SetParam(const std::string& key, float value) {
    float* field = key == "lr"         ? &opts_.lr
                   : key == "momentum" ? &opts_.momentum
                   : key == "beta1"    ? &opts_.beta1
                   : key == "beta2"    ? &opts_.beta2
                   : key == "eps"      ? (opts_.name == "adagrad" ? &opts_.adagrad_eps : &opts_.eps)
                                       : nullptr;
    if (field == nullptr) return Status::InvalidArgument(key + ": not a parameter the reference knows");
    *field = value;
    return Status::OK();
  }
  // Final weights: the double reference where a parameter was updated, else
  // the untouched starting weight.
  std::vector<double> Weights(const std::vector<float>& replayed) const {
    std::vector<double> out(kParams);
    for (size_t i = 0; i < kParams; ++i) out[i] = seen_[i] ? params_[i].w : replayed[i];
    return out;
  }
  const RefParam& param(size_t i) const { return params_[i]; }

 private:
  RuleOptions opts_;
  const RefStep step_;
  std::vector<RefParam> params_;
  std::vector<bool> seen_ = std::vector<bool>(kParams, false);
};

// Float rule vs double reference on the same history: every weight within a
// relative 1e-5 (absolute 1e-5 near zero).
void ExpectMatchesReference(const RuleOptions& o, RefStep step, const std::vector<Change>& changes = kLrHalfway,
                            uint32_t seed = 7) {
  std::unique_ptr<UpdateRule> rule = Make(o, kParams);
  ASSERT_NE(rule, nullptr);
  Reference ref(o, step);
  const std::vector<float> got = RunHistory(rule.get(), seed, changes);
  const std::vector<double> want = ref.Weights(RunHistory(&ref, seed, changes));
  size_t bad = 0, worst = 0;
  double worst_err = 0;
  for (size_t i = 0; i < kParams; ++i) {
    const double err = std::abs(got[i] - want[i]) / std::max(1.0, std::abs(want[i]));
    if (err > 1e-5) ++bad;
    if (err > worst_err) worst_err = err, worst = i;
  }
  EXPECT_EQ(bad, 0u) << o.name << ": worst relative error " << worst_err << " at parameter " << worst << " (got "
                     << got[worst] << ", want " << want[worst] << ")";
}

TEST(UpdateRule, SgdMatchesReference) { ExpectMatchesReference(Named("sgd"), SgdRef); }

TEST(UpdateRule, MomentumMatchesReference) { ExpectMatchesReference(Named("momentum"), MomentumRef); }

TEST(UpdateRule, NesterovMomentumMatchesReference) {
  RuleOptions o = Named("momentum");
  o.nesterov = true;
  ExpectMatchesReference(o, MomentumRef);
}

TEST(UpdateRule, MomentumWithOtherMuMatchesReference) {
  RuleOptions o = Named("momentum");
  o.momentum = 0.5f;
  o.nesterov = true;
  ExpectMatchesReference(o, MomentumRef);
}

TEST(UpdateRule, AdagradMatchesReference) { ExpectMatchesReference(Named("adagrad", 0.1f), AdagradRef); }

TEST(UpdateRule, AdagradWithLargeEpsMatchesReference) {
  RuleOptions o = Named("adagrad", 0.1f);
  o.adagrad_eps = 0.5f;
  ExpectMatchesReference(o, AdagradRef);
}

TEST(UpdateRule, AdamMatchesReference) { ExpectMatchesReference(Named("adam"), AdamRef); }

TEST(UpdateRule, AdamWithOtherBetasAndEpsMatchesReference) {
  RuleOptions o = Named("adam");
  o.beta1 = 0.5f;
  o.beta2 = 0.9f;
  o.eps = 0.1f;
  ExpectMatchesReference(o, AdamRef);
}

TEST(UpdateRule, SumMatchesReference) { ExpectMatchesReference(Named("sum"), SumRef, {}); }

TEST(UpdateRule, AverageMatchesReference) { ExpectMatchesReference(Named("average", 0.25f), AverageRef); }

// The rule follows `changes` as the reference does, and each change matters:
// leaving any one out moves some weight by more than 100× the tolerance, so
// the match is not just the change being too small to see.
void ExpectFollowsChanges(const RuleOptions& o, RefStep step, const std::vector<Change>& changes) {
  ExpectMatchesReference(o, step, changes);
  const std::vector<float> all = RunHistory(Make(o, kParams).get(), 7, changes);
  for (size_t skip = 0; skip < changes.size(); ++skip) {
    std::vector<Change> others = changes;
    others.erase(others.begin() + skip);
    const std::vector<float> without = RunHistory(Make(o, kParams).get(), 7, others);
    double max_diff = 0;
    for (size_t i = 0; i < kParams; ++i) max_diff = std::max(max_diff, double(std::abs(all[i] - without[i])));
    EXPECT_GT(max_diff, 1e-3) << o.name << ": changing " << changes[skip].key << " at step " << changes[skip].step
                              << " made no visible difference";
  }
}

// A fresh gradient (staleness 0) is exactly Apply(), bit for bit, for every
// rule: one learner in async is unchanged.
TEST(UpdateRule, ApplyStaleWithStalenessZeroIsApply) {
  for (const char* name : {"sgd", "momentum", "adagrad", "adam", "sum", "average"}) {
    for (bool nesterov : {false, true}) {
      RuleOptions o = Named(name, 0.05f);
      o.nesterov = nesterov;
      std::unique_ptr<UpdateRule> plain = Make(o, 64), stale = Make(o, 64);
      std::vector<float> a(64, 0.5f), b(64, 0.5f), g(64);
      std::mt19937 rng(8);
      for (int step = 0; step < 20; ++step) {
        for (float& x : g) x = std::uniform_real_distribution<float>(-1, 1)(rng);
        plain->Apply(0, a.data(), g.data(), 64);
        stale->ApplyStale(0, b.data(), g.data(), 64, 0);
      }
      EXPECT_EQ(a, b) << name;
    }
  }
}

// The default for a stale gradient: Apply() to g/(1+staleness).
TEST(UpdateRule, StaleGradientIsScaledByOneOverOnePlusStaleness) {
  std::unique_ptr<UpdateRule> rule = Make(Named("sgd", 0.5f), 4);
  std::vector<float> w(4, 0.0f);
  const std::vector<float> g(4, 1.0f);
  rule->ApplyStale(0, w.data(), g.data(), 4, 3);
  EXPECT_EQ(w, std::vector<float>(4, -0.125f));
}

// Every rule with the default staleness-aware step takes g/N in its own loop
// (ApplyScaled): the same steps, state included, as Apply() of g/N computed
// beforehand, whatever the rule keeps. (adagrad's and adam's steps hardly
// change with the gradient's scale; sgd's catches a scale left out.)
TEST(UpdateRule, StaleStepOfEveryRuleIsItsStepOfTheScaledGradient) {
  for (const char* name : {"sgd", "adagrad", "adam"}) {
    std::unique_ptr<UpdateRule> stale = Make(Named(name, 0.05f), 64), scaled = Make(Named(name, 0.05f), 64);
    std::vector<float> a(64, 0.5f), b(64, 0.5f), g(64), g4(64);
    std::mt19937 rng(9);
    for (int step = 0; step < 20; ++step) {
      for (size_t i = 0; i < g.size(); ++i) {
        g[i] = std::uniform_real_distribution<float>(-1, 1)(rng);
        g4[i] = 0.25f * g[i];
      }
      stale->ApplyStale(0, a.data(), g.data(), 64, 3);
      scaled->Apply(0, b.data(), g4.data(), 64);
    }
    for (size_t i = 0; i < a.size(); ++i) EXPECT_FLOAT_EQ(a[i], b[i]) << name << " parameter " << i;
    EXPECT_NE(a, std::vector<float>(64, 0.5f)) << name;
  }
}

// sum and average are exact accumulators: a stale push is added as written
// (delta mode's changes, exactly-once counts).
TEST(UpdateRule, SumAndAverageAddStalePushesAsWritten) {
  for (const char* name : {"average", "sum"}) {
    std::unique_ptr<UpdateRule> rule = Make(Named(name, 0.5f), 4);
    std::vector<float> w(4, 0.0f);
    const std::vector<float> g(4, 1.0f);
    rule->ApplyStale(0, w.data(), g.data(), 4, 3);
    EXPECT_EQ(w, std::vector<float>(4, std::string(name) == "sum" ? 1.0f : 0.5f)) << name;
  }
}

// momentum, a push of staleness N-1: v = d·v + c·g with d = μ^(1/N),
// c = (1-d)/(1-μ), then the rule's step with lr/N (aggregator/update_rule.cc).
TEST(UpdateRule, StaleMomentumIsOneNthOfARound) {
  for (bool nesterov : {false, true}) {
    RuleOptions o = Named("momentum", 0.05f);
    o.nesterov = nesterov;
    for (uint64_t learners : {2, 4, 8}) {
      std::unique_ptr<UpdateRule> rule = Make(o, 1);
      double v = 0, w = 0;
      float wf = 0.0f;
      const float gs[] = {1.0f, -0.5f, 2.0f, 0.25f};
      const double n = static_cast<double>(learners), d = std::pow(0.9, 1.0 / n), c = (1 - d) / (1 - 0.9);
      for (float g : gs) {
        rule->ApplyStale(0, &wf, &g, 1, learners - 1);
        v = d * v + c * g;
        w -= 0.05 / n * (nesterov ? c * g + d * v : v);
      }
      EXPECT_NEAR(wf, w, 1e-6) << learners << " learners, nesterov " << nesterov;
      EXPECT_NEAR(*static_cast<const float*>(rule->state()[0].data), v, 1e-6);
    }
  }
}

// N learners pushing a steady gradient, each push N-1 updates stale, move
// the model per round of N pushes as one process does per step: lr·g/(1-μ)
// (doc/async.md "Gradient mode: staleness-aware steps in the server").
TEST(UpdateRule, StaleMomentumRoundMovesAsOneProcessStep) {
  for (uint64_t learners : {1, 2, 4, 8}) {
    std::unique_ptr<UpdateRule> rule = Make(Named("momentum", 0.05f), 1);
    float w = 0.0f;
    const float g = 1.0f;
    for (int push = 0; push < 400 * static_cast<int>(learners); ++push) rule->ApplyStale(0, &w, &g, 1, learners - 1);
    const float before = w;
    for (uint64_t push = 0; push < learners; ++push) rule->ApplyStale(0, &w, &g, 1, learners - 1);
    EXPECT_NEAR(before - w, 0.05 / (1 - 0.9), 1e-3) << learners << " learners";
  }
}

TEST(UpdateRule, SgdFollowsLrChanges) {
  ExpectFollowsChanges(Named("sgd"), SgdRef, {{10, "lr", 0.03f}, {30, "lr", 0.002f}});
}

TEST(UpdateRule, MomentumFollowsLrAndMomentumChanges) {
  ExpectFollowsChanges(Named("momentum"), MomentumRef,
                       {{10, "momentum", 0.5f}, {20, "lr", 0.004f}, {35, "momentum", 0.99f}});
}

TEST(UpdateRule, NesterovMomentumFollowsLrAndMomentumChanges) {
  RuleOptions o = Named("momentum");
  o.nesterov = true;
  ExpectFollowsChanges(o, MomentumRef, {{10, "momentum", 0.0f}, {20, "lr", 0.004f}, {35, "momentum", 0.8f}});
}

TEST(UpdateRule, AdagradFollowsLrAndEpsChanges) {
  ExpectFollowsChanges(Named("adagrad", 0.1f), AdagradRef, {{15, "eps", 0.5f}, {30, "lr", 0.03f}});
}

TEST(UpdateRule, AdamFollowsChangesOfEveryParameter) {
  ExpectFollowsChanges(Named("adam"), AdamRef,
                       {{10, "beta1", 0.5f}, {20, "lr", 0.003f}, {30, "beta2", 0.9f}, {40, "eps", 0.1f}});
}

TEST(UpdateRule, AdamFollowsLrAndBeta1ChangedInTheSameStep) {
  ExpectFollowsChanges(Named("adam"), AdamRef, {{5, "lr", 0.05f}, {5, "beta1", 0.6f}});
}

TEST(UpdateRule, AverageFollowsLrChanges) {
  ExpectFollowsChanges(Named("average", 0.25f), AverageRef, {{10, "lr", 0.5f}, {30, "lr", 0.125f}});
}

TEST(UpdateRule, NesterovDiffersFromPlainMomentum) {
  RuleOptions plain = Named("momentum");
  RuleOptions nesterov = plain;
  nesterov.nesterov = true;
  const std::vector<float> a = RunHistory(Make(plain, kParams).get(), 7, kLrHalfway);
  const std::vector<float> b = RunHistory(Make(nesterov, kParams).get(), 7, kLrHalfway);
  double max_diff = 0;
  for (size_t i = 0; i < kParams; ++i) max_diff = std::max(max_diff, double(std::abs(a[i] - b[i])));
  EXPECT_GT(max_diff, 1e-2);
}

TEST(UpdateRule, SetParamTakesEffectOnTheNextApply) {
  std::unique_ptr<UpdateRule> rule = Make(Named("sgd", 0.5f), 4);
  float w[4] = {0, 0, 0, 0};
  const float g[4] = {1, 1, 1, 1};
  rule->Apply(0, w, g, 4);
  EXPECT_EQ(w[0], -0.5f);
  ASSERT_TRUE(rule->SetParam("lr", 0.25f).ok());
  EXPECT_EQ(rule->lr(), 0.25f);
  rule->Apply(0, w, g, 4);
  EXPECT_EQ(w[0], -0.75f);
}

TEST(UpdateRule, SumHasNoParametersAndIgnoresTheLearningRate) {
  std::unique_ptr<UpdateRule> rule = Make(Named("sum", 0.5f), 2);
  EXPECT_TRUE(rule->params().empty());
  EXPECT_EQ(rule->lr(), 0.0f);
  Status s = rule->SetParam("lr", 7.0f);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "lr: rule sum has no parameter 'lr' (it has none)");
  float w[2] = {1, 2};
  const float g[2] = {3, -4};
  rule->Apply(0, w, g, 2);
  rule->Apply(0, w, g, 2);
  EXPECT_EQ(w[0], 7.0f);
  EXPECT_EQ(w[1], -6.0f);
}

using Params = std::vector<std::pair<std::string, float>>;

// Creation values that differ from RuleOptions' defaults and from each other,
// so params() showing the wrong field is caught.
RuleOptions Distinct(const std::string& name) {
  RuleOptions o = Named(name, 0.03f);
  o.momentum = 0.7f;
  o.beta1 = 0.8f;
  o.beta2 = 0.95f;
  o.eps = 1e-6f;
  o.adagrad_eps = 1e-9f;
  return o;
}

// What params() lists for each rule made from Distinct(name).
const struct {
  const char* name;
  Params params;
} kParamsOf[] = {
    {"sgd", {{"lr", 0.03f}}},
    {"momentum", {{"lr", 0.03f}, {"momentum", 0.7f}}},
    {"adagrad", {{"lr", 0.03f}, {"eps", 1e-9f}}},
    {"adam", {{"lr", 0.03f}, {"beta1", 0.8f}, {"beta2", 0.95f}, {"eps", 1e-6f}}},
    {"sum", {}},
    {"average", {{"lr", 0.03f}}},
};

bool IsDecay(const std::string& key) { return key == "momentum" || key == "beta1" || key == "beta2"; }

TEST(UpdateRule, ParamsListTheRuleParametersWithTheirCreationValues) {
  for (const auto& c : kParamsOf) {
    EXPECT_EQ(Make(Distinct(c.name), 10)->params(), c.params) << c.name;
  }
}

TEST(UpdateRule, SetParamChangesThatParameterOnly) {
  for (const auto& c : kParamsOf) {
    for (size_t k = 0; k < c.params.size(); ++k) {
      std::unique_ptr<UpdateRule> rule = Make(Distinct(c.name), 10);
      const std::string& key = c.params[k].first;
      const float value = IsDecay(key) ? 0.0f : 2.5f;  // 0: a decay's lower bound is in range
      Status s = rule->SetParam(key, value);
      EXPECT_TRUE(s.ok()) << c.name << " " << key << ": " << s.message();
      Params want = c.params;
      want[k].second = value;
      EXPECT_EQ(rule->params(), want) << c.name << " " << key;
    }
  }
}

TEST(UpdateRule, SetParamRefusesAKeyTheRuleDoesNotUse) {
  std::unique_ptr<UpdateRule> adam = Make(Named("adam"), 10);
  Status s = adam->SetParam("momentum", 0.5f);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "momentum: rule adam has no parameter 'momentum' (its parameters: lr, beta1, beta2, eps)");

  for (const auto& c : kParamsOf) {
    std::unique_ptr<UpdateRule> rule = Make(Distinct(c.name), 10);
    std::string listed;
    for (const auto& [key, value] : c.params) listed += (listed.empty() ? "" : ", ") + key;
    // "nesterov" is fixed at creation, "adagrad_eps" is adagrad's "eps".
    for (const std::string key : {"lr", "momentum", "beta1", "beta2", "eps", "nesterov", "adagrad_eps", "LR", "mu"}) {
      const bool used = std::any_of(c.params.begin(), c.params.end(), [&](const auto& p) { return p.first == key; });
      if (used) continue;
      s = rule->SetParam(key, 0.5f);
      EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << c.name << " " << key;
      EXPECT_EQ(s.message(), key + ": rule " + c.name + " has no parameter '" + key + "' (" +
                                 (listed.empty() ? "it has none" : "its parameters: " + listed) + ")");
      EXPECT_EQ(rule->params(), c.params) << c.name << " " << key;
    }
  }
}

TEST(UpdateRule, SetParamRefusesValuesOutOfRangeAsMakeUpdateRuleDoes) {
  const struct {
    float value;
    const char* shown;
  } positive_bad[] = {{0.0f, "0"}, {-0.01f, "-0.01"}, {NAN, "nan"}, {INFINITY, "inf"}, {-INFINITY, "-inf"}},
    decay_bad[] = {{1.0f, "1"}, {1.5f, "1.5"}, {-0.1f, "-0.1"}, {NAN, "nan"}, {INFINITY, "inf"}};
  for (const auto& c : kParamsOf) {
    std::unique_ptr<UpdateRule> rule = Make(Distinct(c.name), 10);
    for (const auto& [key, value] : c.params) {
      const bool decay = IsDecay(key);
      for (const auto& bad : decay ? decay_bad : positive_bad) {
        const std::string range = decay ? "a number in [0, 1)" : "a finite number > 0";
        Status s = rule->SetParam(key, bad.value);
        EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << c.name << " " << key << "=" << bad.shown;
        EXPECT_EQ(s.message(), key + ": expected " + range + ", got " + bad.shown);
        EXPECT_EQ(rule->params(), c.params) << c.name << " " << key << "=" << bad.shown;
      }
    }
  }
}

// Another thread changes lr and μ as fast as it can while this one applies
// the same gradient to every parameter: parameters with one history stay
// equal only if each Apply() uses one set of values for its whole range.
TEST(UpdateRule, EachApplyUsesOneSetOfValuesWhileAnotherThreadSetsThem) {
  constexpr size_t kN = 4096;  // a multiple of the loops' chunk: no scalar tail
  std::unique_ptr<UpdateRule> rule = Make(Named("momentum"), kN);
  const float* v = static_cast<const float*>(rule->state()[0].data);
  std::atomic<bool> done{false};
  std::atomic<int> changes{0};
  std::thread tuner([&] {
    for (int i = 0; !done.load(); ++i) {
      const bool ok =
          rule->SetParam("lr", i % 2 ? 0.01f : 0.02f).ok() && rule->SetParam("momentum", i % 3 ? 0.5f : 0.9f).ok();
      if (ok) changes.fetch_add(1);
    }
  });
  std::vector<float> w(kN, 0.0f);
  const std::vector<float> g(kN, 1.0f);
  bool uniform = true;
  int calls = 0;
  for (; uniform && (calls < 200 || changes.load() < 2000); ++calls) {
    rule->Apply(0, w.data(), g.data(), kN);
    uniform = std::all_of(w.begin(), w.end(), [&](float x) { return x == w[0]; }) &&
              std::all_of(v, v + kN, [&](float x) { return x == v[0]; });
  }
  done.store(true);
  tuner.join();
  EXPECT_TRUE(uniform) << "after Apply() call " << calls;
}

TEST(UpdateRule, AdamCountsStepsPerParameter) {
  std::unique_ptr<UpdateRule> rule = Make(Named("adam"), 20);
  std::vector<float> w(20, 0.0f), g(20, 1.0f);
  rule->Apply(0, w.data(), g.data(), 10);          // [0, 10)
  rule->Apply(0, w.data(), g.data(), 10);          // [0, 10)
  rule->Apply(5, w.data() + 5, g.data() + 5, 10);  // [5, 15)
  const std::vector<StateArray> state = rule->state();
  ASSERT_EQ(state.size(), 3u);
  ASSERT_STREQ(state[2].name, "adam.t");
  const uint32_t* t = static_cast<const uint32_t*>(state[2].data);
  for (size_t i = 0; i < 20; ++i) {
    const uint32_t want = i < 5 ? 2 : i < 10 ? 3 : i < 15 ? 1 : 0;
    EXPECT_EQ(t[i], want) << "parameter " << i;
  }
  // Adam's first step moves each parameter by lr·sign(g) whatever its history.
  EXPECT_NEAR(w[12], -0.01f, 1e-7);
  EXPECT_NEAR(w[2], -0.02f, 1e-7);
}

TEST(UpdateRule, AdamStepCountSaturatesInsteadOfWrapping) {
  std::unique_ptr<UpdateRule> rule = Make(Named("adam"), 1);
  uint32_t* t = static_cast<uint32_t*>(rule->state()[2].data);
  *t = std::numeric_limits<uint32_t>::max();
  float w = 0;
  const float g = 1;
  rule->Apply(0, &w, &g, 1);
  EXPECT_EQ(*t, std::numeric_limits<uint32_t>::max());
  EXPECT_TRUE(std::isfinite(w));
  // With corrections of 1: m = 0.1, v = 0.001, step = lr·0.1/sqrt(0.001).
  EXPECT_NEAR(w, -0.01 * 0.1 / std::sqrt(0.001), 1e-6);
}

TEST(UpdateRule, StateBytesPerParamAreExact) {
  const struct {
    const char* name;
    size_t bytes;
  } cases[] = {{"sgd", 0}, {"momentum", 4}, {"adagrad", 4}, {"adam", 12}, {"sum", 0}, {"average", 0}};
  for (const auto& c : cases) {
    EXPECT_EQ(Make(Named(c.name), 10)->state_bytes_per_param(), c.bytes) << c.name;
  }
}

TEST(UpdateRule, StateArraysAreZeroedPageAlignedAndSumToStateBytes) {
  constexpr uint64_t kN = 12345;
  const long page = sysconf(_SC_PAGESIZE);
  for (const char* name : {"sgd", "momentum", "adagrad", "adam", "sum", "average"}) {
    std::unique_ptr<UpdateRule> rule = Make(Named(name), kN);
    size_t total = 0;
    for (const StateArray& a : rule->state()) {
      EXPECT_EQ(std::string(a.name).rfind(std::string(name) + ".", 0), 0u) << a.name;
      ASSERT_NE(a.data, nullptr) << a.name;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data) % page, 0u) << a.name;
      const unsigned char* bytes = static_cast<const unsigned char*>(a.data);
      EXPECT_TRUE(std::all_of(bytes, bytes + a.bytes, [](unsigned char b) { return b == 0; })) << a.name;
      total += a.bytes;
    }
    EXPECT_EQ(total, kN * rule->state_bytes_per_param()) << name;
  }
}

TEST(UpdateRule, InvalidParametersAreRefusedNamingTheOption) {
  const struct {
    void (*set)(RuleOptions*);
    const char* want;  // the message starts with this
  } cases[] = {
      {[](RuleOptions* o) { o->momentum = 1.5f; }, "momentum: expected a number in [0, 1), got 1.5"},
      {[](RuleOptions* o) { o->momentum = 1.0f; }, "momentum: expected a number in [0, 1), got 1"},
      {[](RuleOptions* o) { o->momentum = -0.1f; }, "momentum: "},
      {[](RuleOptions* o) { o->momentum = NAN; }, "momentum: expected a number in [0, 1), got nan"},
      {[](RuleOptions* o) { o->beta1 = 1.0f; }, "beta1: expected a number in [0, 1), got 1"},
      {[](RuleOptions* o) { o->beta2 = -0.5f; }, "beta2: expected a number in [0, 1), got -0.5"},
      {[](RuleOptions* o) { o->eps = 0.0f; }, "eps: expected a finite number > 0, got 0"},
      {[](RuleOptions* o) { o->eps = INFINITY; }, "eps: expected a finite number > 0, got inf"},
      {[](RuleOptions* o) { o->adagrad_eps = -1e-10f; }, "adagrad_eps: expected a finite number > 0, got -1e-10"},
      {[](RuleOptions* o) { o->lr = 0.0f; }, "lr: expected a finite number > 0, got 0"},
      {[](RuleOptions* o) { o->lr = NAN; }, "lr: "},
  };
  for (const char* name : {"sgd", "momentum", "adam"}) {
    for (const auto& c : cases) {
      RuleOptions o = Named(name);
      c.set(&o);
      std::unique_ptr<UpdateRule> rule;
      Status s = MakeUpdateRule(o, 10, &rule);
      EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << c.want;
      EXPECT_EQ(s.message().rfind(c.want, 0), 0u) << "got: " << s.message();
      EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
      EXPECT_EQ(rule, nullptr);
    }
  }
}

TEST(UpdateRule, UnknownRuleListsTheKnownOnes) {
  std::unique_ptr<UpdateRule> rule;
  Status s = MakeUpdateRule(Named("rmsprop"), 10, &rule);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "rule: unknown update rule 'rmsprop' (known: sgd, momentum, adagrad, adam, sum, average)");
  EXPECT_EQ(rule, nullptr);
}

TEST(UpdateRule, EveryKnownNameCreatesThatRule) {
  for (const char* name : {"sgd", "momentum", "adagrad", "adam", "sum", "average"}) {
    EXPECT_NE(std::string(kUpdateRuleNames).find(name), std::string::npos) << name;
    std::unique_ptr<UpdateRule> rule = Make(Named(name), 10);
    ASSERT_NE(rule, nullptr) << name;
    EXPECT_STREQ(rule->name(), name);
  }
}

}  // namespace
}  // namespace blkps::server
