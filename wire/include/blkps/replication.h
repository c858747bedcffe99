/*
 * replication.h: what a shard's primary and its backup say to each other
 * (doc/replicas.md), the one place that states it. Both ends are the server
 * (the primary's plugin connects to the backup's `backup=HOST:PORT`); it is
 * here, beside the control LUN's contract, so that a reader in another
 * language finds the bytes in one file.
 *
 * One TCP connection, primary to backup. Every message is a frame: a
 * struct blkps_replica_frame (32 bytes, little-endian), then `bytes` bytes
 * of body. The primary sends HELLO once, then PUSH records; the backup
 * answers each with ACK (same sequence) once it has applied it, or with
 * REFUSE (body: a one-line reason) and closes the connection; PARAMS
 * records come between them whenever the rule's parameters change, and
 * LIVENESS records whenever a learner dies or returns. ACKs are
 * cumulative: an ACK of sequence S says that every record up to S is
 * applied, and a record followed closely by another may get none of its
 * own. A backup
 * that returns to a primary that went on without it (doc/replicas.md
 * "A backup that returns") gets, after HELLO, one SNAPSHOT_BEGIN, then
 * PUSH records and SNAPSHOT records interleaved; each is acknowledged as
 * a PUSH is.
 *
 * HELLO body: four u64, the primary's geometry: parameters, block bytes,
 * per-parameter arrays (weights, then the rule's state arrays), bytes of the
 * rule's name that follow; then the rule's name. A backup that serves
 * anything else refuses.
 *
 * A block's parts: its first BLKPS_REPLICA_PART_PARAMS parameters are its
 * part 0, the next its part 1, and so on (the last may be shorter); a
 * record carries the parts a push touched, each whole, with the part's
 * state number (counted under the block's lock).
 *
 * PUSH body (one learner WRITE applied on the primary):
 *   struct blkps_replica_push
 *   the initiator's name (initiator_bytes, no NUL)
 *   `parts` times: struct blkps_replica_part, then the part's share of
 *   each per-parameter array in HELLO's order (weights first, then the
 *   rule's state, then bsp's accumulator), each params * 4 bytes.
 *   `blocks` times: struct blkps_replica_block_clocks, then its words: the
 *   clocks of a block the push gave to, as they were right after it (the
 *   block's round, contributors and version, then each learner slot's
 *   clock and partial on it, in slot order: a checkpoint's "clocks" words
 *   for one block, doc/server.md "Checkpoints").
 * The backup counts the write on the initiator's receipt of LUN `lun` at
 * `receipt_unit`, and takes a part's state, or a block's clocks, only if
 * its `sequence` is above the one it holds: records of concurrent pushes
 * may arrive in either order, and the newest state of a part or of a
 * block's clocks includes every push applied to it before.
 *
 * SNAPSHOT_BEGIN body: the primary's counts at the snapshot's instant,
 * u64 words: the number of learner LUNs, then each LUN in the primary's
 * learner-slot order; the number of clock words, then the clocks; the
 * number of receipt words, then the receipts (the words of a checkpoint's
 * "luns", "clocks" and "receipts" sections: doc/server.md "Checkpoints").
 * The backup replaces its clocks and receipts with these (its learner LUNs
 * must be the same, in the same order) and forgets every part's and every
 * block's clocks' state number: the PUSH records that follow are newer.
 *
 * SNAPSHOT body: a PUSH body (lun, receipt_unit, initiator_bytes and
 * blocks 0) holding parts' states as they were at the
 * snapshot's instant, numbered as they were then. The backup takes a
 * part's state unless the one it holds is newer (a PUSH made after the
 * instant): snapshot and stream may reach a part in either order. It
 * counts no receipt and no clock. Weights an operator writes through the
 * primary's control LUN go as a SNAPSHOT record too, at any time: the
 * parts they set, as they are after it, with their new numbers.
 *
 * PARAMS body: every parameter of the rule, as control lines `key=value\n`
 * (lr, momentum, beta1, beta2, eps: doc/server.md "Status and control"),
 * the values the primary holds. Sent when an operator sets one (the
 * control write completes once the backup has it) and after a catch-up's
 * SNAPSHOT_BEGIN; acknowledged as a PUSH is. The backup sets them.
 *
 * LIVENESS body: u64 words, the number of learner LUNs the primary holds
 * dead (declared dead after dead_after without I/O, or whose LUN went
 * away), then those LUNs. Sent by the primary's ticker when that set
 * changed (a death, a learner back); acknowledged as a PUSH is (a
 * catch-up's SNAPSHOT_BEGIN carries liveness in its clocks' words). The backup marks those learners dead and
 * lets every other one back (as a learner's return does): once promoted
 * it waits for no learner its primary had given up, and finishes the bsp
 * rounds that their deaths completed.
 */
#ifndef BLKPS_REPLICATION_H
#define BLKPS_REPLICATION_H

#include <stdint.h>

#define BLKPS_REPLICA_MAGIC "blkpsrep" /* 8 bytes, no NUL */
#define BLKPS_REPLICA_VERSION 4        /* 3: PARAMS; 4: LIVENESS */
/* A block's part: this many parameters (64 KiB of weights). */
#define BLKPS_REPLICA_PART_PARAMS 16384u

enum blkps_replica_kind {
  BLKPS_REPLICA_HELLO = 1,
  BLKPS_REPLICA_PUSH = 2,
  BLKPS_REPLICA_ACK = 3,
  BLKPS_REPLICA_REFUSE = 4,
  BLKPS_REPLICA_SNAPSHOT_BEGIN = 5,
  BLKPS_REPLICA_SNAPSHOT = 6,
  BLKPS_REPLICA_PARAMS = 7,
  BLKPS_REPLICA_LIVENESS = 8,
};

struct blkps_replica_frame {
  char magic[8];     /* BLKPS_REPLICA_MAGIC */
  uint32_t version;  /* BLKPS_REPLICA_VERSION */
  uint32_t kind;     /* enum blkps_replica_kind */
  uint64_t sequence; /* PUSH, SNAPSHOT_BEGIN, SNAPSHOT: 1, 2, ... per connection; ACK: theirs; else 0 */
  uint64_t bytes;    /* body bytes that follow */
};

struct blkps_replica_push {
  uint64_t lun;             /* the learner LUN written */
  uint64_t receipt_unit;    /* where the write started, in receipt units */
  uint64_t initiator_bytes; /* the initiator's name that follows */
  uint64_t parts;           /* part states that follow it */
  uint64_t blocks;          /* block clocks that follow the parts */
};

struct blkps_replica_part {
  uint64_t first;    /* the part's first parameter (in the model) */
  uint64_t sequence; /* the part's state number on the primary, from 1 */
  uint64_t params;   /* parameters in the part */
};

struct blkps_replica_block_clocks {
  uint64_t block;    /* the model block */
  uint64_t sequence; /* the state number of the block's clocks on the primary, from 1 */
  uint64_t words;    /* u64 words that follow: 3 + 2 per learner slot */
};

#ifdef __cplusplus
static_assert(sizeof(struct blkps_replica_frame) == 32, "frame layout");
static_assert(sizeof(struct blkps_replica_push) == 40, "push layout");
static_assert(sizeof(struct blkps_replica_part) == 24, "part layout");
static_assert(sizeof(struct blkps_replica_block_clocks) == 24, "block clocks layout");
#endif

#endif /* BLKPS_REPLICATION_H */
