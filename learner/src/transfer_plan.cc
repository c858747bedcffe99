#include "transfer_plan.h"

#include <algorithm>
#include <cstring>

namespace blkps {

TransferPlan::TransferPlan(Direction direction, uint64_t offset, void* buffer, uint64_t length, uint32_t block_size,
                           uint64_t request_bytes)
    : direction_(direction),
      offset_(offset),
      buffer_(static_cast<uint8_t*>(buffer)),
      length_(length),
      block_size_(block_size) {
  CutRequests(PlanSegments(), request_bytes);
}

uint64_t TransferPlan::head_block_offset() const { return offset_ / block_size_ * block_size_; }

std::vector<TransferPlan::Segment> TransferPlan::PlanSegments() {
  const uint64_t block = block_size_;
  const uint64_t end = offset_ + length_;
  const uint64_t end_floor = end / block * block;

  head_in_bounce_ = offset_ % block != 0;
  const uint64_t middle_begin = head_in_bounce_ ? head_block_offset() + block : offset_;
  // When the whole range sits inside the head block, the head covers it.
  tail_in_bounce_ = end % block != 0 && end_floor >= middle_begin;
  tail_block_offset_ = end_floor;

  std::vector<Segment> segments;
  if (head_in_bounce_ || tail_in_bounce_) bounce_.assign(2 * block, 0);
  if (head_in_bounce_) {
    segments.push_back({head_block_offset(), block, bounce_.data()});
  }
  if (end_floor > middle_begin) {
    segments.push_back({middle_begin, end_floor - middle_begin, buffer_ + (middle_begin - offset_)});
  }
  if (tail_in_bounce_) {
    segments.push_back({tail_block_offset_, block, bounce_.data() + block});
  }

  if (direction_ == Direction::kWrite) {
    if (head_in_bounce_) {
      const uint64_t head_end = std::min(end, head_block_offset() + block);
      memcpy(bounce_.data() + (offset_ - head_block_offset()), buffer_, head_end - offset_);
    }
    if (tail_in_bounce_) {
      memcpy(bounce_.data() + block, buffer_ + (tail_block_offset_ - offset_), end - tail_block_offset_);
    }
  }
  return segments;
}

void TransferPlan::CutRequests(const std::vector<Segment>& segments, uint64_t request_bytes) {
  const uint64_t request_size = request_bytes / block_size_ * block_size_;
  const uint64_t begin = segments.front().device_offset;
  const uint64_t end = segments.back().device_offset + segments.back().length;
  const uint64_t request_count = (end - begin + request_size - 1) / request_size;

  // Reserved up front: requests_ point into iovecs_, which must not move.
  // A request boundary and a segment boundary each start one iovec.
  iovecs_.reserve(request_count + segments.size());
  requests_.reserve(request_count);

  for (const Segment& segment : segments) {
    uint64_t position = segment.device_offset;
    const uint64_t segment_end = segment.device_offset + segment.length;
    while (position < segment_end) {
      if (requests_.empty() || requests_.back().length == request_size) {
        requests_.push_back({position, 0, iovecs_.data() + iovecs_.size(), 0});
      }
      IoRequest& request = requests_.back();
      const uint64_t take = std::min(segment_end - position, request_size - request.length);
      iovecs_.push_back({segment.memory + (position - segment.device_offset), take});
      request.length += take;
      request.iovcnt++;
      position += take;
    }
  }
  requests_.front().padding_head = offset_ - begin;
  requests_.back().padding_tail = end - (offset_ + length_);
}

void TransferPlan::FinishRead() {
  if (direction_ != Direction::kRead) return;
  const uint64_t end = offset_ + length_;
  if (head_in_bounce_) {
    const uint64_t head_end = std::min(end, head_block_offset() + block_size_);
    memcpy(buffer_, bounce_.data() + (offset_ - head_block_offset()), head_end - offset_);
  }
  if (tail_in_bounce_) {
    memcpy(buffer_ + (tail_block_offset_ - offset_), bounce_.data() + block_size_, end - tail_block_offset_);
  }
}

}  // namespace blkps
