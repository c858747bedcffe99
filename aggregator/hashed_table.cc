// HashedTable (hashed_table.h): the index, the pool of rows, eviction.
#include "hashed_table.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <unordered_set>

#include "blkps/feature_id.h"
#include "model.h"

namespace blkps::server {
namespace {

constexpr uint64_t kMaxCapacity = UINT32_MAX - 1;  // a row's number + 1 fits a slot's uint32

// Slots for `capacity` ids at most half full: the smallest power of two
// >= 2 * capacity, at least 8. (Linear probing's runs grow fast past half
// full: at 70% the longest probe of 91,750 random ids was 129 slots.)
uint64_t SlotsFor(uint64_t capacity) {
  uint64_t slots = 8;
  while (slots < 2 * capacity) slots *= 2;
  return slots;
}

std::string Mib(uint64_t bytes) { return std::to_string((bytes + (1 << 20) - 1) >> 20) + " MiB"; }

bool AllZero(const float* g, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    if (g[i] != 0.0f) return false;
  }
  return true;
}

}  // namespace

Status ParseEvictionRule(const std::string& text, EvictionRule* rule) {
  EvictionRule parsed;
  if (text == "none") {
    parsed.kind = EvictionRule::Kind::kNone;
  } else if (text == "lru-push") {
    parsed.kind = EvictionRule::Kind::kLeastRecentlyPushed;
  } else if (text.rfind("idle:", 0) == 0 && text.size() > 5 &&
             text.find_first_not_of("0123456789", 5) == std::string::npos && text.size() <= 5 + 18 &&
             std::stoull(text.substr(5)) > 0) {
    parsed.kind = EvictionRule::Kind::kIdle;
    parsed.idle_updates = std::stoull(text.substr(5));
  } else {
    return Status::InvalidArgument("evict: expected none, lru-push or idle:N (N updates, a positive integer), got '" +
                                   text + "'");
  }
  *rule = parsed;
  return Status::OK();
}

std::string EvictionRuleText(const EvictionRule& rule) {
  switch (rule.kind) {
    case EvictionRule::Kind::kLeastRecentlyPushed: return "lru-push";
    case EvictionRule::Kind::kIdle: return "idle:" + std::to_string(rule.idle_updates);
    case EvictionRule::Kind::kNone: break;
  }
  return "none";
}

uint64_t HashedTable::SlotArrayBytes(uint64_t capacity) {
  return SlotsFor(capacity) * (sizeof(uint64_t) + sizeof(uint32_t));
}

uint64_t HashedTable::RowBytes(uint64_t width, const UpdateRule& rule) {
  const uint64_t bookkeeping = sizeof(uint64_t) + 2 * sizeof(uint32_t) + sizeof(uint64_t);
  return width * (sizeof(float) + rule.state_bytes_per_param()) + bookkeeping;
}

uint64_t HashedTable::StartBytes(uint64_t capacity, uint64_t width, const UpdateRule& rule) {
  return SlotArrayBytes(capacity) + RowBytes(width, rule);
}

uint64_t HashedTable::StateRowBytes(const StateArray& array) const { return array.bytes / row_limit_; }

