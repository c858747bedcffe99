// Job's checkpoints (job.h, "Checkpoints"): which of the job's state goes
// into which section of a checkpoint file (checkpoint_file.h), which file of
// the job's checkpoint set (checkpoint_set.h) it is, what a loaded file must
// match, and restoring it.
#include "job.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>

#include "checkpoint_file.h"
#include "checkpoint_set.h"
#include "number_text.h"
#include "table_checkpoint.h"

namespace blkps::server {
namespace {

// Keys of Identity() that only some jobs have: a file with one of them
// refuses a job without it, as a job with one refuses a file without it.
constexpr const char* kOptionalIdentityKeys[] = {"table", "parts"};

// The checkpoint's metadata: what a loaded file must match.
std::map<std::string, std::string> Identity(const JobOptions& opts) {
  const TableShape& table = opts.model.table;
  std::map<std::string, std::string> identity = {{"format", "blkps-model"},
                                                 {"params", std::to_string(opts.model.num_params)},
                                                 {"block", std::to_string(opts.model.block_bytes)},
                                                 {"rule", opts.model.rule.name},
                                                 {"nesterov", opts.model.rule.nesterov ? "1" : "0"},
                                                 {"mode", FormatConsistency(opts.consistency)}};
  // Only tables say so: a dense model's files stay as they were.
  if (table.is_table()) identity["table"] = std::to_string(table.rows) + ":" + std::to_string(table.width);
  if (opts.hashed_capacity != 0) {
    identity["table"] = "hash:" + std::to_string(opts.hashed_capacity) + ":" + std::to_string(table.width);
  }
  // A round's clocks count a block's parts (doc/server.md "A gradient in parts").
  if (opts.parts.count != 0) identity["parts"] = FormatGradientParts(opts.parts);
  return identity;
}

}  // namespace

Status Job::Checkpoint() { return Checkpoint(kNoSlot); }

Status Job::Checkpoint(size_t slot) {
  if (standby()) return StandbyStatus();
  // A primary past its lease writes no generation: a backup may be the
  // primary by then, and one from here would roll back what it acknowledged.
  if (Status leased = CheckLease(); !leased.ok()) return leased;
  if (opts_.checkpoint.empty()) return Status::OK();
  if (!RoundBoundaries()) return WriteCheckpoint(kNoCheckpointRound);
  uint64_t round = kNoCheckpointRound;
  {
    // A request for a round this shard has written (another learner's
    // fsync of the same round, which the others may have gone on from)
    // returns once that part is durable.
    MutexLock lock(&mu_);
    round = BoundaryAskedLocked(slot);
    lock.Unlock();
    MutexLock one_at_a_time(&checkpoint_mu_);
    if (RoundWrittenLocked(round)) return Status::OK();
  }
  // Waits before it takes checkpoint_mu_: a request for a later round
  // (another learner's) must not hold up one for this round.
  Status s = AwaitRoundBoundary(slot, &round);
  s = s.ok() ? WriteCheckpoint(round) : FailCheckpoint(s, round);
  EndRoundBoundary(round);
  return s;
}

bool Job::RoundWrittenLocked(uint64_t round) const { return round_written_ != kNoRound && round <= round_written_; }

Status Job::FailCheckpoint(const Status& why, uint64_t round) {
  MutexLock one_at_a_time(&checkpoint_mu_);
  const uint64_t generation = generation_ = round != kNoCheckpointRound ? RoundGeneration(round) : generation_ + 1;
  MutexLock lock(&mu_);
  last_checkpoint_ = Clock::now();
  checkpoint_error_ = "generation " + std::to_string(generation) + " failed: " + why.message();
  return why;
}

Status Job::WriteCheckpoint(uint64_t round) {
  MutexLock one_at_a_time(&checkpoint_mu_);
  const Clock::time_point start = Clock::now();
  const bool at_round = round != kNoCheckpointRound;
  if (at_round && RoundWrittenLocked(round)) return Status::OK();  // by a request for it that came first
  // A failed one uses its number up too.
  const uint64_t generation = generation_ = at_round ? RoundGeneration(round) : generation_ + 1;
  std::string past;  // at_round: why the shard is not at `round` at the instant
  uint64_t step = 0;
  std::map<std::string, std::string> meta = Identity(opts_);
  std::vector<uint64_t> clocks, luns, receipts, row_windows, hashed_rows;
  std::unique_ptr<Model::Snapshot> snapshot;
  {
    // The instant: the write gate closed (new writes wait) and the running
    // writes finished, so every gradient in the snapshot has its receipt
    // count in it too, and none after it has.
    CloseWriteGate();
    snapshot = model_->TakeSnapshot([&] {
      MutexLock lock(&mu_);
      if (at_round) past = NotAtBoundaryLocked(round);
      clocks = at_round ? SaveClocksAtRoundLocked(round) : clocks_.Save();
      receipts = at_round ? SaveReceiptsAtRoundLocked(round) : receipts_.Save();
      row_windows = SaveRowWindowsLocked();
      hashed_rows = SaveHashedRows();
      for (const Slot& slot : slots_) luns.push_back(slot.lun);
      step = clocks_.global_step();
      for (const auto& [key, value] : model_->rule().params()) meta["rule." + key] = FloatText(value);
    });
    OpenWriteGate();
  }
  // Writes go on from here; the snapshot keeps what they change first.
  const double stalled = Seconds(Clock::now() - start);
  const CheckpointIdentity id{job_id_, generation, opts_.shard, opts_.shards, step, round};
  PutCheckpointIdentity(id, &meta);
  const std::string file = CheckpointPartPath(opts_.checkpoint, opts_.shard, opts_.shards, generation);
  std::vector<CheckpointSection> sections;
  const std::vector<Model::Array>& arrays = snapshot->arrays();
  // A dense table's arrays hold its rows made (table_checkpoint.h).
  std::unique_ptr<MadeRowsWriter> made_rows;
  if (opts_.model.table.is_table() && hashed_ == nullptr) {
    made_rows = std::make_unique<MadeRowsWriter>(*model_, *snapshot);
    meta[kMadeRowsKey] = kMadeRowsValue;
  }
  for (size_t k = 0; k < arrays.size(); ++k) {
    // At a round boundary the round's sum is empty: what was given towards
    // the next round is left out.
    const bool empty = at_round && arrays[k].name == "accumulator";
    const bool rows = made_rows != nullptr && arrays[k].elem_bytes != 0;
    sections.emplace_back(arrays[k].name, rows ? made_rows->Bytes(k) : arrays[k].bytes,
                          [&, k, empty, rows](uint64_t offset, uint64_t len, void* out) {
                            if (opts_.checkpoint_hook) opts_.checkpoint_hook(arrays[k].name, offset);
                            if (empty) std::memset(out, 0, len);
                            else if (rows) made_rows->Fill(k, offset, len, out);
                            else snapshot->Read(k, offset, len, out);
                          });
  }
  sections.push_back({"clocks", clocks.data(), clocks.size() * sizeof(uint64_t)});
  sections.push_back({"luns", luns.data(), luns.size() * sizeof(uint64_t)});
  sections.push_back({"receipts", receipts.data(), receipts.size() * sizeof(uint64_t)});
  sections.push_back({"receipts.windows", row_windows.data(), row_windows.size() * sizeof(uint64_t)});
  if (hashed_ != nullptr)
    sections.push_back({"hashed.rows", hashed_rows.data(), hashed_rows.size() * sizeof(uint64_t)});
  Status s = past.empty() ? WriteCheckpointFile(file, meta, sections) : Status::IOError(past);
  const uint64_t copied = snapshot->bytes_copied(), peak = snapshot->peak_bytes_held();
  snapshot.reset();
  bool committed = opts_.shards <= 1;  // a set of one is committed by its rename
  if (s.ok() && !committed) s = CommitCheckpointGeneration(opts_.checkpoint, id, opts_.keep_generations, &committed);
  const double took = Seconds(Clock::now() - start);
  MutexLock lock(&mu_);
  last_checkpoint_ = Clock::now();
  if (!s.ok()) {
    checkpoint_error_ = "generation " + std::to_string(generation) + " failed: " + s.message();
    return s;
  }
  checkpoint_error_.clear();
  ++checkpoints_;
  written_generation_ = generation;
  if (at_round) round_written_ = round;
  checkpoint_seconds_ = took;
  checkpoint_stall_seconds_ = stalled;
  log_("checkpoint of step " + std::to_string(step) + " (generation " + std::to_string(generation) +
       (opts_.shards > 1 ? committed ? ", committed" : ", its part" : "") + ") written to " + file + " in " +
       Fixed(took, 3) + " s (writes waited " + Fixed(stalled, 3) + " s; " + std::to_string(copied >> 20) +
       " MiB copied for writes meanwhile, at most " + std::to_string(peak >> 20) + " MiB at once)");
  return Status::OK();
}

Status Job::LoadCheckpoint() {
  // Create() calls this before anyone else can reach the Job: the locks are
  // taken for the analysis's sake (in the usual order), never waited for.
  MutexLock one_at_a_time(&checkpoint_mu_);
  MutexLock lock(&mu_);
  job_id_ = opts_.job_id;
  CheckpointSet set;
  Status s = opts_.fresh ? Status::NotFound("fresh=1") : ReadCheckpointSet(opts_.checkpoint, &set);
  if (s.code() == Status::Code::kNotFound) {  // a new job
    if (job_id_.empty()) job_id_ = NewCheckpointJobId();
    // Over an old set (fresh=1) its numbers go on, so that no part's name
    // is used twice.
    generation_ = round_generation_base_ = NewestCheckpointGeneration(opts_.checkpoint);
    return Status::OK();
  }
  if (!s.ok())
    return Status::InvalidArgument(s.message().rfind("checkpoint ", 0) == 0 ? s.message()
                                                                            : "checkpoint: " + s.message());
  if (set.parts.size() != opts_.shards) {
    return Status::InvalidArgument(
        "checkpoint " + opts_.checkpoint + ": its committed generation " + std::to_string(set.generation) + " has " +
        std::to_string(set.parts.size()) + " part(s), and this server is shard " + std::to_string(opts_.shard) +
        " of " + std::to_string(opts_.shards) + "; serve it with " + std::to_string(set.parts.size()) + " tgtd(s)");
  }
  if (!job_id_.empty() && !set.job.empty() && set.job != job_id_) {
    return Status::InvalidArgument("checkpoint " + opts_.checkpoint + ": foreign: it is of job " + set.job +
                                   ", this server was started for job " + job_id_ + "; give job=" + set.job +
                                   " (or fresh=1 for a new job over it)");
  }
  if (!set.job.empty()) job_id_ = set.job;
  if (job_id_.empty()) job_id_ = NewCheckpointJobId();  // a file written before identities
  generation_ = std::max(set.generation, NewestCheckpointGeneration(opts_.checkpoint));
  written_generation_ = set.generation;
  const std::string& path = set.parts[opts_.shard].file;
  CheckpointHeader header;
  s = ReadCheckpointHeader(path, &header);
  if (!s.ok()) return Status::InvalidArgument("checkpoint: " + s.message());
  std::map<std::string, std::string> identity = Identity(opts_);
  for (const char* key : kOptionalIdentityKeys) identity.emplace(key, "(none)");
  for (const auto& [key, want] : identity) {
    auto it = header.meta.find(key);
    const std::string got = it == header.meta.end() ? "(none)" : it->second;
    if (got != want) {
      return Status::InvalidArgument("checkpoint: " + path + " was written with " + key + "=" + got +
                                     " but this LUN has " + key + "=" + want +
                                     "; give matching --bsopts, or move the file away to start afresh");
    }
  }
  std::vector<CheckpointDest> dests;
  // A table's file of rows made (table_checkpoint.h; the identity checked
  // above that this is that table) fills buffers first.
  std::unique_ptr<MadeRowsLoader> made_rows;
  const auto arrays_hold = header.meta.find(kMadeRowsKey);
  if (arrays_hold != header.meta.end() && arrays_hold->second == kMadeRowsValue && opts_.model.table.is_table() &&
      hashed_ == nullptr) {
    made_rows = std::make_unique<MadeRowsLoader>(model_->Arrays(), header, opts_.model.table.width);
    dests = made_rows->dests();
  } else {
    for (const Model::Array& a : model_->Arrays()) dests.push_back({a.name, a.data, a.bytes});
  }
  std::vector<uint64_t> clocks, luns, receipts, row_windows, hashed_rows;
  bool has_receipts = false;     // files written before receipts have none
  bool has_row_windows = false;  // nor, before row windows, this
  for (const auto& [section, bytes] : header.sections) {
    if (section == "clocks") clocks.resize(bytes / sizeof(uint64_t));
    if (section == "luns") luns.resize(bytes / sizeof(uint64_t));
    if (section == "receipts") {
      receipts.resize(bytes / sizeof(uint64_t));
      has_receipts = true;
    }
    if (section == "receipts.windows") {
      row_windows.resize(bytes / sizeof(uint64_t));
      has_row_windows = true;
    }
    if (section == "hashed.rows") hashed_rows.resize(bytes / sizeof(uint64_t));
  }
  dests.push_back({"clocks", clocks.data(), clocks.size() * sizeof(uint64_t)});
  dests.push_back({"luns", luns.data(), luns.size() * sizeof(uint64_t)});
  if (has_receipts) dests.push_back({"receipts", receipts.data(), receipts.size() * sizeof(uint64_t)});
  if (has_row_windows) {
    dests.push_back({"receipts.windows", row_windows.data(), row_windows.size() * sizeof(uint64_t)});
  }
  // A hashed table's file has its rows (the identity's table= says hash:).
  if (hashed_ != nullptr) dests.push_back({"hashed.rows", hashed_rows.data(), hashed_rows.size() * sizeof(uint64_t)});
  s = ReadCheckpointSections(path, dests);
  if (!s.ok()) return Status::InvalidArgument("checkpoint: " + s.message());
  if (made_rows != nullptr) s = made_rows->Scatter();
  if (!s.ok()) return Status::InvalidArgument("checkpoint: " + path + ": " + s.message());
  s = clocks_.Restore(clocks);
  if (s.ok() && clocks_.num_learners() != luns.size()) {
    s = Status::InvalidArgument("its clocks are for " + std::to_string(clocks_.num_learners()) +
                                " learners but it names " + std::to_string(luns.size()) + " LUNs");
  }
  if (!s.ok()) return Status::InvalidArgument("checkpoint: " + path + ": " + s.message());
  const Clock::time_point now = Clock::now();
  for (uint64_t lun : luns) {
    AddSlotLocked();
    slots_.back().lun = lun;
    slots_.back().last_io = now;
  }
  std::vector<size_t> pushed;
  s = receipts_.Restore(receipts, &pushed);
  // A slot that had pushed took part before the restart: it counts for
  // async steps from the restart on (for dead_after, as its learner
  // reconnects), so the restart changes no step's size.
  for (size_t slot : pushed) slots_[slot].last_push = now;
  if (s.ok()) s = RestoreRowWindowsLocked(row_windows);
  if (s.ok() && hashed_ != nullptr) s = RestoreHashedRows(hashed_rows);
  if (!s.ok()) return Status::InvalidArgument("checkpoint: " + path + ": " + s.message());
  for (const auto& [key, value] : header.meta) {
    if (key.rfind("rule.", 0) != 0) continue;
    s = SetRuleParam(key.substr(5), std::strtof(value.c_str(), nullptr));
    if (!s.ok()) return Status::InvalidArgument("checkpoint: " + path + ": " + s.message());
  }
  round_generation_base_ = set.generation;
  // bsp's parts before rounds were recorded are at their step; ssp's at 0,
  // the same on every shard.
  const uint64_t part_round = set.parts[opts_.shard].round;
  round_base_ = part_round != kNoCheckpointRound                  ? part_round
                : opts_.consistency.mode == ConsistencyMode::kBsp ? clocks_.global_step()
                                                                  : 0;
  log_("loaded checkpoint " + path + " (job " + job_id_ + ", generation " + std::to_string(set.generation) + ", step " +
       header.meta["step"] + ")");
  return Status::OK();
}

}  // namespace blkps::server
