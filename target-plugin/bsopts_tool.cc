// blkps-bsopts: asks the plugin's own --bsopts parser (ParseLuOptions) about
// an option string, so that tools never parse --bsopts again.
//
//   blkps-bsopts 'params=1000;lr=0.1'
//
// On success prints one JSON object on stdout and exits 0:
//   {"control": false, "params": 1000, "block_bytes": 1048576,
//    "table_rows": 0, "table_width": 0, "hashed_capacity": 0,
//    "dtype": "float32", "memory_bytes": 4000, "memory_available_bytes": ...,
//    "options": [["params", "1000"], ["lr", "0.1"]]}
// table_rows and table_width are a table's shape (table=ROWS:WIDTH), 0 for a
// dense model; a hashed table's (table=hash:CAPACITY:WIDTH) are its one-row
// stand-in, 1 and WIDTH, with hashed_capacity CAPACITY (else 0).
// `options` are the pairs as given (SplitLuOptions), for a tool that rewrites
// some of them (blkps shards gives each shard its part). memory_bytes is
// what the model needs (Job::MemoryBytes) and memory_available_bytes the
// host's available memory now (0 if unknown): co-located shards share it,
// so blkps shards checks their sum before starting any (a control LUN's
// are 0). On failure prints
// "blkps: --bsopts: <reason>" on stderr, one line, and exits 1.

#include <cstdio>
#include <string>

#include "json_text.h"
#include "lu_options.h"

int main(int argc, char** argv) {
  if (argc != 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::fprintf(argc == 2 ? stdout : stderr,
                 "usage: blkps-bsopts OPTIONS\n"
                 "Checks a --bsopts string with the blkps plugin's parser; prints it as JSON.\n");
    return argc == 2 ? 0 : 2;
  }
  const std::string bsopts = argv[1];
  blkps::server::LuOptions options;
  blkps::server::LuOptionPairs pairs;
  blkps::server::Status s = blkps::server::ParseLuOptions(bsopts, &options);
  if (s.ok()) s = blkps::server::SplitLuOptions(bsopts, &pairs);
  uint64_t memory = 0;
  if (s.ok() && !options.control) s = blkps::server::Job::MemoryBytes(options.job, &memory);
  if (!s.ok()) {
    std::fprintf(stderr, "blkps: --bsopts: %s\n", s.message().c_str());
    return 1;
  }
  std::string out = "{\"control\": " + std::string(options.control ? "true" : "false") +
                    ", \"params\": " + std::to_string(options.job.model.num_params) +
                    ", \"block_bytes\": " + std::to_string(options.job.model.block_bytes) +
                    ", \"table_rows\": " + std::to_string(options.job.model.table.rows) +
                    ", \"table_width\": " + std::to_string(options.job.model.table.width) +
                    ", \"hashed_capacity\": " + std::to_string(options.job.hashed_capacity) +
                    ", \"dtype\": " + blkps::server::JsonString(blkps::wire::DtypeName(options.dtype)) +
                    ", \"memory_bytes\": " + std::to_string(memory) + ", \"memory_available_bytes\": " +
                    std::to_string(options.control ? 0 : blkps::server::AvailableMemoryBytes()) + ", \"options\": [";
  for (size_t i = 0; i < pairs.size(); ++i) {
    out += (i ? ", [" : "[") + blkps::server::JsonString(pairs[i].first) + ", " +
           blkps::server::JsonString(pairs[i].second) + "]";
  }
  std::printf("%s]}\n", out.c_str());
  return 0;
}
