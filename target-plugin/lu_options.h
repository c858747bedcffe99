// LuOptions: what a blkps LUN is configured with, parsed from tgtadm's
// --bsopts string.
//
// Syntax: key=value pairs separated by ';' (tgtadm splits --bsopts on ',' and
// drops the rest, so ',' cannot be used). Keys:
//   params=<n>        number of float32 parameters (required, > 0)
//   block=<bytes>     model block size; K/M suffixes (default 1M)
//   rule=<name>       update rule: sgd momentum adagrad adam sum average
//   lr=<float>        learning rate (default 0.01)
//   momentum=<float>  momentum's μ (default 0.9)
//   nesterov=0|1      momentum: Nesterov's variant (default 0)
//   beta1=, beta2=    adam's moment decays (default 0.9, 0.999)
//   eps=<float>       adam's ε (default 1e-8) or adagrad's (default 1e-10)
//   init=<spec>       zeros | uniform:<a> | normal:<std> | file:<path>
//   seed=<n>          seed for uniform/normal (default 0)
// This is the one parser of --bsopts; README.md documents the same keys.
#pragma once

#include <string>

#include "model.h"
#include "status.h"

namespace blkps {

inline constexpr const char* kLuOptionKeys =
    "params, block, rule, lr, momentum, nesterov, beta1, beta2, eps, init, seed";

struct LuOptions {
  ModelOptions model;
};

// Parses `bsopts` into *out. On failure returns InvalidArgument with a
// one-line message that starts with the offending key ("lr: expected ...").
Status ParseLuOptions(const std::string& bsopts, LuOptions* out);

}  // namespace blkps
