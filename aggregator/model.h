// Model: the global model, a flat vector of float32 parameters, as the bytes
// of a block device.
//
// Byte offset 4*i holds parameter i (little-endian float32). The device is
// size_bytes() long: the parameters rounded up to kDeviceSectorBytes; the
// padding reads as zeros and ignores writes.
//
// The parameters are divided into model blocks of block_bytes() each (the
// last may be shorter). Each block has a reader-writer lock:
//   - ApplyGradient(), the one path every gradient takes (Job::Write calls
//     it for each learner WRITE), applies its range block by block, each
//     under that block's write lock: concurrent writes to one block are all
//     applied (no lost update), and writes to different blocks run in
//     parallel.
//   - Read() copies each block under its read lock: a read never returns a
//     half-applied block.
// A range spanning several blocks is not atomic as a whole; each block is.
//
// Tables. A model declared as a table (ModelOptions::table: rows x width,
// e.g. embeddings) is the same device, row r at parameters [r*width,
// (r+1)*width), that is at byte r*width*4, with three differences:
//   - A row is made when it is first written (a gradient or weights): until
//     then a read returns its initial values computed on the fly
//     (InitializeRow), and its weights and rule state, anonymous mapped
//     memory, are not committed. (Memory is committed by the page: a written
//     row commits the pages it lies on, 4 KiB each.) A bitmap of one bit per
//     row says which rows are made.
//   - The part of a row that a write covers whose gradient is all zeros is
//     no gradient: nothing changes for it (not adam's moments or step count
//     either). Learners write whole 512-byte sectors, so a write carries the
//     rows its batch did not touch as zeros.
//   - Model blocks hold whole rows, so a read never returns a half-applied
//     row.
//
// Thread-safe: Read() and ApplyGradient() may be called from any number of
// threads at once.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "blkps/wire_dtype.hpp"
#include "initializer.h"
#include "page_buffer.h"
#include "status.h"
#include "update_rule.h"

namespace blkps::server {

inline constexpr uint64_t kDeviceSectorBytes = 512;
// Chosen by measurement (doc/performance.md): best of 256K/1M/4M for writes.
inline constexpr uint64_t kDefaultBlockBytes = 1 << 20;

// The shape of a table: rows of `width` float32 values.
struct TableShape {
  uint64_t rows = 0;   // 0: not a table, a dense model
  uint64_t width = 0;  // values per row, > 0 in a table
  bool is_table() const { return rows != 0; }
  uint64_t row_bytes() const { return width * sizeof(float); }
};

// A table's default model block: as many whole rows as fit in
// kDefaultBlockBytes, at least one.
inline uint64_t TableBlockBytes(uint64_t row_bytes) {
  return std::max<uint64_t>(1, kDefaultBlockBytes / row_bytes) * row_bytes;
}

struct ModelOptions {
  uint64_t num_params = 0;                    // > 0; rows x width in a table
  TableShape table;                           // rows = 0: a dense model
  uint64_t block_bytes = kDefaultBlockBytes;  // a multiple of 4, > 0; of the
                                              // row's bytes in a table
  uint64_t memory_limit_bytes = 0;            // the memory check's bound; 0:
                                              // MemAvailable (bsopts memory=)
  uint64_t snapshot_copy_limit_bytes = 0;     // the most a Snapshot's copies
                                              // hold at once; 0: no limit
                                              // (bsopts checkpoint_memory=)
  RuleOptions rule;
  InitSpec init;
  bool initialize = true;    // false: weights stay zero (a checkpoint is
                             // about to replace them); `init` still makes
                             // a table's rows
  bool accumulator = false;  // bsp: one float per parameter for the sum of
                             // a round's gradients
};

// The host's available memory (MemAvailable from /proc/meminfo) in bytes,
// or 0 if unknown: the bound of the memory check at Model::Create() unless
// memory= gives one.
uint64_t AvailableMemoryBytes();

class Model {
 public:
  // Creates and initialises a model. On failure returns non-OK with a
  // one-line reason (bad geometry, unknown rule, unreadable init file, not
  // enough memory) and leaves *out untouched.
  static Status Create(const ModelOptions& opts, std::unique_ptr<Model>* out);

  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  uint64_t num_params() const { return num_params_; }
  uint64_t block_bytes() const { return block_bytes_; }
  uint64_t num_blocks() const { return num_blocks_; }
  uint64_t size_bytes() const { return size_bytes_; }
  const UpdateRule& rule() const { return *rule_; }
  UpdateRule& rule() { return *rule_; }
  const TableShape& table() const { return table_; }
  // A table's rows made so far (see "Tables"); 0 for a dense model.
  uint64_t RowsMade() const;

  // Copies device bytes [offset, offset + len) into dst.
  // Returns OutOfRange, copying nothing, if the range passes size_bytes().
  Status Read(uint64_t offset, void* dst, size_t len) const;

