// Job's side of replicas (job.h "Replicas"; doc/replicas.md): the checks at
// Create, a primary's push sent to its backup before its WRITE completes, a
// backup's records applied, promotion, and a leased primary's fence. A
// returning backup's catch-up: job_catch_up.cc.
#include "job.h"
#include "number_text.h"

namespace blkps::server {

Status CheckReplicaJob(const JobOptions& opts, bool primary) {
  if (!primary && !opts.backup) return Status::OK();
  const char* key = opts.backup ? "backup" : "replicate_to";
  if (primary && opts.backup) {
    return Status::InvalidArgument("backup: a server is a primary (replicate_to=) or a backup (backup=), not both");
  }
  if (opts.consistency.mode != ConsistencyMode::kAsync && opts.shards > 1) {
    return Status::InvalidArgument(std::string(key) +
                                   ": replicas serve a scaled-out job in async only for now: its bsp and ssp round "
                                   "boundaries are not replicated");
  }
  if (opts.model.table.is_table() || opts.hashed_capacity > 0) {
    return Status::InvalidArgument(std::string(key) + ": replicas serve dense models only for now, not tables");
  }
  return Status::OK();
}

Status Job::StandbyStatus() {
  return Status::Standby("this server is a backup on standby: it serves learners once promoted (blkps target "
                         "promote); until then use its primary");
}

Status Job::Replicate(ReplicaChannel::Record kind, const std::string& body, ReplicaChannel& channel) {
  Status s = channel.Send(kind, body);
  if (s.ok()) {
    replica_records_.fetch_add(1);
    return s;
  }
  const std::string why = channel.peer() + ": " + s.message();
  // Without a lease a backup is never declared outdated: the job fails.
  switch (lease_.leased() ? backup_.Failed(&channel, why) : BackupVerdict::Loss::kLost) {
    case BackupVerdict::Loss::kAlone: return Status::OK();
    case BackupVerdict::Loss::kCatchUpEnded:
      log_("backup catch-up failed: " + why + ": it stays outdated; writes are acknowledged alone");
      return Status::OK();
    case BackupVerdict::Loss::kLostNow:
      log_("backup lost: " + why + ": writes wait for the lease keeper to declare it outdated (backup_outdated=1)");
      [[fallthrough]];
    case BackupVerdict::Loss::kLost:
      if (lease_.leased() && backup_.AwaitOutdated()) return Status::OK();
      break;
  }
  MutexLock lock(&mu_);
  if (!FailedLocked()) {
    failure_ = "job failed: backup " + channel.peer() + ": " + s.message() +
               ": a write is not acknowledged without its backup; promote the backup (blkps target promote) or "
               "restart both";
    failed_.store(true);
    log_(failure_);
  }
  return Status::Unavailable(failure_);
}

Status Job::CheckLease() {
  bool lapsed_first = false;
  Status s = lease_.Admit(&lapsed_first);
  if (lapsed_first)
    log_("lease lapsed: this primary serves no learner read or write from now on (" + s.message() + ")");
  return s;
}

Status Job::CheckReplicaHello(const std::string& hello) {
  if (!standby()) return Status::Unavailable("this server was promoted: it follows no primary");
  return blkps::server::CheckReplicaHello(*model_, hello);
}

Status Job::ApplyReplica(const std::string& body) {
  if (!standby()) return Status::Unavailable("this server was promoted: it follows no primary");
  ReplicaRecord record;
  Status s = ParseReplicaPush(*model_, replica_parts_, body, &record);
  if (!s.ok()) return s;
  size_t slot = 0;
  {
    MutexLock lock(&mu_);
    slot = SlotOfLunLocked(record.lun);
    if (slot == slots_.size()) {
      return Status::InvalidArgument("replica record for learner LUN " + std::to_string(record.lun) +
                                     ", which this backup does not serve: give it the primary's LUNs");
    }
    // Refused whole, before any of it is taken.
    for (const ReplicaRecord::Clocks& c : record.clocks) {
      if (c.words.size() != 3 + 2 * clocks_.num_learners()) {
        return Status::InvalidArgument("replica record: block " + std::to_string(c.block) + "'s clocks are not for " +
                                       std::to_string(clocks_.num_learners()) +
                                       " learners: give both the same learner LUNs");
      }
    }
  }
  for (const ReplicaRecord::Part& p : record.parts) {
    std::unique_lock<std::shared_mutex> block_lock = model_->LockBlock(p.part.block);
    if (replica_parts_.TakeIfNewerLocked(p.part.index, p.sequence)) RestorePartLocked(*model_, p.part, p.state);
  }
  MutexLock lock(&mu_);
  for (const ReplicaRecord::Clocks& c : record.clocks) {
    if (c.sequence <= clock_sequence_[c.block]) continue;  // a newer record's came first
    (void)clocks_.RestoreBlock(c.block, c.words);          // OK: its size was checked above
    clock_sequence_[c.block] = c.sequence;
  }
  receipts_.FinishWrite(slot, record.initiator, record.receipt_unit, true);
  replica_records_.fetch_add(1);
  return Status::OK();
}

Status Job::ReplicateRuleParams() {
  std::shared_ptr<ReplicaChannel> channel = replicated_.load() ? backup_.ChannelForWrite() : nullptr;
  if (!channel) return Status::OK();
  std::string lines;
  for (const auto& [key, value] : model_->rule().params()) lines += key + "=" + FloatText(value) + "\n";
  return Replicate(ReplicaChannel::Record::kParams, lines, *channel);
}

Status Job::ReplicateLiveness() {
  MutexLock in_order(&liveness_mu_);
  std::shared_ptr<ReplicaChannel> channel = replicated_.load() ? backup_.ChannelForWrite() : nullptr;
  if (!channel) return Status::OK();
  ReplicaLiveness dead;
  {
    MutexLock lock(&mu_);
    for (size_t k = 0; k < slots_.size(); ++k) {
      if (!clocks_.live(k)) dead.dead_luns.push_back(slots_[k].lun);
    }
  }
  if (dead.dead_luns == liveness_sent_) return Status::OK();
  Status s = Replicate(ReplicaChannel::Record::kLiveness, dead.Body(), *channel);
  if (s.ok()) liveness_sent_ = dead.dead_luns;
  return s;
}

Status Job::ApplyReplicaLiveness(const std::string& body) {
  if (!standby()) return Status::Unavailable("this server was promoted: it follows no primary");
  ReplicaLiveness record;
  Status s = ReplicaLiveness::Parse(body, &record);
  if (!s.ok()) return s;
  MutexLock lock(&mu_);
  std::vector<bool> dead(slots_.size(), false);
  for (uint64_t lun : record.dead_luns) {
    const size_t slot = SlotOfLunLocked(lun);
    if (slot == slots_.size()) {
      return Status::InvalidArgument("replica liveness: learner LUN " + std::to_string(lun) +
                                     ", which this backup does not serve: give it the primary's LUNs");
    }
    dead[slot] = true;
  }
  for (size_t k = 0; k < slots_.size(); ++k) {
    if (dead[k] && clocks_.live(k)) {
      clocks_.MarkDead(k);
      ++slots_[k].deaths;
    } else if (!dead[k] && !clocks_.live(k)) {
      clocks_.Rejoin(k);
    }
  }
  replica_records_.fetch_add(1);
  return Status::OK();
}

Status Job::AssignWeights(uint64_t offset, const void* src, size_t len) {
  // In the write gate, as a write: a catch-up's snapshot holds the weights
  // set, or their record goes through the channel it made.
  EnterWriteGate();
  std::shared_ptr<ReplicaChannel> channel = replicated_.load() ? backup_.ChannelForWrite() : nullptr;
  std::optional<ReplicaPush> record;
  if (channel) record.emplace(0, "", 0);  // a SNAPSHOT record: states only, nothing counted
  Status s = model_->AssignWeights(offset, src, len, [&](uint64_t block, uint64_t first, uint64_t n) {
    if (record) record->AddBlockLocked(*model_, replica_parts_, block, first, n);
  });
  LeaveWriteGate();
  if (s.ok() && record && !record->empty()) s = Replicate(ReplicaChannel::Record::kSnapshot, record->Body(), *channel);
  return s;
}

Status Job::ApplyReplicaParams(const std::string& body) {
  if (!standby()) return Status::Unavailable("this server was promoted: it follows no primary");
  return Control(body);
}

Status Job::Promote() {
  bool expected = true;
  if (!standby_.compare_exchange_strong(expected, false)) {
    return Status::Unavailable("promote: this server is not a backup on standby");
  }
  {
    // Every learner had no I/O here: each live one gets dead_after from now
    // to come over (its clocks are the primary's; a rejoin would move them);
    // those its primary held dead stay dead (LIVENESS records).
    MutexLock lock(&mu_);
    for (Slot& s : slots_) s.last_io = Clock::now();
    rounds_may_be_complete_ = true;  // bsp: rounds its primary's learners' deaths completed (the ticker's)
  }
  backup_.None("none since this server was promoted (control replicate_to= names a new one)");
  log_("promoted: this backup serves learners from now on, as a primary without a backup; it follows no "
       "primary (" +
       std::to_string(replica_records_.load()) + " records applied)");
  return Status::OK();
}

Status Job::ReplicateTo(const std::string& address) {
  if (standby()) return Status::Unavailable("control: replicate_to: this server is a backup on standby");
  if (!backup_.outdated()) {
    return Status::InvalidArgument(
        "control: replicate_to: this primary has a backup (in sync, lost or catching up: status `backup`); only "
        "one without one takes a new one");
  }
  if (!opts_.watch_new_backup) return Status::InvalidArgument("control: replicate_to: not served by the plugin");
  Status s = opts_.watch_new_backup(address);
  if (!s.ok()) return Status::InvalidArgument("control: replicate_to: " + s.message());
  replicated_.store(true);
  log_("replicate_to: looking for a new backup at " + address + " (caught up once it answers)");
  return Status::OK();
}

}  // namespace blkps::server
