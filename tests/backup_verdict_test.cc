// A leased primary whose backup is lost (aggregator/backup_verdict.h,
// doc/replicas.md "A backup that is lost"): real primary and backup tgtds
// on loopback, the lease keeper's part played by control commands
// (lease_until=, backup_outdated=1) through the primary's control LUN.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "raw_lun.h"
#include "replicated_shard.h"
#include "target_process.h"

namespace blkps_test {
namespace {

constexpr uint32_t kParams = 1024;  // one 4 KiB block
const std::string kModel = "params=" + std::to_string(kParams) + ";block=4K;rule=sum";
const std::string kLearner = "iqn.2026-11.io.blkps.test:learner-1";

bool Contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A write of ones to the whole model through learner LUN 1.
std::string PushOnes(RawLun& lun) {
  const std::vector<float> ones(kParams, 1.0f);
  std::vector<uint8_t> bytes(kParams * 4);
  std::memcpy(bytes.data(), ones.data(), bytes.size());
  return lun.Write(0, bytes);
}

// Parameter 0 as learner LUN 1 of `target` reads it.
float FirstWeight(const TargetProcess& target) {
  RawLun reader(target.url(1), "iqn.2026-11.io.blkps.test:reader");
  std::vector<uint8_t> block;
  EXPECT_EQ(reader.Read(0, 1, &block), "GOOD");
  float w = 0;
  std::memcpy(&w, block.data(), sizeof w);
  return w;
}

struct LeasedShard : ReplicatedShard {
  LeasedShard() : ReplicatedShard(kModel) {}
  bool Lease() { return primary.ok() && Command(primary, LeaseForAMinute()) == "GOOD"; }
};

TEST(BackupVerdict, AWriteThatLostItsBackupWaitsForTheVerdictThenIsAcknowledgedAlone) {
  LeasedShard shard;
  ASSERT_TRUE(shard.backup.ok()) << shard.backup.start_output();
  ASSERT_TRUE(shard.Lease()) << shard.primary.start_output();
  RawLun lun(shard.primary.url(1), kLearner);
  ASSERT_EQ(PushOnes(lun), "GOOD");
  std::string why;
  ASSERT_TRUE(shard.backup.KillTgtd(&why)) << why;
  auto waiting = std::async(std::launch::async, [&] { return PushOnes(lun); });
  // The write waits: the status says the backup is lost, not the job failed.
  for (int i = 0; i < 200 && !Contains(StatusJson(shard.primary), "\"backup\": \"lost: "); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::string lost = StatusJson(shard.primary);
  EXPECT_TRUE(Contains(lost, "\"backup\": \"lost: " + shard.address)) << lost;
  EXPECT_TRUE(Contains(lost, "\"failed\": false")) << lost;
  ASSERT_EQ(Command(shard.primary, "backup_outdated=1"), "GOOD");
  EXPECT_EQ(waiting.get(), "GOOD");
  EXPECT_EQ(PushOnes(lun), "GOOD");  // degraded: no backup asked any more
  EXPECT_EQ(FirstWeight(shard.primary), 3.0f);
  EXPECT_TRUE(Contains(StatusJson(shard.primary), "\"backup\": \"outdated: " + shard.address))
      << StatusJson(shard.primary);
}

TEST(BackupVerdict, WithoutAVerdictTheJobFailsAsWithoutALease) {
  LeasedShard shard;
  ASSERT_TRUE(shard.backup.ok()) << shard.backup.start_output();
  ASSERT_TRUE(shard.Lease()) << shard.primary.start_output();
  RawLun lun(shard.primary.url(1), kLearner);
  std::string why;
  ASSERT_TRUE(shard.backup.KillTgtd(&why)) << why;
  // NOT READY, MANUAL INTERVENTION REQUIRED, after the verdict's wait.
  EXPECT_EQ(PushOnes(lun), "sense 0x2 0x0403");
  EXPECT_TRUE(Contains(StatusJson(shard.primary), "\"failed\": true")) << StatusJson(shard.primary);
}

TEST(BackupVerdict, ABackupInSyncIsNotDeclaredOutdated) {
  LeasedShard shard;
  ASSERT_TRUE(shard.backup.ok()) << shard.backup.start_output();
  ASSERT_TRUE(shard.Lease()) << shard.primary.start_output();
  // ILLEGAL REQUEST, INVALID FIELD IN PARAMETER LIST: the command refused.
  EXPECT_EQ(Command(shard.primary, "backup_outdated=1"), "sense 0x5 0x2600");
  EXPECT_TRUE(Contains(StatusJson(shard.primary), "backup_outdated: this primary's backup is not lost"))
      << StatusJson(shard.primary);
  EXPECT_TRUE(Contains(StatusJson(shard.primary), "\"backup\": \"\"")) << StatusJson(shard.primary);
}

}  // namespace
}  // namespace blkps_test