  // A table's rows by id (Tables): row ids[k]'s width() values into
  // out[k * width, (k + 1) * width), for k in [0, count), as Read() of each
  // row would give them (a row not made as its initial values, without
  // making it; an id may repeat), in one pass over the batch: the rows are
  // visited by block, each block's read lock taken once for all its rows
  // (model_rows.cc). Returns, copying nothing: InvalidArgument for a dense
  // model; OutOfRange if an id is past the table's end.
  Status ReadRows(const uint64_t* ids, uint64_t count, float* out) const;

  // A table's row gradients by id: rows[k * width, (k + 1) * width) is the
  // gradient of row ids[k], for k in [0, count), applied as ApplyGradient()
  // of each row alone in the order given would (an all-zero row is no
  // gradient; a repeated id is applied each time, in its order), in one
  // pass: the rows are visited by block, each block's write lock taken once
  // for all the batch's rows in it. After each block's rows, still under its
  // lock, calls applied(block, rows) with the number of the batch's rows in
  // it. Returns, applying nothing: InvalidArgument for a dense model;
  // OutOfRange if an id is past the table's end.
  // REQUIRES: every value finite (Job::CheckRowBatch checks a batch whole).
  using RowsApplied = std::function<void(uint64_t block, uint64_t rows)>;
  Status ApplyRows(const uint64_t* ids, uint64_t count, const float* rows, const RowsApplied& applied);

  // Read() without the copy: hands the weights of parameters [first,
  // first + count) to `take` in order, a piece per block, each under that
  // block's read lock (so no piece is torn): take(weights, n, done), `done`
  // being the parameters handed before. A table's rows not made yet are
  // handed as Read() gives them. The 16-bit wire narrows straight out of the
  // model this way, in one pass. Returns OutOfRange, handing nothing, if the
  // parameters pass num_params().
  using TakeWeights = std::function<void(const float* weights, uint64_t n, uint64_t done)>;
  Status ReadParams(uint64_t first, uint64_t count, const TakeWeights& take) const;

  // Applies the gradient for device bytes [offset, offset + len), held in src
  // as `values`: float32 (len bytes, as the device holds them), or a 16-bit
  // LUN's bfloat16 or float16 (len / 2 bytes, blkps/wire_dtype.hpp), widened
  // exactly, kWidenChunk values at a time, as each piece is applied: a
  // 16-bit gradient has no float32 copy and gives the same bits as its
  // widened float32 values would. Block by block under each block's write
  // lock: with the update rule, or,
  // with an accumulator (bsp), by adding it to the round's sum, which
  // ApplyAverageLocked() applies when the round is complete. After each
  // block's part, still under that block's lock, calls applied(block, n)
  // with the number of parameters given (if `applied` is set): the job
  // counts the gradient there. Returns, applying nothing:
  //   OutOfRange       if the range passes size_bytes();
  //   InvalidArgument  if offset or len is not a multiple of 4, or a gradient
  //                    value is NaN or infinite (the message names the first
  //                    such parameter; a 16-bit gradient is checked on its
  //                    16-bit values, before any is widened).
  //
  // `staleness` (async and ssp, if set): called under each block's write
  // lock before that block's part is applied; the part is applied with
  // UpdateRule::ApplyStale() and what it returns (0: exactly Apply()).
  using BlockApplied = std::function<void(uint64_t block, uint64_t n)>;
  using BlockStaleness = std::function<uint64_t(uint64_t block)>;
  Status ApplyGradient(uint64_t offset, const void* src, size_t len, const BlockApplied& applied = nullptr,
                       const BlockStaleness& staleness = nullptr, wire::Dtype values = wire::Dtype::kFloat32);
  // Values a 16-bit gradient is widened by at a time, into a buffer on the
  // stack: 8 KiB of float32, which stays in L1 while the rule reads it.
  static constexpr uint64_t kWidenChunk = 2048;

  // Block `block`'s write lock, for ApplyAverageLocked().
  std::unique_lock<std::shared_mutex> LockBlock(uint64_t block) {
    return std::unique_lock<std::shared_mutex>(block_locks_[block]);
  }
  uint64_t BlockOf(uint64_t param) const { return param / params_per_block_; }
  uint64_t BlockParams(uint64_t block) const {
    return std::min(params_per_block_, num_params_ - block * params_per_block_);
  }

  // bsp: applies the accumulated sum of `given` gradients for `block`,
  // divided by `given`, with the update rule, and zeroes that part of the
  // accumulator. REQUIRES: block's write lock, has_accumulator(), given > 0.
  void ApplyAverageLocked(uint64_t block, uint32_t given);

  bool has_accumulator() const { return accumulator_.as<float>() != nullptr; }

