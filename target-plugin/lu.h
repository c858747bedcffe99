/*
 * The bridge between bs_blkps.c (C: tgt's headers do not compile as C++) and
 * the C++ core in lu.cc (lu_core.h names its parts). One struct blkps_lu per
 * tgt logical unit.
 *
 * A blkps LUN is one of two kinds, both windows onto one model (a Job, in
 * aggregator/job.h) named by tgt's --backing-store:
 *   - a learner slot: READ returns weights, WRITE is a gradient; one LUN
 *     per learner, which is how the server tells learners apart;
 *   - the control LUN (--bsopts role=control): status, commands, counters
 *     and the weights, laid out as wire/include/blkps/control_lun.h says
 *     (control_lun_server.cc serves it; doc/server.md documents it).
 *
 * Threading: create/open/close/destroy, admit and take_released run on
 * tgtd's main thread. read/write/sync run on tgt's worker threads,
 * concurrently with each other and with the main thread.
 *
 * Errors: functions that can fail write a one-line message (no newline) into
 * err[0..errlen) for the shim to log.
 *
 * Receipts are kept per initiator: blkps_lu_admit takes tgt's description
 * of the command's I_T nexus (it_nexus->info, "Initiator: <name> alias:
 * ...") while the session surely exists, and the core remembers the name for
 * that command until it runs (read/write take the same `cmd`) or fails.
 */
#ifndef BLKPS_TARGET_PLUGIN_LU_H
#define BLKPS_TARGET_PLUGIN_LU_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct blkps_lu;

/* What an I/O came to; the shim turns each into SCSI status and sense. */
enum blkps_io_result {
  BLKPS_IO_OK = 0,
  BLKPS_IO_OUT_OF_RANGE,      /* ILLEGAL REQUEST, LBA OUT OF RANGE */
  BLKPS_IO_BAD_DATA,          /* ILLEGAL REQUEST, INVALID FIELD IN PARAMETER LIST */
  BLKPS_IO_NOT_READY,         /* NOT READY, MEDIUM NOT PRESENT: no model open */
  BLKPS_IO_HOLD_TIMEOUT,      /* ABORTED COMMAND, INSUFFICIENT TIME FOR OPERATION */
  BLKPS_IO_JOB_FAILED,        /* NOT READY, MANUAL INTERVENTION REQUIRED */
  BLKPS_IO_WRITE_PROTECT,     /* DATA PROTECT, WRITE PROTECTED: the control
                                 LUN's status and counters regions, and
                                 operator commands and weights on the
                                 learners' one (access=learners) */
  BLKPS_IO_CHECKPOINT_FAILED, /* MEDIUM ERROR, WRITE ERROR */
  BLKPS_IO_TABLE_FULL,        /* ILLEGAL REQUEST, INSUFFICIENT RESOURCES: a
                                 hashed table cannot make a push's rows */
  BLKPS_IO_WINDOWS_ONLY,      /* ILLEGAL REQUEST, INVALID COMMAND OPERATION
                                 CODE: a hashed table's learner LUN takes
                                 no READ or WRITE (row windows only) */
  BLKPS_IO_STANDBY,           /* NOT READY, LOGICAL UNIT NOT ACCESSIBLE,
                                 TARGET PORT IN STANDBY STATE: a backup
                                 not promoted (doc/replicas.md) */
};

/* Where the core's event lines go (one line, no newline); set once at load. */
void blkps_set_log(void (*log)(const char *line));

/* Parses --bsopts (may be NULL). Returns NULL on failure. */
struct blkps_lu *blkps_lu_create(const char *bsopts, char *err, size_t errlen);
void blkps_lu_destroy(struct blkps_lu *lu);

/* Opens the model named by tgt's --backing-store `path` for LUN `lun`:
 * creates it, or joins the instance other LUNs of this tgtd already serve
 * under that name (a learner LUN must give the same --bsopts; a control LUN
 * needs the model to exist). `wake_fd` is an eventfd the core writes to when
 * held commands of this LUN are released. Stores the device size in
 * *size_bytes. Returns 0, or -1 on failure. */
int blkps_lu_open(struct blkps_lu *lu, const char *path, uint64_t lun, int wake_fd, uint64_t *size_bytes, char *err,
                  size_t errlen);
void blkps_lu_close(struct blkps_lu *lu);
/* 1 for a control LUN (it answers INQUIRY with BLKPS_CONTROL_PRODUCT_ID). */
int blkps_lu_is_control(const struct blkps_lu *lu);

/* Main thread, for each READ and WRITE. Returns 0 if the command may run
 * now, or 1 if the core holds it (bsp/ssp): it is handed back later by
 * blkps_lu_take_released, after wake_fd fires. */
int blkps_lu_admit(struct blkps_lu *lu, int write, uint64_t offset, uint64_t len, void *cmd, const char *nexus);
/* Main thread, for an admitted READ or WRITE: 1 if it may run right there
 * on tgtd's main thread instead of the worker pool. So do a table's commands
 * of at most 4 KiB (a few rows): a row's copy or update holds its block lock
 * briefly, and the pool's hand-off (a futex wake and a thread switch each
 * way) cost tgtd more CPU than the row itself (doc/embeddings.md "Bench").
 * Not a hashed table's: its READ and WRITE are refused, and a refusal must
 * go through the pool (tgt reports a command done on the main thread as
 * GOOD, whatever its sense). */
int blkps_lu_runs_inline(const struct blkps_lu *lu, uint64_t len);
/* Main thread: one released command, or NULL when there is none. *result is
 * BLKPS_IO_OK if it may run now; otherwise the shim fails it with *result
 * and err. */
void *blkps_lu_take_released(struct blkps_lu *lu, enum blkps_io_result *result, char *err, size_t errlen);

/* READ: device bytes [offset, offset+len) into buf. */
enum blkps_io_result blkps_lu_read(struct blkps_lu *lu, uint64_t offset, void *buf, uint64_t len, void *cmd, char *err,
                                   size_t errlen);
/* WRITE: buf holds the gradient (or control data) for [offset, offset+len). */
enum blkps_io_result blkps_lu_write(struct blkps_lu *lu, uint64_t offset, const void *buf, uint64_t len, void *cmd,
                                    char *err, size_t errlen);
/* SYNCHRONIZE CACHE: a durable checkpoint of the model, if configured. */
enum blkps_io_result blkps_lu_sync(struct blkps_lu *lu, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* BLKPS_TARGET_PLUGIN_LU_H */
