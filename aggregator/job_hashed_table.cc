// Job's hashed table (job.h "Hashed tables"; the storage is hashed_table.h):
// made at Create from the job's options, read by the row windows
// (job_row_windows.cc), shown in status, and its rows in the checkpoint's
// "hashed.rows" section.
#include <cstring>
#include <sstream>

#include "job.h"
#include "json_text.h"

namespace blkps::server {

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

Status Job::SetRuleParam(const std::string& key, float value) {
  Status s = model_->rule().SetParam(key, value);
  if (s.ok() && hashed_ != nullptr) s = hashed_->rule().SetParam(key, value);
  return s;
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
    << ", \"evictions\": " << (hashed ? hashed_->Evictions() : 0)
    << ", \"memory_bytes\": " << (hashed ? hashed_->MemoryBytes() : Model::MemoryBytes(opts_.model, model_->rule()))
    << "}";
  return j.str();
}

namespace {

// `bytes` bytes as whole words, zero-padded, appended to *words.
void AppendBytes(const void* bytes, uint64_t n, std::vector<uint64_t>* words) {
  const size_t at = words->size();
  words->resize(at + (n + 7) / 8, 0);
  if (n != 0) std::memcpy(words->data() + at, bytes, n);
}

}  // namespace

// Layout: updates, evictions, rows; per row (oldest push first): id,
// last_push, its weights (width floats), then per rule state array its
// bytes' count and bytes, each part padded to whole words.
std::vector<uint64_t> Job::SaveHashedRows() const {
  if (hashed_ == nullptr) return {};
  const std::vector<HashedTable::Row> rows = hashed_->SaveRows();
  std::vector<uint64_t> words{hashed_->Updates(), hashed_->Evictions(), rows.size()};
  for (const HashedTable::Row& row : rows) {
    words.insert(words.end(), {row.id, row.last_push});
    AppendBytes(row.weights.data(), row.weights.size() * sizeof(float), &words);
    for (const std::vector<char>& state : row.state) {
      words.push_back(state.size());
      AppendBytes(state.data(), state.size(), &words);
    }
  }
  return words;
}

Status Job::RestoreHashedRows(const std::vector<uint64_t>& words) {
  const Status bad = Status::InvalidArgument("its hashed.rows section is malformed");
  if (words.size() < 3) return bad;
  const uint64_t width = hashed_->width(), arrays = hashed_->RuleStateNames().size();
  const uint64_t weight_words = (width * sizeof(float) + 7) / 8;
  std::vector<HashedTable::Row> rows;
  size_t i = 3;
  for (uint64_t k = 0; k < words[2]; ++k) {
    if (words.size() - i < 2 + weight_words) return bad;
    HashedTable::Row row;
    row.id = words[i];
    row.last_push = words[i + 1];
    row.weights.resize(width);
    std::memcpy(row.weights.data(), words.data() + i + 2, width * sizeof(float));
    i += 2 + weight_words;
    for (uint64_t a = 0; a < arrays; ++a) {
      if (i == words.size() || (words[i] + 7) / 8 > words.size() - i - 1) return bad;
      const char* from = reinterpret_cast<const char*>(words.data() + i + 1);
      row.state.emplace_back(from, from + words[i]);
      i += 1 + (words[i] + 7) / 8;
    }
    rows.push_back(std::move(row));
  }
  if (i != words.size()) return bad;
  return hashed_->RestoreRows(words[0], words[1], rows);
}

}  // namespace blkps::server
