// Model::ReadRows and ApplyRows (model.h): a batch of a table's rows
// gathered or applied in one pass. A row window's pull or push
// (job_row_windows.cc) moves thousands of scattered rows at once; one by
// one, each row paid a range check and a lock of its block. Here the batch
// is visited in id order, so each block's lock is taken once for all the
// batch's rows in it, and each row is copied (or made up as its initial
// values) straight into its place in the output, or its gradient applied
// from its place in the input.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "model.h"

namespace blkps::server {

namespace {

// The batch's (id, position) pairs by id: a block's rows come together, and
// a repeated id's positions stay in the batch's order. Per thread: a batch
// is sorted and visited before the next on that thread. Ids that come
// ascending (from a client that sorts them) cost a pass, not a sort.
const std::vector<std::pair<uint64_t, uint64_t>>& ById(const uint64_t* ids, uint64_t count) {
  thread_local std::vector<std::pair<uint64_t, uint64_t>> by_id;
  by_id.resize(count);
  for (uint64_t k = 0; k < count; ++k) by_id[k] = {ids[k], k};
  if (!std::is_sorted(by_id.begin(), by_id.end())) std::sort(by_id.begin(), by_id.end());
  return by_id;
}

// A batch's rows lie far apart (ids spread over a table many times the
// caches' size), so each row's first touch waits for memory: asking for
// the row kRowsAhead places on (its weights, and its rule state when it is
// applied) while this one is copied or applied lets those waits overlap
// the work (with huge pages, the two together more than halved a random
// row's apply in a loop on this project's machines; a dense table has 4 KiB
// pages since, page_buffer.h, at a few percent of the bench's row rates). The
// first kPrefetchBytes of a row: the hardware's own prefetcher follows a
// row read in order.
constexpr size_t kRowsAhead = 4;
constexpr uint64_t kPrefetchBytes = 2048;

template <int kForWrite>
void PrefetchRow(const void* row, uint64_t row_bytes) {
  const char* p = static_cast<const char*>(row);
  for (uint64_t at = 0; at < std::min(row_bytes, kPrefetchBytes); at += 64) __builtin_prefetch(p + at, kForWrite);
}

// An array of one value per parameter that a row's apply writes (the
// weights, the rule's state): its base and bytes per parameter.
struct ParamArray {
  const char* base;
  uint64_t value_bytes;
};

}  // namespace

Status Model::CheckRowIds(const uint64_t* ids, uint64_t count) const {
  if (!table_.is_table()) {
    return Status::InvalidArgument("rows by id: this model is dense, not a table (--bsopts table=ROWS:WIDTH)");
  }
  for (uint64_t k = 0; k < count; ++k) {
    if (ids[k] >= table_.rows) {
      return Status::OutOfRange("row id " + std::to_string(ids[k]) + " (position " + std::to_string(k) +
                                ") is past the table's end (" + std::to_string(table_.rows) + " rows)");
    }
  }
  return Status::OK();
}

Status Model::ReadRows(const uint64_t* ids, uint64_t count, float* out) const {
  Status s = CheckRowIds(ids, count);
  if (!s.ok()) return s;
  const uint64_t width = table_.width;
  const uint64_t rows_per_block = block_bytes_ / table_.row_bytes();  // blocks hold whole rows
  std::shared_lock<std::shared_mutex> lock;
  uint64_t locked = num_blocks_;  // none yet
  const auto& by_id = ById(ids, count);
  for (size_t j = 0; j < by_id.size(); ++j) {
    const auto [r, k] = by_id[j];
    if (j + kRowsAhead < by_id.size()) PrefetchRow<0>(weights_ + by_id[j + kRowsAhead].first * width, width * 4);
    const uint64_t block = r / rows_per_block;
    if (block != locked) {  // one block's lock at a time, as every reader and writer
      if (lock.owns_lock()) lock.unlock();
      lock = std::shared_lock<std::shared_mutex>(block_locks_[block]);
      locked = block;
    }
    float* row = out + k * width;
    if (RowMadeLocked(r)) {
      std::memcpy(row, weights_ + r * width, width * sizeof(float));
    } else {
      InitializeRow(init_, r, row, width);
    }
  }
  return Status::OK();
}

Status Model::ApplyRows(const uint64_t* ids, uint64_t count, const float* rows, const RowsApplied& applied) {
  Status s = CheckRowIds(ids, count);
  if (!s.ok()) return s;
  const uint64_t width = table_.width;
  const uint64_t rows_per_block = block_bytes_ / table_.row_bytes();
  const auto& by_id = ById(ids, count);
  std::vector<ParamArray> written{{reinterpret_cast<const char*>(weights_), sizeof(float)}};
  for (const StateArray& a : rule_state_) written.push_back({static_cast<const char*>(a.data), a.bytes / num_params_});
  for (size_t i = 0; i < by_id.size();) {
    const uint64_t block = by_id[i].first / rows_per_block;
    size_t end = i;
    while (end < by_id.size() && by_id[end].first / rows_per_block == block) ++end;
    // The block's write lock (and a snapshot's copy of it) as for any
    // write: the range of the group's first row, which lies in the block.
    ForEachBlockLocked(ParamRange{by_id[i].first * width, width}, [&](uint64_t, uint64_t, uint64_t) {
      for (size_t j = i; j < end; ++j) {
        if (j + kRowsAhead < by_id.size()) {
          for (const ParamArray& a : written) {
            PrefetchRow<1>(a.base + by_id[j + kRowsAhead].first * width * a.value_bytes, width * a.value_bytes);
          }
        }
        ApplyTableLocked(by_id[j].first * width, rows + by_id[j].second * width, width);
      }
      if (applied) applied(block, end - i);
    });
    i = end;
  }
  return Status::OK();
}

}  // namespace blkps::server