  // Sets the weights of device bytes [offset, offset + len) to src, block by
  // block under write locks; rule state is kept. OutOfRange /
  // InvalidArgument (alignment, NaN or infinite value) as ApplyGradient.
  // `assigned(block, first, n)`, if given, runs after each block's share
  // [first, first + n) is set, with its write lock still held.
  using AssignedFn = std::function<void(uint64_t block, uint64_t first, uint64_t n)>;
  Status AssignWeights(uint64_t offset, const void* src, size_t len, const AssignedFn& assigned = nullptr);

  // The model's arrays, for checkpoints: "weights", the rule's state arrays,
  // "accumulator" if any, and a table's "table.made" (the bitmap of rows
  // made, bit r%64 of little-endian word r/64), in that order. A table's
  // rows not made read as zeros here. Every array but "table.made" holds
  // elem_bytes per parameter (elem_bytes 0: not per parameter). Reading
  // them while writes run needs a Snapshot; writing them needs no I/O
  // running at all.
  struct Array {
    std::string name;
    void* data;
    uint64_t bytes;
    uint64_t elem_bytes = 0;
  };
  std::vector<Array> Arrays();

  // Snapshots: the arrays as they were at one instant, read while writes go
  // on (doc/server.md "Checkpoints"). TakeSnapshot() write-locks every
  // block for a moment, calls at_instant() with them all held (nothing in
  // the model changes meanwhile: the caller records what goes with the
  // instant), copies the arrays that are not per parameter, and returns.
  // From then on, until the Snapshot is destroyed, the first change to a
  // block (a gradient, weights, a bsp average) first copies that block's
  // part of each array that the snapshot has not read yet: copy on write
  // per block, so a write waits for at most one block's copy, never for the
  // checkpoint. Snapshot::Read() gives each array's bytes as at the instant:
  // the copy if one was made, else the live bytes under the block's read
  // lock. Extra memory: the copies of blocks changed before the snapshot
  // read them, each freed when read (at most the arrays' size). With
  // opts.snapshot_copy_limit_bytes, the copies hold at most that much (or
  // one block's parts, if larger): a write that would copy past it waits,
  // holding no block lock, until Read() frees copies or the snapshot ends.
  // A bsp round finished when a dead learner is dropped copies regardless.
  // One snapshot at a time; destroy it before the Model.
  class Snapshot;
  std::unique_ptr<Snapshot> TakeSnapshot(const std::function<void()>& at_instant);

  // Bytes of memory a model with `opts` needs: weights, rule state, the
  // accumulator if any, and a table's bitmap. A table needs it all once
  // every row is made; the check at Create() asks for that much.
  static uint64_t MemoryBytes(const ModelOptions& opts, const UpdateRule& rule);

 private:
  Model(const ModelOptions& opts, PageBuffer weights, std::unique_ptr<UpdateRule> rule, PageBuffer accumulator,
        PageBuffer made);

  // Tables: whether row r is made; makes it (writes its initial values, and
  // zeros over its rule state, which is zero until then).
  // REQUIRES: the write lock of r's block for MakeRowLocked, a lock of it
  // for RowMadeLocked.
  bool RowMadeLocked(uint64_t r) const;
  void MakeRowLocked(uint64_t r);
  // Copies device bytes [pos, stop) of one block into out, rows not made as
  // their initial values. REQUIRES: a lock of the block.
  void ReadTableLocked(uint64_t pos, uint64_t stop, char* out) const;
  // Applies g[0..n), parameters [first, first + n) of one block, row part by
  // row part, skipping all-zero parts. REQUIRES: the block's write lock.
  void ApplyTableLocked(uint64_t first, const float* g, uint64_t n);

  Status CheckRange(uint64_t offset, uint64_t len) const;
  // ReadRows' and ApplyRows' checks: a table, every id in it.
  Status CheckRowIds(const uint64_t* ids, uint64_t count) const;
  // The parameters a write of device bytes [offset, offset + len) covers:
  // [first, first + count), the device's padding past num_params() excluded.
  struct ParamRange {
    uint64_t first = 0;
    uint64_t count = 0;
  };
  // bsp: adds g, parameters [first, first + n)' gradient, into the
  // accumulator. REQUIRES: their block's write lock, has_accumulator().
  void AccumulateLocked(uint64_t first, const float* g, uint64_t n);
  // Checks a gradient or weights write (errors as ApplyGradient; messages
  // call the values `what`) and stores its range in *range.
  Status CheckValues(uint64_t offset, const void* src, size_t len, const char* what, ParamRange* range,
                     wire::Dtype values = wire::Dtype::kFloat32) const;
  // Calls piece(block, first, n) for each model block holding parameters of
  // `range`, in order, with that block's write lock held; [first, first + n)
  // is the part of the range in the block.
  template <typename Piece>
  void ForEachBlockLocked(ParamRange range, Piece piece) {
    const uint64_t end = range.first + range.count;
    for (uint64_t i = range.first; i < end;) {
      const uint64_t block = i / params_per_block_;
      const uint64_t stop = std::min(end, (block + 1) * params_per_block_);
      std::unique_lock<std::shared_mutex> lock = LockBlock(block);
      while (!PreserveLocked(block, true)) {
        lock.unlock();  // the snapshot's reader needs it to free copies
        WaitForCopyRoom();
        lock.lock();
      }
      piece(block, i, stop - i);
      i = stop;
    }
  }