Status HashedTable::Create(const HashedTableOptions& opts, std::unique_ptr<HashedTable>* out) {
  const std::string shape = "table=hash:" + std::to_string(opts.capacity) + ":" + std::to_string(opts.width);
  if (opts.capacity == 0 || opts.capacity > kMaxCapacity) {
    return Status::InvalidArgument("table: " + shape + ": CAPACITY must be 1 to " + std::to_string(kMaxCapacity) +
                                   " rows; shard a larger table");
  }
  if (opts.width == 0 || opts.width > (uint64_t{1} << 20)) {
    return Status::InvalidArgument("table: " + shape + ": WIDTH must be 1 to 1048576 values");
  }
  if (opts.init.kind == InitSpec::Kind::kFile) {
    return Status::InvalidArgument("init: a hashed table's rows are keyed by id, not read from a file; use zeros, "
                                   "uniform:A or normal:STD");
  }
  std::unique_ptr<UpdateRule> rule;
  Status s = MakeUpdateRule(opts.rule, 0, &rule);
  if (!s.ok()) return s;
  const uint64_t start = StartBytes(opts.capacity, opts.width, *rule), per_row = RowBytes(opts.width, *rule);
  const uint64_t bound = opts.memory_limit_bytes != 0 ? opts.memory_limit_bytes : AvailableMemoryBytes();
  uint64_t row_limit = opts.capacity;
  if (bound != 0) {
    if (start > bound) {
      return Status::ResourceExhausted("table: " + shape + " needs " + Mib(start) +
                                       " for its slot array and one row, but " +
                                       (opts.memory_limit_bytes != 0 ? "memory= allows " : "the host has ") +
                                       Mib(bound) + "; lower CAPACITY, raise memory= or shard the table");
    }
    row_limit = std::min(row_limit, (bound - SlotArrayBytes(opts.capacity)) / per_row);
  }
  // The pool is mapped for the rows the table may make, not for CAPACITY:
  // under memory= a table of many possible rows maps no more than it may use.
  s = MakeUpdateRule(opts.rule, row_limit * opts.width, &rule);
  if (!s.ok()) return s;
  std::unique_ptr<HashedTable> table(new HashedTable(opts, SlotsFor(opts.capacity), row_limit, std::move(rule)));
  const uint64_t slots = table->slot_count();
  for (Status a : {PageBuffer::Allocate(slots, sizeof(uint64_t), "the hashed table's slots", &table->slot_ids_),
                   PageBuffer::Allocate(slots, sizeof(uint32_t), "the hashed table's slots", &table->slot_rows_),
                   PageBuffer::Allocate(row_limit, sizeof(uint64_t), "the hashed table's ids", &table->row_ids_),
                   PageBuffer::Allocate(row_limit, sizeof(uint32_t), "the hashed table's order", &table->prev_),
                   PageBuffer::Allocate(row_limit, sizeof(uint32_t), "the hashed table's order", &table->next_),
                   PageBuffer::Allocate(row_limit, sizeof(uint64_t), "the hashed table's pushes", &table->last_push_),
                   PageBuffer::Allocate(row_limit * opts.width, sizeof(float), "the weights", &table->weights_)}) {
    if (!a.ok()) return a;
  }
  *out = std::move(table);
  return Status::OK();
}

HashedTable::HashedTable(const HashedTableOptions& opts, uint64_t slots, uint64_t row_limit,
                         std::unique_ptr<UpdateRule> rule)
    : capacity_(opts.capacity),
      width_(opts.width),
      mask_(slots - 1),
      row_limit_(row_limit),
      init_(opts.init),
      evict_(opts.evict),
      rule_(std::move(rule)),
      rule_state_(rule_->state()) {}

uint64_t HashedTable::RowsMade() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return rows_made_;
}

uint64_t HashedTable::Evictions() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return evictions_;
}

uint64_t HashedTable::Updates() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return updates_;
}

uint64_t HashedTable::MemoryBytes() const { return SlotArrayBytes(capacity_) + RowsMade() * RowBytes(width_, *rule_); }

// ---- The index ----------------------------------------------------------------

uint64_t HashedTable::HomeSlot(uint64_t id) const { return blkps_feature_id_hash(id) & mask_; }

uint32_t HashedTable::FindLocked(uint64_t id) const {
  const uint64_t* ids = slot_ids_.as<uint64_t>();
  const uint32_t* rows = slot_rows_.as<uint32_t>();
  for (uint64_t s = HomeSlot(id);; s = (s + 1) & mask_) {
    if (rows[s] == 0) return kNoRow;
    if (ids[s] == id) return rows[s] - 1;
  }
}

void HashedTable::InsertLocked(uint64_t id, uint32_t row) {
  uint64_t* ids = slot_ids_.as<uint64_t>();
  uint32_t* rows = slot_rows_.as<uint32_t>();
  uint64_t s = HomeSlot(id);
  while (rows[s] != 0) s = (s + 1) & mask_;
  ids[s] = id;
  rows[s] = row + 1;
}

void HashedTable::EraseLocked(uint64_t id) {
  uint64_t* ids = slot_ids_.as<uint64_t>();
  uint32_t* rows = slot_rows_.as<uint32_t>();
  uint64_t hole = HomeSlot(id);
  while (ids[hole] != id || rows[hole] == 0) hole = (hole + 1) & mask_;
  // Backward shift: an entry after the hole moves into it if its home slot
  // is not between the hole and it (cyclically), so every probe still finds
  // its id before an empty slot.
  for (uint64_t s = (hole + 1) & mask_; rows[s] != 0; s = (s + 1) & mask_) {
    const uint64_t home = HomeSlot(ids[s]);
    if (((s - home) & mask_) >= ((s - hole) & mask_)) {
      ids[hole] = ids[s];
      rows[hole] = rows[s];
      hole = s;
    }
  }
  rows[hole] = 0;
}

