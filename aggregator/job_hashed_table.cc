// Job's hashed table (job.h "Hashed tables"; the storage is hashed_table.h):
// made at Create from the job's options, read by the row windows
// (job_row_windows.cc), shown in status.
#include <sstream>

#include "job.h"
#include "json_text.h"

namespace blkps::server {

Status CheckHashedTableJob(const JobOptions& opts) {
  if (opts.hashed_capacity == 0) return Status::OK();
  if (!opts.checkpoint.empty()) {
    return Status::InvalidArgument("checkpoint: a hashed table (table=hash:...) is not checkpointed yet; leave "
                                   "checkpoint= out");
  }
  if (opts.shards > 1) {
    return Status::InvalidArgument("shard: a hashed table (table=hash:...) is served by one server for now; leave "
                                   "shard= out");
  }
  return Status::OK();
}

Status Job::CreateHashedTable() {
  if (opts_.hashed_capacity == 0) return Status::OK();
  HashedTableOptions table;
  table.capacity = opts_.hashed_capacity;
  table.width = opts_.model.table.width;
  table.rule = opts_.model.rule;
  table.init = opts_.model.init;
  table.evict = opts_.evict;
  table.memory_limit_bytes = opts_.model.memory_limit_bytes;
  return HashedTable::Create(table, &hashed_);
}

Status Job::ReadTableRows(const uint64_t* ids, uint64_t count, float* out) const {
  if (hashed_ == nullptr) return model_->ReadRows(ids, count, out);
  hashed_->ReadRows(ids, count, out);
  return Status::OK();
}

std::string Job::TableStatusJson() const {
  const TableShape& t = model_->table();
  if (!t.is_table()) return "null";
  std::ostringstream j;
  const bool hashed = hashed_ != nullptr;
  const uint64_t rows = hashed ? hashed_->capacity() : t.rows;
  j << "{\"rows\": " << rows << ", \"width\": " << t.width << ", \"row_bytes\": " << t.row_bytes()
    << ", \"rows_made\": " << (hashed ? hashed_->RowsMade() : model_->RowsMade())
    << ", \"hashed\": " << (hashed ? "true" : "false") << ", \"row_limit\": " << (hashed ? hashed_->row_limit() : rows)
    << ", \"evict\": " << JsonString(EvictionRuleText(opts_.evict))
    << ", \"evictions\": " << (hashed ? hashed_->Evictions() : 0) << "}";
  return j.str();
}

}  // namespace blkps::server
