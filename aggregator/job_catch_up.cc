// A returning backup caught up from a snapshot plus the stream (job.h
// CatchUp; doc/replicas.md "A backup that returns"): the primary's side,
// and the backup's SNAPSHOT_BEGIN and SNAPSHOT records
// (wire/include/blkps/replication.h).
#include "job.h"
#include "number_text.h"

namespace blkps::server {
namespace {

// A SNAPSHOT record holds blocks up to about this many bytes: a write's
// record waits behind one of them at most.
constexpr size_t kSnapshotRecordBytes = size_t{4} << 20;

}  // namespace

Status Job::CatchUp(std::shared_ptr<ReplicaChannel> channel) {
  const Status not_outdated = Status::InvalidArgument("catch-up: this primary's backup is not outdated");
  if (!backup_.outdated()) return not_outdated;
  Status s = channel->Hello(ReplicaHello(*model_));
  if (!s.ok()) return s;
  MutexLock one_at_a_time(&checkpoint_mu_);  // the model's one snapshot
  const Clock::time_point start = Clock::now();
  ReplicaCounts counts;
  std::vector<uint64_t> sequences;
  std::unique_ptr<Model::Snapshot> snapshot;
  {
    // The instant, as a checkpoint's: every write before it is in the
    // snapshot with its receipt count, and every write after it sends its
    // record through `channel`, after the counts.
    CloseWriteGate();
    snapshot = model_->TakeSnapshot([&] {
      sequences = replica_parts_.CopyLocked();
      MutexLock lock(&mu_);
      counts.clocks = clocks_.Save();
      counts.receipts = receipts_.Save();
      for (const Slot& slot : slots_) counts.luns.push_back(slot.lun);
    });
    s = backup_.BeginCatchUp(channel) ? channel->Send(ReplicaChannel::Record::kSnapshotBegin, counts.Body())
                                      : not_outdated;
    OpenWriteGate();
  }
  if (s.ok()) {
    MutexLock in_order(&rule_params_mu_);  // a Control setting one after this sends its own record
    s = ReplicateRuleParams();
  }
  const std::string peer = channel->peer();
  if (s.ok()) {
    log_("backup at " + peer + " returned: catching it up (" + std::to_string(model_->num_blocks()) +
         " blocks as at one instant, and every write since) while training goes on");
  }
  uint64_t bytes = 0;
  for (uint64_t k = 0; s.ok() && k < replica_parts_.count();) {
    ReplicaPush record(0, "", 0);
    for (; k < replica_parts_.count() && record.bytes() < kSnapshotRecordBytes; ++k) {
      const ReplicaPart part = replica_parts_.Part(k);
      if (part.params > 0) record.AddSnapshotPart(*snapshot, part, sequences[k]);
    }
    bytes += record.bytes();
    s = channel->Send(ReplicaChannel::Record::kSnapshot, record.Body());
  }
  snapshot.reset();
  if (!s.ok()) {
    backup_.CatchUpFailed(channel.get(), peer + ": " + s.message());
    log_("backup catch-up failed: " + peer + ": " + s.message() + ": it stays outdated");
    return s;
  }
  if (!backup_.CaughtUp(channel.get())) {
    return Status::Unavailable("catch-up: " + peer + ": a write's record failed first: " + backup_.Describe());
  }
  log_("backup at " + peer + " caught up in " + Fixed(Seconds(Clock::now() - start), 3) + " s (" +
       std::to_string(bytes >> 20) + " MiB of state): every write is on both again");
  return Status::OK();
}

Status Job::BeginReplicaSnapshot(const std::string& body) {
  if (!standby()) return Status::Unavailable("this server was promoted: it follows no primary");
  ReplicaCounts counts;
  Status s = ReplicaCounts::Parse(body, &counts);
  if (!s.ok()) return s;
  // Every part's number forgotten before the counts change: no record is
  // applied meanwhile (they come in order on one connection).
  for (uint64_t b = 0; b < model_->num_blocks(); ++b) {
    std::unique_lock<std::shared_mutex> block_lock = model_->LockBlock(b);
    replica_parts_.ForgetBlockLocked(b);
  }
  MutexLock lock(&mu_);
  std::vector<uint64_t> luns;
  for (const Slot& slot : slots_) luns.push_back(slot.lun);
  if (luns != counts.luns) {
    return Status::InvalidArgument("replica snapshot: the primary's learner LUNs are not this backup's, in "
                                   "the same order: start both from one layout");
  }
  // Both taken or neither: the receipts into a Receipts of their own first,
  // then the clocks (Restore changes nothing when it refuses them).
  Receipts receipts;
  for (size_t k = 0; k < slots_.size(); ++k) receipts.AddSlot();
  std::vector<size_t> pushed;
  s = receipts.Restore(counts.receipts, &pushed);
  if (s.ok() && (counts.clocks.size() < 2 || counts.clocks[1] != slots_.size())) {
    s = Status::InvalidArgument("its clocks are not for this backup's " + std::to_string(slots_.size()) + " learners");
  }
  if (s.ok()) s = clocks_.Restore(counts.clocks);
  if (!s.ok()) return Status::InvalidArgument("replica snapshot: " + s.message());
  receipts_ = std::move(receipts);
  std::fill(clock_sequence_.begin(), clock_sequence_.end(), 0);  // the stream's are newer
  return Status::OK();
}

Status Job::ApplyReplicaSnapshot(const std::string& body) {
  if (!standby()) return Status::Unavailable("this server was promoted: it follows no primary");
  ReplicaRecord record;
  Status s = ParseReplicaPush(*model_, replica_parts_, body, &record);
  if (!s.ok()) return s;
  for (const ReplicaRecord::Part& p : record.parts) {
    std::unique_lock<std::shared_mutex> block_lock = model_->LockBlock(p.part.block);
    if (replica_parts_.TakeUnlessNewerLocked(p.part.index, p.sequence)) RestorePartLocked(*model_, p.part, p.state);
  }
  replica_records_.fetch_add(1);
  return Status::OK();
}

}  // namespace blkps::server
