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
 *                             resume=1), NUL-padded; a bad line fails the
 *                             write (ILLEGAL REQUEST). READ returns zeros.
 *   [1 MiB - 4 KiB, 1 MiB)    counters: a fixed binary record
 *                             (struct blkps_control_counters, little-endian,
 *                             then zeros), taken fresh on every read. For
 *                             programs that poll a number (the learner
 *                             engine's staleness) without parsing JSON.
 *                             Writes are refused (DATA PROTECT).
 *   [1 MiB, 1 MiB + device)   the weights, as the learner LUNs' bytes:
 *                             READ them, WRITE to set them (rule state kept).
 *
 * Users: the server (target-plugin/lu.cc serves the regions and fills the
 * record; aggregator/job_status.cc writes the status keys), libblkps (the
 * engine reads the counters; blkps_control_layout_get() hands all of this to
 * the Python package, learner/python/blkps/control.py), the tests, and
 * README's "Status and control" section.
 *
 * Changing it: a new status key goes into BLKPS_STATUS_KEYS (a unit test
 * compares them with what the server writes); a new counter goes at the end
 * of the record with record_bytes growing; anything that moves a region or a
 * field bumps BLKPS_CONTROL_FORMAT_VERSION.
 */
#ifndef BLKPS_CONTROL_LUN_H
#define BLKPS_CONTROL_LUN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this layout, also in the counters record. */
#define BLKPS_CONTROL_FORMAT_VERSION 1u

#define BLKPS_CONTROL_STATUS_OFFSET UINT64_C(0)
#define BLKPS_CONTROL_STATUS_BYTES (UINT64_C(64) << 10)
#define BLKPS_CONTROL_COMMANDS_OFFSET (UINT64_C(64) << 10)
#define BLKPS_CONTROL_COMMANDS_BYTES \
  (BLKPS_CONTROL_COUNTERS_OFFSET - BLKPS_CONTROL_COMMANDS_OFFSET)
#define BLKPS_CONTROL_COUNTERS_OFFSET ((UINT64_C(1) << 20) - (UINT64_C(4) << 10))
#define BLKPS_CONTROL_COUNTERS_BYTES (UINT64_C(4) << 10)
#define BLKPS_CONTROL_WEIGHTS_OFFSET (UINT64_C(1) << 20)

/* The status object's keys, space-separated, in the order the server writes
 * them: the top level, the "checkpoint" object, and each entry of the
 * "learners" array. Their meanings are in README, "Status and control". */
#define BLKPS_STATUS_KEYS                                                    \
  "model params device_bytes block_bytes blocks mode rule rule_params "      \
  "global_step updates rejected_writes held_now uptime_s dead_after_s "      \
  "hold_limit_s max_dead live_learners failed failure control_error checkpoint learners"
#define BLKPS_STATUS_CHECKPOINT_KEYS "path written last_seconds every_s error"
#define BLKPS_STATUS_LEARNER_KEYS                                            \
  "lun state iteration idle_s held reads writes bytes_read bytes_written "   \
  "holds hold_timeouts deaths staleness_max staleness_mean"

/* The first 8 bytes of the counters record. */
#define BLKPS_CONTROL_COUNTERS_MAGIC "blkpsctr"

/* The counters record at BLKPS_CONTROL_COUNTERS_OFFSET: little-endian
 * fields, no padding (64 bytes in format 1). The numbers are the status
 * keys of the same names. */
typedef struct blkps_control_counters {
  char magic[8];           /* BLKPS_CONTROL_COUNTERS_MAGIC, no NUL */
  uint32_t format_version; /* BLKPS_CONTROL_FORMAT_VERSION */
  uint32_t record_bytes;   /* sizeof(blkps_control_counters) the server wrote */
  uint64_t params;
  uint64_t blocks;
  uint64_t global_step;
  uint64_t updates;         /* model-block updates applied, all learners */
  uint64_t rejected_writes;
  uint64_t failed;          /* 1 while the job has failed, else 0 */
} blkps_control_counters;

#ifdef __cplusplus
}  // extern "C"
static_assert(sizeof(blkps_control_counters) == 64, "the record is 64 bytes in format 1");
#endif

#endif /* BLKPS_CONTROL_LUN_H */
