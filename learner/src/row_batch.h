// RowBatch: one batch of table rows (doc/embeddings.md) as few block-aligned
// IoRequests.
//
// A table holds row r at device bytes [r * row_bytes, (r + 1) * row_bytes).
// RowBatch takes a batch's row ids in any order, repeats allowed, keeps each
// row once, sorts them, and covers them with runs of whole logical blocks:
// rows whose blocks touch or overlap share a run, and a run is cut into
// requests of at most request_bytes. The runs live in one staging buffer
// that the requests point into.
//   - A read fills the staging buffer; CopyRowsOut() then hands every id its
//     row, in the order the ids were given.
//   - A write sends, for each row of the batch, the sum of the gradients
//     given for it, and zeros for the other rows that share its blocks: a
//     table takes a zero row gradient as none (aggregator/model.h "Tables").
//     So a repeated id costs nothing on the wire and is applied once.
//
// Thread-safety: a batch serves one transfer on one thread.

#ifndef BLKPS_LEARNER_ROW_BATCH_H_
#define BLKPS_LEARNER_ROW_BATCH_H_

#include <sys/uio.h>

#include <cstdint>
#include <vector>

#include "device.h"

namespace blkps {

// The distinct ids of a batch, and which of them each id is: what both
// ways of moving rows (RowBatch's blocks, and the server's row windows,
// device.h TransferRows) send once per row.
struct DistinctRows {
  enum class Order {
    kAscending,  // by sorting: RowBatch covers them with block runs
    kFirstSeen,  // by hashing, in about a third of the time (perf: the sort
                 // was a sixth of a learner's push_rows): the row windows
                 // take rows in any order
  };
  // Throws std::bad_alloc when out of memory.
  DistinctRows(const uint64_t* ids, uint64_t n, Order order = Order::kAscending);
  std::vector<uint64_t> rows;       // distinct ids, in `order`
  std::vector<uint64_t> row_of_id;  // ids[k] is rows[row_of_id[k]]
};

class RowBatch {
 public:
  // Plans the rows ids[0..n) of `width` float32 values each. For a write,
  // `grads` holds n * width values, row k's at grads[k * width]; they are
  // summed per row now. Throws std::bad_alloc when out of memory.
  // REQUIRES: width > 0; every id < rows on the device; block_size > 0;
  //           request_bytes >= block_size, a multiple of it.
  RowBatch(Direction direction, const uint64_t* ids, uint64_t n, uint64_t width, const float* grads,
           uint32_t block_size, uint64_t request_bytes);

  RowBatch(const RowBatch&) = delete;
  RowBatch& operator=(const RowBatch&) = delete;

  // In device order.
  const std::vector<IoRequest>& requests() const { return requests_; }
  // Distinct rows in the batch.
  uint64_t unique_rows() const { return rows_.size(); }

  // A write: the first non-finite value of the summed gradients, or null.
  const float* FirstNonFinite() const;

  // After every read request has completed: row ids[k] into
  // rows[k * width .. (k + 1) * width) for each k.
  void CopyRowsOut(float* rows) const;

 private:
  const uint64_t n_;
  const uint64_t width_;
  const DistinctRows distinct_;
  const std::vector<uint64_t>& rows_ = distinct_.rows;
  const std::vector<uint64_t>& row_of_id_ = distinct_.row_of_id;
  std::vector<uint64_t> staged_at_;  // rows_[j]'s byte offset in staging_
  std::vector<uint8_t> staging_;     // the runs' bytes, back to back
  std::vector<iovec> iovecs_;        // requests_ point into this
  std::vector<IoRequest> requests_;
};

}  // namespace blkps

#endif  // BLKPS_LEARNER_ROW_BATCH_H_
