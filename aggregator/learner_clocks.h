// LearnerClocks: each learner's iteration clock per model block, taken from
// its own I/O, and the gates that async, bsp and ssp put on its reads and
// writes.
//
// A learner slot (one LUN on the target) has, for every model block b:
//   clock[l][b]    gradients for b it has written in full; its iteration
//                  clock for b;
//   partial[l][b]  parameters of b written towards its next gradient.
// A learner's gradient for block b is complete once it has written as many
// parameters of b as the block holds, in any number of writes, in any order
// (a write may cover part of a block or many blocks). So a learner that
// writes its whole gradient once per iteration, with plain pwrite(), ticks
// every block's clock once per iteration, whatever its request sizes.
// A block in the GradientParts range takes K parts instead: the gradient is
// complete once K times the block's parameters are written
// (doc/server.md "A gradient in parts"); nothing else changes.
//
// The gates (min_live(b): the least clock[·][b] over live learners):
//   async   reads and writes always pass.
//   bsp     a read of b passes when round[b] >= clock[l][b]: every live
//           learner's gradient for the learner's previous iteration has been
//           applied. A write to b passes when clock[l][b] <= round[b]: the
//           learner has not already given its gradient for this round (a
//           learner that writes twice without reading waits). A round of b
//           completes when every live learner has given its gradient for it;
//           the caller then applies the average of those given.
//   ssp:s   a read of b passes when clock[l][b] - min_live(b) <= s. Writes
//           always pass.
//
// Liveness is the caller's: it calls MarkDead() and Rejoin(). A dead learner
// does not hold anyone back. A rejoining learner's clocks move up to where
// the live learners are (bsp: the current round; ssp/async: min_live), and
// its partial gradients are forgotten.
//
// Not thread-safe: the owner (Job) serialises every call with its mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "status.h"

namespace blkps::server {

enum class ConsistencyMode { kAsync, kBsp, kSsp };

struct ConsistencyOptions {
  ConsistencyMode mode = ConsistencyMode::kAsync;
  uint32_t staleness = 0;  // ssp's s
};

// "async", "bsp", "ssp:<s>" → *out; InvalidArgument naming `mode` otherwise.
Status ParseConsistency(const std::string& text, ConsistencyOptions* out);
std::string FormatConsistency(const ConsistencyOptions& opts);

// parts=FIRST:COUNT:K (doc/server.md "A gradient in parts"): the model
// blocks of parameters [first, first + count) take each learner's gradient
// in k writes a round. count 0: no such blocks.
struct GradientParts {
  uint64_t first = 0;
  uint64_t count = 0;
  uint32_t k = 1;
};

// "FIRST:COUNT:K" (K from 2 to kMaxGradientParts, COUNT > 0) -> *out;
// InvalidArgument naming `parts` otherwise.
constexpr uint32_t kMaxGradientParts = 16;
Status ParseGradientParts(const std::string& text, GradientParts* out);
// The text ParseGradientParts reads back ("FIRST:COUNT:K"); "" for none.
std::string FormatGradientParts(const GradientParts& parts);
// OK if `parts` can serve a model of num_params parameters in blocks of
// block_params, in `consistency`, on `shards` servers: none, or bsp on one
// server and a range of whole blocks inside the model. Else InvalidArgument,
// one line starting with `parts: `, saying what to give instead.
Status CheckGradientParts(const GradientParts& parts, const ConsistencyOptions& consistency, uint64_t num_params,
                          uint64_t block_params, uint32_t shards);

class LearnerClocks {
 public:
  // block_params[b]: number of parameters in model block b. The blocks that
  // lie wholly inside `parts` take parts.k gradients a round (a block only
  // partly inside takes one; CheckGradientParts refuses such a range).
  LearnerClocks(ConsistencyOptions opts, std::vector<uint64_t> block_params, GradientParts parts = {});

  const ConsistencyOptions& options() const { return opts_; }
  size_t num_learners() const { return learners_.size(); }
  size_t num_blocks() const { return gradient_params_.size(); }

