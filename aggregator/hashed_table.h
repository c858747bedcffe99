// HashedTable: a table of rows keyed by any 64-bit id (a feature hash), the
// storage of a hashed table (doc/embeddings.md "Hashed ids"), served by a
// Job for `--bsopts table=hash:CAPACITY:WIDTH` and `evict=` through the row
// windows (job.h "Hashed tables"); the checkpoint file and shards are to
// come (issue 38).
//
// Collision-free: each row is stored with its id. The index is open
// addressing with linear probing over a slot array of a power of two slots,
// at least 2 * CAPACITY (so at most half full), slot s holding an id and
// its row's number; an id's probe starts at blkps_feature_id_hash(id) mod
// the slot count (blkps/feature_id.h, the hash libblkps shards by). Erasing
// shifts the entries after it back (no tombstones), so probes stay as short
// as the load alone makes them.
//
// Rows live in a pool of row_limit() rows, handed out in order as ids are
// pushed: row k's weights at [k*width, (k+1)*width) and its rule state at
// the same parameters of the rule (an UpdateRule of row_limit()*width
// parameters: adam's moments and step count per value, as for a dense
// table). The pool is anonymous memory, committed as rows are made, so a
// table costs its slot array (fixed, at CAPACITY) and the rows it holds;
// row_limit() (below) is CAPACITY or what the memory bound holds.
//
//   - A pull of an id without a row gives the id's initial values
//     (InitializeRow keyed by the id) and makes nothing.
//   - A push makes the rows it needs, then applies the rule row by row in
//     the order given; an all-zero row is no gradient (it makes no row).
//   - The rows a table may make: CAPACITY, or fewer if the memory bound
//     (memory=, else MemAvailable at creation) holds fewer beside the slot
//     array. A push that needs more rows than are free evicts, if the
//     operator chose an eviction rule, or else is refused whole
//     (ResourceExhausted: the table is full).
//
// Eviction. The table counts its updates (row gradients applied; its
// clock) and keeps its rows in order of their last push.
//   lru-push  evicts the least recently pushed rows;
//   idle:N    evicts the least recently pushed rows among those not pushed
//             for N updates or more (and refuses the push if too few are).
// A row of the batch being pushed is never evicted for it. An evicted row's
// weights and rule state are gone: its id reads as its initial values again.
//
// Thread-safe: ReadRows() runs concurrently with other ReadRows(); a
// PushRows() runs alone (one reader-writer lock for the table).
#pragma once

#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <string>
#include <vector>

#include "initializer.h"
#include "page_buffer.h"
#include "status.h"
#include "update_rule.h"

namespace blkps::server {

// What a full hashed table does when a push needs a row (to be bsopts evict=).
struct EvictionRule {
  enum class Kind { kNone, kLeastRecentlyPushed, kIdle };
  Kind kind = Kind::kNone;
  uint64_t idle_updates = 0;  // kIdle: N, > 0
};

// Parses "none", "lru-push" or "idle:N" (N > 0) into *rule. On failure
// returns InvalidArgument, a one-line message starting with "evict:".
Status ParseEvictionRule(const std::string& text, EvictionRule* rule);

// "none", "lru-push" or "idle:N": as ParseEvictionRule reads it.
std::string EvictionRuleText(const EvictionRule& rule);

struct HashedTableOptions {
  uint64_t capacity = 0;  // rows it may hold, 1 .. 2^32 - 2
  uint64_t width = 0;     // float32 values per row, > 0
  RuleOptions rule;
  InitSpec init;  // zeros, uniform or normal (rows are keyed by id, not read from a file)
  EvictionRule evict;
  uint64_t memory_limit_bytes = 0;  // the bound on the slot array and the rows made;
                                    // 0: MemAvailable at Create()
};

class HashedTable {
 public:
  // Creates an empty table. The memory check counts StartBytes(): the slot
  // array and one row; the rows beyond are bounded at run time (row_limit()),
  // and only they are mapped (never CAPACITY rows past the bound). On failure
  // returns non-OK with a one-line reason (InvalidArgument: a bad capacity,
  // width, init or rule; ResourceExhausted: the slot array and a row do not
  // fit the bound) and leaves *out untouched.
  static Status Create(const HashedTableOptions& opts, std::unique_ptr<HashedTable>* out);

  HashedTable(const HashedTable&) = delete;
  HashedTable& operator=(const HashedTable&) = delete;

  uint64_t capacity() const { return capacity_; }
  uint64_t width() const { return width_; }
  const EvictionRule& evict() const { return evict_; }
  // The update rule, for its parameters at run time (lr=, ...): its
  // SetParam() is safe beside pushes, as for a model's rule.
  UpdateRule& rule() { return *rule_; }
  // The most rows this table makes: capacity(), or fewer under the memory bound.
  uint64_t row_limit() const { return row_limit_; }
  uint64_t slot_count() const { return mask_ + 1; }
  uint64_t RowsMade() const;
  uint64_t Evictions() const;
  uint64_t Updates() const;  // the clock: row gradients applied so far

  // Writes the rows of ids[0..n), row k for ids[k], into out[k*width ..),
  // as they are now: an id without a row as its initial values.
  void ReadRows(const uint64_t* ids, uint64_t n, float* out) const;

