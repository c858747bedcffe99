// Learners follow a failover (doc/replicas.md "Learners follow a failover"):
// a learner through libblkps (blkps::Model) opens a layout that lists a
// shard's primary and its backup, both real tgtds on loopback
// (ReplicatedShard). What is checked: training goes on through a kill -9 of
// the primary and a promotion by hand, every push applied exactly once on
// the backup; a learner that opens while the primary is down finds the
// promoted backup; with no replica serving, the learner fails in one line
// naming the shard and every replica; the replicas of a LUN present one
// SCSI identity (for dm-multipath), read by INQUIRY (RawLun).
#include <stdlib.h>
#include <blkps/model.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "raw_lun.h"
#include "replicated_shard.h"
#include "target_process.h"
#include "temp_dir.h"

namespace blkps_test {
namespace {

// 16 model blocks of 1024 parameters, rule sum: weights are exact sums of
// small integers whatever the order, so they compare with a reference.
constexpr uint64_t kParams = 16 * 1024;
constexpr uint64_t kBlockParams = 1024;
constexpr uint64_t kBlocks = kParams / kBlockParams;
const std::string kModel = "params=" + std::to_string(kParams) + ";block=4K;rule=sum;staleness_aware=0";

// BLKPS_RECONNECT_SECONDS for the life of one test.
class ReconnectSeconds {
 public:
  explicit ReconnectSeconds(const char* seconds) { setenv("BLKPS_RECONNECT_SECONDS", seconds, 1); }
  ~ReconnectSeconds() { unsetenv("BLKPS_RECONNECT_SECONDS"); }
};

// A layout (learner/src/shard_layout.h) of one shard: learner LUN 1 of the
// primary, its backup's as the replica. Returns "layout:PATH".
std::string WriteLayout(const TempDir& dir, const ReplicatedShard& shard) {
  const std::string path = dir.path + "/slot-1.layout";
  std::ofstream(path) << "stripe_unit = 1048576\n"
                      << "shard = " << shard.primary.url(1) << "\n"
                      << "replica = " << shard.backup.url(1) << "\n";
  return "layout:" + path;
}

std::unique_ptr<blkps::Model> Open(const std::string& target, const std::string& who, std::string* error) {
  blkps::OpenOptions o;
  o.initiator_name = "iqn.2026-11.io.blkps.test:follow-" + who;
  return blkps::Model::Open(target, o, error);
}

// Every weight of learner LUN 1 of `target`, read under a reader's name.
std::vector<float> Weights(const TargetProcess& target) {
  std::string error;
  auto m = Open(target.url(1), "reader", &error);
  std::vector<float> w(kParams, -1.0f);
  EXPECT_NE(m, nullptr) << error;
  if (m != nullptr) {
    EXPECT_EQ(m->Pull(0, w.data(), kParams), 0) << m->last_error();
  }
  return w;
}

// A shard, its backup and a layout that lists both, for each test.
class ReplicasFollow : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(shard_.backup.ok()) << shard_.backup.start_output();
    ASSERT_TRUE(shard_.primary.ok()) << shard_.primary.start_output();
  }
  // A learner over the layout, under its own initiator name; nullptr and
  // the reason in *error if the open fails.
  std::unique_ptr<blkps::Model> OpenLayout(const std::string& who, std::string* error) {
    return Open(WriteLayout(dir_, shard_), who, error);
  }
  ReplicatedShard shard_{kModel};
  TempDir dir_;
};

TEST_F(ReplicasFollow, TrainingGoesOnThroughAKill9OfThePrimaryAndEveryPushIsOnTheBackupOnce) {
  ReconnectSeconds reconnect("60");
  std::string error;
  auto learner = OpenLayout("learner", &error);
  ASSERT_NE(learner, nullptr) << error;

  // The learner streams pushes of one block of a small integer, up to 8 in
  // flight (SubmitPush); every one must complete with 0 (acknowledged) and
  // goes into the reference once.
  std::vector<float> reference(kParams, 0.0f);
  std::mutex mu;
  std::condition_variable cv;
  int pushed = 0;
  bool promoted = false;
  std::string failure;
  std::thread training([&] {
    std::mt19937 rng(11);
    std::map<blkps::Model::Ticket, std::pair<uint64_t, std::vector<float>>> in_flight;  // block, gradient
    std::vector<blkps::Model::Completion> done;
    int after_promotion = 0;
    for (;;) {
      while (in_flight.size() < 8 && after_promotion < 200) {
        const uint64_t block = rng() % kBlocks;
        std::vector<float> g(kBlockParams, static_cast<float>(1 + rng() % 4));
        blkps::Model::Ticket ticket = 0;
        if (learner->SubmitPush(block * kBlockParams, g.data(), kBlockParams, &ticket) != 0) {
          std::lock_guard<std::mutex> lock(mu);
          failure = learner->last_error();
          after_promotion = 200;  // submit no more
          break;
        }
        in_flight[ticket] = {block, std::move(g)};
      }
      if (in_flight.empty()) break;
      done.clear();
      learner->Complete(&done, in_flight.size(), -1);
      std::lock_guard<std::mutex> lock(mu);
      for (const blkps::Model::Completion& c : done) {
        if (c.result != 0 && failure.empty()) failure = c.error;
        const auto& [block, g] = in_flight[c.ticket];
        if (c.result == 0) {
          for (uint64_t i = 0; i < kBlockParams; ++i) reference[block * kBlockParams + i] += g[i];
        }
        in_flight.erase(c.ticket);
        ++pushed;
        if (promoted) ++after_promotion;
      }
      if (!failure.empty()) after_promotion = 200;  // submit no more
      cv.notify_all();
    }
    std::lock_guard<std::mutex> lock(mu);
    pushed = -1;  // done
    cv.notify_all();
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return pushed >= 200 || pushed < 0; });
  }
  std::string why;
  const bool killed = shard_.primary.KillTgtd(&why);
  const std::string promote = Command(shard_.backup, "promote=1");
  {
    std::lock_guard<std::mutex> lock(mu);
    promoted = true;
  }
  training.join();
  ASSERT_TRUE(killed) << why;
  ASSERT_EQ(promote, "GOOD");
  ASSERT_EQ(failure, "") << "training stopped at the failover";
  EXPECT_GE(learner->reconnects(), 1u);
  learner.reset();
  EXPECT_EQ(Weights(shard_.backup), reference) << "the backup does not hold every push exactly once";
}

