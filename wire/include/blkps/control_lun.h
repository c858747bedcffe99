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
 *                             access=learners) only fence=, tag=,
 *                             rank= (blkps.torch's heartbeat) and
 *                             pipeline= are taken,
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
 *   [W, W + n * 16 * 8 MiB)   row windows (a table's rows in batches; doc/
 *                             embeddings.md "A batch in one command"): for
 *                             learner LUN k, BLKPS_CONTROL_WINDOWS_PER_LUN
 *                             windows of BLKPS_CONTROL_WINDOW_BYTES, window w
 *                             at blkps_control_window_offset(device, n, k, w),
 *                             W = blkps_control_windows_offset(). Each is one
 *                             batch at a time of the initiator that uses it;
 *                             the rows it moves are LUN k's (its learner
 *                             slot). Layout and rules below, "Row windows".
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
 * and fills the record, row_window_server.cc the row windows;
 * aggregator/job_status.cc writes the status keys), libblkps (the
 * engine reads the counters; iscsi_row_windows.cc sends pull_rows and
 * push_rows through the windows; blkps_control_layout_get() hands all of this to
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
#define BLKPS_CONTROL_FORMAT_VERSION 3u /* 3: row windows before the exchange */

#define BLKPS_CONTROL_STATUS_OFFSET UINT64_C(0)
#define BLKPS_CONTROL_STATUS_BYTES (UINT64_C(64) << 10)
#define BLKPS_CONTROL_COMMANDS_OFFSET (UINT64_C(64) << 10)
#define BLKPS_CONTROL_COMMANDS_BYTES (BLKPS_CONTROL_COUNTERS_OFFSET - BLKPS_CONTROL_COMMANDS_OFFSET)

/* A libblkps session's initiator alias (sent at login): this prefix, then
 * 16 lower-case hex digits, a token it chose for that session. A learner
 * that reconnects names the ended session's token in its fence,
 * fence=<lun>:<token>: the server refuses that session's writes from then
 * on (a write of it that tgtd read only after the fence is never applied
 * behind the receipt the learner resends by). */
#define BLKPS_SESSION_ALIAS_PREFIX "blkps-session-"
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

/* Row windows: how many per learner LUN (batches in flight per learner) and
 * the bytes of each (the largest batch one window carries). */
#define BLKPS_CONTROL_WINDOWS_PER_LUN 16u
#define BLKPS_CONTROL_WINDOW_BYTES (UINT64_C(8) << 20)

/* Where the row windows start on control LUN number `control_lun`: after a
 * receipt for every LUN before it. */
static inline uint64_t blkps_control_windows_offset(uint64_t device_bytes, uint64_t control_lun) {
  return blkps_control_receipts_offset(device_bytes) + control_lun * blkps_control_receipt_bytes(device_bytes);
}

/* Where window `window` (< BLKPS_CONTROL_WINDOWS_PER_LUN) of learner LUN
 * `lun` (< control_lun) starts. */
static inline uint64_t blkps_control_window_offset(uint64_t device_bytes, uint64_t control_lun, uint64_t lun,
                                                   uint64_t window) {
  return blkps_control_windows_offset(device_bytes, control_lun) +
         (lun * BLKPS_CONTROL_WINDOWS_PER_LUN + window) * BLKPS_CONTROL_WINDOW_BYTES;
}

/* Where the exchange region starts on control LUN number `control_lun`
 * (the windows of every LUN before it), and that LUN's size in bytes. */
static inline uint64_t blkps_control_exchange_offset(uint64_t device_bytes, uint64_t control_lun) {
  return blkps_control_window_offset(device_bytes, control_lun, control_lun, 0);
}
static inline uint64_t blkps_control_lun_bytes(uint64_t device_bytes, uint64_t control_lun) {
  return blkps_control_exchange_offset(device_bytes, control_lun) + BLKPS_CONTROL_EXCHANGE_BYTES;
}

/* The status object's keys, space-separated, in the order the server writes
 * them: the top level, the "checkpoint" object, and each entry of the
 * "learners" and "ranks" arrays. Their meanings are in doc/server.md, "Status and control". */
#define BLKPS_STATUS_KEYS                                                                   \
  "model params device_bytes block_bytes blocks table mode parts rule tag rule_params "     \
  "global_step updates rejected_writes held_now uptime_s dead_after_s "                     \
  "hold_limit_s max_dead staleness_aware stale_bound live_learners pushing_learners "       \
  "failed failure control_error control_refused stop replica replica_records backup lease " \
  "checkpoint "                                                                             \
  "learners ranks"
#define BLKPS_STATUS_CHECKPOINT_KEYS \
  "path job shard shards generation written last_seconds last_stall_seconds every_s error waiting_round"
/* "table" is null for a dense model; for a table, an object of these
 * (hashed: whether ids are any 64-bit value, table=hash:CAPACITY:WIDTH;
 * memory_bytes: the table's bytes by the server's accounting, a hashed
 * table's slot array and rows made, a dense table's every row). */
#define BLKPS_STATUS_TABLE_KEYS "rows width row_bytes rows_made hashed row_limit evict evictions memory_bytes"
/* Each entry of the "ranks" array: a collective rank's last heartbeat
 * (control command rank=<rank>:<run>, blkps.torch; doc/pytorch.md). */
#define BLKPS_STATUS_RANK_KEYS "rank run state idle_s"
#define BLKPS_STATUS_LEARNER_KEYS                                                                                  \
  "lun dtype state iteration idle_s held reads writes bytes_read bytes_written "                                   \
  "holds hold_timeouts deaths staleness_last staleness_max staleness_mean push_staleness_max push_staleness_mean " \
  "stale_pushes pipeline_depth"

/* The first 8 bytes of the counters record. */
#define BLKPS_CONTROL_COUNTERS_MAGIC "blkpsctr"

/* The counters record at BLKPS_CONTROL_COUNTERS_OFFSET: little-endian
 * fields, no padding (64 bytes in format 1, 72 with stop, 88 with
 * table_width and pushing_learners, 96 with table_hashed). The numbers are the status keys of the same names. */
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
  /* 1 for a hashed table (status "table"."hashed"): its ids are any 64-bit
   * value, not bounded by the learner LUN's size, and its rows are reached
   * through the row windows only; else 0. */
  uint64_t table_hashed;
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

/*
 * Row windows. A batch of a table's rows (doc/embeddings.md) in one command
 * each way, through plain WRITE and READ of a window, from any language:
 *
 *   window + 0                a request header (struct
 *                             blkps_row_window_request, then zeros to
 *                             BLKPS_ROW_WINDOW_HEADER_BYTES)
 *   window + 4 KiB            the batch's ids: `count` little-endian uint64
 *                             (a table's row numbers, or a hashed
 *                             table's feature ids: any 64-bit value)
 *   window + blkps_row_window_rows_offset(count)
 *                             a push's rows: `count` rows of `width`
 *                             little-endian float32, row k for ids[k]
 *
 * A request is one WRITE command: an initiator that splits large writes
 * (the kernel's max_sectors_kb, a FUSE mount's 256 KiB pieces, iSER's 512
 * KiB per command) must keep a request within that, or the piece that does
 * not start at the window is refused. READs may come in any pieces.
 *
 * A pull is one WRITE of the header and ids (from the window's first byte),
 * then one READ: the window reads as its state (struct
 * blkps_row_window_state at window + 0, zeros to 4 KiB), then from window +
 * 4 KiB the rows of the last pull, row k for ids[k], taken at the READ (zeros
 * past them). A push is one WRITE of header, ids and rows. Either WRITE is
 * checked whole first and refused whole (ILLEGAL REQUEST, nothing applied,
 * the window's state unchanged): an id past the table's end (LBA OUT OF
 * RANGE), a width other than the table's, a non-finite value in a push's
 * rows, a header of another magic, version or op, a write that does not
 * start at the window or does not hold the ids and rows its count says
 * (INVALID FIELD IN PARAMETER LIST). A dense model refuses windows the same
 * way. A push applies its rows with the table's rule, one by one in the
 * order given (a repeated id is applied once per time it is given: libblkps
 * sums them first); an all-zero row is no gradient, as everywhere in a table.
 *
 * A hashed table (--bsopts table=hash:CAPACITY:WIDTH; counters
 * table_hashed = 1) is reached through the windows only: its ids are any
 * 64-bit value (no id is past its end), its learner LUN is one row long
 * (rounded up to a sector) and refuses plain READ and WRITE (ILLEGAL
 * REQUEST, INVALID COMMAND OPERATION CODE). A push that needs rows the
 * table cannot make (it is full and its evict= rule frees too few, or it
 * has none) is refused whole (ILLEGAL REQUEST, INSUFFICIENT RESOURCES,
 * asc/ascq 0x5503; nothing applied, the window's state unchanged).
 *
 * Receipts per batch: exactly-once pushes. Each window keeps, per initiator
 * (as the receipts region does), the `sequence` and `tag` of the last push
 * applied. A push whose sequence is above it is applied; one with the same
 * sequence and tag is a resend of a batch already applied: GOOD, applied
 * nothing; any other is refused (ILLEGAL REQUEST: read the window's state
 * and go on from push_sequence + 1). So a learner numbers its batches per
 * window, one in flight per window, a new random tag per batch, and after a
 * lost connection resends what it has not seen acknowledged, as it was. A
 * push and the window's counters are one step for checkpoints; after a
 * restart from one, the state is the checkpoint's. rows_applied counts the
 * rows of this initiator's pushes applied through the window (mod 2^64):
 * pushed_bytes_lost of a learner is, over its windows, rows it saw
 * acknowledged minus rows_applied after a reconnect, times the row's bytes.
 * Pulls are in the server's memory only (a restart forgets the last one:
 * its READ then shows another pull_sequence; pull again).
 */
#define BLKPS_ROW_WINDOW_REQUEST_MAGIC "blkpsrow"
#define BLKPS_ROW_WINDOW_STATE_MAGIC "blkpswst"
#define BLKPS_ROW_WINDOW_HEADER_BYTES (UINT64_C(4) << 10)
#define BLKPS_ROW_WINDOW_PULL 1u
#define BLKPS_ROW_WINDOW_PUSH 2u

typedef struct blkps_row_window_request {
  char magic[8];           /* BLKPS_ROW_WINDOW_REQUEST_MAGIC, no NUL */
  uint32_t format_version; /* BLKPS_CONTROL_FORMAT_VERSION */
  uint32_t op;             /* BLKPS_ROW_WINDOW_PULL or BLKPS_ROW_WINDOW_PUSH */
  uint64_t sequence;       /* a push: > 0, see "Receipts per batch" */
  uint64_t tag;            /* a push: any value, the same when resent */
  uint64_t count;          /* ids in the batch, >= 1 */
  uint64_t width;          /* values per row: the table's */
} blkps_row_window_request;

typedef struct blkps_row_window_state {
  char magic[8];           /* BLKPS_ROW_WINDOW_STATE_MAGIC, no NUL */
  uint32_t format_version; /* BLKPS_CONTROL_FORMAT_VERSION */
  uint32_t record_bytes;   /* sizeof(blkps_row_window_state) */
  uint64_t lun;            /* the learner LUN and window it is for */
  uint64_t window;
  uint64_t push_sequence; /* the last push applied (0: none), its tag */
  uint64_t push_tag;
  uint64_t pushes_applied; /* batches applied, and their rows (mod 2^64) */
  uint64_t rows_applied;
  uint64_t pull_sequence; /* the last pull's header: its rows follow */
  uint64_t pull_tag;
  uint64_t pull_count;
  uint64_t pull_width;
} blkps_row_window_state;

/* Where a request's rows start in its window: after the header and the
 * ids, at a 512-byte boundary. */
static inline uint64_t blkps_row_window_rows_offset(uint64_t count) {
  return BLKPS_ROW_WINDOW_HEADER_BYTES + (count * 8 + 511) / 512 * 512;
}

/* The bytes a request's WRITE carries (a multiple of 512): a pull's header
 * and ids, a push's rows too. */
static inline uint64_t blkps_row_window_request_bytes(uint32_t op, uint64_t count, uint64_t width) {
  const uint64_t rows = op == BLKPS_ROW_WINDOW_PUSH ? count * width * 4 : 0;
  return blkps_row_window_rows_offset(count) + (rows + 511) / 512 * 512;
}

/* The most rows of `width` values one window carries: a push's WRITE and a
 * pull's READ both fit BLKPS_CONTROL_WINDOW_BYTES. */
static inline uint64_t blkps_row_window_capacity(uint64_t width) {
  const uint64_t room = BLKPS_CONTROL_WINDOW_BYTES - BLKPS_ROW_WINDOW_HEADER_BYTES - 512;
  return width == 0 ? 0 : room / (8 + width * 4);
}

/* Encodes a request header (its numbers; magic and format_version are set
 * here) into the sizeof(blkps_row_window_request) bytes at `out`. */
static inline void blkps_row_window_request_encode(blkps_row_window_request r, void *out) {
  memcpy(r.magic, BLKPS_ROW_WINDOW_REQUEST_MAGIC, sizeof r.magic);
  r.format_version = BLKPS_CONTROL_FORMAT_VERSION;
  memcpy(out, &r, sizeof r);
}

/* Decodes a request header from the `n` bytes written at a window's start.
 * Returns 0, or -1 (*out untouched) for a short write, another magic or
 * version, or an op that is neither pull nor push. */
static inline int blkps_row_window_request_decode(const void *bytes, uint64_t n, blkps_row_window_request *out) {
  blkps_row_window_request r;
  if (n < sizeof r) return -1;
  memcpy(&r, bytes, sizeof r);
  if (memcmp(r.magic, BLKPS_ROW_WINDOW_REQUEST_MAGIC, sizeof r.magic) != 0 ||
      r.format_version != BLKPS_CONTROL_FORMAT_VERSION ||
      (r.op != BLKPS_ROW_WINDOW_PULL && r.op != BLKPS_ROW_WINDOW_PUSH)) {
    return -1;
  }
  *out = r;
  return 0;
}

/* Encodes a window's state (its numbers; magic, format_version and
 * record_bytes are set here) into the sizeof(blkps_row_window_state) bytes
 * at `out`. */
static inline void blkps_row_window_state_encode(blkps_row_window_state r, void *out) {
  memcpy(r.magic, BLKPS_ROW_WINDOW_STATE_MAGIC, sizeof r.magic);
  r.format_version = BLKPS_CONTROL_FORMAT_VERSION;
  r.record_bytes = sizeof r;
  memcpy(out, &r, sizeof r);
}

/* Decodes the state of window `window` of LUN `lun` from the `n` bytes read
 * at its start. Returns 0, or -1 (*out untouched) when they hold none. */
static inline int blkps_row_window_state_decode(const void *bytes, uint64_t n, uint64_t lun, uint64_t window,
                                                blkps_row_window_state *out) {
  blkps_row_window_state r;
  if (n < sizeof r) return -1;
  memcpy(&r, bytes, sizeof r);
  if (memcmp(r.magic, BLKPS_ROW_WINDOW_STATE_MAGIC, sizeof r.magic) != 0 ||
      r.format_version != BLKPS_CONTROL_FORMAT_VERSION || r.record_bytes < sizeof r || r.lun != lun ||
      r.window != window) {
    return -1;
  }
  *out = r;
  return 0;
}

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
static_assert(sizeof(blkps_control_counters) == 96, "the record is 96 bytes since table_hashed");
static_assert(sizeof(blkps_control_receipt) == 40, "the receipt header is 40 bytes in format 2");
static_assert(sizeof(blkps_row_window_request) == 48, "the window request header is 48 bytes in format 3");
static_assert(sizeof(blkps_row_window_state) == 96, "the window state is 96 bytes in format 3");
#endif

#endif /* BLKPS_CONTROL_LUN_H */
