/*
 * feature_id.h: hashed feature ids, the one hash both ends use.
 *
 * A hashed table (`--bsopts table=hash:CAPACITY:WIDTH`, doc/embeddings.md
 * "Hashed ids") keys its rows by any 64-bit id. Two things are computed from
 * an id, in C, C++ and (through libblkps) Python alike, by the functions
 * here and nowhere else:
 *
 *   blkps_feature_id_hash(id)            64 well-mixed bits of the id: the
 *                                        SplitMix64 finaliser (Steele, Lea
 *                                        and Flood, 2014): xor-shift 30,
 *                                        multiply 0xbf58476d1ce4e5b9,
 *                                        xor-shift 27, multiply
 *                                        0x94d049bb133111eb, xor-shift 31.
 *                                        A bijection: distinct ids, distinct
 *                                        hashes.
 *   blkps_feature_id_shard(id, shards)   the shard (0 .. shards-1) that
 *                                        holds the id's row: the hash's high
 *                                        bits, (hash * shards) >> 64.
 *
 * Vectors for another language's copy (tests check them in C++ and Python):
 *   hash(0) = 0, hash(1) = 0x5692161d100b05e5,
 *   hash(12345) = 0xf36cf1164265dd51, hash(2^64 - 1) = 0xb4d055fcf2cbbd7b;
 *   shard(2, 4) = 3, shard(12345, 3) = 2, shard(2^64 - 1, 4) = 2.
 *
 * A server's slot array takes the hash's low bits (hash mod its power-of-two
 * slot count), so a shard's ids, which share high bits, still spread over
 * all of its slots. Changing either function moves every row: it is part of
 * the contract, like the control LUN's offsets.
 */
#ifndef BLKPS_FEATURE_ID_H
#define BLKPS_FEATURE_ID_H

#include <stdint.h>

static inline uint64_t blkps_feature_id_hash(uint64_t id) {
  uint64_t z = id;
  z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
  return z ^ (z >> 31);
}

/* (hash * shards) >> 64 in 64-bit arithmetic: with hash = hi * 2^32 + lo,
 * it is (hi * shards + ((lo * shards) >> 32)) >> 32, which cannot overflow. */
static inline uint32_t blkps_feature_id_shard(uint64_t id, uint32_t shards) {
  const uint64_t hash = blkps_feature_id_hash(id);
  const uint64_t hi = hash >> 32, lo = hash & UINT64_C(0xffffffff);
  return (uint32_t)((hi * shards + ((lo * shards) >> 32)) >> 32);
}

#endif /* BLKPS_FEATURE_ID_H */
