// Submissions end to end (doc/libblkps.md "Streaming"), a real tgtd with the
// built plugin: every ticket completes exactly once; streamed exchanges,
// pushes and pulls leave the model and their buffers as the synchronous
// calls do, on float32 and bfloat16 LUNs and striped over two shards; a
// pull submitted after a push of the same range sees it; input the
// synchronous call refuses gets no ticket and leaves the others; a write the
// target refuses fails its ticket with the synchronous call's error.
#include <blkps/blkps.h>
#include <blkps/model.hpp>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "target_process.h"
#include "temp_dir.h"

namespace blkps_test {
namespace {

constexpr uint64_t kParams = 20480;  // 20 stripe units of 4 KiB
constexpr float kUntouched = -7.5f;

std::unique_ptr<blkps::Model> OpenModel(const std::string& target, const char* dtype = nullptr) {
  blkps::OpenOptions o;
  o.request_bytes = 1024;  // many requests per submission
  if (dtype != nullptr) o.dtype = dtype;
  std::string error;
  auto model = blkps::Model::Open(target, o, &error);
  EXPECT_NE(model, nullptr) << error;
  return model;
}

// Completes every outstanding ticket of `model`: their results by ticket;
// a ticket completed twice fails the test.
std::map<uint64_t, blkps::Model::Completion> CompleteAll(blkps::Model& model) {
  std::map<uint64_t, blkps::Model::Completion> done;
  while (model.outstanding() > 0) {
    std::vector<blkps::Model::Completion> ended;
    EXPECT_GE(model.Complete(&ended, 3, -1), 0);
    for (blkps::Model::Completion& c : ended) {
      EXPECT_TRUE(done.emplace(c.ticket, c).second) << "ticket " << c.ticket << " completed twice";
    }
  }
  return done;
}

// A small integer (exact in bfloat16 and in the sums below).
float SmallInteger(uint64_t round, uint64_t i) { return static_cast<float>(static_cast<int>((i * 7 + round) % 9) - 4); }

// Buckets of uneven sizes that start and end inside logical blocks.
std::vector<std::pair<uint64_t, uint64_t>> Buckets(uint64_t params) {
  std::vector<std::pair<uint64_t, uint64_t>> buckets;
  for (uint64_t first = 0, k = 0; first < params; ++k) {
    const uint64_t count = std::min<uint64_t>(params - first, 700 + 413 * (k % 5));
    buckets.push_back({first, count});
    first += count;
  }
  return buckets;
}

// rule=sum: a round of streamed exchanges of every bucket, then streamed
// pushes and streamed pulls, against a float32 LUN, a bfloat16 LUN (float32
// values narrowed, and 16-bit values as they are) and a layout over two
// shards: every ticket completes once, GOOD; each exchange's `out` holds
// the model with its own bucket's gradient; the pulls read the model.
TEST(Stream, SubmissionsCompleteOnceAndEqualTheSynchronousCalls) {
  const std::string bsopts = "params=" + std::to_string(kParams) + ";rule=sum;block=1K";
  TargetProcess target(bsopts);
  ASSERT_TRUE(target.ok()) << target.start_output();
  std::string out;
  ASSERT_EQ(target.Admin("--lld iscsi --op new --mode logicalunit --tid 1 --lun 5 --bstype blkps "
                         "--backing-store model --bsopts " +
                             ShellQuote("params=20480;rule=sum;block=1K;dtype=bfloat16"),
                         &out),
            0)
      << target.Log();
  const std::string half = "params=" + std::to_string(kParams / 2) + ";rule=sum;block=1K";
  TargetProcess shard0(half), shard1(half);
  ASSERT_TRUE(shard0.ok()) << shard0.start_output();
  ASSERT_TRUE(shard1.ok()) << shard1.start_output();
  TempDir dir;
  const std::string layout = dir.path + "/two.layout";
  std::ofstream(layout) << "stripe_unit = 4096\nshard = " << shard0.url(1) << "\nshard = " << shard1.url(1) << "\n";

  struct Case {
    std::string what, target;
    const char* dtype;
    bool values16;
  };
  for (const Case& c :
       {Case{"float32", target.url(1), nullptr, false}, Case{"bfloat16 from float32", target.url(5), "bfloat16", false},
        Case{"bfloat16 as 16-bit values", target.url(5), "bfloat16", true},
        Case{"two shards", "layout:" + layout, nullptr, false}}) {
    auto model = OpenModel(c.target, c.dtype);
    ASSERT_NE(model, nullptr) << c.what;
    std::vector<float> weights(kParams);
    ASSERT_EQ(model->Pull(0, weights.data(), kParams), 0) << c.what << ": " << model->last_error();
    for (uint64_t round = 1; round <= 2; ++round) {
      std::vector<float> g(kParams), got(kParams, kUntouched);
      std::vector<uint16_t> g16(kParams), got16(kParams);
      for (uint64_t i = 0; i < kParams; ++i) g[i] = SmallInteger(round, i);
      std::set<uint64_t> tickets;
      for (const auto& [first, count] : Buckets(kParams)) {
        blkps::Model::Ticket t = 0;
        int rc;
        if (c.values16) {
          // bfloat16 of g: the upper half of the float32 (the integers are exact).
          for (uint64_t i = first; i < first + count; ++i) {
            uint32_t bits;
            std::memcpy(&bits, &g[i], 4);
            g16[i] = static_cast<uint16_t>(bits >> 16);
          }
          rc = model->SubmitExchange16(first, g16.data() + first, got16.data() + first, count, &t);
        } else {
          rc = model->SubmitExchange(first, g.data() + first, got.data() + first, count, &t);
        }
        ASSERT_EQ(rc, 0) << c.what << ": " << model->last_error();
        EXPECT_TRUE(tickets.insert(t).second) << c.what << ": ticket " << t << " given twice";
      }
      const auto done = CompleteAll(*model);
      ASSERT_EQ(done.size(), tickets.size()) << c.what;
      for (const auto& [ticket, completion] : done) {
        EXPECT_EQ(tickets.count(ticket), 1u) << c.what << ": unknown ticket " << ticket;
        EXPECT_EQ(completion.result, 0) << c.what << ": " << completion.error;
      }
      if (c.values16) {
        for (uint64_t i = 0; i < kParams; ++i) {
          const uint32_t bits = static_cast<uint32_t>(got16[i]) << 16;
          std::memcpy(&got[i], &bits, 4);
        }
      }
      for (uint64_t i = 0; i < kParams; ++i) {
        weights[i] += g[i];
        ASSERT_EQ(got[i], weights[i]) << c.what << ", round " << round << ": parameter " << i;
      }
    }
    // Streamed pushes of every bucket, then streamed pulls: the pulls run
    // after the pushes (another kind) and read the model with them.
    std::vector<float> ones(kParams, 1.0f), pulled(kParams, kUntouched);
    for (const auto& [first, count] : Buckets(kParams)) {
      blkps::Model::Ticket t = 0;
      ASSERT_EQ(model->SubmitPush(first, ones.data() + first, count, &t), 0) << c.what << ": " << model->last_error();
    }
    for (const auto& [first, count] : Buckets(kParams)) {
      blkps::Model::Ticket t = 0;
      ASSERT_EQ(model->SubmitPull(first, pulled.data() + first, count, &t), 0) << c.what << ": " << model->last_error();
    }
    for (const auto& [ticket, completion] : CompleteAll(*model)) {
      EXPECT_EQ(completion.result, 0) << c.what << ": " << completion.error;
    }
    for (uint64_t i = 0; i < kParams; ++i) ASSERT_EQ(pulled[i], weights[i] + 1.0f) << c.what << ": parameter " << i;
    // And the synchronous pull agrees.
    std::vector<float> sync(kParams);
    ASSERT_EQ(model->Pull(0, sync.data(), kParams), 0) << model->last_error();
    EXPECT_EQ(sync, pulled) << c.what;
    weights = sync;
  }
}

// A pull submitted after a push of the same range runs after it (the same
// blocks: one after the other, in submission order) and reads the weights
// with that push, whatever else is in flight.
TEST(Stream, APullSubmittedAfterAPushOfItsRangeSeesThePush) {
  TargetProcess target("params=" + std::to_string(kParams) + ";rule=sum;block=1K");
  ASSERT_TRUE(target.ok()) << target.start_output();
  auto model = OpenModel(target.url(1));
  ASSERT_NE(model, nullptr);
  std::vector<float> g(kParams, 2.0f), w(kParams, kUntouched);
  for (int k = 0; k < 5; ++k) {
    blkps::Model::Ticket push = 0, pull = 0;
    ASSERT_EQ(model->SubmitPush(0, g.data(), kParams, &push), 0) << model->last_error();
    ASSERT_EQ(model->SubmitPull(0, w.data(), kParams, &pull), 0) << model->last_error();
    const auto done = CompleteAll(*model);
    ASSERT_EQ(done.size(), 2u);
    for (uint64_t i = 0; i < kParams; ++i) ASSERT_EQ(w[i], 2.0f * (k + 1)) << "round " << k << ": parameter " << i;
  }
}

// Input the synchronous call refuses (a range past the end, 16-bit values
// to a float32 LUN) is refused by the submission with the same errno and no
// ticket; the submissions around it complete GOOD.
TEST(Stream, ARefusedSubmissionGetsNoTicketAndLeavesTheOthers) {
  TargetProcess target("params=" + std::to_string(kParams) + ";rule=sum;block=1K");
  ASSERT_TRUE(target.ok()) << target.start_output();
  auto model = OpenModel(target.url(1));
  ASSERT_NE(model, nullptr);
  std::vector<float> g(kParams, 1.0f), out(kParams, kUntouched);
  std::vector<uint16_t> g16(kParams);
  blkps::Model::Ticket a = 0, refused = 0, b = 0;
  ASSERT_EQ(model->SubmitExchange(0, g.data(), out.data(), 1000, &a), 0) << model->last_error();
  const uint64_t end = model->param_capacity();
  EXPECT_EQ(model->SubmitExchange(end - 10, g.data(), out.data(), 11, &refused), -ERANGE);
  EXPECT_NE(model->last_error().find("past the end"), std::string::npos) << model->last_error();
  EXPECT_EQ(model->SubmitPush16(0, g16.data(), 10, &refused), -EINVAL);
  EXPECT_EQ(refused, 0u);
  ASSERT_EQ(model->SubmitExchange(1000, g.data() + 1000, out.data() + 1000, 1000, &b), 0) << model->last_error();
  const auto done = CompleteAll(*model);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done.at(a).result, 0) << done.at(a).error;
  EXPECT_EQ(done.at(b).result, 0) << done.at(b).error;
  for (uint64_t i = 0; i < 2000; ++i) ASSERT_EQ(out[i], 1.0f) << "parameter " << i;
}

// A float32 LUN refuses a NaN gradient at the target (ILLEGAL REQUEST):
// the submission that carries it completes with -EINVAL and the target's
// words, as blkps_exchange does; a submission batched with it fails with
// the same error, else completes GOOD; the next submission runs (through
// the C API, whose completions carry the message).
TEST(Stream, ATargetRefusalFailsItsTicketWithTheSynchronousError) {
  TargetProcess target("params=" + std::to_string(kParams) + ";rule=sum;block=1K");
  ASSERT_TRUE(target.ok()) << target.start_output();
  blkps_model* m = nullptr;
  char err[512] = "";
  ASSERT_EQ(blkps_open(target.url(1).c_str(), nullptr, &m, err, sizeof err), 0) << err;
  std::vector<float> g(kParams, 1.0f), out(kParams, kUntouched);
  g[15000] = std::numeric_limits<float>::quiet_NaN();
  blkps_ticket good = 0, bad = 0, later = 0;
  ASSERT_EQ(blkps_submit_exchange(m, 0, g.data(), out.data(), 10000, &good), 0) << blkps_last_error(m);
  ASSERT_EQ(blkps_submit_exchange(m, 10000, g.data() + 10000, out.data() + 10000, 10000, &bad), 0)
      << blkps_last_error(m);
  std::map<blkps_ticket, blkps_completion> done;
  while (blkps_outstanding(m) > 0) {
    blkps_completion c[4];
    const int n = blkps_complete(m, c, 4, -1);
    ASSERT_GE(n, 0);
    for (int k = 0; k < n; ++k) EXPECT_TRUE(done.emplace(c[k].ticket, c[k]).second) << "ticket " << c[k].ticket;
  }
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done.at(bad).result, -EINVAL);
  EXPECT_NE(std::string(done.at(bad).error).find("ILLEGAL"), std::string::npos) << done.at(bad).error;
  if (done.at(good).result != 0) {
    EXPECT_STREQ(done.at(good).error, done.at(bad).error) << "a ticket failed with another ticket's error";
  }
  g[15000] = 1.0f;
  ASSERT_EQ(blkps_submit_push(m, 10000, g.data() + 10000, 10000, &later), 0) << blkps_last_error(m);
  blkps_completion c{};
  ASSERT_EQ(blkps_complete(m, &c, 1, -1), 1);
  EXPECT_EQ(c.ticket, later);
  EXPECT_EQ(c.result, 0) << c.error;
  blkps_close(m);
}

}  // namespace
}  // namespace blkps_test
