// Model::ReadRows (model.h): a batch of a table's rows gathered in one pass.
// A row window's pull (job_row_windows.cc) reads thousands of scattered rows
// at once; read one by one, each paid a range check and a lock of its block.
// Here the batch is visited in id order, so each block's read lock is taken
// once for all the batch's rows in it, and the rows are copied (or made up
// as their initial values) straight into their places in the output.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "model.h"

namespace blkps::server {

Status Model::ReadRows(const uint64_t* ids, uint64_t count, float* out) const {
  if (!table_.is_table()) {
    return Status::InvalidArgument("rows by id: this model is dense, not a table (--bsopts table=ROWS:WIDTH)");
  }
  for (uint64_t k = 0; k < count; ++k) {
    if (ids[k] >= table_.rows) {
      return Status::OutOfRange("row id " + std::to_string(ids[k]) + " (position " + std::to_string(k) +
                                ") is past the table's end (" + std::to_string(table_.rows) + " rows)");
    }
  }
  const uint64_t width = table_.width;
  const uint64_t rows_per_block = block_bytes_ / table_.row_bytes();  // blocks hold whole rows
  // (id, position in the batch), by id: a block's rows come together.
  thread_local std::vector<std::pair<uint64_t, uint64_t>> by_id;
  by_id.resize(count);
  for (uint64_t k = 0; k < count; ++k) by_id[k] = {ids[k], k};
  std::sort(by_id.begin(), by_id.end());
  std::shared_lock<std::shared_mutex> lock;
  uint64_t locked = num_blocks_;  // none yet
  for (const auto& [r, k] : by_id) {
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

}  // namespace blkps::server