TEST_F(ReplicasFollow, ALearnerThatOpensWhileThePrimaryIsDownFindsThePromotedBackup) {
  ReconnectSeconds reconnect("10");
  std::string why;
  ASSERT_TRUE(shard_.primary.KillTgtd(&why)) << why;
  ASSERT_EQ(Command(shard_.backup, "promote=1"), "GOOD");
  std::string error;
  auto learner = OpenLayout("late", &error);
  ASSERT_NE(learner, nullptr) << error;
  std::vector<float> g(kBlockParams, 2.0f);
  ASSERT_EQ(learner->Push(0, g.data(), kBlockParams), 0) << learner->last_error();
  learner.reset();
  EXPECT_EQ(Weights(shard_.backup)[0], 2.0f);
}

TEST_F(ReplicasFollow, WithNoReplicaServingTheLearnerFailsInOneLineNamingTheShardAndEveryReplica) {
  ReconnectSeconds reconnect("2");
  std::string error;
  auto learner = OpenLayout("learner", &error);
  ASSERT_NE(learner, nullptr) << error;
  std::vector<float> g(kBlockParams, 1.0f);
  ASSERT_EQ(learner->Push(0, g.data(), kBlockParams), 0) << learner->last_error();
  std::string why;
  ASSERT_TRUE(shard_.primary.KillTgtd(&why)) << why;
  ASSERT_TRUE(shard_.backup.KillTgtd(&why)) << why;
  EXPECT_NE(learner->Push(0, g.data(), kBlockParams), 0);
  const std::string message = learner->last_error();
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_NE(message.find("slot-1.layout:2: shard 0"), std::string::npos) << message;
  EXPECT_NE(message.find(shard_.primary.url(1)), std::string::npos) << message;
  EXPECT_NE(message.find(shard_.backup.url(1)), std::string::npos) << message;
}

TEST_F(ReplicasFollow, ALearnerOpeningWhileThePrimaryIsDownAndTheBackupOnStandbyIsToldWhatEachAnswered) {
  std::string why;
  ASSERT_TRUE(shard_.primary.KillTgtd(&why)) << why;
  std::string error;
  auto learner = OpenLayout("late", &error);
  ASSERT_EQ(learner, nullptr);
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  EXPECT_NE(error.find("cannot connect to portal"), std::string::npos) << error;
  EXPECT_NE(error.find(shard_.backup.url(1) + ": on standby"), std::string::npos) << error;
}

// Learner LUN `lun`'s unit serial number (VPD page 0x80) and device
// identification (VPD page 0x83) pages on `target`, one after the other.
std::vector<uint8_t> ScsiIdentity(const TargetProcess& target, int lun) {
  RawLun raw(target.url(lun), "iqn.2026-11.io.blkps.test:identity");
  std::vector<uint8_t> serial, id;
  EXPECT_EQ(raw.Inquiry(0x80, &serial), "GOOD");
  EXPECT_EQ(raw.Inquiry(0x83, &id), "GOOD");
  serial.insert(serial.end(), id.begin(), id.end());
  return serial;
}

TEST_F(ReplicasFollow, TheReplicasOfALunPresentOneScsiIdentityOfTheirOwn) {
  // What dm-multipath groups paths by: the same LUN on both replicas is
  // one disk, another LUN is another, and neither is tgt's default (the
  // same for LUN 1 of every target, "beaf11").
  const std::vector<uint8_t> lun1 = ScsiIdentity(shard_.primary, 1);
  EXPECT_EQ(ScsiIdentity(shard_.backup, 1), lun1) << "the replicas of LUN 1 present two identities";
  EXPECT_NE(ScsiIdentity(shard_.primary, 2), lun1) << "LUNs 1 and 2 present one identity";
  EXPECT_EQ(std::string(lun1.begin(), lun1.end()).find("beaf1"), std::string::npos) << "tgt's default serial";
}

}  // namespace
}  // namespace blkps_test
