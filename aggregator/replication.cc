// The job's side of replication (replication.h): HELLO, PUSH records built
// from and restored into model blocks.
#include "replication.h"

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "blkps/replication.h"

namespace blkps::server {

namespace {

// The arrays a record carries for each block: those with a value per
// parameter (weights, the rule's state). Tables and bsp are refused with
// replicas (Job), so there is nothing else.
std::vector<Model::Array> BlockArrays(Model& model) {
  std::vector<Model::Array> arrays;
  for (const Model::Array& a : model.Arrays()) {
    if (a.elem_bytes != 0) arrays.push_back(a);
  }
  return arrays;
}

// The first parameter of `block`: every block but the last is whole.
uint64_t FirstParam(const Model& model, uint64_t block) { return block * model.BlockParams(0); }

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

ReplicaPush::ReplicaPush(uint64_t lun, const std::string& initiator, uint64_t receipt_unit) {
  const blkps_replica_push head{lun, receipt_unit, initiator.size(), 0};
  body_.append(reinterpret_cast<const char*>(&head), sizeof head);
  body_ += initiator;
}

void ReplicaPush::Reserve(Model& model, uint64_t params) {
  uint64_t elem_bytes = 0;
  for (const Model::Array& a : BlockArrays(model)) elem_bytes += a.elem_bytes;
  const uint64_t block_params = model.BlockParams(0);
  const uint64_t blocks = std::min<uint64_t>(params / block_params + 2, model.num_blocks());
  body_.reserve(body_.size() + blocks * (sizeof(blkps_replica_block) + block_params * elem_bytes));
}

void ReplicaPush::AddBlockLocked(Model& model, uint64_t block, uint64_t sequence, uint64_t given) {
  const uint64_t params = model.BlockParams(block);
  const blkps_replica_block head{block, sequence, given, params};
  body_.append(reinterpret_cast<const char*>(&head), sizeof head);
  const uint64_t first = FirstParam(model, block);
  for (const Model::Array& a : BlockArrays(model)) {
    body_.append(static_cast<const char*>(a.data) + first * a.elem_bytes, params * a.elem_bytes);
  }
  ++blocks_;
}

void ReplicaPush::AddSnapshotBlock(Model& model, Model::Snapshot& snapshot, uint64_t block, uint64_t sequence) {
  const uint64_t params = model.BlockParams(block);
  const blkps_replica_block head{block, sequence, 0, params};
  body_.append(reinterpret_cast<const char*>(&head), sizeof head);
  const uint64_t first = FirstParam(model, block);
  const std::vector<Model::Array>& arrays = snapshot.arrays();
  for (size_t k = 0; k < arrays.size(); ++k) {  // BlockArrays' order: the model's, per-parameter ones
    if (arrays[k].elem_bytes == 0) continue;
    const size_t at = body_.size();
    body_.resize(at + params * arrays[k].elem_bytes);
    snapshot.Read(k, first * arrays[k].elem_bytes, params * arrays[k].elem_bytes, &body_[at]);
  }
  ++blocks_;
}

const std::string& ReplicaPush::Body() {
  std::memcpy(&body_[offsetof(blkps_replica_push, blocks)], &blocks_, sizeof blocks_);
  return body_;
}

Status ParseReplicaPush(Model& model, const std::string& body, ReplicaRecord* out) {
  const auto bad = [](const std::string& why) { return Status::InvalidArgument("replica record: " + why); };
  blkps_replica_push head;
  if (body.size() < sizeof head) return bad("shorter than its header");
  std::memcpy(&head, body.data(), sizeof head);
  size_t at = sizeof head;
  if (head.initiator_bytes > body.size() - at) return bad("initiator name past its end");
  out->lun = head.lun;
  out->receipt_unit = head.receipt_unit;
  out->initiator = body.substr(at, head.initiator_bytes);
  at += head.initiator_bytes;
  uint64_t elem_bytes = 0;
  for (const Model::Array& a : BlockArrays(model)) elem_bytes += a.elem_bytes;
  out->blocks.clear();
  for (uint64_t k = 0; k < head.blocks; ++k) {
    blkps_replica_block b;
    if (body.size() - at < sizeof b) return bad("block header past its end");
    std::memcpy(&b, body.data() + at, sizeof b);
    at += sizeof b;
    if (b.block >= model.num_blocks() || b.params != model.BlockParams(b.block)) {
      return bad("block " + std::to_string(b.block) + " of " + std::to_string(b.params) +
                 " parameters is not one of this model's");
    }
    if (body.size() - at < b.params * elem_bytes) return bad("block state past its end");
    out->blocks.push_back({b.block, b.sequence, b.given, body.data() + at});
    at += b.params * elem_bytes;
  }
  if (at != body.size()) return bad("bytes after its last block");
  return Status::OK();
}

std::string ReplicaCounts::Body() const {
  std::string body;
  for (const std::vector<uint64_t>* words : {&luns, &clocks, &receipts}) {
    AppendWords(&body, {words->size()});
    body.append(reinterpret_cast<const char*>(words->data()), words->size() * sizeof(uint64_t));
  }
  return body;
}

Status ReplicaCounts::Parse(const std::string& body, ReplicaCounts* out) {
  size_t at = 0;
  for (std::vector<uint64_t>* words : {&out->luns, &out->clocks, &out->receipts}) {
    uint64_t n = 0;
    if (body.size() - at < sizeof n) return Status::InvalidArgument("replica snapshot: counts past their end");
    std::memcpy(&n, body.data() + at, sizeof n);
    at += sizeof n;
    if (n > (body.size() - at) / sizeof(uint64_t))
      return Status::InvalidArgument("replica snapshot: counts past their end");
    words->resize(n);
    std::memcpy(words->data(), body.data() + at, n * sizeof(uint64_t));
    at += n * sizeof(uint64_t);
  }
  if (at != body.size()) return Status::InvalidArgument("replica snapshot: bytes after its counts");
  return Status::OK();
}

void RestoreBlockLocked(Model& model, uint64_t block, const char* state) {
  const uint64_t params = model.BlockParams(block);
  const uint64_t first = FirstParam(model, block);
  for (const Model::Array& a : BlockArrays(model)) {
    std::memcpy(static_cast<char*>(a.data) + first * a.elem_bytes, state, params * a.elem_bytes);
    state += params * a.elem_bytes;
  }
}

}  // namespace blkps::server
