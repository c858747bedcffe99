// SameStateAsTheNextGeneration: whether two checkpoint files' bytes
// (aggregator/checkpoint_file.h) hold the same job and state, `later` being
// written as the generation after `earlier`'s (checkpoint_set.h): equal but
// for the generation number in the header and the trailer's checksum. What
// a restart that restores everything bit for bit writes at its next
// checkpoint.
#pragma once

#include <string>

namespace blkps_test {

inline bool SameStateAsTheNextGeneration(std::string earlier, const std::string& later, int generation) {
  constexpr size_t kTrailerBytes = 12;
  const std::string was = "\nmeta generation=" + std::to_string(generation) + "\n";
  const size_t at = earlier.find(was);
  if (at == std::string::npos) return false;
  earlier.replace(at, was.size(), "\nmeta generation=" + std::to_string(generation + 1) + "\n");
  return earlier.size() == later.size() && earlier.size() >= kTrailerBytes &&
         earlier.compare(0, earlier.size() - kTrailerBytes, later, 0, later.size() - kTrailerBytes) == 0;
}

}  // namespace blkps_test
