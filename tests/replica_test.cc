// Replicas end to end (doc/replicas.md): a backup tgtd and its primary, both
// real (TargetProcess: the built plugin in a private tgtd on loopback),
// learners as raw SCSI sessions (RawLun) so that every WRITE's status is
// seen. What is checked: the backup is the primary exactly (weights, rule
// state through the weights of later steps, receipts), every push the
// primary acknowledged is on the backup after a kill -9 of the primary, a
// backup serves learners only once promoted, and a primary whose backup is
// gone acknowledges nothing more.
#include <blkps/control_lun.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
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

namespace blkps_test {
namespace {

// 16 model blocks of 1024 parameters: pushes of one or two blocks, from two
// learners, meet on the same blocks often.
constexpr uint64_t kParams = 16 * 1024;
constexpr uint64_t kBlockBytes = 4096;
constexpr uint64_t kDeviceBytes = kParams * 4;
constexpr uint32_t kDeviceLbas = kDeviceBytes / kRawLbaBytes;
constexpr uint64_t kBlocks = kDeviceBytes / kBlockBytes;
const std::string kModel = "params=" + std::to_string(kParams) + ";block=4K";

std::string Learner(int k) { return "iqn.2026-11.io.blkps.test:learner-" + std::to_string(k); }

// The weights of a model of `device_bytes`, through learner LUN 1 under a
// reader's own name.
std::vector<uint8_t> Weights(const TargetProcess& target, uint64_t device_bytes = kDeviceBytes) {
  RawLun reader(target.url(1), "iqn.2026-11.io.blkps.test:reader");
  std::vector<uint8_t> weights;
  EXPECT_EQ(reader.Read(0, static_cast<uint32_t>(device_bytes / kRawLbaBytes), &weights), "GOOD");
  return weights;
}

// Learner `k`'s receipts for every LUN, as the control LUN serves them to it
// (header and counts: blkps/control_lun.h).
std::vector<uint8_t> Receipts(const TargetProcess& target, int k, uint64_t device_bytes = kDeviceBytes) {
  RawLun control(target.control_url(), Learner(k));
  const uint64_t first = blkps_control_receipts_offset(device_bytes);
  const uint64_t bytes = 3 * blkps_control_receipt_bytes(device_bytes);  // LUNs 0..2 before the control LUN 3
  std::vector<uint8_t> receipts;
  EXPECT_EQ(control.Read(first / kRawLbaBytes, bytes / kRawLbaBytes, &receipts), "GOOD");
  return receipts;
}

// How many writes of learner `k` to its LUN (k) starting at each 512-byte
// unit the server shows applied.
std::vector<uint32_t> AppliedCounts(const TargetProcess& target, int k) {
  const std::vector<uint8_t> r = Receipts(target, k);
  const uint64_t at = k * blkps_control_receipt_bytes(kDeviceBytes) + 4096;
  std::vector<uint32_t> counts(kDeviceLbas);
  std::memcpy(counts.data(), r.data() + at, counts.size() * 4);
  return counts;
}

// A gradient of `blocks` model blocks, seeded.
std::vector<uint8_t> Gradient(std::mt19937& rng, uint64_t blocks) {
  std::normal_distribution<float> value(0.0f, 1.0f);
  std::vector<float> g(blocks * kBlockBytes / 4);
  for (float& x : g) x = value(rng);
  std::vector<uint8_t> bytes(g.size() * 4);
  std::memcpy(bytes.data(), g.data(), bytes.size());
  return bytes;
}

// Learners 1 and 2 (LUNs 1 and 2 of `primary`), each in a thread with its
// own generator seeded by its number, call `push` `pushes` times; the
// number of pushes that did not answer GOOD.
int FailedPushesOfTwoLearners(const TargetProcess& primary, int pushes,
                              const std::function<std::string(RawLun&, std::mt19937&, int)>& push) {
  std::vector<std::thread> learners;
  std::atomic<int> failed{0};
  for (int k = 1; k <= 2; ++k) {
    learners.emplace_back([&, k] {
      RawLun lun(primary.url(k), Learner(k));
      std::mt19937 rng(k);
      for (int i = 0; i < pushes; ++i) {
        if (push(lun, rng, i) != "GOOD") ++failed;
      }
    });
  }
  for (std::thread& t : learners) t.join();
  return failed.load();
}

// Promotes `backup` (a model of `device_bytes`) and expects it to hold
// `primary`'s weights (and through them the rule's state) and both
// learners' receipts, byte for byte.
void ExpectPromotionKeepsEverything(const TargetProcess& primary, const TargetProcess& backup,
                                    uint64_t device_bytes = kDeviceBytes) {
  const std::vector<uint8_t> weights = Weights(primary, device_bytes);
  const std::vector<uint8_t> receipts1 = Receipts(primary, 1, device_bytes);
  const std::vector<uint8_t> receipts2 = Receipts(primary, 2, device_bytes);
  ASSERT_EQ(Command(backup, "promote=1"), "GOOD");
  EXPECT_TRUE(Weights(backup, device_bytes) == weights) << "the backup's weights differ from the primary's";
  EXPECT_TRUE(Receipts(backup, 1, device_bytes) == receipts1) << "learner 1's receipts differ";
  EXPECT_TRUE(Receipts(backup, 2, device_bytes) == receipts2) << "learner 2's receipts differ";
}
void ExpectThePromotedBackupEqualsThePrimary(const ReplicatedShard& shard, uint64_t device_bytes = kDeviceBytes) {
  ExpectPromotionKeepsEverything(shard.primary, shard.backup, device_bytes);
}

TEST(Replicas, TheBackupEqualsThePrimaryExactlyAfterTwoLearnersPush) {
  // adam: each push's result depends on the moments every earlier push left,
  // and staleness-aware steps on what the pusher read: a backup that redid
  // the pushes in another order would differ in the last bits. (Once the
  // backup is promoted its old primary can acknowledge nothing more, so the
  // moments are not compared by a further push to both.)
  ReplicatedShard shard(kModel + ";rule=adam;lr=0.001;init=uniform:0.1;seed=7");
  ASSERT_TRUE(shard.backup.ok()) << shard.backup.start_output();
  ASSERT_TRUE(shard.primary.ok()) << shard.primary.start_output();
  const int failed = FailedPushesOfTwoLearners(shard.primary, 150, [](RawLun& lun, std::mt19937& rng, int i) {
    const uint64_t blocks = 1 + rng() % 2;
    const uint64_t block = rng() % (kBlocks - blocks + 1);
    std::vector<uint8_t> weights;
    if (i % 3 == 0) lun.Read(block * kBlockBytes / kRawLbaBytes, kBlockBytes / kRawLbaBytes, &weights);
    return lun.Write(block * kBlockBytes / kRawLbaBytes, Gradient(rng, blocks));
  });
  ASSERT_EQ(failed, 0);
  ExpectThePromotedBackupEqualsThePrimary(shard);
}

// A record carries only the parts of a block a push touched (64 KiB of
// weights each, wire/include/blkps/replication.h): pushes of any range,
// across parts and blocks of 256 KiB, from two learners, leave the backup
// the primary exactly. The last block is shorter than one part.
TEST(Replicas, PushesOfPartsOfLargeBlocksLeaveTheBackupEqual) {
  constexpr uint64_t kLargeBytes = 2 * (256 << 10) + (40 << 10);  // two blocks of four parts, one of 40 KiB
  ReplicatedShard shard("params=" + std::to_string(kLargeBytes / 4) +
                        ";block=256K;rule=adam;lr=0.001;init=uniform:0.1;seed=7");
  ASSERT_TRUE(shard.backup.ok()) << shard.backup.start_output();
  ASSERT_TRUE(shard.primary.ok()) << shard.primary.start_output();
  const int failed = FailedPushesOfTwoLearners(shard.primary, 100, [](RawLun& lun, std::mt19937& rng, int) {
    std::normal_distribution<float> value(0.0f, 1.0f);
    const uint64_t lbas = 1 + rng() % 160;  // up to 80 KiB: one part to three
    const uint64_t lba = rng() % (kLargeBytes / kRawLbaBytes - lbas + 1);
    std::vector<float> g(lbas * kRawLbaBytes / 4);
    for (float& x : g) x = value(rng);
    return lun.Write(lba, FloatBytes(g));
  });
  ASSERT_EQ(failed, 0);
  ExpectThePromotedBackupEqualsThePrimary(shard, kLargeBytes);
}

// Ends the test process, saying `phase` and both servers' logs, unless
// Done() comes first: a hang (seen once in CI, 300 s without a line) then
// says where it stood.
class HangWatch {
 public:
  HangWatch(const ReplicatedShard& shard, int seconds) : shard_(shard) {
    thread_ = std::thread([this, seconds] {
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_for(lock, std::chrono::seconds(seconds), [this] { return done_; })) return;
      std::cerr << "hung " << seconds << " s at: " << phase_ << "\n---- primary's log\n"
                << shard_.primary.Log() << "\n---- backup's log\n"
                << shard_.backup.Log() << std::endl;
      std::abort();
    });
  }
  void Phase(const char* phase) {
    std::lock_guard<std::mutex> lock(mu_);
    phase_ = phase;
  }
  ~HangWatch() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  const ReplicatedShard& shard_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  const char* phase_ = "start";
  std::thread thread_;
};

TEST(Replicas, EveryPushThePrimaryAcknowledgedIsOnTheBackupAfterItsKill9) {
  // sum with gradients of small integers: the weights are exact whatever the
  // order, so they can be compared with a reference of every push once.
  ReplicatedShard shard(kModel + ";rule=sum;staleness_aware=0");
  ASSERT_TRUE(shard.backup.ok()) << shard.backup.start_output();
  ASSERT_TRUE(shard.primary.ok()) << shard.primary.start_output();
  HangWatch watch(shard, 150);
  watch.Phase("two learners pushing to the primary");
  struct Push {
    uint32_t lba;
    std::vector<uint8_t> gradient;
  };
  std::mutex mu;
  std::condition_variable cv;
  int acknowledged = 0, finished = 0;
  std::vector<std::vector<Push>> acked(3), lost(3);  // by learner
  std::vector<std::thread> learners;
  for (int k = 1; k <= 2; ++k) {
    learners.emplace_back([&, k] {
      RawLun lun(shard.primary.url(k), Learner(k));
      lun.GiveUpWhenTargetIsGone();
      std::mt19937 rng(k);
      for (int i = 0; i < 100000; ++i) {
        const uint64_t block = rng() % kBlocks;
        std::vector<float> g(kBlockBytes / 4, static_cast<float>(1 + rng() % 4));
        Push push{static_cast<uint32_t>(block * kBlockBytes / kRawLbaBytes), std::vector<uint8_t>(kBlockBytes)};
        std::memcpy(push.gradient.data(), g.data(), kBlockBytes);
        const bool good = lun.Write(push.lba, push.gradient) == "GOOD";
        std::lock_guard<std::mutex> lock(mu);
        (good ? acked : lost)[k].push_back(push);
        if (!good) break;  // the primary is gone: the rest is resent below
        ++acknowledged;
        cv.notify_all();
      }
      std::lock_guard<std::mutex> lock(mu);
      ++finished;
      cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return acknowledged >= 200 || finished > 0; });
    ASSERT_EQ(finished, 0) << "a push failed before the kill";
  }
  std::string why;
  watch.Phase("killing the primary's tgtd");
  ASSERT_TRUE(shard.primary.KillTgtd(&why)) << why;
  watch.Phase("the learners finding the primary gone");
  for (std::thread& t : learners) t.join();

  watch.Phase("promoting the backup, then reading and resending there");
  ASSERT_EQ(Command(shard.backup, "promote=1"), "GOOD");
  std::vector<float> reference(kParams, 0.0f);
  for (int k = 1; k <= 2; ++k) {
    std::vector<uint32_t> expected(kDeviceLbas, 0);
    for (const Push& p : acked[k]) ++expected[p.lba];
    const std::vector<uint32_t> shown = AppliedCounts(shard.backup, k);
    for (uint32_t u = 0; u < kDeviceLbas; ++u) {
      ASSERT_GE(shown[u], expected[u]) << "learner " << k << ": an acknowledged push at unit " << u << " is lost";
    }
    // The push the primary did not acknowledge: resent where the backup's
    // receipt lacks it, as libblkps does after a reconnect.
    RawLun lun(shard.backup.url(k), Learner(k));
    for (const Push& p : lost[k]) {
      if (shown[p.lba] == expected[p.lba]) {
        ASSERT_EQ(lun.Write(p.lba, p.gradient), "GOOD");
      }
      ++expected[p.lba];
    }
    for (const std::vector<Push>* pushes : {&acked[k], &lost[k]}) {
      for (const Push& p : *pushes) {
        const float* g = reinterpret_cast<const float*>(p.gradient.data());
        for (uint64_t i = 0; i < kBlockBytes / 4; ++i) reference[p.lba * kRawLbaBytes / 4 + i] += g[i];
      }
    }
  }
  const std::vector<uint8_t> weights = Weights(shard.backup);
  ASSERT_EQ(weights.size(), kDeviceBytes);
  EXPECT_EQ(std::memcmp(weights.data(), reference.data(), kDeviceBytes), 0)
      << "the backup does not hold every push exactly once";
}

TEST(Replicas, ABackupRefusesLearnersWithStandbySenseUntilPromoted) {
  ReplicatedShard shard(kModel + ";rule=sum");
  ASSERT_TRUE(shard.backup.ok()) << shard.backup.start_output();
  ASSERT_TRUE(shard.primary.ok()) << shard.primary.start_output();
  RawLun lun(shard.backup.url(1), Learner(1));
  // NOT READY, LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN STANDBY STATE.
  EXPECT_EQ(lun.Read(0, 1), "sense 0x2 0x040b");
  EXPECT_EQ(lun.Write(0, std::vector<uint8_t>(kRawLbaBytes)), "sense 0x2 0x040b");
  EXPECT_TRUE(Contains(StatusJson(shard.backup), "\"replica\": \"backup\"")) << StatusJson(shard.backup);
  ASSERT_EQ(Command(shard.backup, "promote=1"), "GOOD");
  EXPECT_EQ(lun.Read(0, 1), "GOOD");
  EXPECT_TRUE(Contains(StatusJson(shard.backup), "\"replica\": \"primary\""));
}

TEST(Replicas, ABackupWhosePrimaryDiedStaysOnStandby) {
  ReplicatedShard shard(kModel + ";rule=sum");
  ASSERT_TRUE(shard.backup.ok()) << shard.backup.start_output();
  ASSERT_TRUE(shard.primary.ok()) << shard.primary.start_output();
  std::string why;
  ASSERT_TRUE(shard.primary.KillTgtd(&why)) << why;
  RawLun lun(shard.backup.url(1), Learner(1));
  EXPECT_EQ(lun.Read(0, 1), "sense 0x2 0x040b");
}

// Learner 1's session on `shard`'s primary once it has pushed one block
// (GOOD); null, with the failure added, if the shard did not start or the
// push failed.
std::unique_ptr<RawLun> LearnerOneAfterAPush(const ReplicatedShard& shard) {
  if (!shard.backup.ok() || !shard.primary.ok()) {
    ADD_FAILURE() << shard.backup.start_output() << shard.primary.start_output();
    return nullptr;
  }
  auto lun = std::make_unique<RawLun>(shard.primary.url(1), Learner(1));
  const std::string first = lun->Write(0, std::vector<uint8_t>(kRawLbaBytes));
  if (first != "GOOD") {
    ADD_FAILURE() << "the first push: " << first;
    return nullptr;
  }
  return lun;
}

TEST(Replicas, APrimaryWhoseBackupIsGoneAcknowledgesNoMoreWrites) {
  ReplicatedShard shard(kModel + ";rule=sum");
  std::unique_ptr<RawLun> pushed = LearnerOneAfterAPush(shard);
  ASSERT_TRUE(pushed);
  RawLun& lun = *pushed;
  std::string why;
  ASSERT_TRUE(shard.backup.KillTgtd(&why)) << why;
  // NOT READY, MANUAL INTERVENTION REQUIRED: the job failed, saying why.
  EXPECT_EQ(lun.Write(0, std::vector<uint8_t>(kRawLbaBytes)), "sense 0x2 0x0403");
  EXPECT_EQ(lun.Write(0, std::vector<uint8_t>(kRawLbaBytes)), "sense 0x2 0x0403");
  EXPECT_TRUE(Contains(StatusJson(shard.primary), "backup " + shard.address)) << StatusJson(shard.primary);
}

// A backup that stops answering (SIGSTOP: alive, its connection open) is
// waited for at most ReplicaLink::kAckTimeoutSeconds; then the write fails
// as if the backup were gone, and so does every later one.
TEST(Replicas, APrimaryWhoseBackupStopsAnsweringFailsTheWrite) {
  ReplicatedShard shard(kModel + ";rule=sum");
  std::unique_ptr<RawLun> pushed = LearnerOneAfterAPush(shard);
  ASSERT_TRUE(pushed);
  RawLun& lun = *pushed;
  std::string why;
  const bool stopped = shard.backup.StopTgtd(&why);
  const std::string stalled = lun.Write(0, std::vector<uint8_t>(kRawLbaBytes));
  const std::string after = lun.Write(0, std::vector<uint8_t>(kRawLbaBytes));
  shard.backup.ContinueTgtd();  // before any assertion: the fixture stops it
  ASSERT_TRUE(stopped) << why;
  EXPECT_EQ(stalled, "sense 0x2 0x0403");
  EXPECT_EQ(after, "sense 0x2 0x0403");
  EXPECT_TRUE(Contains(StatusJson(shard.primary), "backup " + shard.address)) << StatusJson(shard.primary);
}

// Learner `k`'s receipt header for its LUN on `target` (writes applied, in
// progress), as the control LUN serves it to the learner.
blkps_control_receipt ReceiptHeader(const TargetProcess& target, int k) {
  const std::vector<uint8_t> r = Receipts(target, k);
  blkps_control_receipt header{};
  EXPECT_EQ(blkps_control_receipt_decode(r.data() + k * blkps_control_receipt_bytes(kDeviceBytes),
                                         BLKPS_CONTROL_RECEIPT_HEADER_BYTES, k, &header),
            0);
  return header;
}

// A write the primary applied while its record waits for the backup is
// still in progress on the learner's receipt: a learner that reconnects
// then (a silent replica: doc/libblkps.md "Faults") waits for it to end
// before it trusts the receipt, instead of counting as done a push that a
// failover to the backup would lose. It ends once the backup answers.
TEST(Replicas, AWriteWaitingForItsBackupIsInProgressOnItsReceipt) {
  ReplicatedShard shard(kModel + ";rule=sum");
  std::unique_ptr<RawLun> pushed = LearnerOneAfterAPush(shard);
  ASSERT_TRUE(pushed);
  RawLun& lun = *pushed;
  std::string why;
  ASSERT_TRUE(shard.backup.StopTgtd(&why)) << why;
  std::string stalled;
  std::thread pusher([&] { stalled = lun.Write(0, std::vector<uint8_t>(kRawLbaBytes)); });
  blkps_control_receipt applied{};
  for (int i = 0; i < 200 && applied.writes_applied < 2; ++i) {  // the primary applies it at once
    applied = ReceiptHeader(shard.primary, 1);
    if (applied.writes_applied < 2) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  shard.backup.ContinueTgtd();
  pusher.join();
  EXPECT_EQ(applied.writes_applied, 2u);
  EXPECT_EQ(applied.writes_in_progress, 1u) << "the receipt counted the write as ended before its backup had it";
  EXPECT_EQ(stalled, "GOOD");
  const blkps_control_receipt ended = ReceiptHeader(shard.primary, 1);
  EXPECT_EQ(ended.writes_applied, 2u);
  EXPECT_EQ(ended.writes_in_progress, 0u);
}

// Polls the primary's status until `part` shows in it (about 30 s at most).
bool StatusShows(const TargetProcess& target, const std::string& part) {
  for (int i = 0; i < 600; ++i) {
    if (Contains(StatusJson(target), part)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// doc/replicas.md "A backup that returns": a leased primary whose backup
// was killed goes on alone (the keeper's verdict played by the test); the
// backup, restarted, is caught up from a snapshot plus the stream while two
// learners keep pushing, and is then the primary exactly: weights, adam's
// moments through them, and receipts. From the backup's restart on the
// learners push to the first half of the model only: the second half's
// state reaches the backup through the snapshot alone.
// Learners 1 and 2 of `target`, each in a thread, push one or two blocks
// at a time (reading one push in three) until Stop().
class PushingLearners {
 public:
  explicit PushingLearners(const TargetProcess& target) {
    for (int k = 1; k <= 2; ++k) {
      threads_.emplace_back([this, &target, k] {
        RawLun lun(target.url(k), Learner(k));
        std::mt19937 rng(k);
        for (int i = 0; !stop_.load(); ++i) {
          const uint64_t blocks = 1 + rng() % 2;
          const uint64_t block = rng() % (within_.load() - blocks + 1);
          std::vector<uint8_t> weights;
          if (i % 3 == 0) lun.Read(block * kBlockBytes / kRawLbaBytes, kBlockBytes / kRawLbaBytes, &weights);
          if (lun.Write(block * kBlockBytes / kRawLbaBytes, Gradient(rng, blocks)) != "GOOD") ++failed_;
          ++pushes_;
        }
      });
    }
  }
  ~PushingLearners() { Stop(); }
  // Waits until they made `n` more pushes, or one failed.
  void AfterMore(int n) {
    const int until = pushes_.load() + n;
    while (pushes_.load() < until && failed_.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // From now on they push to blocks [0, blocks) only.
  void Within(uint64_t blocks) { within_ = blocks; }
  // Stops and joins them; the number of pushes that were not GOOD.
  int Stop() {
    stop_ = true;
    for (std::thread& t : threads_) t.join();
    threads_.clear();
    return failed_.load();
  }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int> pushes_{0}, failed_{0};
  std::atomic<uint64_t> within_{kBlocks};
  std::vector<std::thread> threads_;
};

TEST(Replicas, ARestartedBackupCatchesUpWhileLearnersPushAndEqualsThePrimary) {
  ReplicatedShard shard(kModel + ";rule=adam;lr=0.001;init=uniform:0.1;seed=7");
  ASSERT_TRUE(shard.backup.ok()) << shard.backup.start_output();
  ASSERT_TRUE(shard.primary.ok()) << shard.primary.start_output();
  ASSERT_EQ(Command(shard.primary, LeaseForAMinute()), "GOOD");
  PushingLearners learners(shard.primary);
  learners.AfterMore(100);
  std::string why;
  ASSERT_TRUE(shard.backup.KillTgtd(&why)) << why;
  const bool lost = StatusShows(shard.primary, "\"backup\": \"lost: ");
  const std::string verdict = Command(shard.primary, "backup_outdated=1");
  learners.AfterMore(100);  // acknowledged alone
  learners.Within(kBlocks / 2);
  learners.AfterMore(10);
  const bool restarted = shard.backup.Restart();
  const bool caught_up = restarted && StatusShows(shard.primary, "\"backup\": \"\"");
  learners.AfterMore(100);  // in sync again
  const int failed = learners.Stop();
  ASSERT_TRUE(lost) << StatusJson(shard.primary);
  ASSERT_EQ(verdict, "GOOD");
  ASSERT_TRUE(restarted) << shard.backup.start_output();
  ASSERT_TRUE(caught_up) << StatusJson(shard.primary) << shard.primary.Log();
  ASSERT_EQ(failed, 0);
  EXPECT_TRUE(Contains(shard.primary.Log(), "caught up")) << shard.primary.Log();
  ExpectThePromotedBackupEqualsThePrimary(shard);
}

// doc/replicas.md "A new backup": the backup promoted after its primary's
// kill -9 has no backup (status `backup` says so) until replicate_to= names
// a new one, which it catches up while two learners push to it; promoted in
// its turn, the new backup equals it exactly (weights, adam's moments
// through them, receipts). replicate_to= is refused on a primary that has
// a backup, on a backup on standby, and with a malformed address.
TEST(Replicas, APromotedBackupCatchesUpANewBackupThatThenEqualsIt) {
  const std::string model = kModel + ";rule=adam;lr=0.001;init=uniform:0.1;seed=7";
  ReplicatedShard shard(model);
  ASSERT_TRUE(shard.backup.ok()) << shard.backup.start_output();
  ASSERT_TRUE(shard.primary.ok()) << shard.primary.start_output();
  const std::string address = "127.0.0.1:" + std::to_string(FreePort());
  EXPECT_NE(Command(shard.primary, "replicate_to=" + address), "GOOD") << "a primary with a backup took another";
  EXPECT_NE(Command(shard.backup, "replicate_to=" + address), "GOOD") << "a backup on standby took one";
  {
    PushingLearners learners(shard.primary);
    learners.AfterMore(100);
    ASSERT_EQ(learners.Stop(), 0);
  }
  std::string why;
  ASSERT_TRUE(shard.primary.KillTgtd(&why)) << why;
  ASSERT_EQ(Command(shard.backup, "promote=1"), "GOOD");
  EXPECT_TRUE(Contains(StatusJson(shard.backup), "\"backup\": \"outdated: none since this server was promoted"))
      << StatusJson(shard.backup);
  TargetProcess fresh(model + ";backup=" + address, "--luns 2");
  ASSERT_TRUE(fresh.ok()) << fresh.start_output();
  PushingLearners learners(shard.backup);
  learners.AfterMore(50);
  EXPECT_NE(Command(shard.backup, "replicate_to=127.0.0.1"), "GOOD") << "a malformed address was taken";
  const std::string taken = Command(shard.backup, "replicate_to=" + address);
  const bool caught_up = taken == "GOOD" && StatusShows(shard.backup, "\"backup\": \"\"");
  learners.AfterMore(100);  // in sync
  const int failed = learners.Stop();
  ASSERT_EQ(taken, "GOOD") << StatusJson(shard.backup);
  ASSERT_TRUE(caught_up) << StatusJson(shard.backup) << shard.backup.Log();
  ASSERT_EQ(failed, 0);
  ExpectPromotionKeepsEverything(shard.backup, fresh);
}

// Kills `shard`'s backup (the primary holds a lease) and has its primary
// find it lost with a learner's write, which waits for the verdict; runs
// `meanwhile`, then declares the backup outdated as its lease keeper would:
// the write is acknowledged alone. "" or what went wrong.
std::string OutdateTheBackup(
    ReplicatedShard& shard, const std::function<void()>& meanwhile = [] {}) {
  std::mt19937 rng(1);
  RawLun learner(shard.primary.url(1), Learner(1));
  if (learner.Write(0, Gradient(rng, 1)) != "GOOD") return "a write failed before the backup's kill";
  std::string why;
  if (!shard.backup.KillTgtd(&why)) return why;
  std::string alone;
  std::thread write([&] { alone = learner.Write(0, Gradient(rng, 1)); });
  const bool lost = StatusShows(shard.primary, "\"backup\": \"lost: ");
  meanwhile();
  const std::string verdict = Command(shard.primary, "backup_outdated=1");
  write.join();
  if (!lost) return "the primary did not find its backup lost: " + StatusJson(shard.primary);
  if (verdict != "GOOD") return "backup_outdated=1: " + verdict;
  if (alone != "GOOD") return "the write alone: " + alone;
  return "";
}

// A connection the restarted backup took and that ended before any catch-up
// (a stranger's, or a catch-up refused while the backup was still adding
// its LUNs) does not use up the backup: the primary's catch-up, tried
// again, follows it.
TEST(Replicas, AConnectionEndedBeforeTheCatchUpDoesNotKeepTheBackupOutdated) {
  ReplicatedShard shard(kModel + ";rule=sum");
  ASSERT_TRUE(shard.backup.ok()) << shard.backup.start_output();
  ASSERT_TRUE(shard.primary.ok()) << shard.primary.start_output();
  ASSERT_EQ(Command(shard.primary, LeaseForAMinute()), "GOOD");
  bool restarted = false, connected = false;
  ASSERT_EQ(OutdateTheBackup(shard,
                             [&] {
                               // The primary's catch-up starts only once the backup is outdated.
                               restarted = shard.backup.Restart();
                               const int port = std::stoi(shard.address.substr(shard.address.rfind(':') + 1));
                               const int stranger = socket(AF_INET, SOCK_STREAM, 0);
                               sockaddr_in a{};
                               a.sin_family = AF_INET;
                               a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
                               a.sin_port = htons(static_cast<uint16_t>(port));
                               connected = connect(stranger, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
                               close(stranger);  // the backup's first connection since its restart, ended at once
                             }),
            "");
  ASSERT_TRUE(restarted) << shard.backup.start_output();
  ASSERT_TRUE(connected) << "the restarted backup does not listen on " << shard.address;
  ASSERT_TRUE(StatusShows(shard.primary, "\"backup\": \"\"")) << StatusJson(shard.primary) << shard.primary.Log();
  ExpectThePromotedBackupEqualsThePrimary(shard);
}

// A rule parameter an operator sets on the primary is the backup's before
// the control write completes, and a returning backup's catch-up carries
// the one set while it was away: after a failover the job trains on with
// the learning rate it had.
TEST(Replicas, RuleParametersSetOnThePrimaryAreTheBackupsInSyncAndAfterACatchUp) {
  ReplicatedShard shard(kModel + ";rule=sgd;lr=1");
  ASSERT_TRUE(shard.backup.ok()) << shard.backup.start_output();
  ASSERT_TRUE(shard.primary.ok()) << shard.primary.start_output();
  ASSERT_EQ(Command(shard.primary, LeaseForAMinute()), "GOOD");
  ASSERT_EQ(Command(shard.primary, "lr=0.5"), "GOOD");
  EXPECT_TRUE(Contains(StatusJson(shard.backup), "\"rule_params\": {\"lr\": 0.5}")) << StatusJson(shard.backup);
  ASSERT_EQ(OutdateTheBackup(shard), "");
  ASSERT_EQ(Command(shard.primary, "lr=0.25"), "GOOD");  // the backup is away
  ASSERT_TRUE(shard.backup.Restart()) << shard.backup.start_output();
  ASSERT_TRUE(StatusShows(shard.primary, "\"backup\": \"\"")) << StatusJson(shard.primary) << shard.primary.Log();
  EXPECT_TRUE(Contains(StatusJson(shard.backup), "\"rule_params\": {\"lr\": 0.25}")) << StatusJson(shard.backup);
  ExpectThePromotedBackupEqualsThePrimary(shard);
}

// Weights an operator writes through the primary's control LUN are the
// backup's before the write completes (no push touches them after).
TEST(Replicas, WeightsAnOperatorWritesOnThePrimaryAreTheBackups) {
  ReplicatedShard shard(kModel + ";rule=adam;lr=0.001");
  ASSERT_TRUE(shard.backup.ok()) << shard.backup.start_output();
  ASSERT_TRUE(shard.primary.ok()) << shard.primary.start_output();
  const int failed = FailedPushesOfTwoLearners(shard.primary, 20, [](RawLun& lun, std::mt19937& rng, int) {
    return lun.Write(rng() % kBlocks * kBlockBytes / kRawLbaBytes, Gradient(rng, 1));
  });
  ASSERT_EQ(failed, 0);
  std::vector<float> weights(kParams / 2 + 128);  // from inside block 3 on, across parts and blocks
  for (size_t i = 0; i < weights.size(); ++i) weights[i] = 0.5f * static_cast<float>(i % 1000) - 7.0f;
  RawLun control(shard.primary.control_url(), "iqn.2026-11.io.blkps.test:operator");
  const uint64_t at = BLKPS_CONTROL_WEIGHTS_OFFSET + 3 * kBlockBytes + 512;
  ASSERT_EQ(control.Write(at / kRawLbaBytes, FloatBytes(weights)), "GOOD");
  ExpectThePromotedBackupEqualsThePrimary(shard);
}

// A learner the primary declared dead is dead on the backup too, in sync
// (LIVENESS records) and after a catch-up (its counts' clocks): promoted,
// the backup waits for no learner its primary had given up (a bsp round
// would wait dead_after).
TEST(Replicas, ALearnerItsPrimaryHoldsDeadIsDeadOnTheBackupInSyncAndAfterACatchUp) {
  ReplicatedShard shard(kModel + ";rule=sum;mode=bsp;dead_after=1");
  ASSERT_TRUE(shard.backup.ok()) << shard.backup.start_output();
  ASSERT_TRUE(shard.primary.ok()) << shard.primary.start_output();
  ASSERT_EQ(Command(shard.primary, LeaseForAMinute()), "GOOD");
  // Learner 1 reads on; learner 2 never comes.
  std::atomic<bool> stop{false};
  std::thread reader([&] {
    RawLun lun(shard.primary.url(1), Learner(1));
    std::vector<uint8_t> block;
    while (!stop.load()) {
      (void)lun.Read(0, 1, &block);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  const std::string dead = "{\"lun\": 2, \"dtype\": \"float32\", \"state\": \"dead\"";
  const std::string live = "{\"lun\": 1, \"dtype\": \"float32\", \"state\": \"live\"";
  EXPECT_TRUE(StatusShows(shard.primary, dead)) << StatusJson(shard.primary);
  EXPECT_TRUE(StatusShows(shard.backup, dead)) << StatusJson(shard.backup);
  EXPECT_TRUE(Contains(StatusJson(shard.backup), live)) << StatusJson(shard.backup);
  // Learner 1's bsp rounds complete without learner 2 on the primary; the
  // restarted backup is caught up and holds learner 2 dead again.
  EXPECT_EQ(OutdateTheBackup(shard), "");
  ASSERT_TRUE(shard.backup.Restart()) << shard.backup.start_output();
  EXPECT_TRUE(StatusShows(shard.primary, "\"backup\": \"\"")) << StatusJson(shard.primary) << shard.primary.Log();
  EXPECT_TRUE(StatusShows(shard.backup, dead)) << StatusJson(shard.backup);
  stop.store(true);
  reader.join();
  ExpectThePromotedBackupEqualsThePrimary(shard);
}

TEST(Replicas, APrimaryDoesNotStartWithoutItsBackup) {
  TargetProcess primary(kModel + ";rule=sum;replicate_to=127.0.0.1:" + std::to_string(FreePort()));
  EXPECT_FALSE(primary.ok());
  EXPECT_TRUE(Contains(primary.start_output(), "start the backup first")) << primary.start_output();
}

}  // namespace
}  // namespace blkps_test
