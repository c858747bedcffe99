// Replication: a shard's primary keeps an exact copy of its job on a backup
// (doc/replicas.md; the bytes: wire/include/blkps/replication.h). This file
// is the job's side, with no network: the records a push makes and a backup
// applies, and the channel a primary sends them through (the plugin's TCP
// link, target-plugin/replica_link.h, implements it).
//
// What a record holds is the new state of every block part a push touched
// (weights, then the rule's state arrays; parts of 64 KiB of weights, so
// that a push of a quarter of a 1 MiB block sends a quarter), not the
// gradient: the backup copies the primary's float sums instead of redoing
// them in some order, so it is equal bit for bit. Each part's states are
// numbered under its block's write lock (ReplicaParts); a backup keeps a
// part's state only if its number is newer, so records of concurrent
// pushes may arrive in any order.
//
// A backup that returns to a primary that went on without it catches up
// from a snapshot plus the stream (doc/replicas.md "A backup that
// returns"): the job's counts at one instant (ReplicaCounts), then the
// parts' states as they were at that instant (SNAPSHOT records), sent
// while the pushes made after it stream as PUSH records.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model.h"
#include "status.h"

namespace blkps::server {

// Where a primary's records go. Thread-safe: tgt's worker threads push
// concurrently.
class ReplicaChannel {
 public:
  virtual ~ReplicaChannel() = default;
  // Sends the HELLO body (ReplicaHello) and waits for the backup's answer:
  // OK, or non-OK with why it refused or could not be reached.
  virtual Status Hello(const std::string& body) = 0;
  // What a record is (the frame kinds of wire/include/blkps/replication.h).
  enum class Record { kPush, kSnapshotBegin, kSnapshot, kParams, kLiveness };
  // Sends a record's body (PUSH and SNAPSHOT: ReplicaPush::Body;
  // SNAPSHOT_BEGIN: ReplicaCounts::Body; PARAMS: control lines) and returns
  // once the backup has
  // applied it (OK), or non-OK with why it cannot be acknowledged. Records
  // reach the backup in the order their Send calls began.
  virtual Status Send(Record kind, const std::string& body) = 0;
  // Where the backup is, for messages ("127.0.0.1:3270").
  virtual std::string peer() const = 0;
};

// The HELLO body of `model`: its geometry and rule (replication.h).
std::string ReplicaHello(Model& model);
// OK if `hello` is the HELLO of a primary with `model`'s geometry and rule;
// otherwise InvalidArgument saying what differs.
Status CheckReplicaHello(Model& model, const std::string& hello);

// A block's part: its index over the model, its block, its first
// parameter (in the model) and its parameters.
struct ReplicaPart {
  uint64_t index, block, first, params;
};

// Where a model's parts are (wire/include/blkps/replication.h: a block's
// first BLKPS_REPLICA_PART_PARAMS parameters are its part 0, ...), and each
// part's state number: the primary counts a part's states as pushes change
// it; a backup holds the number of the state it has. Each number is guarded
// by its part's block's lock (Model::LockBlock), which clang cannot check.
class ReplicaParts {
 public:
  explicit ReplicaParts(const Model& model);
  uint64_t count() const { return sequence_.size(); }
  ReplicaPart Part(uint64_t index) const;
  // The parts of `block` that model parameters [first, first + n) overlap,
  // in order.
  std::vector<ReplicaPart> Overlapping(uint64_t block, uint64_t first, uint64_t n) const;
  // The part that starts at parameter `first` and has `params` parameters,
  // if there is one.
  bool Find(uint64_t first, uint64_t params, ReplicaPart* out) const;

