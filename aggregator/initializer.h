// Initial weights of a model: zeros, seeded random, or a file.
//
// Spelled in options as  zeros | uniform:<a> | normal:<std> | file:<path>.
// Random initialisation is deterministic for a given seed: each parameter's
// value is a function of the seed and its index alone (counter-based,
// doc/server.md "Checkpoints"), whatever the block size, the model's
// size or the number of threads that fill it. A table's rows
// (ModelOptions::table) are initialised one row at a time, each from the seed
// and its own row number alone (InitializeRow), so a row can be made when it
// is first read or written, in any order, and untouched rows cost nothing.
#pragma once

#include <cstdint>
#include <string>

#include "status.h"

namespace blkps::server {

struct InitSpec {
  enum class Kind { kZeros, kUniform, kNormal, kFile };
  Kind kind = Kind::kZeros;
  double scale = 0;   // kUniform: weights in [-scale, scale]; kNormal: std
  std::string path;   // kFile: raw little-endian float32, one per parameter
  uint64_t seed = 0;  // kUniform, kNormal
};

// Parses "zeros", "uniform:0.05", "normal:0.01" or "file:/path" into *spec
// (seed untouched). On failure returns InvalidArgument naming the problem.
Status ParseInitSpec(const std::string& text, InitSpec* spec);

// Fills w[0..n) as `spec` says, random values from one thread per core. A
// file must hold exactly 4*n bytes.
// REQUIRES: w[0..n) reads as zeros (a fresh PageBuffer): "zeros" leaves it
// untouched, so the pages stay uncommitted until gradients arrive.
Status InitializeWeights(const InitSpec& spec, float* w, uint64_t n);

// Fills w[0..width) with the initial values of table row `row` as `spec`
// says: zeros, or values drawn from a counter-based generator keyed by
// (spec.seed, row), so the same seed gives the same row whatever else was
// touched before. (They differ from InitializeWeights's values for the same
// parameters: a dense model draws one stream for all of them.)
// REQUIRES: spec.kind is not kFile (a file initialises a table whole).
void InitializeRow(const InitSpec& spec, uint64_t row, float* w, uint64_t width);

}  // namespace blkps::server