HashedTable::ProbeLengths HashedTable::Probes() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  const uint64_t* ids = slot_ids_.as<uint64_t>();
  const uint32_t* rows = slot_rows_.as<uint32_t>();
  ProbeLengths p;
  uint64_t held = 0, total = 0;
  for (uint64_t s = 0; s <= mask_; ++s) {
    if (rows[s] == 0) continue;
    const uint64_t probe = ((s - HomeSlot(ids[s])) & mask_) + 1;
    ++held;
    total += probe;
    p.max = std::max(p.max, probe);
  }
  if (held != 0) p.mean = static_cast<double>(total) / static_cast<double>(held);
  return p;
}

// ---- The pool and the order of pushes ----------------------------------------------

void HashedTable::UnlinkLocked(uint32_t row) {
  uint32_t* prev = prev_.as<uint32_t>();
  uint32_t* next = next_.as<uint32_t>();
  (prev[row] == kNoRow ? head_ : next[prev[row]]) = next[row];
  (next[row] == kNoRow ? tail_ : prev[next[row]]) = prev[row];
}

void HashedTable::AppendLocked(uint32_t row) {
  uint32_t* prev = prev_.as<uint32_t>();
  uint32_t* next = next_.as<uint32_t>();
  prev[row] = tail_;
  next[row] = kNoRow;
  (tail_ == kNoRow ? head_ : next[tail_]) = row;
  tail_ = row;
}

void HashedTable::MakeRowLocked(uint64_t id, uint32_t row) {
  InitializeRow(init_, id, weights_.as<float>() + row * width_, width_);
  ZeroStateRow(rule_state_, row_limit_, row);
  row_ids_.as<uint64_t>()[row] = id;
  last_push_.as<uint64_t>()[row] = updates_;
  InsertLocked(id, row);
  AppendLocked(row);
}

template <typename Keep>
bool HashedTable::ChooseVictimsLocked(uint64_t count, const Keep& keep, std::vector<uint32_t>* victims) const {
  if (evict_.kind == EvictionRule::Kind::kNone) return false;
  const uint64_t* ids = row_ids_.as<uint64_t>();
  const uint64_t* last = last_push_.as<uint64_t>();
  for (uint32_t row = head_; row != kNoRow && victims->size() < count; row = next_.as<uint32_t>()[row]) {
    // Oldest first: once a row is too recent for idle:N, so are all after it.
    if (evict_.kind == EvictionRule::Kind::kIdle && updates_ - last[row] < evict_.idle_updates) break;
    if (keep(ids[row])) continue;
    victims->push_back(row);
  }
  return victims->size() == count;
}

// ---- Reads and pushes ---------------------------------------------------------------

void HashedTable::ReadRows(const uint64_t* ids, uint64_t n, float* out) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  const float* w = weights_.as<float>();
  for (uint64_t k = 0; k < n; ++k) {
    const uint32_t row = FindLocked(ids[k]);
    if (row == kNoRow) {
      InitializeRow(init_, ids[k], out + k * width_, width_);
    } else {
      std::memcpy(out + k * width_, w + row * width_, width_ * sizeof(float));
    }
  }
}

