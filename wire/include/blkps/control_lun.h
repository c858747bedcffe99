/*
 * control_lun.h: the control LUN's contract, the one place that states it.
 *
 * Every blkps model has a control LUN (`--bsopts role=control`, LUN N+1 of a
 * `blkps target`). It is plain bytes, so any language can look at and steer
 * the job with pread/pwrite. Its regions:
 *
 *   [0, 64 KiB)               status: one JSON object (keys below),
 *                             NUL-padded. A read starting at byte 0 takes a
 *                             fresh snapshot; reads of the rest of the region
 *                             return that snapshot. Writes are refused
 *                             (DATA PROTECT).
 *   [64 KiB, 1 MiB - 4 KiB)   commands: WRITE `key=value` lines (lr=0.01,
 *                             resume=1), NUL-padded; one write is checked
 *                             whole and applied whole: a bad line fails it
 *                             (ILLEGAL REQUEST) and nothing of it is done.
 *                             On the learners' control LUN (--bsopts
 *                             access=learners) only fence=, tag= and
 *                             rank= (blkps.torch's heartbeat) are taken,
 *                             and weights are refused (DATA PROTECT).
 *                             READ returns zeros.
 *   [1 MiB - 4 KiB, 1 MiB)    counters: a fixed binary record
 *                             (struct blkps_control_counters, little-endian,
 *                             then zeros), taken fresh on every read. For
 *                             programs that poll a number (the learner
 *                             engine's staleness) without parsing JSON.
 *                             Writes are refused (DATA PROTECT).
 *   [1 MiB, 1 MiB + device)   the weights, as the learner LUNs' bytes:
 *                             READ them, WRITE to set them (rule state kept).
 *   [R, R + n * S)            receipts (exactly-once pushes, doc/libblkps.md
 *                             "Faults"): for learner LUN k, at R + k * S,
 *                             the receipt of the initiator that reads it:
 *                             a header (struct blkps_control_receipt), then
 *                             at R + k * S + 4 KiB one little-endian uint32
 *                             per 512-byte unit u of the device: how many
 *                             writes of this initiator to LUN k that start
 *                             at byte 512 * u the server has applied (mod
 *                             2^32). R = blkps_control_receipts_offset(),
 *                             S = blkps_control_receipt_bytes(), n = the
 *                             control LUN's own number (learner LUNs come
 *                             before it). Read-only. After a restart from a
 *                             checkpoint they are the checkpoint's.
 *   [Z - E, Z)                exchange: plain bytes that any initiator may
 *                             READ and WRITE (zeros at start; kept in the
 *                             server's memory only, not in checkpoints).
 *                             Z = the control LUN's size, E =
 *                             BLKPS_CONTROL_EXCHANGE_BYTES. The server gives
 *                             them no meaning; blkps.torch's collectives
 *                             (allreduce, allgather, broadcast) lay out their
 *                             rounds there (learner/python/blkps/collectives.py).
 *
 * The control LUN answers INQUIRY with product BLKPS_CONTROL_PRODUCT_ID, so
 * that a learner finds it among the target's LUNs (REPORT LUNS).
 *
 * Users: the server (target-plugin/control_lun_server.cc serves the regions
 * and fills the record; aggregator/job_status.cc writes the status keys), libblkps (the
 * engine reads the counters; blkps_control_layout_get() hands all of this to
 * the Python package, learner/python/blkps/control.py), the tests, and
 * doc/server.md's "Status and control" section.
 *
 * Changing it: a new status key goes into BLKPS_STATUS_KEYS (a unit test
 * compares them with what the server writes); a new counter goes at the end
 * of the record with record_bytes growing; anything that moves a region or a
 * field bumps BLKPS_CONTROL_FORMAT_VERSION.
 */
#ifndef BLKPS_CONTROL_LUN_H
#define BLKPS_CONTROL_LUN_H

#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this layout, also in the counters record. */
#define BLKPS_CONTROL_FORMAT_VERSION 2u

#define BLKPS_CONTROL_STATUS_OFFSET UINT64_C(0)
#define BLKPS_CONTROL_STATUS_BYTES (UINT64_C(64) << 10)
#define BLKPS_CONTROL_COMMANDS_OFFSET (UINT64_C(64) << 10)
#define BLKPS_CONTROL_COMMANDS_BYTES (BLKPS_CONTROL_COUNTERS_OFFSET - BLKPS_CONTROL_COMMANDS_OFFSET)
#define BLKPS_CONTROL_COUNTERS_OFFSET ((UINT64_C(1) << 20) - (UINT64_C(4) << 10))
#define BLKPS_CONTROL_COUNTERS_BYTES (UINT64_C(4) << 10)
#define BLKPS_CONTROL_WEIGHTS_OFFSET (UINT64_C(1) << 20)

/* INQUIRY's product identification of a control LUN (tgt pads it). */
#define BLKPS_CONTROL_PRODUCT_ID "BLKPS CONTROL"

