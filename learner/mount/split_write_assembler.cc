#include "split_write_assembler.h"

#include <cstring>

namespace blkps {

SplitWriteAssembler::SplitWriteAssembler(uint32_t block_size, uint32_t value_bytes)
    : block_size_(block_size), value_bytes_(value_bytes) {}

SplitWriteAssembler::PieceResult SplitWriteAssembler::AddPiece(uint64_t offset, const uint8_t* data, uint64_t length,
                                                               uint64_t owner) {
  PieceResult result;
  const uint64_t end = offset + length;
  // The whole blocks: from the first block boundary at or after `offset` to
  // the last one at or before `end`.
  const uint64_t first_boundary = (offset + block_size_ - 1) / block_size_ * block_size_;
  const uint64_t last_boundary = end / block_size_ * block_size_;
  std::lock_guard<std::mutex> lock(mutex_);
  if (first_boundary >= last_boundary) {
    // No whole block: the piece lies within one block, or straddles one
    // boundary with a partial block on each side.
    uint64_t at = offset;
    while (at < end) {
      const uint64_t block_end = (at / block_size_ + 1) * block_size_;
      const uint64_t stop = block_end < end ? block_end : end;
      MergeLocked(at, data + (at - offset), stop - at, owner, &result.drained);
      at = stop;
    }
    result.direct_begin = result.direct_end = offset;
    return result;
  }
  if (offset < first_boundary) {
    MergeLocked(offset, data, first_boundary - offset, owner, &result.drained);
  }
  if (last_boundary < end) {
    MergeLocked(last_boundary, data + (last_boundary - offset), end - last_boundary, owner, &result.drained);
  }
  result.direct_begin = first_boundary;
  result.direct_end = last_boundary;
  return result;
}

void SplitWriteAssembler::MergeLocked(uint64_t offset, const uint8_t* data, uint64_t length, uint64_t owner,
                                      Drained* out) {
  const uint64_t block_offset = offset / block_size_ * block_size_;
  const uint32_t from = static_cast<uint32_t>(offset - block_offset);
  auto it = pending_.find(block_offset);
  if (it != pending_.end()) {
    const PendingBlock& block = it->second;
    for (uint32_t i = from; i < from + length; ++i) {
      if (block.written[i]) {
        // A second gradient for a byte already written: the first goes out
        // on its own, this one starts afresh.
        EvictLocked(it, out);
        it = pending_.end();
        break;
      }
    }
  }
  if (it == pending_.end()) {
    PendingBlock fresh;
    fresh.bytes.assign(block_size_, 0);
    fresh.written.assign(block_size_, 0);
    fresh.owner = owner;
    it = pending_.emplace(block_offset, std::move(fresh)).first;
  }
  PendingBlock& block = it->second;
  memcpy(block.bytes.data() + from, data, length);
  memset(block.written.data() + from, 1, length);
  block.written_count += static_cast<uint32_t>(length);
  if (block.written_count == block_size_) {
    out->blocks.push_back({block_offset, std::move(block.bytes)});
    pending_.erase(it);
  }
}

int64_t SplitWriteAssembler::PartialValue(const PendingBlock& block) const {
  if (value_bytes_ == 0) return -1;
  for (uint32_t i = 0; i < block_size_; i += value_bytes_) {
    uint32_t n = 0;
    for (uint32_t j = 0; j < value_bytes_; ++j) n += block.written[i + j];
    if (n != 0 && n != value_bytes_) return i;
  }
  return -1;
}

void SplitWriteAssembler::EvictLocked(std::map<uint64_t, PendingBlock>::iterator it, Drained* out) {
  const int64_t partial = PartialValue(it->second);
  if (partial < 0) {
    out->blocks.push_back({it->first, std::move(it->second.bytes)});
  } else {
    const uint64_t at = it->first + static_cast<uint64_t>(partial);
    std::string written;
    for (uint32_t i = 0; i < value_bytes_; ++i) {
      if (it->second.written[partial + i]) {
        written += (written.empty() ? "" : ",") + std::to_string(at + i);
      }
    }
    out->dropped.push_back("block at byte " + std::to_string(it->first) + ": the " +
                           (value_bytes_ == 4 ? "float" : "16-bit value") + " at byte " + std::to_string(at) +
                           " is only partly written (bytes " + written + " of " + std::to_string(at) + ".." +
                           std::to_string(at + value_bytes_ - 1) + "); the block's pending bytes are dropped");
  }
  pending_.erase(it);
}

Drained SplitWriteAssembler::TakeOwnedBy(uint64_t owner) {
  Drained out;
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = pending_.begin(); it != pending_.end();) {
    auto next = std::next(it);
    if (it->second.owner == owner) EvictLocked(it, &out);
    it = next;
  }
  return out;
}

Drained SplitWriteAssembler::TakeAll() {
  Drained out;
  std::lock_guard<std::mutex> lock(mutex_);
  while (!pending_.empty()) EvictLocked(pending_.begin(), &out);
  return out;
}

Drained SplitWriteAssembler::TakeOverlapping(uint64_t begin, uint64_t end) {
  Drained out;
  std::lock_guard<std::mutex> lock(mutex_);
  if (pending_.empty() || begin >= end) return out;
  const uint64_t first_block = begin / block_size_ * block_size_;
  for (auto it = pending_.lower_bound(first_block); it != pending_.end() && it->first < end;) {
    auto next = std::next(it);
    if (PartialValue(it->second) < 0) EvictLocked(it, &out);
    it = next;
  }
  return out;
}

size_t SplitWriteAssembler::pending_blocks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return pending_.size();
}

}  // namespace blkps
