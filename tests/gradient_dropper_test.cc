// GradientDropper (learner/src/gradient_dropper.h): the residual bookkeeping
// of gradient dropping, without a server. Gradients are small integers, so
// every sum below is exact in float and compared with ==.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gradient_dropper.h"

namespace blkps_test {
namespace {

using blkps::GradientDropper;

// Pushes `grad` through the dropper: adds the selected ranges into `server`
// (what a rule=sum server holds) and returns them.
std::vector<GradientDropper::Range> PushInto(GradientDropper& dropper, std::vector<float> grad,
                                             std::vector<double>* server) {
  const std::vector<GradientDropper::Range> ranges = dropper.Select(grad.data());
  for (const GradientDropper::Range& r : ranges) {
    for (uint64_t i = r.first; i < r.first + r.count; ++i) (*server)[i] += grad[i];
  }
  return ranges;
}

std::vector<float> RandomIntegers(std::mt19937& rng, uint64_t count) {
  std::uniform_int_distribution<int> value(-8, 8);
  std::vector<float> g(count);
  for (float& v : g) v = static_cast<float>(value(rng));
  return g;
}

void ExpectNothingLost(const GradientDropper& dropper, const std::vector<double>& server,
                       const std::vector<double>& given, int step) {
  for (uint64_t i = 0; i < dropper.count(); ++i) {
    ASSERT_EQ(server[i] + dropper.residual()[i], given[i])
        << "after step " << step << ", parameter " << i << ": pushed + residual is not the sum of the gradients given";
  }
}

// `steps` steps of random integer gradients through the dropper, checking
// after each that nothing was lost.
void PushRandomSteps(GradientDropper& dropper, std::mt19937& rng, int steps, std::vector<double>* server,
                     std::vector<double>* given) {
  for (int step = 0; step < steps; ++step) {
    const std::vector<float> g = RandomIntegers(rng, dropper.count());
    for (uint64_t i = 0; i < dropper.count(); ++i) (*given)[i] += g[i];
    PushInto(dropper, g, server);
    ExpectNothingLost(dropper, *server, *given, step);
  }
}

TEST(GradientDropper, PushedPlusResidualIsExactlyTheSumOfAllGradients) {
  // 1000 parameters in runs of 64 (the last run is 40), 99% dropped.
  constexpr uint64_t kCount = 1000;
  GradientDropper dropper(kCount, 64, 0, 0.99);
  std::mt19937 rng(11);
  std::vector<double> server(kCount), given(kCount);
  PushRandomSteps(dropper, rng, 500, &server, &given);
}

TEST(GradientDropper, SelectAllPushesTheGradientWithTheWholeResidual) {
  constexpr uint64_t kCount = 300;
  GradientDropper dropper(kCount, 32, 0, 0.9);
  std::mt19937 rng(17);
  std::vector<double> server(kCount), given(kCount);
  PushRandomSteps(dropper, rng, 29, &server, &given);
  std::vector<float> g = RandomIntegers(rng, kCount);
  for (uint64_t i = 0; i < kCount; ++i) given[i] += g[i];
  const auto ranges = dropper.SelectAll(g.data());
  ASSERT_EQ(ranges.size(), 1u);
  ASSERT_EQ(ranges[0].count, kCount);
  for (uint64_t i = 0; i < kCount; ++i) server[i] += g[i];
  for (uint64_t i = 0; i < kCount; ++i) {
    ASSERT_EQ(server[i], given[i]) << "parameter " << i;
    ASSERT_EQ(dropper.residual()[i], 0.0f) << "parameter " << i;
  }
}

TEST(GradientDropper, RatioZeroPushesEverythingAndKeepsNoResidual) {
  constexpr uint64_t kCount = 777;
  GradientDropper dropper(kCount, 128, 0, 0.0);
  std::mt19937 rng(5);
  for (int step = 0; step < 20; ++step) {
    std::vector<double> server(kCount);
    const std::vector<float> g = RandomIntegers(rng, kCount);
    const auto ranges = PushInto(dropper, g, &server);
    ASSERT_EQ(ranges.size(), 1u);  // adjacent runs merged into one range
    EXPECT_EQ(ranges[0].first, 0u);
    EXPECT_EQ(ranges[0].count, kCount);
    for (uint64_t i = 0; i < kCount; ++i) {
      ASSERT_EQ(server[i], g[i]) << "step " << step << ", parameter " << i;
      ASSERT_EQ(dropper.residual()[i], 0.0f);
    }
  }
}

TEST(GradientDropper, KeepsTheRunsOfLargestNormAndAtLeastOne) {
  // 10 runs of 4; run r holds the value r, except run 3 which is the largest.
  constexpr uint64_t kCount = 40;
  std::vector<float> g(kCount);
  for (uint64_t i = 0; i < kCount; ++i) g[i] = static_cast<float>(i / 4);
  for (uint64_t i = 12; i < 16; ++i) g[i] = -100;  // negative: the norm counts
  {
    GradientDropper dropper(kCount, 4, 0, 0.8);  // keeps 2 of 10
    std::vector<double> server(kCount);
    const auto ranges = PushInto(dropper, g, &server);
    ASSERT_EQ(ranges.size(), 2u);
    EXPECT_EQ(ranges[0].first, 12u);
    EXPECT_EQ(ranges[0].count, 4u);
    EXPECT_EQ(ranges[1].first, 36u);
    EXPECT_EQ(ranges[1].count, 4u);
  }
  {
    GradientDropper dropper(kCount, 4, 0, 0.99);  // 0.1 of a run: still one
    std::vector<double> server(kCount);
    const auto ranges = PushInto(dropper, g, &server);
    ASSERT_EQ(ranges.size(), 1u);
    EXPECT_EQ(ranges[0].first, 12u);
  }
}

TEST(GradientDropper, ADroppedRunGrowsUntilItIsPushedAndThenLeavesTheResidual) {
  // Run 0 gets 1 per step, run 1 gets 3 per step; one run of two is pushed.
  GradientDropper dropper(8, 4, 0, 0.5);
  std::vector<double> server(8);
  const std::vector<float> g = {1, 1, 1, 1, 3, 3, 3, 3};
  // Step 0: run 1 (3) beats run 0 (1). Step 1: run 0 holds 2, run 1 holds 3.
  // Step 2: run 0 holds 3, run 1 holds 3: the tie goes to the lower run.
  const uint64_t expected_first[] = {4, 4, 0, 4};
  for (int step = 0; step < 4; ++step) {
    const auto ranges = PushInto(dropper, g, &server);
    ASSERT_EQ(ranges.size(), 1u) << "step " << step;
    EXPECT_EQ(ranges[0].first, expected_first[step]) << "step " << step;
  }
  // Run 0 was pushed once, carrying its 3 steps; run 1 three times: 3, 3,
  // then 6 (its dropped step 2 with step 3).
  EXPECT_EQ(server[0], 3);
  EXPECT_EQ(server[4], 12);
  EXPECT_EQ(dropper.residual()[0], 1);  // step 3's, not yet pushed
  EXPECT_EQ(dropper.residual()[4], 0);
}

TEST(GradientDropper, NoValueIsEverPushedTwice) {
  // Each parameter gets a gradient once (at step 0), then zeros: whatever the
  // selection does afterwards, the server must end with exactly that value,
  // once, and the residual with nothing.
  constexpr uint64_t kCount = 512;
  GradientDropper dropper(kCount, 16, 0, 0.9);
  std::mt19937 rng(3);
  const std::vector<float> first = RandomIntegers(rng, kCount);
  std::vector<double> server(kCount);
  std::vector<uint64_t> pushes_with_value(kCount);
  std::vector<float> g = first;
  for (int step = 0; step < 40; ++step) {
    std::vector<float> accumulated = g;
    const auto ranges = dropper.Select(accumulated.data());
    for (const auto& r : ranges) {
      for (uint64_t i = r.first; i < r.first + r.count; ++i) {
        server[i] += accumulated[i];
        if (accumulated[i] != 0) ++pushes_with_value[i];
      }
    }
    g.assign(kCount, 0.0f);
  }
  for (uint64_t i = 0; i < kCount; ++i) {
    ASSERT_EQ(server[i], first[i]) << "parameter " << i;
    ASSERT_LE(pushes_with_value[i], 1u) << "parameter " << i << " was pushed twice";
    ASSERT_EQ(dropper.residual()[i], 0.0f) << "parameter " << i;
  }
}

TEST(GradientDropper, EveryGroupKeepsItsShareOfRuns) {
  // 3 groups of 10 runs of 2; 70% dropped: 3 runs of each group, whatever
  // the norms (group 0 has all the large values).
  constexpr uint64_t kCount = 60;
  GradientDropper dropper(kCount, 2, 20, 0.7);
  std::vector<float> g(kCount, 1.0f);
  for (uint64_t i = 0; i < 20; ++i) g[i] = 50;
  std::vector<double> server(kCount);
  PushInto(dropper, g, &server);
  for (uint64_t group = 0; group < 3; ++group) {
    uint64_t pushed = 0;
    for (uint64_t i = group * 20; i < (group + 1) * 20; ++i) pushed += server[i] != 0;
    EXPECT_EQ(pushed, 3u * 2) << "group " << group;
  }
}

TEST(GradientDropper, ANonFiniteRunIsAlwaysPushed) {
  GradientDropper dropper(16, 4, 0, 0.75);  // one run of four
  std::vector<float> g(16, 5.0f);
  g[9] = std::numeric_limits<float>::quiet_NaN();
  const auto& ranges = dropper.Select(g.data());
  ASSERT_EQ(ranges.size(), 1u);
  EXPECT_EQ(ranges[0].first, 8u);
}

}  // namespace
}  // namespace blkps_test