  // Primary: the number of the part's next state. REQUIRES: its block's
  // write lock.
  uint64_t NextLocked(uint64_t part) { return ++sequence_[part]; }
  // Backup: whether a state numbered `sequence` is newer than the one held;
  // if so it is held from now. REQUIRES: the part's block's write lock.
  bool TakeIfNewerLocked(uint64_t part, uint64_t sequence) {
    if (sequence <= sequence_[part]) return false;
    sequence_[part] = sequence;
    return true;
  }
  // Backup: the same for a SNAPSHOT record's state, which is taken unless
  // the one held is newer (a state numbered 0 is the part's first).
  bool TakeUnlessNewerLocked(uint64_t part, uint64_t sequence) {
    if (sequence < sequence_[part]) return false;
    sequence_[part] = sequence;
    return true;
  }
  // Backup: forgets every number of `block`'s parts (a catch-up begins).
  // REQUIRES: the block's write lock.
  void ForgetBlockLocked(uint64_t block);
  // Primary: every part's number. REQUIRES: every block's lock.
  std::vector<uint64_t> CopyLocked() const { return sequence_; }

 private:
  uint64_t num_params_, block_params_, part_params_, parts_per_block_;
  std::vector<uint64_t> sequence_;
};

// One push's PUSH record, made on the primary while the push is applied.
class ReplicaPush {
 public:
  ReplicaPush(uint64_t lun, const std::string& initiator, uint64_t receipt_unit);
  // Makes room for the parts a push of `params` parameters touches (its
  // body is built without reallocating).
  void Reserve(Model& model, uint64_t params);
  // Adds the parts of `block` that the push's parameters [first, first + n)
  // touch, each part's state as it is now, numbered by `parts`.
  // REQUIRES: the block's write lock, held since the push was applied there.
  void AddBlockLocked(Model& model, ReplicaParts& parts, uint64_t block, uint64_t first, uint64_t n);
  // Adds `block`'s clocks as the push left them (LearnerClocks::SaveBlock),
  // their state number `sequence`.
  void AddClocks(uint64_t block, uint64_t sequence, const std::vector<uint64_t>& words);
  // A SNAPSHOT record's part (made with lun 0, initiator "", unit 0): its
  // state as `snapshot` holds it, numbered `sequence` (the
  // part's number at the snapshot's instant).
  void AddSnapshotPart(Model::Snapshot& snapshot, const ReplicaPart& part, uint64_t sequence);
  // The body's bytes so far.
  size_t bytes() const { return body_.size(); }
  bool empty() const { return parts_ == 0; }
  // The record's body, complete.
  const std::string& Body();

 private:
  void AddPartHead(const ReplicaPart& part, uint64_t sequence);
  std::string body_;
  uint64_t parts_ = 0;
  std::string clocks_;  // after the parts, once Body() is asked for
  uint64_t blocks_ = 0;
  bool complete_ = false;
};

// A PUSH body as the backup reads it. `state` points into the body.
struct ReplicaRecord {
  uint64_t lun = 0, receipt_unit = 0;
  std::string initiator;
  struct Part {
    ReplicaPart part;
    uint64_t sequence;
    const char* state;
  };
  std::vector<Part> parts;
  struct Clocks {
    uint64_t block, sequence;
    std::vector<uint64_t> words;
  };
  std::vector<Clocks> clocks;
};
// Reads `body` (which must outlive *out) for `model` and its `parts`.
// InvalidArgument if it is malformed or names parts `model` does not have.
Status ParseReplicaPush(Model& model, const ReplicaParts& parts, const std::string& body, ReplicaRecord* out);
// Sets `part`'s weights and rule state from a record's `state`.
// REQUIRES: the part's block's write lock.
void RestorePartLocked(Model& model, const ReplicaPart& part, const char* state);

// A SNAPSHOT_BEGIN body: the job's counts at a snapshot's instant, in the
// words of a checkpoint's sections (wire/include/blkps/replication.h).
struct ReplicaCounts {
  std::vector<uint64_t> luns, clocks, receipts;
  std::string Body() const;
  // InvalidArgument if `body` is malformed.
  static Status Parse(const std::string& body, ReplicaCounts* out);
};

// A LIVENESS body: the learner LUNs the primary holds dead
// (wire/include/blkps/replication.h).
struct ReplicaLiveness {
  std::vector<uint64_t> dead_luns;
  std::string Body() const;
  // InvalidArgument if `body` is malformed.
  static Status Parse(const std::string& body, ReplicaLiveness* out);
};

}  // namespace blkps::server