  // Applies grads[k*width ..) to the row of ids[k], k = 0 .. n-1, making the
  // rows needed (and evicting, see above). Returns ResourceExhausted,
  // changing nothing, if the rows it needs are not free and the eviction
  // rule frees too few. REQUIRES: grads are finite.
  Status PushRows(const uint64_t* ids, uint64_t n, const float* grads);

  // Bytes this table holds by its own accounting: the slot array, plus per
  // row made its weights, its rule state and its bookkeeping (id, order of
  // pushes, last push). Memory is committed by the page, so the resident
  // size is this rounded up to a page per array.
  uint64_t MemoryBytes() const;
  // The parts of MemoryBytes(): the fixed part and the cost of one row.
  static uint64_t SlotArrayBytes(uint64_t capacity);
  static uint64_t RowBytes(uint64_t width, const UpdateRule& rule);
  // What the start-time memory check counts for a table of this shape: the
  // slot array and one row (Job::MemoryBytes adds it to the model's).
  static uint64_t StartBytes(uint64_t capacity, uint64_t width, const UpdateRule& rule);

  // The probes of the ids held: a lookup of id x reads probe(x) slots,
  // 1 + its distance from its home slot.
  struct ProbeLengths {
    double mean = 0;
    uint64_t max = 0;
  };
  ProbeLengths Probes() const;

  // Every row made, for checkpoints: the id, its last push (on the clock),
  // its weights and each of the rule's state arrays' part for it, in
  // RuleStateNames() order. Rows come in order of their last push, oldest
  // first, so RestoreRow() in that order rebuilds the eviction order.
  struct Row {
    uint64_t id = 0;
    uint64_t last_push = 0;
    std::vector<float> weights;
    std::vector<std::vector<char>> state;
  };
  std::vector<Row> SaveRows() const;
  // The rule's state arrays, as Row::state holds them ("adam.m", ...).
  std::vector<std::string> RuleStateNames() const;
  // Empties the table, sets its clock and evictions, and makes `rows` in
  // order (as SaveRows() gave them). Returns InvalidArgument, leaving the
  // table empty, if a row's id repeats, its sizes do not fit this table, or
  // there are more rows than row_limit().
  Status RestoreRows(uint64_t updates, uint64_t evictions, const std::vector<Row>& rows);

 private:
  static constexpr uint32_t kNoRow = UINT32_MAX;
  HashedTable(const HashedTableOptions& opts, uint64_t slots, uint64_t row_limit, std::unique_ptr<UpdateRule> rule);

  uint64_t HomeSlot(uint64_t id) const;
  // Bytes of one row's part of a rule state array (the arrays hold
  // row_limit_ rows).
  uint64_t StateRowBytes(const StateArray& array) const;
  // The row of `id`, or kNoRow. REQUIRES: mu_ held.
  uint32_t FindLocked(uint64_t id) const;
  // Puts id -> row in the index. REQUIRES: mu_ held exclusively; id absent.
  void InsertLocked(uint64_t id, uint32_t row);
  // Takes id out of the index, shifting the entries after it back.
  // REQUIRES: mu_ held exclusively; id present.
  void EraseLocked(uint64_t id);
  // Gives `row` to `id`: its initial values, zero rule state, newest in the
  // order of pushes. REQUIRES: mu_ held exclusively.
  void MakeRowLocked(uint64_t id, uint32_t row);
  // Order of pushes: a doubly linked list over rows, oldest at head_.
  void UnlinkLocked(uint32_t row);
  void AppendLocked(uint32_t row);
  // Collects `count` rows to evict, none of them an id in `keep`, into
  // *victims; false if the eviction rule allows fewer. REQUIRES: mu_ held.
  template <typename Keep>
  bool ChooseVictimsLocked(uint64_t count, const Keep& keep, std::vector<uint32_t>* victims) const;

  const uint64_t capacity_;
  const uint64_t width_;
  const uint64_t mask_;  // slot count - 1
  const uint64_t row_limit_;
  const InitSpec init_;
  const EvictionRule evict_;
  std::unique_ptr<UpdateRule> rule_;
  const std::vector<StateArray> rule_state_;  // rule_->state(), asked once

  mutable std::shared_mutex mu_;
  // The index: slot s holds slot_ids_[s] -> row slot_rows_[s] - 1 (0: empty).
  PageBuffer slot_ids_;   // uint64 per slot
  PageBuffer slot_rows_;  // uint32 per slot
  // The pool: per row its id, its neighbours in the order of pushes (kNoRow
  // at the ends) and its last push; the weights; the rule's state.
  PageBuffer row_ids_;    // uint64 per row
  PageBuffer prev_;       // uint32 per row
  PageBuffer next_;       // uint32 per row
  PageBuffer last_push_;  // uint64 per row
  PageBuffer weights_;    // width floats per row
  uint32_t head_ = kNoRow, tail_ = kNoRow;
  uint64_t rows_made_ = 0;  // rows [0, rows_made_) of the pool hold ids
  uint64_t updates_ = 0;
  uint64_t evictions_ = 0;
};

}  // namespace blkps::server
