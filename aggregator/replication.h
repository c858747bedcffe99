// Replication: a shard's primary keeps an exact copy of its job on a backup
// (doc/replicas.md; the bytes: wire/include/blkps/replication.h). This file
// is the job's side, with no network: the records a push makes and a backup
// applies, and the channel a primary sends them through (the plugin's TCP
// link, target-plugin/replica_link.h, implements it).
//
// What a record holds is the new state of every block a push touched
// (weights, then the rule's state arrays), not the gradient: the backup
// copies the primary's float sums instead of redoing them in some order,
// so it is equal bit for bit. Each block's states are numbered under its
// write lock (BlockSequences); a backup keeps a block's state only if its
// number is newer, so records of concurrent pushes may arrive in any order.
//
// A backup that returns to a primary that went on without it catches up
// from a snapshot plus the stream (doc/replicas.md "A backup that
// returns"): the job's counts at one instant (ReplicaCounts), then the
// blocks' states as they were at that instant (SNAPSHOT records), sent
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
  enum class Record { kPush, kSnapshotBegin, kSnapshot };
  // Sends a record's body (PUSH and SNAPSHOT: ReplicaPush::Body;
  // SNAPSHOT_BEGIN: ReplicaCounts::Body) and returns once the backup has
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

// One push's PUSH record, made on the primary while the push is applied.
class ReplicaPush {
 public:
  ReplicaPush(uint64_t lun, const std::string& initiator, uint64_t receipt_unit);
  // Makes room for the blocks a push of `params` parameters touches (its
  // body is built without reallocating).
  void Reserve(Model& model, uint64_t params);
  // Adds `block`'s state as it is now, numbered `sequence`, with `given`
  // parameters of the push. REQUIRES: the block's write lock, held since
  // the push was applied there.
  void AddBlockLocked(Model& model, uint64_t block, uint64_t sequence, uint64_t given);
  // A SNAPSHOT record's block (made with lun 0, initiator "", unit 0):
  // `block`'s state as `snapshot` of `model` holds it, numbered `sequence`
  // (the block's number at the snapshot's instant).
  void AddSnapshotBlock(Model& model, Model::Snapshot& snapshot, uint64_t block, uint64_t sequence);
  // The body's bytes so far.
  size_t bytes() const { return body_.size(); }
  bool empty() const { return blocks_ == 0; }
  // The record's body, complete.
  const std::string& Body();

 private:
  std::string body_;
  uint64_t blocks_ = 0;
};

// A PUSH body as the backup reads it. `state` points into the body.
struct ReplicaRecord {
  uint64_t lun = 0, receipt_unit = 0;
  std::string initiator;
  struct Block {
    uint64_t block, sequence, given;
    const char* state;
  };
  std::vector<Block> blocks;
};
// Reads `body` (which must outlive *out) for `model`. InvalidArgument if it
// is malformed or names blocks `model` does not have.
Status ParseReplicaPush(Model& model, const std::string& body, ReplicaRecord* out);
// Sets `block`'s weights and rule state from a record's `state`.
// REQUIRES: the block's write lock.
void RestoreBlockLocked(Model& model, uint64_t block, const char* state);

// A SNAPSHOT_BEGIN body: the job's counts at a snapshot's instant, in the
// words of a checkpoint's sections (wire/include/blkps/replication.h).
struct ReplicaCounts {
  std::vector<uint64_t> luns, clocks, receipts;
  std::string Body() const;
  // InvalidArgument if `body` is malformed.
  static Status Parse(const std::string& body, ReplicaCounts* out);
};

// Each block's state number: the primary counts a block's states as pushes
// change it; a backup holds the number of the state it has. Each entry is
// guarded by its block's lock (Model::LockBlock), which clang cannot check.
class BlockSequences {
 public:
  explicit BlockSequences(uint64_t blocks) : sequence_(blocks, 0) {}
  // Primary: the number of block's next state. REQUIRES: its write lock.
  uint64_t NextLocked(uint64_t block) { return ++sequence_[block]; }
  // Backup: whether a state numbered `sequence` is newer than the one held;
  // if so it is held from now. REQUIRES: the block's write lock.
  bool TakeIfNewerLocked(uint64_t block, uint64_t sequence) {
    if (sequence <= sequence_[block]) return false;
    sequence_[block] = sequence;
    return true;
  }
  // Backup: the same for a SNAPSHOT record's state, which is taken unless
  // the one held is newer (a state numbered 0 is the block's first).
  bool TakeUnlessNewerLocked(uint64_t block, uint64_t sequence) {
    if (sequence < sequence_[block]) return false;
    sequence_[block] = sequence;
    return true;
  }
  // Backup: forgets `block`'s number (a catch-up begins).
  void ForgetLocked(uint64_t block) { sequence_[block] = 0; }
  // Primary: every block's number. REQUIRES: every block's lock.
  std::vector<uint64_t> CopyLocked() const { return sequence_; }

 private:
  std::vector<uint64_t> sequence_;
};

}  // namespace blkps::server