/* Receipts: one counter per unit of this many device bytes. */
#define BLKPS_CONTROL_RECEIPT_UNIT 512u
#define BLKPS_CONTROL_RECEIPT_HEADER_BYTES (UINT64_C(4) << 10)
#define BLKPS_CONTROL_RECEIPT_MAGIC "blkpsrcp"

/* The exchange region's size, at the end of the control LUN. */
#define BLKPS_CONTROL_EXCHANGE_BYTES (UINT64_C(8) << 20)

/* Where the receipts region starts: after the weights, at a MiB boundary. */
static inline uint64_t blkps_control_receipts_offset(uint64_t device_bytes) {
  const uint64_t mib = UINT64_C(1) << 20;
  return BLKPS_CONTROL_WEIGHTS_OFFSET + (device_bytes + mib - 1) / mib * mib;
}

/* Counters in one LUN's receipt: one per unit of the learner LUN. */
static inline uint64_t blkps_control_receipt_unit_count(uint64_t device_bytes) {
  return (device_bytes + BLKPS_CONTROL_RECEIPT_UNIT - 1) / BLKPS_CONTROL_RECEIPT_UNIT;
}

/* Bytes of one LUN's receipt: the header, then the counters, to 4 KiB. */
static inline uint64_t blkps_control_receipt_bytes(uint64_t device_bytes) {
  const uint64_t units = blkps_control_receipt_unit_count(device_bytes);
  const uint64_t page = UINT64_C(4) << 10;
  return BLKPS_CONTROL_RECEIPT_HEADER_BYTES + (units * 4 + page - 1) / page * page;
}

/* Where the exchange region starts on control LUN number `control_lun`
 * (a receipt for every LUN before it), and that LUN's size in bytes. */
static inline uint64_t blkps_control_exchange_offset(uint64_t device_bytes, uint64_t control_lun) {
  return blkps_control_receipts_offset(device_bytes) + control_lun * blkps_control_receipt_bytes(device_bytes);
}
static inline uint64_t blkps_control_lun_bytes(uint64_t device_bytes, uint64_t control_lun) {
  return blkps_control_exchange_offset(device_bytes, control_lun) + BLKPS_CONTROL_EXCHANGE_BYTES;
}

/* The status object's keys, space-separated, in the order the server writes
 * them: the top level, the "checkpoint" object, and each entry of the
 * "learners" and "ranks" arrays. Their meanings are in doc/server.md, "Status and control". */
#define BLKPS_STATUS_KEYS                                                             \
  "model params device_bytes block_bytes blocks table mode rule tag rule_params "     \
  "global_step updates rejected_writes held_now uptime_s dead_after_s "               \
  "hold_limit_s max_dead staleness_aware stale_bound live_learners pushing_learners " \
  "failed failure control_error control_refused stop checkpoint "                     \
  "learners ranks"
#define BLKPS_STATUS_CHECKPOINT_KEYS \
  "path job shard shards generation written last_seconds last_stall_seconds every_s error waiting_round"
/* "table" is null for a dense model; for a table, an object of these. */
#define BLKPS_STATUS_TABLE_KEYS "rows width row_bytes rows_made"
/* Each entry of the "ranks" array: a collective rank's last heartbeat
 * (control command rank=<rank>:<run>, blkps.torch; doc/pytorch.md). */
#define BLKPS_STATUS_RANK_KEYS "rank run state idle_s"
#define BLKPS_STATUS_LEARNER_KEYS                                                                                  \
  "lun dtype state iteration idle_s held reads writes bytes_read bytes_written "                                   \
  "holds hold_timeouts deaths staleness_last staleness_max staleness_mean push_staleness_max push_staleness_mean " \
  "stale_pushes"

/* The first 8 bytes of the counters record. */
#define BLKPS_CONTROL_COUNTERS_MAGIC "blkpsctr"

/* The counters record at BLKPS_CONTROL_COUNTERS_OFFSET: little-endian
 * fields, no padding (64 bytes in format 1, 72 with stop, 88 with
 * table_width and pushing_learners). The numbers are the status keys of the same names. */
typedef struct blkps_control_counters {
  char magic[8];           /* BLKPS_CONTROL_COUNTERS_MAGIC, no NUL */
  uint32_t format_version; /* BLKPS_CONTROL_FORMAT_VERSION */
  uint32_t record_bytes;   /* sizeof(blkps_control_counters) the server wrote */
  uint64_t params;
  uint64_t blocks;
  uint64_t global_step;
  uint64_t updates; /* model-block updates applied, all learners */
  uint64_t rejected_writes;
  uint64_t failed; /* 1 while the job has failed, else 0 */
  uint64_t stop;   /* 1 once an operator asked the job to stop (stop=1), else 0 */
  /* A table's values per row (status "table"."width"; the only width
   * libblkps's pull_rows and push_rows accept); 0 for a dense model. */
  uint64_t table_width;
  /* The learners taking part in async steps: those that pushed within
   * dead_after (status "pushing_learners"; doc/async.md "One N: the
   * learners that push"). */
  uint64_t pushing_learners;
} blkps_control_counters;

