#include "row_batch.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "blkps/wire_convert.h"

namespace blkps {

DistinctRows::DistinctRows(const uint64_t* ids, uint64_t n, Order order) {
  row_of_id.resize(n);
  if (order == Order::kFirstSeen && n < 0xffffffffull) {  // else sorted: a slot holds 32 bits
    // Open addressing, linear probing, at most half full: slot -> index
    // into rows (kEmpty: none).
    constexpr uint32_t kEmpty = ~uint32_t{0};
    unsigned bits = 4;
    while ((uint64_t{1} << bits) < 2 * n) ++bits;
    const uint64_t mask = (uint64_t{1} << bits) - 1;
    std::vector<uint32_t> slots(mask + 1, kEmpty);
    rows.reserve(n);
    for (uint64_t k = 0; k < n; ++k) {
      uint64_t s = (ids[k] * 0x9E3779B97F4A7C15ull) >> (64 - bits);
      while (slots[s] != kEmpty && rows[slots[s]] != ids[k]) s = (s + 1) & mask;
      if (slots[s] == kEmpty) {
        slots[s] = static_cast<uint32_t>(rows.size());
        rows.push_back(ids[k]);
      }
      row_of_id[k] = slots[s];
    }
    return;
  }
  // (id, position) pairs sorted as they are: a comparison reads no other
  // array (perf saw the sort through `ids` take 8% of a push's learner time).
  std::vector<std::pair<uint64_t, uint64_t>> by_id(n);
  for (uint64_t k = 0; k < n; ++k) by_id[k] = {ids[k], k};
  std::sort(by_id.begin(), by_id.end());
  for (const auto& [id, k] : by_id) {
    if (rows.empty() || rows.back() != id) rows.push_back(id);
    row_of_id[k] = rows.size() - 1;
  }
}

RowBatch::RowBatch(Direction direction, const uint64_t* ids, uint64_t n, uint64_t width, const float* grads,
                   uint32_t block_size, uint64_t request_bytes)
    : n_(n), width_(width), distinct_(ids, n) {
  const uint64_t row_bytes = width * sizeof(float);

  // Runs of whole blocks: [begin, end) device bytes, staged at `staged`.
  struct Run {
    uint64_t begin, end, staged;
  };
  std::vector<Run> runs;
  staged_at_.resize(rows_.size());
  uint64_t staged = 0;  // bytes of the runs before the last one
  for (size_t j = 0; j < rows_.size(); ++j) {
    const uint64_t begin = rows_[j] * row_bytes / block_size * block_size;
    const uint64_t end = ((rows_[j] + 1) * row_bytes + block_size - 1) / block_size * block_size;
    if (runs.empty() || begin > runs.back().end) {
      if (!runs.empty()) staged += runs.back().end - runs.back().begin;
      runs.push_back({begin, end, staged});
    }
    Run& run = runs.back();
    run.end = std::max(run.end, end);
    staged_at_[j] = run.staged + (rows_[j] * row_bytes - run.begin);
  }
  if (!runs.empty()) staged += runs.back().end - runs.back().begin;
  staging_.assign(staged, 0);

  if (direction == Direction::kWrite) {
    for (uint64_t k = 0; k < n; ++k) {
      float* row = reinterpret_cast<float*>(staging_.data() + staged_at_[row_of_id_[k]]);
      const float* g = grads + k * width;
      for (uint64_t i = 0; i < width; ++i) row[i] += g[i];
    }
  }

  size_t pieces = 0;
  for (const Run& run : runs) pieces += (run.end - run.begin + request_bytes - 1) / request_bytes;
  iovecs_.resize(pieces);
  requests_.reserve(pieces);
  size_t p = 0;
  for (const Run& run : runs) {
    for (uint64_t at = run.begin; at < run.end; at += request_bytes, ++p) {
      const uint64_t length = std::min(request_bytes, run.end - at);
      iovecs_[p] = {staging_.data() + run.staged + (at - run.begin), length};
      requests_.push_back(IoRequest{at, length, &iovecs_[p], 1});
    }
  }
}

const float* RowBatch::FirstNonFinite() const {
  for (uint64_t at : staged_at_) {
    const float* row = reinterpret_cast<const float*>(staging_.data() + at);
    const size_t bad = wire::FirstNonFinite32(row, width_);
    if (bad < width_) return row + bad;
  }
  return nullptr;
}

void RowBatch::CopyRowsOut(float* rows) const {
  for (uint64_t k = 0; k < n_; ++k) {
    std::memcpy(rows + k * width_, staging_.data() + staged_at_[row_of_id_[k]], width_ * sizeof(float));
  }
}

}  // namespace blkps
