// The job's side of replication (replication.h): HELLO, the model's parts,
// PUSH records built from and restored into them, a catch-up's counts.
#include "replication.h"

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "blkps/replication.h"

namespace blkps::server {

namespace {

// The arrays a record carries for each block: those with a value per
// parameter (weights, the rule's state, bsp's accumulator). Tables are
// refused with replicas (Job), so there is nothing else.
std::vector<Model::Array> BlockArrays(Model& model) {
  std::vector<Model::Array> arrays;
  for (const Model::Array& a : model.Arrays()) {
    if (a.elem_bytes != 0) arrays.push_back(a);
  }
  return arrays;
}

// Copies the `T` at body[*at] into *out and moves *at past it; false if
// the body ends first.
template <typename T>
bool Take(const std::string& body, size_t* at, T* out) {
  if (body.size() - *at < sizeof *out) return false;
  std::memcpy(out, body.data() + *at, sizeof *out);
  *at += sizeof *out;
  return true;
}

// The same for `n` u64 words, into *out.
bool TakeWords(const std::string& body, size_t* at, uint64_t n, std::vector<uint64_t>* out) {
  if (n > (body.size() - *at) / sizeof(uint64_t)) return false;
  out->resize(n);
  std::memcpy(out->data(), body.data() + *at, n * sizeof(uint64_t));
  *at += n * sizeof(uint64_t);
  return true;
}

void AppendWords(std::string* out, std::initializer_list<uint64_t> words) {
  for (uint64_t w : words) out->append(reinterpret_cast<const char*>(&w), sizeof w);
}

}  // namespace

std::string ReplicaHello(Model& model) {
  const std::string rule = model.rule().name();
  std::string body;
  AppendWords(&body, {model.num_params(), model.block_bytes(), BlockArrays(model).size(), rule.size()});
  return body + rule;
}

Status CheckReplicaHello(Model& model, const std::string& hello) {
  if (ReplicaHello(model) == hello) return Status::OK();
  uint64_t words[4] = {};
  std::memcpy(words, hello.data(), std::min(hello.size(), sizeof words));
  const std::string rule = hello.size() > sizeof words ? hello.substr(sizeof words) : "";
  return Status::InvalidArgument("this backup serves " + std::to_string(model.num_params()) + " parameters, block " +
                                 std::to_string(model.block_bytes()) + ", rule " + model.rule().name() +
                                 "; its primary " + std::to_string(words[0]) + ", block " + std::to_string(words[1]) +
                                 ", rule " + rule + ": give both the same --bsopts");
}

ReplicaParts::ReplicaParts(const Model& model)
    : num_params_(model.num_params()),
      block_params_(model.BlockParams(0)),
      part_params_(std::min<uint64_t>(BLKPS_REPLICA_PART_PARAMS, block_params_)),
      parts_per_block_((block_params_ + part_params_ - 1) / part_params_),
      sequence_(model.num_blocks() * parts_per_block_, 0) {}

ReplicaPart ReplicaParts::Part(uint64_t index) const {
  const uint64_t block = index / parts_per_block_;
  const uint64_t first = block * block_params_ + index % parts_per_block_ * part_params_;
  const uint64_t block_end = std::min(num_params_, (block + 1) * block_params_);
  return {index, block, first, std::min(part_params_, block_end > first ? block_end - first : 0)};
}

std::vector<ReplicaPart> ReplicaParts::Overlapping(uint64_t block, uint64_t first, uint64_t n) const {
  const uint64_t block_first = block * block_params_;
  const uint64_t from = std::max(first, block_first) - block_first;
  const uint64_t to = std::min(first + n, block_first + block_params_) - block_first;
  std::vector<ReplicaPart> parts;
  for (uint64_t k = from / part_params_; k * part_params_ < to; ++k)
    parts.push_back(Part(block * parts_per_block_ + k));
  return parts;
}

bool ReplicaParts::Find(uint64_t first, uint64_t params, ReplicaPart* out) const {
  const uint64_t block = first / block_params_;
  const uint64_t within = first % block_params_;
  if (first >= num_params_ || within % part_params_ != 0) return false;
  *out = Part(block * parts_per_block_ + within / part_params_);
  return out->params == params;
}

void ReplicaParts::ForgetBlockLocked(uint64_t block) {
  for (uint64_t k = 0; k < parts_per_block_; ++k) sequence_[block * parts_per_block_ + k] = 0;
}

ReplicaPush::ReplicaPush(uint64_t lun, const std::string& initiator, uint64_t receipt_unit) {
  const blkps_replica_push head{lun, receipt_unit, initiator.size(), 0, 0};
  body_.append(reinterpret_cast<const char*>(&head), sizeof head);
  body_ += initiator;
}

void ReplicaPush::Reserve(Model& model, uint64_t params) {
  uint64_t elem_bytes = 0;
  for (const Model::Array& a : BlockArrays(model)) elem_bytes += a.elem_bytes;
  const uint64_t part_params = std::min<uint64_t>(BLKPS_REPLICA_PART_PARAMS, model.BlockParams(0));
  const uint64_t parts = params / part_params + 2;
  body_.reserve(body_.size() + parts * (sizeof(blkps_replica_part) + part_params * elem_bytes));
}

void ReplicaPush::AddPartHead(const ReplicaPart& part, uint64_t sequence) {
  const blkps_replica_part head{part.first, sequence, part.params};
  body_.append(reinterpret_cast<const char*>(&head), sizeof head);
  ++parts_;
}

void ReplicaPush::AddBlockLocked(Model& model, ReplicaParts& parts, uint64_t block, uint64_t first, uint64_t n) {
  for (const ReplicaPart& part : parts.Overlapping(block, first, n)) {
    AddPartHead(part, parts.NextLocked(part.index));
    for (const Model::Array& a : BlockArrays(model)) {
      body_.append(static_cast<const char*>(a.data) + part.first * a.elem_bytes, part.params * a.elem_bytes);
    }
  }
}

void ReplicaPush::AddClocks(uint64_t block, uint64_t sequence, const std::vector<uint64_t>& words) {
  const blkps_replica_block_clocks head{block, sequence, words.size()};
  clocks_.append(reinterpret_cast<const char*>(&head), sizeof head);
  clocks_.append(reinterpret_cast<const char*>(words.data()), words.size() * sizeof(uint64_t));
  ++blocks_;
}

void ReplicaPush::AddSnapshotPart(Model::Snapshot& snapshot, const ReplicaPart& part, uint64_t sequence) {
  AddPartHead(part, sequence);
  const std::vector<Model::Array>& arrays = snapshot.arrays();
  for (size_t k = 0; k < arrays.size(); ++k) {  // BlockArrays' order: the model's, per-parameter ones
    if (arrays[k].elem_bytes == 0) continue;
    const size_t at = body_.size();
    body_.resize(at + part.params * arrays[k].elem_bytes);
    snapshot.Read(k, part.first * arrays[k].elem_bytes, part.params * arrays[k].elem_bytes, &body_[at]);
  }
}

const std::string& ReplicaPush::Body() {
  if (!complete_) {
    complete_ = true;
    body_ += clocks_;
    clocks_.clear();
  }
  std::memcpy(&body_[offsetof(blkps_replica_push, parts)], &parts_, sizeof parts_);
  std::memcpy(&body_[offsetof(blkps_replica_push, blocks)], &blocks_, sizeof blocks_);
  return body_;
}

Status ParseReplicaPush(Model& model, const ReplicaParts& parts, const std::string& body, ReplicaRecord* out) {
  const auto bad = [](const std::string& why) { return Status::InvalidArgument("replica record: " + why); };
  blkps_replica_push head;
  size_t at = 0;
  if (!Take(body, &at, &head)) return bad("shorter than its header");
  if (head.initiator_bytes > body.size() - at) return bad("initiator name past its end");
  out->lun = head.lun;
  out->receipt_unit = head.receipt_unit;
  out->initiator = body.substr(at, head.initiator_bytes);
  at += head.initiator_bytes;
  uint64_t elem_bytes = 0;
  for (const Model::Array& a : BlockArrays(model)) elem_bytes += a.elem_bytes;
  out->parts.clear();
  for (uint64_t k = 0; k < head.parts; ++k) {
    blkps_replica_part p;
    if (!Take(body, &at, &p)) return bad("part header past its end");
    ReplicaPart part;
    if (!parts.Find(p.first, p.params, &part)) {
      return bad("a part at parameter " + std::to_string(p.first) + " of " + std::to_string(p.params) +
                 " parameters is not one of this model's");
    }
    if (body.size() - at < p.params * elem_bytes) return bad("part state past its end");
    out->parts.push_back({part, p.sequence, body.data() + at});
    at += p.params * elem_bytes;
  }
  out->clocks.clear();
  for (uint64_t k = 0; k < head.blocks; ++k) {
    blkps_replica_block_clocks c;
    if (!Take(body, &at, &c)) return bad("block clocks' header past its end");
    if (c.block >= model.num_blocks()) return bad("clocks of block " + std::to_string(c.block) + ", past the model");
    std::vector<uint64_t> words;
    if (!TakeWords(body, &at, c.words, &words)) return bad("block clocks past their end");
    out->clocks.push_back({c.block, c.sequence, std::move(words)});
  }
  if (at != body.size()) return bad("bytes after its last part and clocks");
  return Status::OK();
}

void RestorePartLocked(Model& model, const ReplicaPart& part, const char* state) {
  for (const Model::Array& a : BlockArrays(model)) {
    std::memcpy(static_cast<char*>(a.data) + part.first * a.elem_bytes, state, part.params * a.elem_bytes);
    state += part.params * a.elem_bytes;
  }
}

namespace {

// A list of words as the records carry it: its length, then the words.
void AppendCounted(std::string* body, const std::vector<uint64_t>& words) {
  AppendWords(body, {words.size()});
  body->append(reinterpret_cast<const char*>(words.data()), words.size() * sizeof(uint64_t));
}

bool TakeCounted(const std::string& body, size_t* at, std::vector<uint64_t>* out) {
  uint64_t n = 0;
  return Take(body, at, &n) && TakeWords(body, at, n, out);
}

}  // namespace

std::string ReplicaCounts::Body() const {
  std::string body;
  for (const std::vector<uint64_t>* words : {&luns, &clocks, &receipts}) AppendCounted(&body, *words);
  return body;
}

Status ReplicaCounts::Parse(const std::string& body, ReplicaCounts* out) {
  size_t at = 0;
  for (std::vector<uint64_t>* words : {&out->luns, &out->clocks, &out->receipts}) {
    if (!TakeCounted(body, &at, words)) return Status::InvalidArgument("replica snapshot: counts past their end");
  }
  if (at != body.size()) return Status::InvalidArgument("replica snapshot: bytes after its counts");
  return Status::OK();
}

std::string ReplicaLiveness::Body() const {
  std::string body;
  AppendCounted(&body, dead_luns);
  return body;
}

Status ReplicaLiveness::Parse(const std::string& body, ReplicaLiveness* out) {
  size_t at = 0;
  if (!TakeCounted(body, &at, &out->dead_luns) || at != body.size()) {
    return Status::InvalidArgument("replica liveness: not a count of LUNs and those LUNs");
  }
  return Status::OK();
}

}  // namespace blkps::server
