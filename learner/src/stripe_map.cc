#include "stripe_map.h"

#include <algorithm>

namespace blkps {

StripeMap::StripeMap(uint64_t stripe_unit, uint32_t shard_count, uint64_t size_bytes)
    : stripe_unit_(stripe_unit), shard_count_(shard_count), size_bytes_(size_bytes) {}

uint64_t StripeMap::ShardBytes(uint32_t shard) const {
  const uint64_t units = (size_bytes_ + stripe_unit_ - 1) / stripe_unit_;
  if (shard >= units) return 0;
  const uint64_t shard_units = (units - 1 - shard) / shard_count_ + 1;
  uint64_t bytes = shard_units * stripe_unit_;
  // The last unit, possibly partial, is unit (units - 1).
  if ((units - 1) % shard_count_ == shard) {
    bytes -= units * stripe_unit_ - size_bytes_;
  }
  return bytes;
}

void StripeMap::Map(uint64_t offset, uint64_t length, std::vector<StripePiece>* pieces) const {
  const size_t first = pieces->size();  // merge only this call's pieces
  while (length > 0) {
    const uint64_t unit = offset / stripe_unit_;
    const uint64_t within = offset % stripe_unit_;
    StripePiece piece;
    piece.shard = static_cast<uint32_t>(unit % shard_count_);
    piece.shard_offset = unit / shard_count_ * stripe_unit_ + within;
    piece.length = std::min(stripe_unit_ - within, length);
    if (pieces->size() > first) {
      StripePiece& last = pieces->back();
      if (last.shard == piece.shard && last.shard_offset + last.length == piece.shard_offset) {
        last.length += piece.length;
        offset += piece.length;
        length -= piece.length;
        continue;
      }
    }
    pieces->push_back(piece);
    offset += piece.length;
    length -= piece.length;
  }
}

}  // namespace blkps
