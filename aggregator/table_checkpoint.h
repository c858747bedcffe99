// A dense table's checkpoint holds the rows made, not the whole table
// (doc/embeddings.md "Declaring a table"): each per-parameter array's
// section (weights, the rule's state) is the values of the rows made,
// ascending by row, and the "table.made" section (the bitmap) says which
// rows they are. The file says so in its metadata (kMadeRowsKey); a file
// without it holds whole arrays, as files written before did. So a
// checkpoint's size and time grow with the rows made, and a restart commits
// memory for them only.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint_file.h"
#include "model.h"
#include "status.h"

namespace blkps::server {

// The metadata key and value of a file whose table arrays hold rows made.
inline constexpr const char* kMadeRowsKey = "table.arrays";
inline constexpr const char* kMadeRowsValue = "rows-made";

// The rows whose bit is set in `words` (bit r%64 of word r/64), ascending.
std::vector<uint64_t> MadeRows(const uint64_t* words, uint64_t rows);

// The sections of a snapshot's per-parameter arrays, rows made only. It
// reads the bitmap as at the snapshot's instant, and tells the snapshot at
// once that blocks without a row made need nothing (writes to them copy
// nothing); the others are read whole, one block at a time, so each copy a
// write made is freed as it is read (Model::Snapshot).
class MadeRowsWriter {
 public:
  // REQUIRES: `model` is a table (not hashed) and `snapshot` its snapshot,
  // both outliving this.
  MadeRowsWriter(Model& model, Model::Snapshot& snapshot);
  // The section of array k (a per-parameter array of snapshot.arrays()):
  // its bytes, and its values in [offset, offset + len).
  uint64_t Bytes(size_t k) const;
  void Fill(size_t k, uint64_t offset, uint64_t len, void* out);
  uint64_t rows_made() const { return rows_.size(); }

 private:
  Model& model_;
  Model::Snapshot& snapshot_;
  std::vector<uint64_t> rows_;
  size_t cached_array_ = SIZE_MAX;  // the block part in cache_
  uint64_t cached_block_ = UINT64_MAX;
  std::vector<char> cache_;
};

// The load side: ReadCheckpointSections' destinations for a file of rows
// made, then the rows put in place.
class MadeRowsLoader {
 public:
  // The destinations of `arrays` (Model::Arrays of a table, not hashed) for
  // a file whose sections have the sizes in `header`: the bitmap into the
  // model, each per-parameter array into a buffer of its own.
  MadeRowsLoader(const std::vector<Model::Array>& arrays, const CheckpointHeader& header, uint64_t width);
  const std::vector<CheckpointDest>& dests() const { return dests_; }
  // After the sections are read: writes each row's values to its place in
  // the arrays. InvalidArgument if a section's size is not the rows made
  // times a row's values.
  Status Scatter();

 private:
  std::vector<Model::Array> arrays_;
  uint64_t width_;
  std::vector<CheckpointDest> dests_;
  std::vector<std::vector<char>> buffers_;  // per array; empty for the bitmap
};

}  // namespace blkps::server
