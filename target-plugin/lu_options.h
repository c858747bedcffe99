// LuOptions: what a blkps LUN is configured with, parsed from tgtadm's
// --bsopts string.
//
// Syntax: key=value pairs separated by ';' (tgtadm splits --bsopts on ',' and
// drops the rest, so ',' cannot be used). Keys: the table in lu_options.cc,
// each with the value it takes and what it sets (LuOptionKeys lists them).
// This is the one parser of --bsopts; doc/server.md documents the same keys.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "blkps/wire_dtype.hpp"
#include "job.h"
#include "status.h"

namespace blkps::server {

// The keys ParseLuOptions takes, as "params, table, ...": its table's order.
std::string LuOptionKeys();

struct LuOptions {
  bool control = false;                       // role=control
  bool learners_access = false;               // access=learners
  wire::Dtype dtype = wire::Dtype::kFloat32;  // this LUN's view of the model
  JobOptions job;
  // Replicas (doc/replicas.md): the backup's address (replicate_to=), or
  // this backup's own (backup=); the job's channel is made at its creation.
  std::string replicate_to, backup_at;
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
