// The 16-bit wire end to end: a real tgtd with the built plugin, learner LUNs
// of one float32 model with --bsopts dtype=bfloat16 / float16, reached with
// libblkps (which converts float32 arrays) and with raw SCSI commands (which
// see the 16-bit bytes themselves).
#include <blkps/blkps.h>
#include <blkps/wire_dtype.hpp>

#include <gtest/gtest.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "raw_lun.h"
#include "target_process.h"

namespace blkps_test {
namespace {

using blkps::wire::Dtype;

constexpr uint64_t kParams = 1000;

struct ModelHandle {
  blkps_model* m = nullptr;
  std::string error;
  int rc = 0;
  // request_bytes, queue_depth: 0 for libblkps's defaults.
  ModelHandle(const std::string& url, const char* dtype, uint64_t request_bytes = 0, uint32_t queue_depth = 0) {
    blkps_open_options o{};
    o.dtype = dtype;
    o.request_bytes = request_bytes;
    o.queue_depth = queue_depth;
    char err[512] = "";
    rc = blkps_open(url.c_str(), &o, &m, err, sizeof err);
    if (rc != 0) error = err;
  }
  ~ModelHandle() { blkps_close(m); }
};

// Adds LUN `lun` of model "model" to `target` with `bsopts`; returns tgtadm's
// exit status.
int AddLun(const TargetProcess& target, int lun, const std::string& bsopts) {
  std::string out;
  return target.Admin("--lld iscsi --op new --mode logicalunit --tid 1 --lun " + std::to_string(lun) +
                          " --bstype blkps --backing-store model --bsopts " + ShellQuote(bsopts),
                      &out);
}

std::vector<uint8_t> Bytes16(const std::vector<uint16_t>& v) {
  std::vector<uint8_t> b(v.size() * 2);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::vector<uint16_t> Values16(const std::vector<uint8_t>& b) {
  std::vector<uint16_t> v(b.size() / 2);
  std::memcpy(v.data(), b.data(), b.size());
  return v;
}

// Learner `lun`'s gradient for parameter i: a small integer (exact in both
// 16-bit types and in float32 sums).
float SmallInteger(int lun, uint64_t i) { return static_cast<float>(static_cast<int>((i * (lun + 2)) % 11) - 5); }

// rule=sum: w += g. LUN 1 float32, LUN 5 bfloat16, LUN 6 float16, all one
// model: every LUN's integer gradients add up exactly, and every LUN reads
// the exact sum.
TEST(WireDtype, SixteenBitLunsAddExactlyIntoTheFloat32Model) {
  TargetProcess target("params=" + std::to_string(kParams) + ";rule=sum;block=1K");
  ASSERT_TRUE(target.ok()) << target.start_output();
  ASSERT_EQ(AddLun(target, 5, "params=1000;rule=sum;block=1K;dtype=bfloat16"), 0) << target.Log();
  ASSERT_EQ(AddLun(target, 6, "params=1000;dtype=float16;rule=sum;block=1K"), 0) << target.Log();

  const struct {
    int lun;
    const char* dtype;
  } luns[] = {{1, nullptr}, {5, "bfloat16"}, {6, "float16"}};
  std::vector<float> expected(kParams, 0.0f);
  for (int round = 0; round < 3; ++round) {
    for (const auto& l : luns) {
      ModelHandle h(target.url(l.lun), l.dtype);
      ASSERT_NE(h.m, nullptr) << h.error;
      std::vector<float> g(kParams);
      for (uint64_t i = 0; i < kParams; ++i) {
        g[i] = SmallInteger(l.lun + round, i);
        expected[i] += g[i];
      }
      ASSERT_EQ(blkps_push(h.m, 0, g.data(), kParams), 0) << blkps_last_error(h.m);
    }
  }
  for (const auto& l : luns) {
    ModelHandle h(target.url(l.lun), l.dtype);
    ASSERT_NE(h.m, nullptr) << h.error;
    std::vector<float> w(kParams);
    ASSERT_EQ(blkps_pull(h.m, 0, w.data(), kParams), 0) << blkps_last_error(h.m);
    for (uint64_t i = 0; i < kParams; ++i) ASSERT_EQ(w[i], expected[i]) << "LUN " << l.lun << " parameter " << i;
  }
  // A 16-bit LUN holds 2 bytes per parameter, rounded up to whole blocks.
  ModelHandle bf16(target.url(5), "bfloat16");
  ASSERT_NE(bf16.m, nullptr) << bf16.error;
  EXPECT_EQ(blkps_size_bytes(bf16.m), 2048u);
  EXPECT_EQ(blkps_param_capacity(bf16.m), 1024u);
}

// Reads round each float32 weight to the LUN's type, ties to even; the
// raw bytes on the wire are the 16-bit values at byte 2*i.
TEST(WireDtype, ReadsRoundTheWeightsToNearestEven) {
  TargetProcess target("params=1000;rule=sum");
  ASSERT_TRUE(target.ok()) << target.start_output();
  ASSERT_EQ(AddLun(target, 5, "params=1000;rule=sum;dtype=bfloat16"), 0) << target.Log();
  ASSERT_EQ(AddLun(target, 6, "params=1000;rule=sum;dtype=float16"), 0) << target.Log();
  const std::vector<float> w = {
      1.0f + std::ldexp(1.0f, -8),      // bfloat16 tie: down to even 1.0
      1.0f + 3 * std::ldexp(1.0f, -8),  // bfloat16 tie: up to even
      1.0f + std::ldexp(1.0f, -11),     // float16 tie: down to even 1.0
      70000.0f,                         // past float16's 65504: Inf
      std::ldexp(1.0f, -24),            // float16's smallest subnormal
      -3.140625f,
  };
  std::vector<float> g(kParams, 0.0f);
  std::copy(w.begin(), w.end(), g.begin());
  {
    ModelHandle h(target.url(1), nullptr);
    ASSERT_NE(h.m, nullptr) << h.error;
    ASSERT_EQ(blkps_push(h.m, 0, g.data(), kParams), 0) << blkps_last_error(h.m);
  }
  for (Dtype t : {Dtype::kBfloat16, Dtype::kFloat16}) {
    RawLun lun(target.url(t == Dtype::kBfloat16 ? 5 : 6), "iqn.2026-11.io.blkps:test-raw");
    ASSERT_TRUE(lun.connected()) << lun.error();
    std::vector<uint8_t> data;
    ASSERT_EQ(lun.Read(0, 4, &data), "GOOD");
    const std::vector<uint16_t> got = Values16(data);
    for (size_t i = 0; i < w.size(); ++i) {
      const uint16_t want =
          t == Dtype::kBfloat16 ? blkps::wire::FloatToBfloat16(w[i]) : blkps::wire::FloatToFloat16(w[i]);
      EXPECT_EQ(got[i], want) << blkps::wire::DtypeName(t) << " parameter " << i;
    }
    for (size_t i = w.size(); i < got.size(); ++i) ASSERT_EQ(got[i], 0) << i;  // zeros, and the padding
  }
  // The reference values, spelled out for two of them.
  RawLun bf16(target.url(5), "iqn.2026-11.io.blkps:test-raw-bf16");
  std::vector<uint8_t> data;
  ASSERT_EQ(bf16.Read(0, 1, &data), "GOOD");
  EXPECT_EQ(Values16(data)[0], 0x3f80);  // 1.0
  EXPECT_EQ(Values16(data)[1], 0x3f82);
}

// A 16-bit gradient holding a NaN or an Inf is refused whole, with the
// parameter named, and changes nothing; through libblkps a float32 value
// that is not finite in the type is refused before it is sent.
TEST(WireDtype, NonFiniteSixteenBitGradientIsRejectedWhole) {
  TargetProcess target("params=1000;lr=1");
  ASSERT_TRUE(target.ok()) << target.start_output();
  ASSERT_EQ(AddLun(target, 5, "params=1000;lr=1;dtype=bfloat16"), 0) << target.Log();
  ASSERT_EQ(AddLun(target, 6, "params=1000;lr=1;dtype=float16"), 0) << target.Log();
  const char kInvalidField[] = "sense 0x5 0x2600";  // ILLEGAL REQUEST, INVALID FIELD IN PARAMETER LIST
  struct Case {
    int lun;
    uint16_t one, bad;
    uint64_t at;
    const char* what;
  };
  const Case cases[] = {
      {5, 0x3f80, 0x7fc0, 900, "gradient for parameter 900 is NaN"},
      {5, 0x3f80, 0xff80, 17, "gradient for parameter 17 is infinite"},
      {6, 0x3c00, 0x7e00, 901, "gradient for parameter 901 is NaN"},
      {6, 0x3c00, 0x7c00, 999, "gradient for parameter 999 is infinite"},
  };
  for (const Case& c : cases) {
    RawLun lun(target.url(c.lun), "iqn.2026-11.io.blkps:test-raw");
    ASSERT_TRUE(lun.connected()) << lun.error();
    std::vector<uint16_t> g(1024, c.one);
    g[c.at] = c.bad;
    EXPECT_EQ(lun.Write(0, Bytes16(g)), kInvalidField) << c.what;
    EXPECT_NE(target.Log().find(c.what), std::string::npos) << target.Log();
  }
  RawLun f32(target.url(1), "iqn.2026-11.io.blkps:test-raw");
  std::vector<uint8_t> w;
  ASSERT_EQ(f32.Read(0, 8, &w), "GOOD");
  for (uint8_t x : w) ASSERT_EQ(x, 0) << "a refused write changed the model";

  ModelHandle h(target.url(6), "float16");
  ASSERT_NE(h.m, nullptr) << h.error;
  std::vector<float> g(kParams, 1.0f);
  g[123] = 1e10f;  // finite in float32, Inf in float16
  EXPECT_EQ(blkps_push(h.m, 0, g.data(), kParams), -EINVAL);
  EXPECT_NE(std::string(blkps_last_error(h.m))
                .find("gradient for parameter 123 is 1e+10, which is infinite in "
                      "float16; nothing was sent"),
            std::string::npos)
      << blkps_last_error(h.m);
  ASSERT_EQ(f32.Read(0, 8, &w), "GOOD");
  for (uint8_t x : w) ASSERT_EQ(x, 0) << "a refused push changed the model";
}

// bsp counts a 16-bit LUN's I/O for the parameters it carries (the plugin
// translates its byte range for admission). Learner a pushes the whole
// model, b only its second half: a's read of the second half runs at once
// (a read taken for first-half blocks would wait for b and fail at
// hold_limit) and returns the round's average; once b pushes the first half
// too, the whole model has it.
TEST(WireDtype, BspRoundsCompleteWithSixteenBitLearners) {
  TargetProcess target("params=1000;lr=1;block=1K;mode=bsp;hold_limit=3;dtype=bfloat16", "--luns 2");
  ASSERT_TRUE(target.ok()) << target.start_output();
  ModelHandle a(target.url(1), "bfloat16"), b(target.url(2), "bfloat16");
  ASSERT_NE(a.m, nullptr) << a.error;
  ASSERT_NE(b.m, nullptr) << b.error;
  std::vector<float> ga(kParams, 2.0f), gb(kParams, 4.0f), w(kParams);
  const uint64_t half = 512;  // parameters [512, 1000): model blocks 2 and 3
  ASSERT_EQ(blkps_push(a.m, 0, ga.data(), kParams), 0) << blkps_last_error(a.m);
  ASSERT_EQ(blkps_push(b.m, half, gb.data(), kParams - half), 0) << blkps_last_error(b.m);
  ASSERT_EQ(blkps_pull(a.m, half, w.data(), kParams - half), 0) << blkps_last_error(a.m);
  for (uint64_t i = 0; i < kParams - half; ++i) ASSERT_EQ(w[i], -3.0f) << half + i;

  ASSERT_EQ(blkps_push(b.m, 0, gb.data(), half), 0) << blkps_last_error(b.m);
  ASSERT_EQ(blkps_pull(a.m, 0, w.data(), kParams), 0) << blkps_last_error(a.m);
  for (uint64_t i = 0; i < kParams; ++i) ASSERT_EQ(w[i], -3.0f) << i;
}

// A pull of many requests, from and to the middle of a logical block, over
// many model blocks: the plugin narrows each block's piece straight out of
// the model and libblkps widens each request as it completes (and the
// partial first and last blocks after them); every value is the weight
// rounded to the LUN's type, ties to even.
TEST(WireDtype, PullsOfManyRequestsWidenEveryValueOnce) {
  constexpr uint64_t kMany = 20000;
  TargetProcess target("params=" + std::to_string(kMany) + ";rule=sum;block=1K");
  ASSERT_TRUE(target.ok()) << target.start_output();
  ASSERT_EQ(AddLun(target, 5, "params=20000;rule=sum;block=1K;dtype=bfloat16"), 0) << target.Log();
  ASSERT_EQ(AddLun(target, 6, "params=20000;rule=sum;block=1K;dtype=float16"), 0) << target.Log();
  std::vector<float> w(kMany);
  for (uint64_t i = 0; i < kMany; ++i) w[i] = static_cast<float>(i) * 0.3701f - 3000.0f;  // rounds in both types
  {
    ModelHandle h(target.url(1), nullptr);
    ASSERT_NE(h.m, nullptr) << h.error;
    ASSERT_EQ(blkps_push(h.m, 0, w.data(), kMany), 0) << blkps_last_error(h.m);
  }
  for (Dtype t : {Dtype::kBfloat16, Dtype::kFloat16}) {
    const char* dtype = blkps::wire::DtypeName(t);
    ModelHandle h(target.url(t == Dtype::kBfloat16 ? 5 : 6), dtype, 1024, 4);  // 512 values a request
    ASSERT_NE(h.m, nullptr) << h.error;
    blkps_model* const m = h.m;
    const struct { uint64_t first, count; } pulls[] = {{3, kMany - 13}, {0, kMany}, {300, 7}, {255, 2}};
    for (const auto& p : pulls) {
      std::vector<float> got(p.count, -1.0f);
      ASSERT_EQ(blkps_pull(m, p.first, got.data(), p.count), 0) << blkps_last_error(m);
      for (uint64_t i = 0; i < p.count; ++i) {
        const float x = w[p.first + i];
        const float want = t == Dtype::kBfloat16 ? blkps::wire::Bfloat16ToFloat(blkps::wire::FloatToBfloat16(x))
                                                 : blkps::wire::Float16ToFloat(blkps::wire::FloatToFloat16(x));
        ASSERT_EQ(got[i], want) << dtype << " pull from " << p.first << ": parameter " << p.first + i;
      }
    }
  }
}

// A push of many requests, from and to the middle of a logical block, over
// many model blocks: the plugin checks each WRITE's 16-bit values and widens
// them piece by piece as the rule runs; the sum rule adds exactly the
// narrowed values, each once (doc/data-path.md "A 16-bit push widens as the
// rule runs").
TEST(WireDtype, PushesOfManyRequestsNarrowEveryValueOnce) {
  constexpr uint64_t kMany = 20000;
  TargetProcess target("params=" + std::to_string(kMany) + ";rule=sum;block=1K");
  ASSERT_TRUE(target.ok()) << target.start_output();
  ASSERT_EQ(AddLun(target, 5, "params=20000;rule=sum;block=1K;dtype=bfloat16"), 0) << target.Log();
  ASSERT_EQ(AddLun(target, 6, "params=20000;rule=sum;block=1K;dtype=float16"), 0) << target.Log();
  ModelHandle f32(target.url(1), nullptr);
  ASSERT_NE(f32.m, nullptr) << f32.error;
  std::vector<float> g(kMany), want(kMany, 0.0f), got(kMany);
  for (uint64_t i = 0; i < kMany; ++i) g[i] = static_cast<float>(i) * 0.3701f - 3000.0f;  // rounds in both types
  for (Dtype t : {Dtype::kBfloat16, Dtype::kFloat16}) {
    const char* dtype = blkps::wire::DtypeName(t);
    ModelHandle h(target.url(t == Dtype::kBfloat16 ? 5 : 6), dtype, 1024, 4);  // 512 values a request
    ASSERT_NE(h.m, nullptr) << h.error;
    blkps_model* const m = h.m;
    const struct { uint64_t first, count; } pushes[] = {{3, kMany - 13}, {0, kMany}, {300, 7}, {255, 2}};
    for (const auto& p : pushes) {
      ASSERT_EQ(blkps_push(m, p.first, g.data() + p.first, p.count), 0) << blkps_last_error(m);
      for (uint64_t i = p.first; i < p.first + p.count; ++i) {
        want[i] += t == Dtype::kBfloat16 ? blkps::wire::Bfloat16ToFloat(blkps::wire::FloatToBfloat16(g[i]))
                                         : blkps::wire::Float16ToFloat(blkps::wire::FloatToFloat16(g[i]));
      }
      ASSERT_EQ(blkps_pull(f32.m, 0, got.data(), kMany), 0) << blkps_last_error(f32.m);
      for (uint64_t i = 0; i < kMany; ++i) {
        ASSERT_EQ(got[i], want[i]) << dtype << " push from " << p.first << ": parameter " << i;
      }
    }
  }
}

TEST(WireDtype, LunsOfOneModelMayDifferInDtypeOnly) {
  TargetProcess target("params=1000;lr=1");
  ASSERT_TRUE(target.ok()) << target.start_output();
  EXPECT_EQ(AddLun(target, 5, "params=1000;lr=1;dtype=float16"), 0) << target.Log();
  EXPECT_NE(AddLun(target, 6, "params=1000;lr=2;dtype=float16"), 0);
  EXPECT_NE(target.Log().find("model 'model' is already served with --bsopts 'params=1000;lr=1'; a LUN joining "
                              "it must give the same (dtype aside)"),
            std::string::npos)
      << target.Log();
  EXPECT_NE(AddLun(target, 7, "params=1000;lr=1;dtype=half"), 0);
  EXPECT_NE(target.Log().find("dtype: expected one of float32, bfloat16, float16, got 'half'"), std::string::npos)
      << target.Log();
  ModelHandle bad(target.url(5), "half");
  EXPECT_EQ(bad.rc, -EINVAL);
  EXPECT_NE(bad.error.find("dtype 'half' is not one of float32, bfloat16, float16"), std::string::npos) << bad.error;
}

}  // namespace
}  // namespace blkps_test
