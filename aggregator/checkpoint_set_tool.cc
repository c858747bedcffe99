// blkps-checkpoint: asks the server's own checkpoint-set reader
// (checkpoint_set.h) what a checkpoint path holds, so that tools never parse
// checkpoint files or manifests again.
//
//   blkps-checkpoint PATH
//
// PATH is the model's checkpoint= value. Prints one JSON object on stdout
// and exits 0:
//   {"committed": true, "job": "3f0c...", "generation": 7, "shards": 2,
//    "parts": [{"file": "/c/model.ckpt.shard-0.gen-7", "step": 8000}, ...]}
// (a part taken at a round boundary also has "round": R)
// or {"committed": false, ...} with no parts when nothing was ever committed
// there (a new job). A set that a restart would refuse (incomplete, mixed,
// foreign, unreadable) prints "blkps: checkpoint: <reason>" on stderr, one
// line naming the files and what differs, and exits 1.

#include <cstdio>
#include <string>

#include "checkpoint_set.h"
#include "json_text.h"

int main(int argc, char** argv) {
  if (argc != 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::fprintf(argc == 2 ? stdout : stderr,
                 "usage: blkps-checkpoint PATH\n"
                 "Prints the committed checkpoint set of checkpoint=PATH as JSON, or why a restart refuses it.\n");
    return argc == 2 ? 0 : 2;
  }
  blkps::server::CheckpointSet set;
  const blkps::server::Status s = blkps::server::ReadCheckpointSet(argv[1], &set);
  if (s.code() == blkps::server::Status::Code::kNotFound) {
    std::printf("{\"committed\": false, \"job\": \"\", \"generation\": 0, \"shards\": 0, \"parts\": []}\n");
    return 0;
  }
  if (!s.ok()) {
    std::fprintf(stderr, "blkps: checkpoint: %s\n", s.message().c_str());
    return 1;
  }
  std::string out = "{\"committed\": true, \"job\": " + blkps::server::JsonString(set.job) +
                    ", \"generation\": " + std::to_string(set.generation) +
                    ", \"shards\": " + std::to_string(set.parts.size()) + ", \"parts\": [";
  for (size_t k = 0; k < set.parts.size(); ++k) {
    out += std::string(k ? ", " : "") + "{\"file\": " + blkps::server::JsonString(set.parts[k].file) +
           ", \"step\": " + std::to_string(set.parts[k].step) +
           (set.parts[k].round == blkps::server::kNoCheckpointRound
                ? std::string()
                : ", \"round\": " + std::to_string(set.parts[k].round)) +
           "}";
  }
  std::printf("%s]}\n", out.c_str());
  return 0;
}