Status HashedTable::PushRows(const uint64_t* ids, uint64_t n, const float* grads) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  // Each id's row as found now (kSkip: an all-zero gradient, no push), and
  // the rows to make: the distinct ids without one whose gradient is not all
  // zeros. (Per push, not per row: perf saw a set of every id of the batch,
  // built for a rare eviction, take a tenth of tgtd's time in pushes.)
  constexpr uint32_t kSkip = kNoRow - 1;
  static_assert(kMaxCapacity <= kSkip, "a row number (< kMaxCapacity) is never kSkip");
  std::vector<uint32_t> found(n);
  std::unordered_set<uint64_t> absent;
  for (uint64_t k = 0; k < n; ++k) {
    found[k] = AllZero(grads + k * width_, width_) ? kSkip : FindLocked(ids[k]);
    if (found[k] == kNoRow) absent.insert(ids[k]);
  }
  const uint64_t free_rows = row_limit_ - rows_made_;
  std::vector<uint32_t> victims;
  if (absent.size() > free_rows) {
    const uint64_t short_by = absent.size() - free_rows;
    const std::unordered_set<uint64_t> batch(ids, ids + n);  // no victim is a row of this push
    if (!ChooseVictimsLocked(
            short_by, [&](uint64_t id) { return batch.count(id) != 0; }, &victims)) {
      const std::string why =
          evict_.kind == EvictionRule::Kind::kNone
              ? "set evict=lru-push or evict=idle:N, raise CAPACITY or memory=, or shard the table"
              : "too few rows are evictable under evict=" + EvictionRuleText(evict_) + "; wait or change it";
      return Status::ResourceExhausted("hashed table full: " + std::to_string(rows_made_) + " of " +
                                       std::to_string(row_limit_) + " rows made and the push needs " +
                                       std::to_string(absent.size()) + " more; " + why + "; nothing was applied");
    }
    for (uint32_t row : victims) {
      EraseLocked(row_ids_.as<uint64_t>()[row]);
      UnlinkLocked(row);
    }
    evictions_ += victims.size();
  }
  float* w = weights_.as<float>();
  uint64_t* last = last_push_.as<uint64_t>();
  for (uint64_t k = 0; k < n; ++k) {
    const float* g = grads + k * width_;
    if (found[k] == kSkip) continue;
    // A row found stays (no victim is one of this push's); one not found
    // may have been made by the same id earlier in the push.
    uint32_t row = found[k] == kNoRow ? FindLocked(ids[k]) : found[k];
    if (row == kNoRow) {
      if (!victims.empty()) {
        row = victims.back();
        victims.pop_back();
      } else {
        row = static_cast<uint32_t>(rows_made_++);
      }
      MakeRowLocked(ids[k], row);
    }
    rule_->Apply(row * width_, w + row * width_, g, width_);
    last[row] = ++updates_;
    UnlinkLocked(row);
    AppendLocked(row);
  }
  return Status::OK();
}

// ---- Checkpoints ----------------------------------------------------------------------

std::vector<std::string> HashedTable::RuleStateNames() const {
  std::vector<std::string> names;
  for (const StateArray& a : rule_->state()) names.push_back(a.name);
  return names;
}

std::vector<HashedTable::Row> HashedTable::SaveRows() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  const std::vector<StateArray> state = rule_->state();
  std::vector<Row> out;
  out.reserve(rows_made_);
  for (uint32_t row = head_; row != kNoRow; row = next_.as<uint32_t>()[row]) {
    Row r;
    r.id = row_ids_.as<uint64_t>()[row];
    r.last_push = last_push_.as<uint64_t>()[row];
    const float* w = weights_.as<float>() + row * width_;
    r.weights.assign(w, w + width_);
    for (const StateArray& a : state) {
      const uint64_t part = StateRowBytes(a);
      const char* p = static_cast<const char*>(a.data) + row * part;
      r.state.emplace_back(p, p + part);
    }
    out.push_back(std::move(r));
  }
  return out;
}

Status HashedTable::RestoreRows(uint64_t updates, uint64_t evictions, const std::vector<Row>& rows) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  std::memset(slot_rows_.as<void>(), 0, slot_rows_.bytes());
  head_ = tail_ = kNoRow;
  rows_made_ = 0;
  updates_ = updates;
  evictions_ = evictions;
  const std::vector<StateArray> state = rule_->state();
  auto bad = [&](const std::string& why) {
    std::memset(slot_rows_.as<void>(), 0, slot_rows_.bytes());
    head_ = tail_ = kNoRow;
    rows_made_ = 0;
    return Status::InvalidArgument("its hashed table rows do not fit this table: " + why);
  };
  if (rows.size() > row_limit_) {
    return bad(std::to_string(rows.size()) + " rows, but this table makes at most " + std::to_string(row_limit_));
  }
  for (const Row& r : rows) {
    if (r.weights.size() != width_ || r.state.size() != state.size()) return bad("a row of another width or rule");
    if (FindLocked(r.id) != kNoRow) return bad("id " + std::to_string(r.id) + " repeats");
    const uint32_t row = static_cast<uint32_t>(rows_made_++);
    MakeRowLocked(r.id, row);
    std::memcpy(weights_.as<float>() + row * width_, r.weights.data(), width_ * sizeof(float));
    for (size_t i = 0; i < state.size(); ++i) {
      const uint64_t part = StateRowBytes(state[i]);
      if (r.state[i].size() != part) return bad("a row of another rule state");
      std::memcpy(static_cast<char*>(state[i].data) + row * part, r.state[i].data(), part);
    }
    last_push_.as<uint64_t>()[row] = r.last_push;
  }
  return Status::OK();
}

}  // namespace blkps::server
