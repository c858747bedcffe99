#include "model.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>

#include "blkps/wire_convert.h"

namespace blkps::server {
namespace {

uint64_t RoundUp(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

std::string Mib(uint64_t bytes) { return std::to_string((bytes + (1 << 20) - 1) >> 20) + " MiB"; }

}  // namespace

namespace {

// Hands the gradient of parameters [at, at + n) of a write whose values src
// holds as `values` to piece(g, done, m), in order, as float32 g[0..m) for
// parameters [at + done, at + done + m): a float32 gradient in one piece, as
// it lies; a 16-bit one widened Model::kWidenChunk values at a time into a
// buffer on the stack, each piece used while it is in L1 (whole: in one
// piece, widened into a per-thread buffer, for a table, whose row parts are
// applied or skipped whole).
template <typename Piece>
void ForEachFloatPiece(wire::Dtype values, const void* src, uint64_t at, uint64_t n, bool whole, Piece piece) {
  if (values == wire::Dtype::kFloat32) return piece(static_cast<const float*>(src) + at, 0, n);
  const uint16_t* h = static_cast<const uint16_t*>(src) + at;
  if (whole) {
    thread_local std::vector<float> wide;
    if (wide.size() < n) wide.resize(n);
    wire::Widen(values, h, wide.data(), n);
    return piece(wide.data(), 0, n);
  }
  alignas(64) float chunk[Model::kWidenChunk];
  for (uint64_t done = 0; done < n; done += Model::kWidenChunk) {
    const uint64_t m = std::min(Model::kWidenChunk, n - done);
    wire::Widen(values, h + done, chunk, m);
    piece(chunk, done, m);
  }
}

}  // namespace

uint64_t AvailableMemoryBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

uint64_t Model::MemoryBytes(const ModelOptions& opts, const UpdateRule& rule) {
  const uint64_t accumulator = opts.accumulator ? sizeof(float) : 0;
  const uint64_t bitmap = (opts.table.rows + 63) / 64 * sizeof(uint64_t);
  return opts.num_params * (sizeof(float) + rule.state_bytes_per_param() + accumulator) + bitmap;
}

Status Model::Create(const ModelOptions& opts, std::unique_ptr<Model>* out) {
  if (opts.num_params == 0) {
    return Status::InvalidArgument("params: a model needs at least 1 parameter");
  }
  if (opts.num_params > (uint64_t{1} << 61)) {
    return Status::InvalidArgument("params: " + std::to_string(opts.num_params) + " is too large");
  }
  if (opts.block_bytes == 0 || opts.block_bytes % sizeof(float) != 0) {
    return Status::InvalidArgument("block: a model block must be a positive multiple of 4 bytes, got " +
                                   std::to_string(opts.block_bytes));
  }
  const TableShape& table = opts.table;
  if (table.is_table()) {
    if (table.width == 0 || table.rows > opts.num_params || opts.num_params / table.rows != table.width ||
        opts.num_params % table.rows != 0) {
      return Status::InvalidArgument("table: " + std::to_string(table.rows) + " rows of " +
                                     std::to_string(table.width) + " values are not " +
                                     std::to_string(opts.num_params) + " parameters");
    }
    if (opts.block_bytes % table.row_bytes() != 0) {
      return Status::InvalidArgument("block: a table's model block holds whole rows: a multiple of its row's " +
                                     std::to_string(table.row_bytes()) + " bytes, got " +
                                     std::to_string(opts.block_bytes));
    }
    if (opts.accumulator) {
      return Status::InvalidArgument("mode: a table is served async only; use mode=async");
    }
  }
  // The memory check comes before any allocation (the rule's state was once
  // allocated first, and a model too large failed with mmap's error instead):
  // a rule of no parameters maps nothing and says its state per parameter.
  std::unique_ptr<UpdateRule> rule;
  Status s = MakeUpdateRule(opts.rule, 0, &rule);
  if (!s.ok()) return s;

  const uint64_t need = MemoryBytes(opts, *rule);
  const uint64_t available = AvailableMemoryBytes();
  if (opts.memory_limit_bytes != 0 && need > opts.memory_limit_bytes) {
    return Status::ResourceExhausted("params: a model of " + std::to_string(opts.num_params) +
                                     " parameters with rule " + rule->name() + " needs " + Mib(need) +
                                     " but memory= allows " + Mib(opts.memory_limit_bytes) +
                                     "; use fewer parameters or shard the model");
  }
  if (available != 0 && need > available) {
    return Status::ResourceExhausted(
        "params: a model of " + std::to_string(opts.num_params) + " parameters with rule " + rule->name() + " needs " +
        Mib(need) + " but only " + Mib(available) + " of memory is available; use fewer parameters or shard the model");
  }
  s = MakeUpdateRule(opts.rule, opts.num_params, &rule);
  if (!s.ok()) return s;

  PageBuffer weights;
  s = PageBuffer::Allocate(opts.num_params, sizeof(float), "the weights", &weights);
  if (!s.ok()) return s;
  PageBuffer made;
  if (table.is_table()) {
    s = PageBuffer::Allocate((table.rows + 63) / 64, sizeof(uint64_t), "the table's bitmap of rows made", &made);
    if (!s.ok()) return s;
    AdviseSmallPages(weights.as<void>(), weights.bytes());
    for (const StateArray& a : rule->state()) AdviseSmallPages(a.data, a.bytes);
  }
  // A table makes its rows when first written; from a file, all at once.
  if (opts.initialize && (!table.is_table() || opts.init.kind == InitSpec::Kind::kFile)) {
    s = InitializeWeights(opts.init, weights.as<float>(), opts.num_params);
    if (!s.ok()) return s;
    if (table.is_table()) {
      uint64_t* bits = made.as<uint64_t>();
      std::fill_n(bits, (table.rows + 63) / 64, ~uint64_t{0});
      if (table.rows % 64 != 0) bits[table.rows / 64] = (uint64_t{1} << (table.rows % 64)) - 1;
    }
  }
  PageBuffer accumulator;
  if (opts.accumulator) {
    s = PageBuffer::Allocate(opts.num_params, sizeof(float), "the bsp accumulator", &accumulator);
    if (!s.ok()) return s;
  }
  out->reset(new Model(opts, std::move(weights), std::move(rule), std::move(accumulator), std::move(made)));
  return Status::OK();
}

Model::Model(const ModelOptions& opts, PageBuffer weights, std::unique_ptr<UpdateRule> rule, PageBuffer accumulator,
             PageBuffer made)
    : num_params_(opts.num_params),
      block_bytes_(opts.block_bytes),
      num_blocks_((opts.num_params * sizeof(float) + opts.block_bytes - 1) / opts.block_bytes),
      params_per_block_(opts.block_bytes / sizeof(float)),
      size_bytes_(RoundUp(opts.num_params * sizeof(float), kDeviceSectorBytes)),
      weights_buffer_(std::move(weights)),
      weights_(weights_buffer_.as<float>()),
      rule_(std::move(rule)),
      rule_state_(rule_->state()),
      accumulator_(std::move(accumulator)),
      table_(opts.table),
      init_(opts.init),
      made_(std::move(made)),
      block_locks_(new std::shared_mutex[num_blocks_]),
      copy_limit_(opts.snapshot_copy_limit_bytes) {}

Status Model::CheckRange(uint64_t offset, uint64_t len) const {
  if (offset > size_bytes_ || len > size_bytes_ - offset) {
    return Status::OutOfRange("bytes [" + std::to_string(offset) + ", " + std::to_string(offset + len) +
                              ") pass the end of the model device (" + std::to_string(size_bytes_) + " bytes)");
  }
  return Status::OK();
}

Status Model::Read(uint64_t offset, void* dst, size_t len) const {
  Status s = CheckRange(offset, len);
  if (!s.ok()) return s;
  const uint64_t param_bytes = num_params_ * sizeof(float);
  const char* src = reinterpret_cast<const char*>(weights_);
  char* out = static_cast<char*>(dst);
  uint64_t pos = offset;
  const uint64_t end = offset + len;
  while (pos < end && pos < param_bytes) {
    const uint64_t block = pos / block_bytes_;
    const uint64_t stop = std::min({end, (block + 1) * block_bytes_, param_bytes});
    std::shared_lock<std::shared_mutex> lock(block_locks_[block]);
    if (table_.is_table()) {
      ReadTableLocked(pos, stop, out + (pos - offset));
    } else {
      std::memcpy(out + (pos - offset), src + pos, stop - pos);
    }
    pos = stop;
  }
  if (pos < end) std::memset(out + (pos - offset), 0, end - pos);  // padding
  return Status::OK();
}

Status Model::ReadParams(uint64_t first, uint64_t count, const TakeWeights& take) const {
  if (first > num_params_ || count > num_params_ - first) {
    return Status::OutOfRange("parameters [" + std::to_string(first) + ", " + std::to_string(first + count) +
                              ") pass the end of the model (" + std::to_string(num_params_) + " parameters)");
  }
  const uint64_t block_params = block_bytes_ / sizeof(float);
  for (uint64_t p = first; p < first + count;) {
    const uint64_t block = p / block_params;
    const uint64_t stop = std::min(first + count, (block + 1) * block_params);
    std::shared_lock<std::shared_mutex> lock(block_locks_[block]);
    if (table_.is_table()) {
      thread_local std::vector<float> rows;
      rows.resize(stop - p);
      ReadTableLocked(p * sizeof(float), stop * sizeof(float), reinterpret_cast<char*>(rows.data()));
      take(rows.data(), stop - p, p - first);
    } else {
      take(weights_ + p, stop - p, p - first);
    }
    p = stop;
  }
  return Status::OK();
}

Status Model::CheckValues(uint64_t offset, const void* src, size_t len, const char* what, ParamRange* range,
                          wire::Dtype values) const {
  Status s = CheckRange(offset, len);
  if (!s.ok()) return s;
  if (offset % sizeof(float) != 0 || len % sizeof(float) != 0) {
    return Status::InvalidArgument("bytes [" + std::to_string(offset) + ", " + std::to_string(offset + len) +
                                   ") do not start and end on a parameter (multiples of 4)");
  }
  const uint64_t first = offset / sizeof(float);
  const uint64_t count = std::min<uint64_t>(len / sizeof(float), num_params_ > first ? num_params_ - first : 0);
  size_t bad = count;
  bool nan = false;
  if (values == wire::Dtype::kFloat32) {
    const float* g = static_cast<const float*>(src);
    bad = wire::FirstNonFinite32(g, count);
    nan = bad != count && std::isnan(g[bad]);
  } else {  // on the 16-bit values themselves, half the bytes, none widened yet
    const uint16_t* h = static_cast<const uint16_t*>(src);
    bad = wire::FirstNonFinite16(values, h, count);
    nan = bad != count &&
          std::isnan(values == wire::Dtype::kBfloat16 ? wire::Bfloat16ToFloat(h[bad]) : wire::Float16ToFloat(h[bad]));
  }
  if (bad != count) {
    return Status::InvalidArgument(std::string(what) + " for parameter " + std::to_string(first + bad) + " is " +
                                   (nan ? "NaN" : "infinite") + "; the whole write was rejected");
  }
  *range = ParamRange{first, count};
  return Status::OK();
}

Status Model::ApplyGradient(uint64_t offset, const void* src, size_t len, const BlockApplied& applied,
                            const BlockStaleness& staleness, wire::Dtype values) {
  ParamRange range;
  Status s = CheckValues(offset, src, len, "gradient", &range, values);
  if (!s.ok()) return s;
  // Parameter i's gradient is value i - range.first of src. (Not a pointer
  // biased by -range.first: that is undefined, and UBSan stopped tgtd on it
  // for a zero-length WRITE, whose buffer is null.)
  const bool bsp = has_accumulator();
  const bool table = table_.is_table();
  ForEachBlockLocked(range, [&](uint64_t block, uint64_t first, uint64_t n) {
    // Once per block part, however many pieces: the job counts staleness.
    const uint64_t tau = bsp || table || !staleness ? 0 : staleness(block);
    ForEachFloatPiece(values, src, first - range.first, n, table, [&](const float* g, uint64_t done, uint64_t m) {
      if (bsp) {
        AccumulateLocked(first + done, g, m);
      } else if (table) {
        ApplyTableLocked(first + done, g, m);
      } else {
        rule_->ApplyStale(first + done, weights_ + first + done, g, m, tau);
      }
    });
    if (applied) applied(block, n);
  });
  return Status::OK();
}

void Model::AccumulateLocked(uint64_t first, const float* g, uint64_t n) {
  float* __restrict acc = accumulator_.as<float>() + first;
  for (uint64_t i = 0; i < n; ++i) acc[i] += g[i];
}

void Model::ApplyAverageLocked(uint64_t block, uint32_t given) {
  const uint64_t first = block * params_per_block_;
  const uint64_t n = BlockParams(block);
  float* __restrict acc = accumulator_.as<float>() + first;
  // Divide, not multiply by 1/given: the average of integer gradients over
  // 2^k learners stays exact, as a sequential reference computes it.
  PreserveLocked(block, false);
  const float count = static_cast<float>(given);
  for (uint64_t i = 0; i < n; ++i) acc[i] /= count;
  rule_->Apply(first, weights_ + first, acc, n);
  std::fill_n(acc, n, 0.0f);
}

Status Model::AssignWeights(uint64_t offset, const void* src, size_t len, const AssignedFn& assigned) {
  ParamRange range;
  Status s = CheckValues(offset, src, len, "weight", &range);
  if (!s.ok()) return s;
  const float* values = static_cast<const float*>(src);  // values[i - range.first]: parameter i
  ForEachBlockLocked(range, [&](uint64_t block, uint64_t first, uint64_t n) {
    if (table_.is_table()) {  // rows made first: their values outside the range stay their initial ones
      for (uint64_t r = first / table_.width; r * table_.width < first + n; ++r) MakeRowLocked(r);
    }
    std::memcpy(weights_ + first, values + (first - range.first), n * sizeof(float));
    if (assigned) assigned(block, first, n);
  });
  return Status::OK();
}

// ---- Tables ------------------------------------------------------------------
// The bitmap's words are shared by rows of different blocks, which are
// locked separately: its bits are read and set with atomic operations. A
// row's own bit changes only under its block's write lock.

bool Model::RowMadeLocked(uint64_t r) const {
  const uint64_t word = __atomic_load_n(made_.as<uint64_t>() + r / 64, __ATOMIC_RELAXED);
  return (word >> (r % 64)) & 1;
}

void Model::MakeRowLocked(uint64_t r) {
  if (RowMadeLocked(r)) return;
  InitializeRow(init_, r, weights_ + r * table_.width, table_.width);
  ZeroStateRow(rule_state_, table_.rows, r);
  __atomic_fetch_or(made_.as<uint64_t>() + r / 64, uint64_t{1} << (r % 64), __ATOMIC_RELAXED);
}

uint64_t Model::RowsMade() const {
  if (!table_.is_table()) return 0;
  uint64_t n = 0;
  const uint64_t* words = made_.as<uint64_t>();
  for (uint64_t i = 0; i < (table_.rows + 63) / 64; ++i) {
    n += static_cast<uint64_t>(__builtin_popcountll(__atomic_load_n(words + i, __ATOMIC_RELAXED)));
  }
  return n;
}

void Model::ReadTableLocked(uint64_t pos, uint64_t stop, char* out) const {
  const uint64_t row_bytes = table_.row_bytes();
  const char* src = reinterpret_cast<const char*>(weights_);
  thread_local std::vector<float> made_now;  // a row not made, as it would be
  for (uint64_t r = pos / row_bytes; pos < stop; ++r) {
    const uint64_t end = std::min(stop, (r + 1) * row_bytes);
    if (RowMadeLocked(r)) {
      std::memcpy(out, src + pos, end - pos);
    } else {
      made_now.resize(table_.width);
      InitializeRow(init_, r, made_now.data(), table_.width);
      std::memcpy(out, reinterpret_cast<const char*>(made_now.data()) + (pos - r * row_bytes), end - pos);
    }
    out += end - pos;
    pos = end;
  }
}

void Model::ApplyTableLocked(uint64_t first, const float* g, uint64_t n) {
  const uint64_t end = first + n;
  for (uint64_t i = first; i < end;) {
    const uint64_t r = i / table_.width;
    const uint64_t stop = std::min(end, (r + 1) * table_.width);
    const float* part = g + (i - first);
    if (std::any_of(part, part + (stop - i), [](float v) { return v != 0.0f; })) {
      MakeRowLocked(r);
      rule_->Apply(i, weights_ + i, part, stop - i);
    }
    i = stop;
  }
}

std::vector<Model::Array> Model::Arrays() {
  std::vector<Array> arrays{{"weights", weights_, num_params_ * sizeof(float), sizeof(float)}};
  for (const StateArray& state : rule_state_) {
    arrays.push_back({state.name, state.data, state.bytes, state.bytes / num_params_});
  }
  if (has_accumulator())
    arrays.push_back({"accumulator", accumulator_.as<void>(), accumulator_.bytes(), sizeof(float)});
  if (table_.is_table())
    arrays.push_back({"table.made", made_.as<void>(), (table_.rows + 63) / 64 * sizeof(uint64_t), 0});
  return arrays;
}

// ---- Snapshots ---------------------------------------------------------------
// A part (a block's share of a per-parameter array) is, for the snapshot,
// in one of three states, each changed under the block's lock: live (not
// changed since the instant, not read: its bytes are the live ones), copied
// (`before` holds its bytes at the instant), or read whole (read ==
// PartBytes: nothing more is needed of it). Writes copy live parts; Read()
// reads a live part straight when it reads it whole, else copies it first.

std::unique_ptr<Model::Snapshot> Model::TakeSnapshot(const std::function<void()>& at_instant) {
  std::unique_ptr<Snapshot> snap(new Snapshot(this));
  copy_held_.store(0, std::memory_order_relaxed);
  snap->arrays_ = Arrays();
  snap->parts_.resize(num_blocks_ * snap->arrays_.size());
  snap->whole_.resize(snap->arrays_.size());
  std::vector<std::unique_lock<std::shared_mutex>> locks;
  locks.reserve(num_blocks_);
  for (uint64_t b = 0; b < num_blocks_; ++b) locks.emplace_back(block_locks_[b]);
  if (at_instant) at_instant();
  for (size_t k = 0; k < snap->arrays_.size(); ++k) {
    const Array& a = snap->arrays_[k];
    if (a.elem_bytes == 0) {
      // The table's bitmap: its words are shared by rows of different blocks
      // and are small (one bit a row).
      const char* data = static_cast<const char*>(a.data);
      snap->whole_[k].assign(data, data + a.bytes);
    }
  }
  snapshot_.store(snap.get(), std::memory_order_release);
  return snap;
}

bool Model::PreserveLocked(uint64_t block, bool limited) {
  Snapshot* snap = snapshot_.load(std::memory_order_acquire);
  return snap == nullptr || snap->CopyLocked(block, limited && copy_limit_ != 0);
}

void Model::WaitForCopyRoom() {
  std::unique_lock<std::mutex> lock(copy_room_mu_);
  copy_room_cv_.wait(lock, [&] {
    return snapshot_.load(std::memory_order_acquire) == nullptr ||
           copy_held_.load(std::memory_order_acquire) < copy_limit_;
  });
}

Model::Snapshot::~Snapshot() {
  model_->snapshot_.store(nullptr, std::memory_order_release);
  // A write that found this snapshot still holds its block's lock: wait for
  // each block's, and none is left using it.
  for (uint64_t b = 0; b < model_->num_blocks_; ++b) {
    std::unique_lock<std::shared_mutex> lock(model_->block_locks_[b]);
  }
  // Writers waiting for room see the snapshot gone.
  std::lock_guard<std::mutex> lock(model_->copy_room_mu_);
  model_->copy_room_cv_.notify_all();
}

bool Model::Snapshot::CopyLocked(uint64_t block, bool limited) {
  uint64_t need = 0;
  for (size_t k = 0; k < arrays_.size(); ++k) {
    if (arrays_[k].elem_bytes == 0) continue;
    const Part& p = PartOf(k, block);
    if (!p.before && p.read != PartBytes(k, block)) need += PartBytes(k, block);
  }
  if (need == 0) return true;
  // Reserve the room first: writers of other blocks copy at the same time.
  const uint64_t held = model_->copy_held_.fetch_add(need, std::memory_order_acq_rel);
  if (limited && held != 0 && held + need > model_->copy_limit_) {
    Freed(need);  // the reservation: another writer may have been refused for it
    return false;
  }
  uint64_t peak = peak_held_.load(std::memory_order_relaxed);
  while (held + need > peak && !peak_held_.compare_exchange_weak(peak, held + need, std::memory_order_relaxed)) {
  }
  for (size_t k = 0; k < arrays_.size(); ++k) {
    if (arrays_[k].elem_bytes == 0) continue;
    Part& p = PartOf(k, block);
    const uint64_t bytes = PartBytes(k, block);
    if (p.before || p.read == bytes) continue;
    p.before.reset(new char[bytes]);
    std::memcpy(p.before.get(), static_cast<const char*>(arrays_[k].data) + PartOffset(k, block), bytes);
    bytes_copied_.fetch_add(bytes, std::memory_order_relaxed);
  }
  return true;
}

void Model::Snapshot::Freed(uint64_t bytes) {
  model_->copy_held_.fetch_sub(bytes, std::memory_order_acq_rel);
  if (model_->copy_limit_ == 0) return;
  std::lock_guard<std::mutex> lock(model_->copy_room_mu_);
  model_->copy_room_cv_.notify_all();
}

void Model::Snapshot::Skip(size_t k, uint64_t block) {
  std::shared_lock<std::shared_mutex> lock(model_->block_locks_[block]);
  Part& p = PartOf(k, block);
  p.read = PartBytes(k, block);
  if (p.before) {
    p.before.reset();
    Freed(p.read);
  }
}

void Model::Snapshot::Read(size_t k, uint64_t offset, uint64_t len, void* out) {
  const Array& a = arrays_[k];
  char* dst = static_cast<char*>(out);
  if (a.elem_bytes == 0) {
    std::memcpy(dst, whole_[k].data() + offset, len);
    return;
  }
  const uint64_t block_part = model_->params_per_block_ * a.elem_bytes;
  const uint64_t end = offset + len;
  for (uint64_t pos = offset; pos < end;) {
    const uint64_t block = pos / block_part;
    const uint64_t part_start = PartOffset(k, block);
    const uint64_t part_bytes = PartBytes(k, block);
    const uint64_t stop = std::min(end, part_start + part_bytes);
    std::shared_lock<std::shared_mutex> lock(model_->block_locks_[block]);
    Part& p = PartOf(k, block);
    const char* live = static_cast<const char*>(a.data);
    if (!p.before && (pos != part_start || stop != part_start + part_bytes)) {
      // Read in pieces: keep the part as it is now for the pieces to come
      // (counted as held, never refused: the reader frees copies).
      model_->copy_held_.fetch_add(part_bytes, std::memory_order_acq_rel);
      p.before.reset(new char[part_bytes]);
      std::memcpy(p.before.get(), live + part_start, part_bytes);
    }
    std::memcpy(dst + (pos - offset), p.before ? p.before.get() + (pos - part_start) : live + pos, stop - pos);
    p.read += stop - pos;
    if (p.read == part_bytes && p.before) {
      p.before.reset();
      Freed(part_bytes);
    }
    pos = stop;
  }
}

}  // namespace blkps::server
