// TransferPlan: one byte-range transfer between caller memory and the model
// device, cut into block-aligned IoRequests of at most `request_bytes` each.
//
// A device moves whole logical blocks only. When [offset, offset + length)
// starts or ends inside a block, that partial block goes through a bounce
// block owned by the plan:
//   - a write sends the caller's bytes padded with zeros. For a gradient a
//     zero leaves the parameter unchanged, so a push never needs a
//     read-modify-write (and must not do one: it would race other learners);
//   - a read fetches the whole block, and FinishRead() copies the requested
//     part into the caller's buffer.
// Every other byte moves straight between the device and the caller's memory
// (the iovecs point into it: zero copy).
//
// Thread-safety: a plan serves one transfer on one thread.

#ifndef BLKPS_LEARNER_TRANSFER_PLAN_H_
#define BLKPS_LEARNER_TRANSFER_PLAN_H_

#include <sys/uio.h>

#include <cstdint>
#include <vector>

#include "device.h"

namespace blkps {

class TransferPlan {
 public:
  // Plans the transfer of `length` bytes at device byte `offset` from (write)
  // or into (read) `buffer`. A write copies the partial blocks' bytes from
  // `buffer` now; otherwise `buffer` is used when the requests run and must
  // outlive them. Throws std::bad_alloc when out of memory.
  // REQUIRES: length > 0; offset + length does not overflow;
  //           block_size > 0; request_bytes >= block_size.
  TransferPlan(Direction direction, uint64_t offset, void* buffer, uint64_t length, uint32_t block_size,
               uint64_t request_bytes);

  TransferPlan(const TransferPlan&) = delete;
  TransferPlan& operator=(const TransferPlan&) = delete;

  // In device order; consecutive requests cover the blocks touched by the
  // range. Each holds at most request_bytes rounded down to whole blocks.
  const std::vector<IoRequest>& requests() const { return requests_; }

  // Call once every read request has completed: copies the requested bytes
  // of the partial blocks into the caller's buffer. Does nothing for writes
  // and for block-aligned ranges.
  void FinishRead();

 private:
  // A stretch of device bytes and the memory that backs it.
  struct Segment {
    uint64_t device_offset;
    uint64_t length;
    uint8_t* memory;
  };

  std::vector<Segment> PlanSegments();
  void CutRequests(const std::vector<Segment>& segments, uint64_t request_bytes);
  uint64_t head_block_offset() const;

  const Direction direction_;
  const uint64_t offset_;
  uint8_t* const buffer_;
  const uint64_t length_;
  const uint32_t block_size_;

  // Whole blocks that hold the partial first and last block of the range
  // (head at [0, block), tail at [block, 2 * block)); empty when aligned.
  std::vector<uint8_t> bounce_;
  bool head_in_bounce_ = false;
  bool tail_in_bounce_ = false;
  uint64_t tail_block_offset_ = 0;  // device offset of the tail block

  std::vector<iovec> iovecs_;  // requests_ point into this
  std::vector<IoRequest> requests_;
};

}  // namespace blkps

#endif  // BLKPS_LEARNER_TRANSFER_PLAN_H_
