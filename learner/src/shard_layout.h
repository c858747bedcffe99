// ShardLayout: the text configuration of a model striped over several shards
// (a "layout file"), as libblkps reads it for `layout:PATH` targets.
//
//   # blkps shard layout: the model is striped over the shards below,
//   stripe_unit = 1048576   # bytes, a multiple of 512 and of the servers' model block
//   dtype = bfloat16        # optional: the shards' LUNs are 16-bit
//   shard = iscsi://127.0.0.1:3261/iqn.2026-11.io.blkps:a/1
//   shard = iscsi://127.0.0.1:3262/iqn.2026-11.io.blkps:b/1
//   control = iscsi://127.0.0.1:3261/iqn.2026-11.io.blkps:a/2   # optional
//   control = iscsi://127.0.0.1:3262/iqn.2026-11.io.blkps:b/2
//
// One `key = value` per line; `#` starts a comment; blank lines are ignored.
// `stripe_unit` appears once; `dtype` at most once; `shard` once per shard,
// in stripe order (shard 0 first); `control`, each shard's control LUN in
// the same order, either never or once per shard (the job's control for
// blkps.control and blkps.torch: doc/data-path.md "Scale-out"; the
// striped device itself never opens them). stripe_unit counts bytes of the float32
// model (stripe_unit / 4 parameters per unit), whatever the shards' dtype:
// on 16-bit shards (their --bsopts dtype) a unit is stripe_unit / 2 device
// bytes, which must be a multiple of 512. A shard is anything OpenDevice opens except another
// layout; a relative path is taken relative to the layout file's folder.
// See StripeMap for where each model byte lives.
//
// `replica` lines (doc/replicas.md "Learners follow a failover") name the
// other replicas of the shard line above them, in the order libblkps tries
// them after it when the shard's session breaks or answers standby: the
// shard line is the primary, each replica line a backup. A replica is an
// iscsi:// or iser:// URL of the shard's scheme and LUN (the same LUN on
// another target, usually another portal); a shard without replica lines
// has one replica, as layouts always had.
//
//   shard = iscsi://127.0.0.1:3261/iqn.2026-11.io.blkps:model/1
//   replica = iscsi://127.0.0.1:3263/iqn.2026-11.io.blkps:model/1
//
// `kind` (at most once) says how the model is spread: `striped` (the
// default: stripe units, as above) or `hashed`, a hashed table
// (table=hash:CAPACITY:WIDTH) whose rows go to shards by their id:
// id's row is on shard blkps_feature_id_shard(id, shards)
// (blkps/feature_id.h), under the id itself. A hashed layout has no
// stripe_unit and no dtype (a hashed table is float32 and striped by
// nothing); its shard and control lines are as above.
//
//   # blkps shard layout: a hashed table, its rows split by id hash,
//   kind = hashed
//   shard = iscsi://127.0.0.1:3261/iqn.2026-11.io.blkps:a/1
//   shard = iscsi://127.0.0.1:3262/iqn.2026-11.io.blkps:b/1
//
// Plain values and free functions; thread-compatible.

#ifndef BLKPS_LEARNER_SHARD_LAYOUT_H_
#define BLKPS_LEARNER_SHARD_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "blkps/wire_dtype.hpp"
#include "status.h"

namespace blkps {

struct ShardLayout {
  enum class Kind { kStriped, kHashed };
  struct Shard {
    std::string target;  // as OpenDevice takes it
    int line;            // where the layout file names it (1-based)
    // The shard's other replicas (replica lines), tried in this order after
    // `target`; empty for a shard of one replica and for control lines.
    std::vector<std::string> replicas = {};
  };
  Kind kind = Kind::kStriped;
  uint64_t stripe_unit = 0;                   // float32 model bytes; > 0 and a multiple of 512 (0 if hashed)
  wire::Dtype dtype = wire::Dtype::kFloat32;  // of the shards' LUNs
  std::vector<Shard> shards;
  std::vector<Shard> controls;  // empty, or one per shard
  // A stripe unit in the shards' device bytes.
  uint64_t device_stripe_unit() const { return stripe_unit / 4 * wire::BytesPerParam(dtype); }
};

// Parses the text of a layout file; `name` (the file's path) prefixes every
// message, with the line: "blkps: <name>:<line>: ...". Relative shard paths
// are left as written. A malformed replica line (before any shard, not a URL
// of its shard's scheme and LUN, or naming a replica twice) is an error.
// On failure returns the error; *layout is then
// unspecified.
Status ParseShardLayout(const std::string& text, const std::string& name, ShardLayout* layout);

// Reads and parses the layout file at `path`, and resolves relative shard
// paths against the file's folder.
Status ReadShardLayout(const std::string& path, ShardLayout* layout);

}  // namespace blkps

#endif  // BLKPS_LEARNER_SHARD_LAYOUT_H_
