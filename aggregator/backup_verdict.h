// A leased primary's backup: in sync, lost, outdated, or catching up
// (doc/replicas.md "A backup that is lost", "A backup that returns").
//
// A lost backup: the writes that could not reach it wait for a verdict
// instead of failing the job, because a backup that missed acknowledged
// pushes must never be promoted, and only the lease's coordination service
// (etcd) can promise that. The primary's lease keeper sees the loss in
// status, records in etcd that the backup is outdated (only while it holds
// the lease), then says so with the control command backup_outdated=1:
// from then on the primary acknowledges writes alone (degraded). No verdict
// within kVerdictSeconds fails the job, as a lost backup always did.
//
// An outdated backup that returns catches up (Job::CatchUp): from the
// instant of its snapshot every write's record goes to it too; a record it
// cannot take ends the catch-up (outdated again; the write is acknowledged
// alone, as its state is the primary's alone). Once the snapshot is
// applied the backup is in sync: every acknowledged write is on it. The
// keeper then removes the etcd mark (status `backup` empty).
//
// Without a lease nothing here applies: nothing could stop a by-hand
// promotion of a stale backup, so a lost backup fails the job.
//
// Thread-safe: tgt's worker threads wait here concurrently; the verdict
// arrives on a control write, a catch-up on the plugin's thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <string>

#include "mutex.h"
#include "replication.h"
#include "status.h"

namespace blkps::server {

class BackupVerdict {
 public:
  // How long writes wait for the verdict: under the initiators' ~30 s
  // command timeout, above the keeper's period (a third of the lease's
  // TTL) with room for an etcd election.
  static constexpr std::chrono::seconds kVerdictSeconds{10};

  // A primary's backup, in sync through `channel` (null: no backup).
  explicit BackupVerdict(std::shared_ptr<ReplicaChannel> channel) : channel_(std::move(channel)) {}

  // The channel a write that enters the write gate now sends its record
  // through: null while the backup is outdated (acknowledged alone).
  std::shared_ptr<ReplicaChannel> ChannelForWrite() const;
  // Whether the backup was declared outdated (and is not catching up).
  bool outdated() const;

  // A write's record could not be sent through `channel` (`why`).
  enum class Loss {
    kAlone,         // acknowledge alone: `channel`'s backup is outdated or replaced
    kCatchUpEnded,  // the same, and it ended the catch-up through `channel` (log it)
    kLostNow,       // the backup in sync is lost from now (log it): await the verdict
    kLost,          // it was lost already: await the verdict
  };
  Loss Failed(const ReplicaChannel* channel, const std::string& why);
  // Waits up to kVerdictSeconds for the verdict on a lost backup: true
  // once it is outdated (acknowledge the write alone), false when the wait
  // ran out.
  bool AwaitOutdated();
  // The control command backup_outdated=1: InvalidArgument unless the
  // backup is lost (a backup in sync must not be declared outdated).
  Status DeclareOutdated();
  // A primary that has no backup (a promoted one: `why`): outdated, so
  // that a new backup is caught up as a returning one is.
  void None(const std::string& why);

  // A catch-up through `channel` begins: false unless the backup is
  // outdated. REQUIRES (the caller's): the write gate closed and drained,
  // so that every write after it sends its record through `channel`.
  bool BeginCatchUp(std::shared_ptr<ReplicaChannel> channel);
  // The catch-up through `channel` ended: in sync (true), unless a failed
  // record ended it first (false); or, `why` given, failed (outdated).
  bool CaughtUp(const ReplicaChannel* channel);
  void CatchUpFailed(const ReplicaChannel* channel, const std::string& why);

  // For status `backup`: "" (in sync, or no backup), "lost: <why>",
  // "outdated: <why>" or "catching up: <peer>".
  std::string Describe() const;

 private:
  enum class State { kInSync, kLost, kOutdated, kCatchingUp };
  mutable Mutex mu_;
  std::condition_variable changed_;
  State state_ GUARDED_BY(mu_) = State::kInSync;
  std::string why_ GUARDED_BY(mu_);
  // The backup's channel while in sync, lost or catching up; null once
  // outdated.
  std::shared_ptr<ReplicaChannel> channel_ GUARDED_BY(mu_);
};

}  // namespace blkps::server
