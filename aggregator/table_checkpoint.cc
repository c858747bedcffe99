#include "table_checkpoint.h"

#include <algorithm>
#include <cstring>

namespace blkps::server {
namespace {

constexpr const char* kBitmap = "table.made";

uint64_t RowBytes(const Model::Array& a, uint64_t width) { return width * a.elem_bytes; }

}  // namespace

std::vector<uint64_t> MadeRows(const uint64_t* words, uint64_t rows) {
  std::vector<uint64_t> made;
  for (uint64_t w = 0; w < (rows + 63) / 64; ++w) {
    for (uint64_t bits = words[w]; bits != 0; bits &= bits - 1) {
      const uint64_t r = w * 64 + static_cast<uint64_t>(__builtin_ctzll(bits));
      if (r < rows) made.push_back(r);
    }
  }
  return made;
}

MadeRowsWriter::MadeRowsWriter(Model& model, Model::Snapshot& snapshot) : model_(model), snapshot_(snapshot) {
  const std::vector<Model::Array>& arrays = snapshot_.arrays();
  for (size_t k = 0; k < arrays.size(); ++k) {
    if (arrays[k].name != kBitmap) continue;
    std::vector<uint64_t> words(arrays[k].bytes / sizeof(uint64_t));
    snapshot_.Read(k, 0, arrays[k].bytes, words.data());
    rows_ = MadeRows(words.data(), model_.table().rows);
  }
  // Blocks hold whole rows: a block has a row made if one of its rows is.
  std::vector<bool> needed(model_.num_blocks(), false);
  const uint64_t width = model_.table().width;
  for (uint64_t r : rows_) needed[model_.BlockOf(r * width)] = true;
  for (uint64_t b = 0; b < model_.num_blocks(); ++b) {
    if (needed[b]) continue;
    for (size_t k = 0; k < arrays.size(); ++k) {
      if (arrays[k].elem_bytes != 0) snapshot_.Skip(k, b);
    }
  }
}

uint64_t MadeRowsWriter::Bytes(size_t k) const {
  return rows_.size() * RowBytes(snapshot_.arrays()[k], model_.table().width);
}

void MadeRowsWriter::Fill(size_t k, uint64_t offset, uint64_t len, void* out) {
  const Model::Array& a = snapshot_.arrays()[k];
  const uint64_t width = model_.table().width, row_bytes = RowBytes(a, width);
  char* dst = static_cast<char*>(out);
  for (uint64_t pos = offset; pos < offset + len;) {
    const uint64_t row = rows_[pos / row_bytes], within = pos % row_bytes;
    const uint64_t n = std::min(row_bytes - within, offset + len - pos);
    const uint64_t block = model_.BlockOf(row * width);
    const uint64_t part = block * model_.BlockParams(0) * a.elem_bytes;  // the block's part starts here
    if (k != cached_array_ || block != cached_block_) {
      cache_.resize(model_.BlockParams(block) * a.elem_bytes);
      snapshot_.Read(k, part, cache_.size(), cache_.data());
      cached_array_ = k;
      cached_block_ = block;
    }
    std::memcpy(dst + (pos - offset), cache_.data() + (row * row_bytes + within - part), n);
    pos += n;
  }
}

MadeRowsLoader::MadeRowsLoader(const std::vector<Model::Array>& arrays, const CheckpointHeader& header, uint64_t width)
    : arrays_(arrays), width_(width), buffers_(arrays.size()) {
  std::map<std::string, uint64_t> sizes(header.sections.begin(), header.sections.end());
  for (size_t k = 0; k < arrays_.size(); ++k) {
    const Model::Array& a = arrays_[k];
    if (a.elem_bytes == 0) {
      dests_.push_back({a.name, a.data, a.bytes});
      continue;
    }
    buffers_[k].resize(sizes.count(a.name) != 0 ? sizes[a.name] : 0);
    dests_.push_back({a.name, buffers_[k].data(), buffers_[k].size()});
  }
}

Status MadeRowsLoader::Scatter() {
  const Model::Array* bitmap = nullptr;
  for (const Model::Array& a : arrays_) {
    if (a.name == kBitmap) bitmap = &a;
  }
  if (bitmap == nullptr) return Status::InvalidArgument("a table of rows made without its table.made section");
  // The bitmap's bits past the table's rows are never set: any such bit counts.
  const std::vector<uint64_t> rows = MadeRows(static_cast<const uint64_t*>(bitmap->data), bitmap->bytes * 8);
  for (size_t k = 0; k < arrays_.size(); ++k) {
    const Model::Array& a = arrays_[k];
    if (a.elem_bytes == 0) continue;
    const uint64_t row_bytes = RowBytes(a, width_);
    if (buffers_[k].size() != rows.size() * row_bytes || (!rows.empty() && (rows.back() + 1) * row_bytes > a.bytes)) {
      return Status::InvalidArgument("section " + a.name + " holds " + std::to_string(buffers_[k].size()) +
                                     " bytes, not the " + std::to_string(rows.size()) + " rows made of " +
                                     std::to_string(row_bytes) + " bytes each that table.made names");
    }
    char* data = static_cast<char*>(a.data);
    for (size_t i = 0; i < rows.size(); ++i) {
      std::memcpy(data + rows[i] * row_bytes, buffers_[k].data() + i * row_bytes, row_bytes);
    }
    std::vector<char>().swap(buffers_[k]);
  }
  return Status::OK();
}

}  // namespace blkps::server
