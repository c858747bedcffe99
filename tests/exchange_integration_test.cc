// blkps_exchange end to end (doc/libblkps.md "Exchange"): a real tgtd with the
// built plugin; the exchange must equal a push followed by a pull of the same
// range, whatever the request count, queue depth, dtype or alignment; under
// bsp two learners exchanging at once over two shards both end each round
// with the round's result; a write the target refuses starts no read; on
// iscsi:// an exchange's requests fit the session's first burst; the
// 16-bit exchange moves a 16-bit LUN's values as they are.
#include <blkps/blkps.h>
#include <blkps/model.hpp>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "target_process.h"
#include "temp_dir.h"

namespace blkps_test {
namespace {

constexpr uint64_t kMany = 20000;  // parameters: 80 requests of 1 KiB at float32
constexpr float kUntouched = -7.5f;

// Opens `url` with `dtype` (null: float32), 1 KiB requests (many of them)
// and `queue_depth` in flight.
struct Learner {
  blkps_model* m = nullptr;
  std::string error;
  Learner(const std::string& url, const char* dtype, uint32_t queue_depth, uint32_t request_bytes = 1024) {
    blkps_open_options o{};
    o.dtype = dtype;
    o.queue_depth = queue_depth;
    o.request_bytes = request_bytes;
    char err[512] = "";
    if (blkps_open(url.c_str(), &o, &m, err, sizeof err) != 0) error = err;
  }
  ~Learner() { blkps_close(m); }
};

// A small integer (exact in bfloat16 and in the sums below).
float SmallInteger(uint64_t round, uint64_t i) { return static_cast<float>(static_cast<int>((i * 7 + round) % 9) - 4); }

int AddLun(const TargetProcess& target, int lun, const std::string& bsopts) {
  std::string out;
  return target.Admin("--lld iscsi --op new --mode logicalunit --tid 1 --lun " + std::to_string(lun) +
                          " --bstype blkps --backing-store model --bsopts " + ShellQuote(bsopts),
                      &out);
}

// rule=sum (w += g): after each exchange the pulled weights are the model
// with this gradient added, from the middle of a logical block to the
// middle of another, over many requests; a pull afterwards reads the same
// model, parameters outside the range untouched. On the float32 LUN and a
// bfloat16 LUN of the same model, at queue depth 1 and 16, and in place.
TEST(Exchange, EqualsPushThenPullAtEveryQueueDepthAndDtype) {
  TargetProcess target("params=" + std::to_string(kMany) + ";rule=sum;block=1K");
  ASSERT_TRUE(target.ok()) << target.start_output();
  ASSERT_EQ(AddLun(target, 5, "params=20000;rule=sum;block=1K;dtype=bfloat16"), 0) << target.Log();
  std::vector<float> model(kMany, 0.0f);
  const uint64_t first = 3, count = kMany - 13;
  uint64_t round = 0;
  for (const char* dtype : {static_cast<const char*>(nullptr), "bfloat16"}) {
    for (uint32_t queue_depth : {1u, 16u}) {
      for (bool in_place : {false, true}) {
        ++round;
        const std::string what = std::string(dtype ? dtype : "float32") + " at queue depth " +
                                 std::to_string(queue_depth) + (in_place ? " in place" : "");
        Learner l(target.url(dtype ? 5 : 1), dtype, queue_depth);
        ASSERT_NE(l.m, nullptr) << l.error;
        std::vector<float> g(count), out(count, kUntouched);
        for (uint64_t i = 0; i < count; ++i) {
          g[i] = SmallInteger(round, first + i);
          model[first + i] += g[i];
        }
        float* into = in_place ? g.data() : out.data();
        ASSERT_EQ(blkps_exchange(l.m, first, g.data(), into, count), 0) << what << ": " << blkps_last_error(l.m);
        for (uint64_t i = 0; i < count; ++i)
          ASSERT_EQ(into[i], model[first + i]) << what << ": parameter " << first + i;
        std::vector<float> w(kMany, kUntouched);
        Learner whole(target.url(1), nullptr, 16);
        ASSERT_NE(whole.m, nullptr) << whole.error;
        ASSERT_EQ(blkps_pull(whole.m, 0, w.data(), kMany), 0) << blkps_last_error(whole.m);
        for (uint64_t i = 0; i < kMany; ++i) ASSERT_EQ(w[i], model[i]) << what << ": parameter " << i;
      }
    }
  }
}

// mode=bsp, lr=1, two learner LUNs on each of two shards (one tgtd each),
// each learner a layout over its LUNs. Both exchange the whole model at once,
// round after round: every read waits for the other learner's push of its
// block, and each learner ends every round holding that round's average
// step (-(2 + 4) / 2 per round). Queue depth 2: a device that started a
// read before its own write of that block would fill both slots with reads
// the server holds for writes that cannot start, and fail at hold_limit.
TEST(Exchange, BspLearnersExchangingAtOnceOverTwoShardsEachGetTheRound) {
  constexpr uint64_t kParams = 8192, kShardParams = 4096;  // 8 stripe units of 4 KiB
  const std::string bsopts = "params=" + std::to_string(kShardParams) + ";lr=1;block=4K;mode=bsp;hold_limit=10";
  TargetProcess shard0(bsopts, "--luns 2"), shard1(bsopts, "--luns 2");
  ASSERT_TRUE(shard0.ok()) << shard0.start_output();
  ASSERT_TRUE(shard1.ok()) << shard1.start_output();
  TempDir dir;
  std::string layouts[2];
  for (int learner = 0; learner < 2; ++learner) {
    layouts[learner] = dir.path + "/learner" + std::to_string(learner) + ".layout";
    std::ofstream f(layouts[learner]);
    f << "stripe_unit = 4096\nshard = " << shard0.url(learner + 1) << "\nshard = " << shard1.url(learner + 1) << "\n";
  }
  constexpr int kRounds = 3;
  std::vector<float> got[2];
  std::string errors[2];
  auto learn = [&](int learner) {
    Learner l("layout:" + layouts[learner], nullptr, 2, 4096);
    if (l.m == nullptr) {
      errors[learner] = l.error;
      return;
    }
    std::vector<float> g(kParams), w(kParams);
    for (int round = 1; round <= kRounds; ++round) {
      g.assign(kParams, learner == 0 ? 2.0f : 4.0f);
      if (blkps_exchange(l.m, 0, g.data(), w.data(), kParams) != 0) {
        errors[learner] = "round " + std::to_string(round) + ": " + blkps_last_error(l.m);
        return;
      }
      for (uint64_t i = 0; i < kParams; ++i) {
        if (w[i] != -3.0f * round) {
          errors[learner] = "round " + std::to_string(round) + ": parameter " + std::to_string(i) + " is " +
                            std::to_string(w[i]) + ", not " + std::to_string(-3.0f * round);
          return;
        }
      }
    }
    got[learner] = w;
  };
  std::thread a(learn, 0), b(learn, 1);
  a.join();
  b.join();
  EXPECT_EQ(errors[0], "") << shard0.Log() << shard1.Log();
  EXPECT_EQ(errors[1], "") << shard0.Log() << shard1.Log();
  EXPECT_EQ(got[0].size(), kParams);
  EXPECT_EQ(got[1].size(), kParams);
}

// A float32 LUN refuses a NaN gradient (ILLEGAL REQUEST). The read of the
// refused write's range is never started: `out` keeps its values there; at
// queue depth 1 nothing after it starts either, and the ranges before it
// hold the weights with their gradients.
TEST(Exchange, RefusedWriteStartsNoRead) {
  TargetProcess target("params=" + std::to_string(kMany) + ";rule=sum;block=1K");
  ASSERT_TRUE(target.ok()) << target.start_output();
  const uint64_t per_request = 256, bad_request = 40, bad = bad_request * per_request + 17;
  uint64_t round = 0;
  for (uint32_t queue_depth : {1u, 16u}) {
    Learner l(target.url(1), nullptr, queue_depth);
    ASSERT_NE(l.m, nullptr) << l.error;
    std::vector<float> before(kMany);
    ASSERT_EQ(blkps_pull(l.m, 0, before.data(), kMany), 0) << blkps_last_error(l.m);
    std::vector<float> g(kMany), out(kMany, kUntouched);
    ++round;
    for (uint64_t i = 0; i < kMany; ++i) g[i] = SmallInteger(round, i);
    g[bad] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_EQ(blkps_exchange(l.m, 0, g.data(), out.data(), kMany), -EINVAL);
    EXPECT_NE(std::string(blkps_last_error(l.m)).find("ILLEGAL"), std::string::npos) << blkps_last_error(l.m);
    for (uint64_t i = bad_request * per_request; i < (bad_request + 1) * per_request; ++i) {
      ASSERT_EQ(out[i], kUntouched) << "queue depth " << queue_depth << ": parameter " << i << " was read";
    }
    if (queue_depth == 1) {
      for (uint64_t i = 0; i < kMany; ++i) {
        const float want = i < bad_request * per_request ? before[i] + g[i] : kUntouched;
        ASSERT_EQ(out[i], want) << "queue depth 1: parameter " << i;
      }
    }
  }
}

// Refused before anything is sent: a range past the end (-ERANGE), and on a
// 16-bit LUN a gradient that is not finite in its type (-EINVAL, checked
// while narrowing). The model and `out` stay as they were.
TEST(Exchange, RangeOrSixteenBitRefusalSendsNothing) {
  TargetProcess target("params=2000;rule=sum;block=1K");
  ASSERT_TRUE(target.ok()) << target.start_output();
  ASSERT_EQ(AddLun(target, 5, "params=2000;rule=sum;block=1K;dtype=bfloat16"), 0) << target.Log();
  Learner f32(target.url(1), nullptr, 16), bf16(target.url(5), "bfloat16", 16);
  ASSERT_NE(f32.m, nullptr) << f32.error;
  ASSERT_NE(bf16.m, nullptr) << bf16.error;
  std::vector<float> g(2000, 1.0f), out(2000, kUntouched);
  EXPECT_EQ(blkps_exchange(f32.m, 1000, g.data(), out.data(), 1100), -ERANGE);
  g[1500] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(blkps_exchange(bf16.m, 0, g.data(), out.data(), 2000), -EINVAL);
  EXPECT_NE(std::string(blkps_last_error(bf16.m)).find("parameter 1500"), std::string::npos)
      << blkps_last_error(bf16.m);
  for (float x : out) ASSERT_EQ(x, kUntouched);
  std::vector<float> w(2000, kUntouched);
  ASSERT_EQ(blkps_pull(f32.m, 0, w.data(), 2000), 0) << blkps_last_error(f32.m);
  for (float x : w) ASSERT_EQ(x, 0.0f);
}

// blkps_exchange16 moves a bfloat16 LUN's own values both ways: it equals
// blkps_push16 then blkps_pull16 (in place too); a NaN sends nothing, and
// a float32 LUN refuses it.
TEST(Exchange, SixteenBitValuesEqualPush16ThenPull16) {
  constexpr uint64_t kParams = 3000;
  TargetProcess target("params=" + std::to_string(kParams) + ";rule=sum;block=1K");
  ASSERT_TRUE(target.ok()) << target.start_output();
  ASSERT_EQ(AddLun(target, 5, "params=3000;rule=sum;block=1K;dtype=bfloat16"), 0) << target.Log();
  Learner bf16(target.url(5), "bfloat16", 4), f32(target.url(1), nullptr, 4);
  ASSERT_NE(bf16.m, nullptr) << bf16.error;
  ASSERT_NE(f32.m, nullptr) << f32.error;
  auto bits = [](float x) {  // a small integer's bfloat16: its float32's high half
    uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    return static_cast<uint16_t>(u >> 16);
  };
  std::vector<float> model(kParams, 0.0f);
  for (int round = 1; round <= 2; ++round) {
    const bool in_place = round == 2;
    std::vector<uint16_t> g(kParams), out(kParams, 0xffff);
    for (uint64_t i = 0; i < kParams; ++i) {
      const float x = SmallInteger(round, i);
      g[i] = bits(x);
      model[i] += x;
    }
    uint16_t* into = in_place ? g.data() : out.data();
    ASSERT_EQ(blkps_exchange16(bf16.m, 0, g.data(), into, kParams), 0) << blkps_last_error(bf16.m);
    for (uint64_t i = 0; i < kParams; ++i) ASSERT_EQ(into[i], bits(model[i])) << "round " << round << ", " << i;
  }
  std::vector<uint16_t> nan(kParams, bits(1.0f)), out(kParams, 0xffff);
  nan[2500] = 0x7fc0;
  EXPECT_EQ(blkps_exchange16(bf16.m, 0, nan.data(), out.data(), kParams), -EINVAL);
  EXPECT_NE(std::string(blkps_last_error(bf16.m)).find("parameter 2500"), std::string::npos)
      << blkps_last_error(bf16.m);
  std::vector<uint16_t> pulled(kParams);
  ASSERT_EQ(blkps_pull16(bf16.m, 0, pulled.data(), kParams), 0) << blkps_last_error(bf16.m);
  for (uint64_t i = 0; i < kParams; ++i) ASSERT_EQ(pulled[i], bits(model[i])) << "the NaN exchange sent " << i;
  EXPECT_EQ(blkps_exchange16(f32.m, 0, nan.data(), out.data(), 10), -EINVAL);
  EXPECT_NE(std::string(blkps_last_error(f32.m)).find("float32"), std::string::npos) << blkps_last_error(f32.m);
}

// On iscsi:// an exchange's requests default to the first burst (256 KiB),
// so no write waits for an R2T behind the reads' data on its connection
// (doc/data-path.md "Phases at link rate"); a push's and a pull's stay at
// 1 MiB, a chosen size applies to all, and a file keeps 1 MiB. A default
// exchange of the whole model (several requests) equals push then pull.
TEST(Exchange, RequestsFitTheFirstBurstOnIscsi) {
  constexpr uint64_t kParams = 1 << 20;  // 4 MiB: 16 requests of 256 KiB
  TargetProcess target("params=" + std::to_string(kParams) + ";rule=sum");
  ASSERT_TRUE(target.ok()) << target.start_output();
  std::string error;
  std::unique_ptr<blkps::Model> plain = blkps::Model::Open(target.url(1), blkps::OpenOptions(), &error);
  ASSERT_NE(plain, nullptr) << error;
  EXPECT_EQ(plain->request_bytes(), 1u << 20);
  EXPECT_EQ(plain->exchange_request_bytes(), 256u << 10);
  std::vector<float> g(kParams), out(kParams, kUntouched), w(kParams, kUntouched);
  for (uint64_t i = 0; i < kParams; ++i) g[i] = SmallInteger(1, i);
  ASSERT_EQ(plain->Exchange(0, g.data(), out.data(), kParams), 0) << plain->last_error();
  ASSERT_EQ(plain->Pull(0, w.data(), kParams), 0) << plain->last_error();
  for (uint64_t i = 0; i < kParams; ++i) {
    ASSERT_EQ(out[i], g[i]) << "parameter " << i;
    ASSERT_EQ(w[i], g[i]) << "parameter " << i;
  }
  plain.reset();

  blkps::OpenOptions chosen;
  chosen.request_bytes = 1 << 20;
  std::unique_ptr<blkps::Model> sized = blkps::Model::Open(target.url(1), chosen, &error);
  ASSERT_NE(sized, nullptr) << error;
  EXPECT_EQ(sized->exchange_request_bytes(), 1u << 20);
  sized.reset();

  TempDir dir;
  const std::string file = dir.path + "/model.bin";
  std::ofstream(file).write(std::string(4 << 20, '\0').data(), 4 << 20);
  std::unique_ptr<blkps::Model> local = blkps::Model::Open(file, blkps::OpenOptions(), &error);
  ASSERT_NE(local, nullptr) << error;
  EXPECT_EQ(local->exchange_request_bytes(), local->request_bytes());
}

}  // namespace
}  // namespace blkps_test