  // A snapshot is being read: block `block` is about to change; its parts
  // the snapshot still needs are copied first. With `limited`, returns false
  // and copies nothing if that would take the copies past the limit.
  // REQUIRES: its write lock.
  bool PreserveLocked(uint64_t block, bool limited);
  // Waits until the snapshot's copies are below the limit or it has ended.
  // REQUIRES: no block lock held.
  void WaitForCopyRoom();

  const uint64_t num_params_;
  const uint64_t block_bytes_;
  const uint64_t num_blocks_;
  const uint64_t params_per_block_;
  const uint64_t size_bytes_;
  PageBuffer weights_buffer_;
  float* const weights_;  // weights_buffer_'s num_params_ floats
  std::unique_ptr<UpdateRule> rule_;
  const std::vector<StateArray> rule_state_;  // rule_->state(), asked once
  PageBuffer accumulator_;                    // bsp only
  const TableShape table_;
  const InitSpec init_;  // a table makes rows with it
  PageBuffer made_;      // a table's bitmap of rows made
  mutable std::unique_ptr<std::shared_mutex[]> block_locks_;
  // The snapshot being read, if any: set and cleared with every block's
  // lock taken (see Snapshot), read under one.
  std::atomic<Snapshot*> snapshot_{nullptr};
  // The snapshot's copies: their bytes now (reserved before a copy, given
  // back when freed) and the limit; writers wait for room on copy_room_cv_.
  const uint64_t copy_limit_;
  std::atomic<uint64_t> copy_held_{0};
  std::mutex copy_room_mu_;
  std::condition_variable copy_room_cv_;
};

class Model::Snapshot {
 public:
  ~Snapshot();  // the model's writes stop copying for it
  Snapshot(const Snapshot&) = delete;
  Snapshot& operator=(const Snapshot&) = delete;

  // The arrays, as Model::Arrays() (data: the live memory; do not read it).
  const std::vector<Array>& arrays() const { return arrays_; }
  // Copies bytes [offset, offset + len) of arrays()[k] as they were at the
  // instant into out. Each byte is read at most once (a block's copy is
  // freed when all of it has been read).
  void Read(size_t k, uint64_t offset, uint64_t len, void* out);
  // Nothing more of arrays()[k]'s part of `block` will be read: a copy of
  // it is freed, and writes to the block copy none of it from now on.
  void Skip(size_t k, uint64_t block);
  // Bytes the model's writes have copied for this snapshot so far, and the
  // most its copies held at once.
  uint64_t bytes_copied() const { return bytes_copied_.load(std::memory_order_relaxed); }
  uint64_t peak_bytes_held() const { return peak_held_.load(std::memory_order_relaxed); }

 private:
  friend class Model;
  explicit Snapshot(Model* model) : model_(model) {}
  // One block's part of one per-parameter array.
  struct Part {
    std::unique_ptr<char[]> before;  // its bytes at the instant, if copied
    uint64_t read = 0;               // bytes of it Read() has given
  };
  uint64_t PartOffset(size_t k, uint64_t block) const {
    return block * model_->params_per_block_ * arrays_[k].elem_bytes;
  }
  uint64_t PartBytes(size_t k, uint64_t block) const { return model_->BlockParams(block) * arrays_[k].elem_bytes; }
  Part& PartOf(size_t k, uint64_t block) { return parts_[block * arrays_.size() + k]; }
  // Copies the block's parts that are not yet read or copied; with
  // `limited`, returns false and copies nothing if the copies would pass the
  // model's limit (unless they hold nothing now).
  // REQUIRES: a lock of the block (its write lock, or Read()'s read lock).
  bool CopyLocked(uint64_t block, bool limited);
  // A copy of `bytes` was freed: gives its room back to waiting writers.
  void Freed(uint64_t bytes);

  Model* const model_;
  std::vector<Array> arrays_;
  std::vector<std::vector<char>> whole_;  // arrays not per parameter, copied at the instant
  std::vector<Part> parts_;               // guarded by their block's lock
  std::atomic<uint64_t> bytes_copied_{0};
  std::atomic<uint64_t> peak_held_{0};
};

}  // namespace blkps::server
