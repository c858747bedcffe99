// A leased primary whose backup is lost (doc/replicas.md "A backup that is
// lost"): the writes that could not reach the backup wait for a verdict
// instead of failing the job, because a backup that missed acknowledged
// pushes must never be promoted, and only the lease's coordination service
// (etcd) can promise that. The primary's lease keeper sees the loss in
// status, records in etcd that the backup is outdated (only while it holds
// the lease), then says so with the control command backup_outdated=1:
// from then on the primary acknowledges writes alone (degraded). No verdict
// within kVerdictSeconds fails the job, as a lost backup always did.
//
// Without a lease nothing here applies: nothing could stop a by-hand
// promotion of a stale backup, so a lost backup fails the job.
//
// Thread-safe: tgt's worker threads wait here concurrently; the verdict
// arrives on a control write.
#pragma once

#include <chrono>
#include <condition_variable>
#include <string>

#include "mutex.h"
#include "status.h"

namespace blkps::server {

class BackupVerdict {
 public:
  // How long writes wait for the verdict: under the initiators' ~30 s
  // command timeout, above the keeper's period (a third of the lease's
  // TTL) with room for an etcd election.
  static constexpr std::chrono::seconds kVerdictSeconds{10};

  // Whether the backup was declared outdated: writes go unreplicated.
  bool outdated() const;
  // A write could not reach the backup (`why`): marks the backup lost.
  // True for the write that found it in sync (the caller logs the loss).
  bool Lost(const std::string& why);
  // Waits up to kVerdictSeconds for the verdict on a lost backup: true
  // once it is outdated (acknowledge the write alone), false when the wait
  // ran out.
  bool AwaitOutdated();
  // The control command backup_outdated=1: FailedPrecondition unless the
  // backup is lost (a backup in sync must not be declared outdated).
  Status DeclareOutdated();
  // For status `backup`: "" (in sync, or no backup), "lost: <why>" or
  // "outdated: <why>".
  std::string Describe() const;

 private:
  enum class State { kInSync, kLost, kOutdated };
  mutable Mutex mu_;
  std::condition_variable changed_;
  State state_ GUARDED_BY(mu_) = State::kInSync;
  std::string why_ GUARDED_BY(mu_);
};

}  // namespace blkps::server
