// libFuzzer harness: the shard layout file parser (learner/src/shard_layout.h)
// on any bytes. Contract checked: an accepted layout has a stripe unit that is
// a positive multiple of 512 and at least one shard, each with a non-empty
// target and a line inside the text; a refusal is one line that names the
// file. Never a crash, leak or undefined behaviour (ASan, UBSan).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "shard_layout.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  blkps::ShardLayout layout;
  const blkps::Status s = blkps::ParseShardLayout(text, "fuzz.layout", &layout);
  if (!s.ok()) {
    if (s.message().find("fuzz.layout") == std::string::npos) std::abort();
    return 0;
  }
  if (layout.stripe_unit == 0 || layout.stripe_unit % 512 != 0 || layout.shards.empty()) std::abort();
  const long lines = std::count(text.begin(), text.end(), '\n') + 1;
  for (const auto& shard : layout.shards) {
    if (shard.target.empty() || shard.line < 1 || shard.line > lines) std::abort();
  }
  return 0;
}
