#include "learner_clocks.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <limits>

namespace blkps::server {

Status ParseConsistency(const std::string& text, ConsistencyOptions* out) {
  if (text == "async" || text == "bsp") {
    *out = ConsistencyOptions{text == "bsp" ? ConsistencyMode::kBsp : ConsistencyMode::kAsync, 0};
    return Status::OK();
  }
  if (text.rfind("ssp:", 0) == 0 && text.size() > 4 && text[4] >= '0' && text[4] <= '9') {
    char* end = nullptr;
    errno = 0;
    const unsigned long s = std::strtoul(text.c_str() + 4, &end, 10);
    if (*end == '\0' && errno == 0 && s <= 1000000) {
      *out = ConsistencyOptions{ConsistencyMode::kSsp, static_cast<uint32_t>(s)};
      return Status::OK();
    }
  }
  return Status::InvalidArgument("mode: expected async, bsp or ssp:<s> (s: iterations a reader may run ahead, 0 to "
                                 "1000000), got '" +
                                 text + "'");
}

std::string FormatConsistency(const ConsistencyOptions& opts) {
  switch (opts.mode) {
    case ConsistencyMode::kAsync: return "async";
    case ConsistencyMode::kBsp: return "bsp";
    case ConsistencyMode::kSsp: return "ssp:" + std::to_string(opts.staleness);
  }
  return "?";
}

Status ParseGradientParts(const std::string& text, GradientParts* out) {
  char* end = nullptr;
  const char* at = text.c_str();
  // Three decimal fields separated by ':', nothing else (strtoull would take
  // a sign or spaces).
  bool ok = text.find_first_not_of("0123456789:") == std::string::npos;
  uint64_t fields[3] = {0, 0, 0};
  for (int i = 0; ok && i < 3; ++i) {
    errno = 0;
    fields[i] = std::strtoull(at, &end, 10);
    ok = end != at && errno == 0 && *end == (i < 2 ? ':' : '\0');
    at = end + 1;
  }
  if (!ok || fields[1] == 0 || fields[2] < 2 || fields[2] > kMaxGradientParts ||
      fields[0] > std::numeric_limits<uint64_t>::max() - fields[1]) {
    return Status::InvalidArgument("parts: expected FIRST:COUNT:K, parameters [FIRST, FIRST+COUNT) in whole model "
                                   "blocks whose gradient comes in K writes a round, COUNT > 0, K from 2 to " +
                                   std::to_string(kMaxGradientParts) + " (e.g. 0:262144:2), got '" + text + "'");
  }
  *out = GradientParts{fields[0], fields[1], static_cast<uint32_t>(fields[2])};
  return Status::OK();
}

std::string FormatGradientParts(const GradientParts& parts) {
  if (parts.count == 0) return "";
  return std::to_string(parts.first) + ":" + std::to_string(parts.count) + ":" + std::to_string(parts.k);
}

Status CheckGradientParts(const GradientParts& parts, const ConsistencyOptions& consistency, uint64_t num_params,
                          uint64_t block_params, uint32_t shards) {
  if (parts.count == 0) return Status::OK();
  if (consistency.mode != ConsistencyMode::kBsp) {
    return Status::InvalidArgument("parts: only with mode=bsp (" + FormatConsistency(consistency) +
                                   " applies each write on arrival, so K parts would be K steps of the rule); "
                                   "use mode=bsp or leave parts out");
  }
  if (shards > 1) {
    return Status::InvalidArgument("parts: not yet for a scaled-out model (shard= of " + std::to_string(shards) +
                                   "): serve it from one tgtd or leave parts out");
  }
  const uint64_t end = parts.first + parts.count;
  const auto boundary = [&](uint64_t p) { return p % block_params == 0 || p == num_params; };
  if (end > num_params || !boundary(parts.first) || !boundary(end)) {
    const uint64_t first = std::min(parts.first / block_params * block_params, num_params);
    const uint64_t last = std::min((end + block_params - 1) / block_params * block_params, num_params);
    return Status::InvalidArgument("parts: " + FormatGradientParts(parts) +
                                   " does not start and end at model blocks of " + std::to_string(block_params) +
                                   " parameters inside the " + std::to_string(num_params) +
                                   " of the model; e.g. parts=" + std::to_string(first) + ":" +
                                   std::to_string(std::max(last, first + 1) - first) + ":" + std::to_string(parts.k));
  }
  return Status::OK();
}

namespace {

// Each block's parameters, times parts.k where the block lies wholly inside
// the parts range.
std::vector<uint64_t> GradientParams(std::vector<uint64_t> block_params, const GradientParts& parts) {
  uint64_t start = 0;  // block b's first parameter
  for (uint64_t& n : block_params) {
    const bool inside = parts.count > 0 && start >= parts.first && start + n <= parts.first + parts.count;
    start += n;
    if (inside) n *= parts.k;
  }
  return block_params;
}

}  // namespace

LearnerClocks::LearnerClocks(ConsistencyOptions opts, std::vector<uint64_t> block_params, GradientParts parts)
    : opts_(opts), gradient_params_(GradientParams(std::move(block_params), parts)), blocks_(gradient_params_.size()) {}

size_t LearnerClocks::AddLearner() {
  learners_.push_back(Learner{true, std::vector<LearnerBlock>(blocks_.size())});
  Rejoin(learners_.size() - 1);
  return learners_.size() - 1;
}

uint64_t LearnerClocks::MinLiveClock(uint64_t b, size_t except, uint64_t fallback) const {
  uint64_t least = std::numeric_limits<uint64_t>::max();
  for (size_t k = 0; k < learners_.size(); ++k) {
    if (k != except && learners_[k].live) least = std::min(least, learners_[k].blocks[b].clock);
  }
  return least == std::numeric_limits<uint64_t>::max() ? fallback : least;
}

void LearnerClocks::Rejoin(size_t l) {
  Learner& learner = learners_[l];
  learner.live = true;
  for (uint64_t b = 0; b < blocks_.size(); ++b) {
    LearnerBlock& mine = learner.blocks[b];
    const uint64_t join = opts_.mode == ConsistencyMode::kBsp ? blocks_[b].round : MinLiveClock(b, l, mine.clock);
    if (mine.clock < join) mine.clock = join;
    mine.partial = 0;
  }
}

bool LearnerClocks::ReadMayPass(size_t l, uint64_t first, uint64_t last) const {
  for (uint64_t b = first; b <= last; ++b) {
    const uint64_t mine = learners_[l].blocks[b].clock;
    switch (opts_.mode) {
      case ConsistencyMode::kAsync: return true;
      case ConsistencyMode::kBsp:
        if (blocks_[b].round < mine) return false;
        break;
      case ConsistencyMode::kSsp:
        if (mine - MinLiveClock(b, learners_.size(), mine) > opts_.staleness) return false;
        break;
    }
  }
  return true;
}

bool LearnerClocks::WriteMayPass(size_t l, uint64_t first, uint64_t last) const {
  if (opts_.mode != ConsistencyMode::kBsp) return true;
  for (uint64_t b = first; b <= last; ++b) {
    if (learners_[l].blocks[b].clock > blocks_[b].round) return false;
  }
  return true;
}

bool LearnerClocks::AddGradient(size_t l, uint64_t b, uint64_t n) {
  LearnerBlock& mine = learners_[l].blocks[b];
  mine.partial += n;
  if (mine.partial < gradient_params_[b]) return false;
  mine.partial -= gradient_params_[b];
  ++mine.clock;
  if (opts_.mode == ConsistencyMode::kBsp) {
    ++blocks_[b].contributors;
  } else {
    ++blocks_[b].version;
  }
  return true;
}

bool LearnerClocks::RoundComplete(uint64_t b) const {
  if (opts_.mode != ConsistencyMode::kBsp || blocks_[b].contributors == 0) return false;
  return MinLiveClock(b, learners_.size(), blocks_[b].round + 1) > blocks_[b].round;
}

uint32_t LearnerClocks::FinishRound(uint64_t b) {
  Block& block = blocks_[b];
  const uint32_t given = block.contributors;
  block.contributors = 0;
  ++block.round;
  ++block.version;
  return given;
}

uint64_t LearnerClocks::global_step() const {
  uint64_t least = std::numeric_limits<uint64_t>::max();
  for (const Block& block : blocks_) least = std::min(least, block.version);
  return blocks_.empty() ? 0 : least;
}

uint64_t LearnerClocks::max_round() const {
  uint64_t most = 0;
  for (const Block& block : blocks_) most = std::max(most, block.round);
  return most;
}

uint64_t LearnerClocks::updates() const {
  uint64_t sum = 0;
  for (const Block& block : blocks_) sum += block.version;
  return sum;
}

uint64_t LearnerClocks::iteration(size_t l) const {
  uint64_t least = std::numeric_limits<uint64_t>::max();
  for (const LearnerBlock& mine : learners_[l].blocks) least = std::min(least, mine.clock);
  return learners_[l].blocks.empty() ? 0 : least;
}

uint64_t LearnerClocks::furthest_iteration(size_t l) const {
  uint64_t most = 0;
  for (const LearnerBlock& mine : learners_[l].blocks) most = std::max(most, mine.clock + (mine.partial > 0 ? 1 : 0));
  return most;
}

uint64_t LearnerClocks::Lead(size_t l, uint64_t b) const {
  const uint64_t mine = learners_[l].blocks[b].clock;
  const uint64_t least = MinLiveClock(b, l, mine);
  return mine > least ? mine - least : 0;
}

// Layout: number of blocks, number of learners, per block (round,
// contributors, version), then per learner (live, then per block (clock,
// partial)).
std::vector<uint64_t> LearnerClocks::Save() const {
  std::vector<uint64_t> words{blocks_.size(), learners_.size()};
  words.reserve(2 + 3 * blocks_.size() + learners_.size() * (1 + 2 * blocks_.size()));
  for (const Block& block : blocks_) words.insert(words.end(), {block.round, block.contributors, block.version});
  for (const Learner& learner : learners_) {
    words.push_back(learner.live);
    for (const LearnerBlock& mine : learner.blocks) words.insert(words.end(), {mine.clock, mine.partial});
  }
  return words;
}

std::vector<uint64_t> LearnerClocks::SaveBlock(uint64_t b) const {
  std::vector<uint64_t> words{blocks_[b].round, blocks_[b].contributors, blocks_[b].version};
  for (const Learner& learner : learners_)
    words.insert(words.end(), {learner.blocks[b].clock, learner.blocks[b].partial});
  return words;
}

Status LearnerClocks::RestoreBlock(uint64_t b, const std::vector<uint64_t>& words) {
  if (words.size() != 3 + 2 * learners_.size()) {
    return Status::InvalidArgument("a block's clocks of " +
                                   std::to_string(words.size() < 3 ? 0 : (words.size() - 3) / 2) +
                                   " learners, for a model with " + std::to_string(learners_.size()));
  }
  blocks_[b] = Block{words[0], static_cast<uint32_t>(words[1]), words[2]};
  for (size_t l = 0; l < learners_.size(); ++l)
    learners_[l].blocks[b] = LearnerBlock{words[3 + 2 * l], words[4 + 2 * l]};
  return Status::OK();
}

std::vector<uint64_t> LearnerClocks::SaveAtRound(uint64_t R) const {
  LearnerClocks at = *this;
  for (Block& block : at.blocks_) block.contributors = 0;  // round R, its version as it is
  for (Learner& learner : at.learners_) {
    for (LearnerBlock& mine : learner.blocks) {
      if (mine.clock >= R) mine = LearnerBlock{R, 0};  // its partial is towards a later round
    }
  }
  return at.Save();
}

Status LearnerClocks::Restore(const std::vector<uint64_t>& words) {
  if (words.size() < 2 || words[0] != blocks_.size() ||
      words.size() != 2 + 3 * blocks_.size() + words[1] * (1 + 2 * blocks_.size())) {
    return Status::InvalidArgument("the saved clocks do not match the model's " + std::to_string(blocks_.size()) +
                                   " blocks");
  }
  size_t i = 2;
  for (Block& block : blocks_) {
    block.round = words[i++];
    block.contributors = static_cast<uint32_t>(words[i++]);
    block.version = words[i++];
  }
  learners_.clear();
  while (i < words.size()) {
    Learner learner{words[i++] != 0, std::vector<LearnerBlock>(blocks_.size())};
    for (LearnerBlock& mine : learner.blocks) {
      mine.clock = words[i++];
      mine.partial = words[i++];
    }
    learners_.push_back(std::move(learner));
  }
  return Status::OK();
}

}  // namespace blkps::server
