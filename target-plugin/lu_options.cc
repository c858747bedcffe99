#include "lu_options.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <set>
#include <utility>

#include "blkps/byte_size.hpp"
#include "replica_link.h"

namespace blkps::server {
namespace {

constexpr double kMaxHoldSeconds = 25;

Status Bad(const std::string& key, const std::string& expected, const std::string& got) {
  return Status::InvalidArgument(key + ": expected " + expected + ", got '" + got + "'");
}

// A decimal integer; with allow_suffix, blkps's size syntax (K, M or G,
// powers of 1024: blkps/byte_size.hpp).
bool ParseSize(const std::string& text, bool allow_suffix, uint64_t* out) {
  if (!allow_suffix && text.find_first_not_of("0123456789") != std::string::npos) return false;
  return ParseByteSize(text, out);
}

// Seconds: a finite number in [min, max] (min excluded if open_min).
bool ParseSeconds(const std::string& text, double min, bool open_min, double max, double* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (*end != '\0' || errno != 0 || !std::isfinite(v) || v < min || (open_min && v == min) || v > max) return false;
  *out = v;
  return true;
}

bool ParseFloat(const std::string& text, float* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  float v = std::strtof(text.c_str(), &end);
  if (*end != '\0' || errno != 0 || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

// A replica option's HOST:PORT (replica_link.h's parser) into *out.
Status TakeReplicaAddress(const std::string& key, const std::string& value, std::string* out) {
  sockaddr_in address;
  Status s = ParseReplicaAddress(value, &address);
  if (!s.ok()) return Status::InvalidArgument(key + ": " + s.message());
  *out = value;
  return Status::OK();
}

}  // namespace

Status SplitLuOptions(const std::string& bsopts, LuOptionPairs* pairs) {
  pairs->clear();
  // Errors quote what they refuse, and go to tgtd's log as one line: a
  // control character would break that line (found by tests/fuzz).
  for (size_t i = 0; i < bsopts.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(bsopts[i]);
    if (c < 0x20 || c == 0x7f) {
      char byte[8];
      std::snprintf(byte, sizeof(byte), "0x%02x", c);
      return Status::InvalidArgument("bsopts: control character " + std::string(byte) + " at byte " +
                                     std::to_string(i) + "; --bsopts is one line of key=value;key=value");
    }
  }
  if (bsopts.find(',') != std::string::npos) {
    return Status::InvalidArgument("',' is not an option separator: tgtadm cuts --bsopts at the first ',' and drops "
                                   "the rest; separate options with ';', e.g. \"params=1000;lr=0.1\"");
  }
  std::set<std::string> seen;
  size_t start = 0;
  while (start <= bsopts.size()) {
    size_t end = bsopts.find(';', start);
    if (end == std::string::npos) end = bsopts.size();
    const std::string item = bsopts.substr(start, end - start);
    start = end + 1;
    if (item.empty()) continue;

    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      return Status::InvalidArgument("bsopts: expected key=value, got '" + item + "'");
    }
    const std::string key = item.substr(0, eq);
    if (!seen.insert(key).second) {
      return Status::InvalidArgument(key + ": given more than once");
    }
    pairs->emplace_back(key, item.substr(eq + 1));
  }
  return Status::OK();
}

namespace {

// What ParseLuOptions carries from key to key.
struct Parsing {
  LuOptions opts;
  float eps = 0;  // eps= goes to the named rule's ε, known only at the end
  bool has_eps = false;
};

// One --bsopts key: what its value must be and what it sets. `set` returns
// OK or the key's one-line error; it runs at most once per string.
struct LuOptionKey {
  const char* key;
  const char* help;  // the value it takes; doc/server.md says more
  Status (*set)(const std::string& key, const std::string& value, Parsing* p);
};

// momentum=, beta1=, beta2= and eps=: a rule's float.
Status SetRuleFloat(const std::string& key, const std::string& value, Parsing* p) {
  float v = 0;
  if (!ParseFloat(value, &v)) return Bad(key, "a finite number", value);
  RuleOptions& r = p->opts.job.model.rule;
  (key == "momentum" ? r.momentum : key == "beta1" ? r.beta1 : key == "beta2" ? r.beta2 : p->eps) = v;
  p->has_eps = p->has_eps || key == "eps";
  return Status::OK();
}

// The keys, in the order the unknown-key error lists them (LuOptionKeys).
const LuOptionKey kLuOptionTable[] = {
    {"params", "<n>: number of float32 parameters (this or table= is required, > 0)",
     [](const std::string& key, const std::string& value, Parsing* p) {
       if (!ParseSize(value, false, &p->opts.job.model.num_params) || p->opts.job.model.num_params == 0) {
         return Bad(key, "a positive integer count of float32 parameters", value);
       }
       return Status::OK();
     }},
    {"table",
     "<rows>:<width>: an embedding table instead (doc/embeddings.md): rows of width float32 values, row r at byte "
     "r*width*4, rows made when first written; async only. Its block defaults to whole rows up to 1M. "
     "hash:<capacity>:<width>: a hashed table, rows keyed by any 64-bit id, at most capacity of them, reached "
     "through the row windows only",
     [](const std::string& key, const std::string& value, Parsing* p) {
       TableShape& t = p->opts.job.model.table;
       const std::string hash = "hash:";
       const bool hashed = value.compare(0, hash.size(), hash) == 0;
       const std::string shape = hashed ? value.substr(hash.size()) : value;
       const size_t colon = shape.find(':');
       if (colon == std::string::npos || !ParseSize(shape.substr(0, colon), false, &t.rows) ||
           !ParseSize(shape.substr(colon + 1), false, &t.width) || t.rows == 0 || t.width == 0 ||
           t.width > (uint64_t{1} << 28) || t.rows > (uint64_t{1} << 61) / t.width) {
         return Bad(key,
                    "<rows>:<width> or hash:<capacity>:<width>, positive counts of rows and of float32 values per "
                    "row (e.g. 1000000:128)",
                    value);
       }
       // A hashed table's model is its one-row stand-in (job.h, JobOptions::hashed_capacity).
       if (hashed) p->opts.job.hashed_capacity = std::exchange(t.rows, 1);
       return Status::OK();
     }},
    {"evict",
     "<rule>: what a full hashed table does when a push needs a row: none (refuse the push; default), lru-push "
     "(evict the least recently pushed rows) or idle:<n> (those not pushed for n row updates or more)",
     [](const std::string&, const std::string& value, Parsing* p) {
       return ParseEvictionRule(value, &p->opts.job.evict);
     }},
    {"block", "<bytes>: model block size; K/M suffixes (default 1M)",
     [](const std::string& key, const std::string& value, Parsing* p) {
       if (!ParseSize(value, true, &p->opts.job.model.block_bytes) || p->opts.job.model.block_bytes == 0 ||
           p->opts.job.model.block_bytes % 4 != 0) {
         return Bad(key, "a size in bytes, a positive multiple of 4 (K/M suffix allowed)", value);
       }
       return Status::OK();
     }},
    {"memory", "<bytes>: the most memory this server's model may take; K/M/G suffixes (default: MemAvailable)",
     [](const std::string& key, const std::string& value, Parsing* p) {
       if (!ParseSize(value, true, &p->opts.job.model.memory_limit_bytes) ||
           p->opts.job.model.memory_limit_bytes == 0) {
         return Bad(key, "a positive size in bytes (K/M/G suffix allowed)", value);
       }
       return Status::OK();
     }},
    {"rule", "<name>: update rule: sgd momentum adagrad adam sum average",
     [](const std::string&, const std::string& value, Parsing* p) {
       p->opts.job.model.rule.name = value;
       return Status::OK();
     }},
    {"lr", "<float>: learning rate (default 0.01)",
     [](const std::string& key, const std::string& value, Parsing* p) {
       if (!ParseFloat(value, &p->opts.job.model.rule.lr) || p->opts.job.model.rule.lr <= 0) {
         return Bad(key, "a finite number > 0", value);
       }
       return Status::OK();
     }},
    {"momentum", "<float>: momentum's μ (default 0.9)", SetRuleFloat},
    {"nesterov", "0|1: momentum: Nesterov's variant (default 0)",
     [](const std::string& key, const std::string& value, Parsing* p) {
       if (value != "0" && value != "1") return Bad(key, "0 or 1", value);
       p->opts.job.model.rule.nesterov = value == "1";
       return Status::OK();
     }},
    {"beta1", "<float>: adam's first moment decay (default 0.9)", SetRuleFloat},
    {"beta2", "<float>: adam's second moment decay (default 0.999)", SetRuleFloat},
    {"eps", "<float>: adam's ε (default 1e-8) or adagrad's (default 1e-10)", SetRuleFloat},
    {"init", "<spec>: zeros | uniform:<a> | normal:<std> | file:<path>",
     [](const std::string&, const std::string& value, Parsing* p) {
       return ParseInitSpec(value, &p->opts.job.model.init);
     }},
    {"seed", "<n>: seed for uniform/normal (default 0)",
     [](const std::string& key, const std::string& value, Parsing* p) {
       if (!ParseSize(value, false, &p->opts.job.model.init.seed)) {
         return Bad(key, "a non-negative integer", value);
       }
       return Status::OK();
     }},
    {"mode", "<m>: consistency: async | bsp | ssp:<s> (default async)",
     [](const std::string&, const std::string& value, Parsing* p) {
       return ParseConsistency(value, &p->opts.job.consistency);
     }},
    {"parts",
     "<first>:<count>:<k>: bsp: the whole model blocks of parameters [first, first+count) take each learner's "
     "gradient in k writes a round (doc/server.md \"A gradient in parts\")",
     [](const std::string&, const std::string& value, Parsing* p) {
       return ParseGradientParts(value, &p->opts.job.parts);
     }},
    {"dead_after", "<s>: seconds without I/O before a learner is dead (default 10)",
     [](const std::string& key, const std::string& value, Parsing* p) {
       if (!ParseSeconds(value, 0, true, 86400, &p->opts.job.dead_after_s)) {
         return Bad(key, "seconds, > 0", value);
       }
       return Status::OK();
     }},
    {"hold_limit", "<s>: longest a read waits in bsp/ssp, (0, 25] (default 20)",
     [](const std::string& key, const std::string& value, Parsing* p) {
       if (!ParseSeconds(value, 0, true, kMaxHoldSeconds, &p->opts.job.hold_limit_s)) {
         return Bad(key, "seconds in (0, 25]: initiators abort a command after about 30 s", value);
       }
       return Status::OK();
     }},
    {"max_dead", "<n>: dead learners that fail the job; 0: never (default 0)",
     [](const std::string& key, const std::string& value, Parsing* p) {
       uint64_t n = 0;
       if (!ParseSize(value, false, &n) || n > 1000000) return Bad(key, "a count of learners, 0 for never", value);
       p->opts.job.max_dead = static_cast<uint32_t>(n);
       return Status::OK();
     }},
    {"checkpoint", "<path>: checkpoint file: loaded at start, written on fsync",
     [](const std::string& key, const std::string& value, Parsing* p) {
       if (value.empty() || value[0] != '/') return Bad(key, "an absolute file path", value);
       p->opts.job.checkpoint = value;
       return Status::OK();
     }},
    {"checkpoint_every", "<s>: also write it every s seconds (default 0: off)",
     [](const std::string& key, const std::string& value, Parsing* p) {
       if (!ParseSeconds(value, 0, false, 1e9, &p->opts.job.checkpoint_every_s)) {
         return Bad(key, "seconds, >= 0 (0: only on fsync)", value);
       }
       return Status::OK();
     }},
    {"checkpoint_memory",
     "<bytes>: the most memory a checkpoint's copy-on-write copies may hold; a write that needs more waits for "
     "the checkpoint to write blocks out; K/M/G suffixes (default: no limit, at most the model and its state again)",
     [](const std::string& key, const std::string& value, Parsing* p) {
       if (!ParseSize(value, true, &p->opts.job.model.snapshot_copy_limit_bytes) ||
           p->opts.job.model.snapshot_copy_limit_bytes == 0) {
         return Bad(key, "a positive size in bytes (K/M/G suffix allowed)", value);
       }
       return Status::OK();
     }},
    {"job", "<id>: the job's checkpoint identity, 1 to 64 of [0-9a-z-] (default: the loaded checkpoint's, or new)",
     [](const std::string& key, const std::string& value, Parsing* p) {
       if (value.empty() || value.size() > 64 ||
           value.find_first_not_of("0123456789abcdefghijklmnopqrstuvwxyz-") != std::string::npos) {
         return Bad(key, "1 to 64 of [0-9a-z-]", value);
       }
       p->opts.job.job_id = value;
       return Status::OK();
     }},
    {"shard", "<k>/<n>: this server holds part k (0-based) of a model striped over n (blkps target start --tgtd n)",
     [](const std::string& key, const std::string& value, Parsing* p) {
       const size_t slash = value.find('/');
       uint64_t k = 0, n = 0;
       if (slash == std::string::npos || !ParseSize(value.substr(0, slash), false, &k) ||
           !ParseSize(value.substr(slash + 1), false, &n) || n == 0 || n > 65536 || k >= n) {
         return Bad(key, "<k>/<n> with 0 <= k < n <= 65536", value);
       }
       p->opts.job.shard = static_cast<uint32_t>(k);
       p->opts.job.shards = static_cast<uint32_t>(n);
       return Status::OK();
     }},
    {"checkpoint_keep", "<n>: committed generations a scaled-out job keeps (default 2)",
     [](const std::string& key, const std::string& value, Parsing* p) {
       uint64_t n = 0;
       if (!ParseSize(value, false, &n) || n == 0 || n > 1000) return Bad(key, "a count in [1, 1000]", value);
       p->opts.job.keep_generations = static_cast<uint32_t>(n);
       return Status::OK();
     }},
    {"replicate_to",
     "HOST:PORT: this server is a primary: every push is on its backup, listening there (backup=), before its "
     "WRITE completes (doc/replicas.md)",
     [](const std::string& key, const std::string& value, Parsing* p) {
       return TakeReplicaAddress(key, value, &p->opts.replicate_to);
     }},
    {"backup",
     "HOST:PORT: this server is a backup: it listens there for its primary (replicate_to=) and serves learners only "
     "once promoted (doc/replicas.md)",
     [](const std::string& key, const std::string& value, Parsing* p) {
       p->opts.job.backup = true;
       return TakeReplicaAddress(key, value, &p->opts.backup_at);
     }},
    {"fresh", "1: start a new job over an existing checkpoint instead of loading it (default 0)",
     [](const std::string& key, const std::string& value, Parsing* p) {
       if (value != "0" && value != "1") return Bad(key, "0 or 1", value);
       p->opts.job.fresh = value == "1";
       return Status::OK();
     }},
    {"role",
     "control: this LUN is the status and control LUN of the model its --backing-store names (no other key but "
     "access). Whoever reaches it may write commands and weights: serve it only on a target that admits operators "
     "alone (blkps target start --operator: its own CHAP account)",
     [](const std::string& key, const std::string& value, Parsing* p) {
       if (value != "control") return Bad(key, "control", value);
       p->opts.control = true;
       return Status::OK();
     }},
    {"access",
     "learners: control LUN only: the learners' control LUN. Anyone may read all of it; writes take only fence=, "
     "tag= and rank= (what libblkps and blkps.torch send), everything else is refused (DATA PROTECT)",
     [](const std::string& key, const std::string& value, Parsing* p) {
       if (value != "learners") return Bad(key, "learners", value);
       p->opts.learners_access = true;
       return Status::OK();
     }},
    {"dtype",
     "<t>: how this learner LUN presents the model: float32 | bfloat16 | float16 (default float32); a 16-bit LUN "
     "holds parameter i at byte 2*i (blkps/wire_dtype.hpp). The model stays float32; LUNs of one model may differ "
     "in dtype only",
     [](const std::string& key, const std::string& value, Parsing* p) {
       if (!wire::ParseDtype(value, &p->opts.dtype)) return Bad(key, std::string("one of ") + wire::kDtypeNames, value);
       return Status::OK();
     }},
    {"staleness_aware", "0|1: async/ssp: apply a push with its measured staleness (default 1; 0 for a table)",
     [](const std::string& key, const std::string& value, Parsing* p) {
       if (value != "0" && value != "1") return Bad(key, "1 (scale a push by 1/(1+staleness)) or 0", value);
       p->opts.job.staleness_aware = value == "1";
       return Status::OK();
     }},
    {"stale_bound", "<n>: a push staler than this many updates is counted and its learner told (default 32)",
     [](const std::string& key, const std::string& value, Parsing* p) {
       if (!ParseSize(value, false, &p->opts.job.stale_bound)) return Bad(key, "a count of updates", value);
       return Status::OK();
     }},
};

}  // namespace

std::string LuOptionKeys() {
  std::string keys;
  for (const LuOptionKey& k : kLuOptionTable) keys += (keys.empty() ? "" : ", ") + std::string(k.key);
  return keys;
}

Status ParseLuOptions(const std::string& bsopts, LuOptions* out) {
  Parsing parsing;
  LuOptions& opts = parsing.opts;
  LuOptionPairs pairs;
  Status split = SplitLuOptions(bsopts, &pairs);
  if (!split.ok()) return split;
  std::set<std::string> seen;
  for (const auto& pair : pairs) {
    // Named, not a structured binding: the lambda below captures key
    // (C++17 allows no capture of a structured binding; clang 14 refuses).
    const std::string& key = pair.first;
    const std::string& value = pair.second;
    seen.insert(key);
    if (key != "dtype") opts.model_bsopts += (opts.model_bsopts.empty() ? "" : ";") + key + "=" + value;

    if (key == "operators") {  // a key no longer taken: say what replaced it
      return Status::InvalidArgument(
          "operators: no longer taken: an initiator name proves nothing (a client picks its own); give the "
          "learners' control LUN access=learners and serve role=control on a target with its own CHAP account "
          "(blkps target start --operator)");
    }
    const LuOptionKey* entry = std::find_if(std::begin(kLuOptionTable), std::end(kLuOptionTable),
                                            [&](const LuOptionKey& k) { return key == k.key; });
    if (entry == std::end(kLuOptionTable)) {
      return Status::InvalidArgument(key + ": unknown option (known: " + LuOptionKeys() + ")");
    }
    Status s = entry->set(key, value, &parsing);
    if (!s.ok()) return s;
  }
  const float eps = parsing.eps;
  const bool has_eps = parsing.has_eps;
  if (has_eps) {
    (opts.job.model.rule.name == "adagrad" ? opts.job.model.rule.adagrad_eps : opts.job.model.rule.eps) = eps;
  }
  if (opts.learners_access && !opts.control) {
    return Status::InvalidArgument("access: only for the control LUN (role=control;access=learners)");
  }
  if (opts.control) {
    if (seen.size() != 1 + (opts.learners_access ? 1 : 0)) {
      return Status::InvalidArgument("role: a control LUN takes no other option but access; it shows the model "
                                     "its --backing-store names");
    }
    *out = opts;
    return Status::OK();
  }
  if (opts.job.checkpoint_every_s > 0 && opts.job.checkpoint.empty()) {
    return Status::InvalidArgument("checkpoint_every: needs checkpoint=<path>");
  }
  if ((opts.job.shards > 1 || opts.job.fresh) && opts.job.checkpoint.empty()) {
    return Status::InvalidArgument(std::string(opts.job.fresh ? "fresh" : "shard") + ": needs checkpoint=<path>");
  }
  if (opts.job.model.snapshot_copy_limit_bytes != 0 && opts.job.checkpoint.empty()) {
    return Status::InvalidArgument("checkpoint_memory: needs checkpoint=<path>");
  }
  TableShape& table = opts.job.model.table;
  if (seen.count("evict") && opts.job.hashed_capacity == 0) {
    return Status::InvalidArgument("evict: only for a hashed table (table=hash:CAPACITY:WIDTH)");
  }
  if (table.is_table()) {
    if (seen.count("params")) {
      return Status::InvalidArgument("params: a table's parameters are its rows x width; give table= or params=");
    }
    opts.job.model.num_params = table.rows * table.width;
    if (!seen.count("block")) opts.job.model.block_bytes = TableBlockBytes(table.row_bytes());
    if (opts.job.model.block_bytes % table.row_bytes() != 0) {
      return Bad("block", "a multiple of the table's row of " + std::to_string(table.row_bytes()) + " bytes",
                 std::to_string(opts.job.model.block_bytes));
    }
    if (!seen.count("staleness_aware")) opts.job.staleness_aware = false;
    Status s = CheckTableJob(opts.job);
    if (!s.ok()) return s;
  }
  Status replicas = CheckReplicaJob(opts.job, !opts.replicate_to.empty());
  if (!replicas.ok()) return replicas;
  if (opts.job.model.num_params == 0) {
    return Status::InvalidArgument("params: required (the number of float32 parameters), e.g. params=1000000");
  }
  Status s = CheckGradientParts(opts.job.parts, opts.job.consistency, opts.job.model.num_params,
                                opts.job.model.block_bytes / sizeof(float), opts.job.shards);
  if (!s.ok()) return s;
  *out = opts;
  return Status::OK();
}

}  // namespace blkps::server
