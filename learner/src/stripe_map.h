// StripeMap: where each byte of a striped model lives.
//
// A model of `size_bytes` bytes is cut into stripe units of `stripe_unit`
// bytes; unit k lives on shard k mod S at shard byte (k div S) * stripe_unit.
// The last unit may be partial. Each shard then holds a contiguous part of
// ShardBytes(s) bytes; the shards' parts together are the model.
//
// A pure value: no I/O, no allocation but the caller's vector; copy it
// freely and use it from any number of threads.

#ifndef BLKPS_LEARNER_STRIPE_MAP_H_
#define BLKPS_LEARNER_STRIPE_MAP_H_

#include <cstdint>
#include <vector>

namespace blkps {

// A contiguous run of model bytes that lives contiguously on one shard.
struct StripePiece {
  uint32_t shard;         // in [0, shard_count)
  uint64_t shard_offset;  // byte offset on that shard
  uint64_t length;        // > 0
};

class StripeMap {
 public:
  // REQUIRES: stripe_unit > 0, shard_count > 0.
  StripeMap(uint64_t stripe_unit, uint32_t shard_count, uint64_t size_bytes);

  uint64_t stripe_unit() const { return stripe_unit_; }
  uint32_t shard_count() const { return shard_count_; }
  uint64_t size_bytes() const { return size_bytes_; }

  // Bytes of the model that live on `shard` (0 when there are fewer units
  // than shards). REQUIRES: shard < shard_count().
  uint64_t ShardBytes(uint32_t shard) const;

  // Appends to *pieces the pieces of model bytes [offset, offset + length),
  // in model order: consecutive pieces are consecutive model bytes. Two
  // consecutive units that are also consecutive on one shard (S = 1) come
  // as one piece.
  // REQUIRES: offset + length <= size_bytes() (no overflow).
  void Map(uint64_t offset, uint64_t length, std::vector<StripePiece>* pieces) const;

 private:
  uint64_t stripe_unit_;
  uint32_t shard_count_;
  uint64_t size_bytes_;
};

}  // namespace blkps

#endif  // BLKPS_LEARNER_STRIPE_MAP_H_
