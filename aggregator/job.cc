// Job: its lifetime (Create loads a checkpoint and starts the liveness
// ticker; the destructor stops it) and its learner slots (AddLearner,
// RemoveLearner). job.h lists the files that hold the rest.
#include "job.h"

#include <algorithm>
#include <thread>

#include "checkpoint_set.h"

namespace blkps::server {

Status CheckTableJob(const JobOptions& opts) {
  if (!opts.model.table.is_table()) return Status::OK();
  if (opts.consistency.mode != ConsistencyMode::kAsync) {
    return Status::InvalidArgument("mode: a table is served async only (bsp and ssp count a learner's iteration by "
                                   "whole model blocks, a batch writes a few rows); use mode=async");
  }
  if (opts.staleness_aware) {
    return Status::InvalidArgument("staleness_aware: a table applies every row gradient as written (staleness is "
                                   "counted per model block, not per row); give staleness_aware=0 or leave it out");
  }
  return Status::OK();
}

namespace {

// The model's options as the job's mode needs them: bsp sums a round in an
// accumulator.
ModelOptions ModelOptionsOf(const JobOptions& opts) {
  ModelOptions model = opts.model;
  model.accumulator = opts.consistency.mode == ConsistencyMode::kBsp;
  return model;
}

}  // namespace

Status Job::MemoryBytes(const JobOptions& opts, uint64_t* out) {
  std::unique_ptr<UpdateRule> rule;
  Status s = MakeUpdateRule(opts.model.rule, 0, &rule);
  if (!s.ok()) return s;
  *out = Model::MemoryBytes(ModelOptionsOf(opts), *rule);
  // A hashed table's model is a one-row stand-in; its rows are counted at
  // run time against memory= (HashedTable::row_limit), its fixed part here.
  if (opts.hashed_capacity != 0) *out += HashedTable::StartBytes(opts.hashed_capacity, opts.model.table.width, *rule);
  return Status::OK();
}

Status Job::Create(const std::string& name, const JobOptions& opts, Logger log, std::shared_ptr<Job>* out) {
  Status s = CheckTableJob(opts);
  if (!s.ok()) return s;
  s = CheckGradientParts(opts.parts, opts.consistency, opts.model.num_params, opts.model.block_bytes / sizeof(float),
                         opts.shards);
  if (!s.ok()) return s;
  s = CheckReplicaJob(opts, opts.replica_channel != nullptr);
  if (!s.ok()) return s;
  JobOptions o = opts;
  o.model = ModelOptionsOf(opts);
  // A checkpoint replaces every weight: initialising them first would only
  // double the start (LoadCheckpoint fails Create if it cannot load it).
  CheckpointSet existing;
  if (!o.checkpoint.empty() && !o.fresh &&
      ReadCheckpointSet(o.checkpoint, &existing).code() != Status::Code::kNotFound) {
    o.model.initialize = false;
  }
  std::unique_ptr<Model> model;
  s = Model::Create(o.model, &model);
  if (!s.ok()) return s;
  std::shared_ptr<Job> job(new Job(name, o, std::move(log), std::move(model)));
  s = job->CreateHashedTable();
  if (!s.ok()) return s;
  if (!o.checkpoint.empty()) {
    s = job->LoadCheckpoint();
    if (!s.ok()) return s;
  }
  if (o.replica_channel) {
    s = o.replica_channel->Hello(ReplicaHello(*job->model_));
    if (!s.ok()) return Status::Unavailable("replicate_to: backup " + o.replica_channel->peer() + ": " + s.message());
  }
  job->ticker_ = std::thread([j = job.get()] { j->TickerLoop(); });
  *out = std::move(job);
  return Status::OK();
}

Job::Job(const std::string& name, const JobOptions& opts, Logger log, std::unique_ptr<Model> model)
    : name_(name),
      opts_(opts),
      log_(log ? std::move(log) : [](const std::string&) {}),
      model_(std::move(model)),
      clocks_(
          opts.consistency,
          [&] {
            std::vector<uint64_t> params(model_->num_blocks());
            for (uint64_t b = 0; b < params.size(); ++b) params[b] = model_->BlockParams(b);
            return params;
          }(),
          opts.parts),
      replica_parts_(*model_),
      standby_(opts.backup),
      backup_(opts.replica_channel),
      replicated_(opts.replica_channel != nullptr),
      clock_sequence_(model_->num_blocks(), 0),
      last_checkpoint_(Clock::now()) {}

Job::~Job() {
  {
    MutexLock lock(&ticker_mu_);
    stopping_ = true;
  }
  ticker_cv_.notify_all();
  if (ticker_.joinable()) ticker_.join();
}

size_t Job::AddLearner(uint64_t lun, std::function<void()> wake, const std::string& dtype) {
  MutexLock lock(&mu_);
  size_t slot = slots_.size();
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].lun == lun && !slots_[i].attached) slot = i;  // from a checkpoint, or re-added
  }
  if (slot == slots_.size()) {
    clocks_.AddLearner();
    AddSlotLocked();
  }
  Slot& s = slots_[slot];
  s.lun = lun;
  s.attached = true;
  s.dtype = dtype;
  holds_.SetWake(slot, std::move(wake));
  s.last_io = Clock::now();
  return slot;
}

void Job::AddSlotLocked() {
  slots_.emplace_back();
  receipts_.AddSlot();
  holds_.AddSlot();
}

void Job::RemoveLearner(size_t slot) {
  MutexLock lock(&mu_);
  for (const HeldCommand& h : holds_.Drop(slot)) {
    if (h.write) receipts_.EndWrite(slot, h.initiator);  // dropped: never run
  }
  slots_[slot].attached = false;
  clocks_.MarkDead(slot);
  ReleaseLocked();                 // the others may no longer wait for it
  rounds_may_be_complete_ = true;  // the ticker finishes them
}

}  // namespace blkps::server