/* A receipt's header, little-endian, then zeros to 4 KiB. */
typedef struct blkps_control_receipt {
  char magic[8];               /* BLKPS_CONTROL_RECEIPT_MAGIC, no NUL */
  uint32_t format_version;     /* BLKPS_CONTROL_FORMAT_VERSION */
  uint32_t record_bytes;       /* sizeof(blkps_control_receipt) */
  uint64_t lun;                /* the learner LUN it is for */
  uint64_t writes_applied;     /* all of this initiator's applied writes */
  uint64_t writes_in_progress; /* admitted and not yet finished or failed:
                                  0 means the counters are final for now */
} blkps_control_receipt;

/* The codec: the one writer of these records, the server
 * (target-plugin/control_lun_server.cc), and their one reader, libblkps
 * (Model's ReadControlCounters and ReadControlReceipt, the iSCSI device's
 * resend after a reconnect) and, through libblkps, Python. */

/* Encodes the counters record `r` (its numbers; magic, format_version and
 * record_bytes are set here) into the sizeof(blkps_control_counters) bytes
 * at `out`, the start of the counters region (which is zeros after it). */
static inline void blkps_control_counters_encode(blkps_control_counters r, void *out) {
  memcpy(r.magic, BLKPS_CONTROL_COUNTERS_MAGIC, sizeof r.magic);
  r.format_version = BLKPS_CONTROL_FORMAT_VERSION;
  r.record_bytes = sizeof r;
  memcpy(out, &r, sizeof r);
}

/* Encodes a receipt's header `r` (lun and the writes; magic, format_version
 * and record_bytes are set here) into the sizeof(blkps_control_receipt)
 * bytes at `out`, the start of that LUN's receipt (zeros after it up to
 * BLKPS_CONTROL_RECEIPT_HEADER_BYTES, then the counters). */
static inline void blkps_control_receipt_encode(blkps_control_receipt r, void *out) {
  memcpy(r.magic, BLKPS_CONTROL_RECEIPT_MAGIC, sizeof r.magic);
  r.format_version = BLKPS_CONTROL_FORMAT_VERSION;
  r.record_bytes = sizeof r;
  memcpy(out, &r, sizeof r);
}

/* Where LUN `lun`'s receipt starts on the control LUN of a model whose
 * learner LUNs are `device_bytes` long. */
static inline uint64_t blkps_control_receipt_offset(uint64_t device_bytes, uint64_t lun) {
  return blkps_control_receipts_offset(device_bytes) + lun * blkps_control_receipt_bytes(device_bytes);
}

/* Decodes the counters record from the `n` bytes read at
 * BLKPS_CONTROL_COUNTERS_OFFSET into *out. Returns 0, or -1 (*out
 * untouched) when they hold no record of this format: a short read, another
 * magic or version, or a record shorter than this format's. A later format
 * may append fields (record_bytes grows); this one's stay where they are. */
static inline int blkps_control_counters_decode(const void *bytes, uint64_t n, blkps_control_counters *out) {
  blkps_control_counters r;
  if (n < sizeof r) return -1;
  memcpy(&r, bytes, sizeof r);
  if (memcmp(r.magic, BLKPS_CONTROL_COUNTERS_MAGIC, sizeof r.magic) != 0 ||
      r.format_version != BLKPS_CONTROL_FORMAT_VERSION || r.record_bytes < sizeof r) {
    return -1;
  }
  *out = r;
  return 0;
}

/* Decodes the header of LUN `lun`'s receipt from the `n` bytes read at
 * blkps_control_receipt_offset() into *out. Returns 0, or -1 (*out
 * untouched) when they hold no receipt of this format for that LUN. The
 * counters follow at BLKPS_CONTROL_RECEIPT_HEADER_BYTES: little-endian
 * uint32, blkps_control_receipt_unit_count() of them. */
static inline int blkps_control_receipt_decode(const void *bytes, uint64_t n, uint64_t lun,
                                               blkps_control_receipt *out) {
  blkps_control_receipt r;
  if (n < sizeof r) return -1;
  memcpy(&r, bytes, sizeof r);
  if (memcmp(r.magic, BLKPS_CONTROL_RECEIPT_MAGIC, sizeof r.magic) != 0 ||
      r.format_version != BLKPS_CONTROL_FORMAT_VERSION || r.record_bytes < sizeof r || r.lun != lun) {
    return -1;
  }
  *out = r;
  return 0;
}

#ifdef __cplusplus
}  // extern "C"
static_assert(sizeof(blkps_control_counters) == 88, "the record is 88 bytes since pushing_learners");
static_assert(sizeof(blkps_control_receipt) == 40, "the receipt header is 40 bytes in format 2");
#endif

#endif /* BLKPS_CONTROL_LUN_H */