  // Adds a live learner whose clocks start where the live learners are (as
  // Rejoin). Returns its index.
  size_t AddLearner();

  bool live(size_t l) const { return learners_[l].live; }
  void MarkDead(size_t l) { learners_[l].live = false; }
  void Rejoin(size_t l);

  // Whether learner l may read / write blocks [first, last] now.
  bool ReadMayPass(size_t l, uint64_t first, uint64_t last) const;
  bool WriteMayPass(size_t l, uint64_t first, uint64_t last) const;

  // Records that learner l wrote `n` parameters of block b. Returns true if
  // that completed its gradient for b (its clock for b ticked): all its
  // parts, in a GradientParts block.
  // bsp: REQUIRES WriteMayPass(l, b, b) held when the write was admitted.
  bool AddGradient(size_t l, uint64_t b, uint64_t n);

  // bsp: whether block b's round is complete (every live learner has given
  // its gradient, and at least one was given); then FinishRound(b) returns
  // how many were given and starts the next round.
  bool RoundComplete(uint64_t b) const;
  uint32_t FinishRound(uint64_t b);

  // bsp: rounds of block b applied so far; the highest over the blocks.
  uint64_t round(uint64_t b) const { return blocks_[b].round; }
  uint64_t max_round() const;

  // Updates applied to block b so far: bsp rounds; in async/ssp, complete
  // gradients.
  uint64_t version(uint64_t b) const { return blocks_[b].version; }
  // The job's global step: the least version over the blocks; and the sum.
  uint64_t global_step() const;
  uint64_t updates() const;
  uint64_t clock(size_t l, uint64_t b) const { return learners_[l].blocks[b].clock; }
  // Learner l's iteration: its least clock over all blocks.
  uint64_t iteration(size_t l) const;
  // The iteration learner l gives gradients towards: its highest clock over
  // all blocks, plus one where it has written part of its next gradient
  // of that block (ssp's boundaries, doc/server.md "One round on every shard").
  uint64_t furthest_iteration(size_t l) const;
  // How many iterations learner l is ahead of the slowest live learner, for
  // block b (0 if no other learner is live).
  uint64_t Lead(size_t l, uint64_t b) const;

  // Everything, as words, for checkpoints; Restore() takes what Save()
  // returned for the same geometry and number of learners.
  std::vector<uint64_t> Save() const;
  Status Restore(const std::vector<uint64_t>& words);
  // Block b's share of Save(): its round, contributors and version, then
  // each learner's clock and partial on b, in learner order; RestoreBlock()
  // takes it back for a model with as many learners (liveness is neither's).
  std::vector<uint64_t> SaveBlock(uint64_t b) const;
  Status RestoreBlock(uint64_t b, const std::vector<uint64_t>& words);
  // bsp: Save() as at the boundary where round R ended (doc/server.md
  // "One round on every shard"): the gradients given towards the rounds
  // after R left out, so every learner that had given R is at clock R with
  // nothing partial, and every block at round R with no contributor.
  // REQUIRES: every block's round is R.
  std::vector<uint64_t> SaveAtRound(uint64_t R) const;

 private:
  struct LearnerBlock {
    uint64_t clock = 0;
    uint64_t partial = 0;
  };
  struct Learner {
    bool live = true;
    std::vector<LearnerBlock> blocks;
  };
  struct Block {
    uint64_t round = 0;         // bsp: rounds applied
    uint32_t contributors = 0;  // bsp: gradients given in the current round
    uint64_t version = 0;
  };

  // Least clock[·][b] over live learners other than `except`; `fallback` if none.
  uint64_t MinLiveClock(uint64_t b, size_t except, uint64_t fallback) const;

  const ConsistencyOptions opts_;
  // Parameters a learner writes to block b for one gradient: the block's,
  // times its parts.
  const std::vector<uint64_t> gradient_params_;
  std::vector<Block> blocks_;
  std::vector<Learner> learners_;
};

}  // namespace blkps::server
