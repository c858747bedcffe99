// Model: the global model, a flat vector of float32 parameters, as the bytes
// of a block device.
//
// Byte offset 4*i holds parameter i (little-endian float32). The device is
// size_bytes() long: the parameters rounded up to kDeviceSectorBytes; the
// padding reads as zeros and ignores writes.
//
// The parameters are divided into model blocks of block_bytes() each (the
// last may be shorter). Each block has a reader-writer lock:
//   - ApplyGradient() applies its range block by block, each under that
//     block's write lock: concurrent writes to one block are all applied (no
//     lost update), and writes to different blocks run in parallel.
//   - Read() copies each block under its read lock: a read never returns a
//     half-applied block.
// A range spanning several blocks is not atomic as a whole; each block is.
//
// Thread-safe: Read() and ApplyGradient() may be called from any number of
// threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <shared_mutex>

#include "initializer.h"
#include "page_buffer.h"
#include "status.h"
#include "update_rule.h"

namespace blkps {

inline constexpr uint64_t kDeviceSectorBytes = 512;
// Chosen by measurement (README, Performance): best of 256K/1M/4M for writes.
inline constexpr uint64_t kDefaultBlockBytes = 1 << 20;

struct ModelOptions {
  uint64_t num_params = 0;                    // > 0
  uint64_t block_bytes = kDefaultBlockBytes;  // a multiple of 4, > 0
  RuleOptions rule;
  InitSpec init;
};

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

  // Copies device bytes [offset, offset + len) into dst.
  // Returns OutOfRange, copying nothing, if the range passes size_bytes().
  Status Read(uint64_t offset, void* dst, size_t len) const;

  // Applies the gradient held in device bytes [offset, offset + len) of src
  // with the update rule. Returns, applying nothing:
  //   OutOfRange       if the range passes size_bytes();
  //   InvalidArgument  if offset or len is not a multiple of 4, or a gradient
  //                    value is NaN or infinite (the message names the first
  //                    such parameter).
  Status ApplyGradient(uint64_t offset, const void* src, size_t len);

  // Bytes of memory a model with `opts` needs: weights plus rule state.
  static uint64_t MemoryBytes(const ModelOptions& opts, const UpdateRule& rule);

 private:
  Model(const ModelOptions& opts, PageBuffer weights, std::unique_ptr<UpdateRule> rule);

  Status CheckRange(uint64_t offset, uint64_t len) const;

  const uint64_t num_params_;
  const uint64_t block_bytes_;
  const uint64_t num_blocks_;
  const uint64_t size_bytes_;
  PageBuffer weights_buffer_;
  float* const weights_;  // weights_buffer_'s num_params_ floats
  std::unique_ptr<UpdateRule> rule_;
  mutable std::unique_ptr<std::shared_mutex[]> block_locks_;
};

}  // namespace blkps
