/*
 * The bridge between bs_blkps.c (C: tgt's headers do not compile as C++) and
 * the C++ core in lu.cc. One struct blkps_lu per tgt logical unit.
 *
 * Threading: create/open/close/destroy run on tgtd's main thread, never
 * concurrently with I/O on the same LU. read/write/sync run on tgt's worker
 * threads, concurrently with each other; the model does its own locking.
 *
 * Errors: functions that can fail write a one-line message (no newline) into
 * err[0..errlen) for the shim to log.
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
  BLKPS_IO_OUT_OF_RANGE,  /* ILLEGAL REQUEST, LBA OUT OF RANGE */
  BLKPS_IO_BAD_DATA,      /* ILLEGAL REQUEST, INVALID FIELD IN PARAMETER LIST */
  BLKPS_IO_NOT_READY,     /* NOT READY, MEDIUM NOT PRESENT: no model open */
};

/* Parses --bsopts (may be NULL). Returns NULL on failure. */
struct blkps_lu *blkps_lu_create(const char *bsopts, char *err, size_t errlen);
void blkps_lu_destroy(struct blkps_lu *lu);

/* Opens the model named by tgt's --backing-store `path`: creates it, or
 * joins the instance other LUNs of this tgtd already serve under that name
 * (their --bsopts must be the same). Stores the device size in *size_bytes.
 * Returns 0, or -1 on failure. */
int blkps_lu_open(struct blkps_lu *lu, const char *path, uint64_t *size_bytes,
                  char *err, size_t errlen);
void blkps_lu_close(struct blkps_lu *lu);

/* READ: weights of device bytes [offset, offset+len) into buf. */
enum blkps_io_result blkps_lu_read(struct blkps_lu *lu, uint64_t offset,
                                   void *buf, uint64_t len,
                                   char *err, size_t errlen);
/* WRITE: buf holds the gradient for device bytes [offset, offset+len). */
enum blkps_io_result blkps_lu_write(struct blkps_lu *lu, uint64_t offset,
                                    const void *buf, uint64_t len,
                                    char *err, size_t errlen);
/* SYNCHRONIZE CACHE. */
enum blkps_io_result blkps_lu_sync(struct blkps_lu *lu, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* BLKPS_TARGET_PLUGIN_LU_H */
