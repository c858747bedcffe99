// LuOptions: what a blkps LUN is configured with, parsed from tgtadm's
// --bsopts string.
//
// Syntax: key=value pairs separated by ';' (tgtadm splits --bsopts on ',' and
// drops the rest, so ',' cannot be used). Keys:
//   params=<n>        number of float32 parameters (this or table= is
//                     required, > 0)
//   table=<rows>:<width>  an embedding table instead (doc/embeddings.md):
//                     rows of width float32 values, row r at byte
//                     r*width*4, rows made when first written; async only.
//                     Its block defaults to whole rows up to 1M.
//   block=<bytes>     model block size; K/M suffixes (default 1M)
//   rule=<name>       update rule: sgd momentum adagrad adam sum average
//   lr=<float>        learning rate (default 0.01)
//   momentum=<float>  momentum's μ (default 0.9)
//   nesterov=0|1      momentum: Nesterov's variant (default 0)
//   beta1=, beta2=    adam's moment decays (default 0.9, 0.999)
//   eps=<float>       adam's ε (default 1e-8) or adagrad's (default 1e-10)
//   init=<spec>       zeros | uniform:<a> | normal:<std> | file:<path>
//   seed=<n>          seed for uniform/normal (default 0)
//   mode=<m>          consistency: async | bsp | ssp:<s> (default async)
//   dead_after=<s>    seconds without I/O before a learner is dead (default 10)
//   hold_limit=<s>    longest a read waits in bsp/ssp, (0, 25] (default 20)
//   max_dead=<n>      dead learners that fail the job; 0: never (default 0)
//   checkpoint=<path> checkpoint file: loaded at start, written on fsync
//   checkpoint_every=<s>  also write it every s seconds (default 0: off)
//   role=control      this LUN is the status and control LUN of the model
//                     its --backing-store names (no other key but access).
//                     Whoever reaches it may write commands and weights:
//                     serve it only on a target that admits operators alone
//                     (blkps target start --operator: its own CHAP account)
//   access=learners   control LUN only: the learners' control LUN. Anyone
//                     may read all of it; writes take only fence= and tag=
//                     (what libblkps and blkps.torch send), everything else
//                     is refused (DATA PROTECT)
//   dtype=<t>         how this learner LUN presents the model: float32 |
//                     bfloat16 | float16 (default float32); a 16-bit LUN
//                     holds parameter i at byte 2*i (blkps/wire_dtype.hpp).
//                     The model stays float32; LUNs of one model may differ
//                     in dtype only.
// This is the one parser of --bsopts; doc/server.md documents the same keys.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "blkps/wire_dtype.hpp"
#include "job.h"
#include "status.h"

namespace blkps::server {

inline constexpr const char* kLuOptionKeys =
    "params, table, block, rule, lr, momentum, nesterov, beta1, beta2, eps, init, seed, mode, dead_after, "
    "hold_limit, max_dead, checkpoint, checkpoint_every, role, access, dtype, staleness_aware, stale_bound";

struct LuOptions {
  bool control = false;                       // role=control
  bool learners_access = false;               // access=learners
  wire::Dtype dtype = wire::Dtype::kFloat32;  // this LUN's view of the model
  JobOptions job;
  // The options that define the model: bsopts without dtype, pairs in the
  // order given. LUNs joining one model must give the same.
  std::string model_bsopts;
};

// The key=value pairs of `bsopts` in the order given, values verbatim
// (`blkps-bsopts` prints them so that tools rewrite options without parsing
// the syntax again). Refuses ',' (tgtadm would cut the string there), an item
// without '=' and a key given twice; keys and values are not checked here.
using LuOptionPairs = std::vector<std::pair<std::string, std::string>>;
Status SplitLuOptions(const std::string& bsopts, LuOptionPairs* pairs);

// Parses `bsopts` into *out. On failure returns InvalidArgument with a
// one-line message that starts with the offending key ("lr: expected ...").
Status ParseLuOptions(const std::string& bsopts, LuOptions* out);

}  // namespace blkps::server
