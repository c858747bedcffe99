/* libblkps: a learner's access to a blkps model device. Stable C API.
 *
 * The model is a flat vector of float32 parameters stored on a block device:
 * byte offset 4*i holds parameter i (little-endian). Writing a gradient at a
 * parameter's offset asks the server to apply it (w -= lr * g, or the
 * configured rule); reading returns the current weights. The device is a file,
 * a block device (a kernel iSCSI/iSER session's /dev/sdX) or an iSCSI LUN
 * reached directly with iscsi:// (TCP) or iser:// (RDMA).
 *
 * Errors: calls return 0 or a negative errno value; the one-line message
 * ("blkps: ...") of the last failed call on a handle is blkps_last_error().
 *
 * iSCSI sessions: a dropped connection is re-established transparently and
 * the commands in flight are resent, writes only where the server's receipt
 * shows them not applied (doc/libblkps.md "Faults"). When that fails for the
 * reconnect deadline (BLKPS_RECONNECT_SECONDS; by default 60 s plus 1 s per
 * 64 MiB of model), the call fails with -EIO and so does every later call on
 * the handle: close it and open again. A command the target does not
 * answer within 30 s fails with -EIO.
 *
 * Thread-safety: a handle is used by one thread at a time (libiscsi allows
 * one thread per context). Several handles may be open at once, in one or
 * several threads or processes; each has its own connection.
 */

#ifndef BLKPS_BLKPS_H_
#define BLKPS_BLKPS_H_

#include <stddef.h>
#include <stdint.h>

#include "blkps/control_lun.h"
#include "blkps/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct blkps_model blkps_model;

typedef struct blkps_open_options {
  /* Bytes per I/O request, rounded down to whole logical blocks (at least
   * one); 0 = default: 1 MiB, or 256 KiB for iser:// (libiscsi 1.19's iSER
   * stages a command's data in a 256 KiB buffer; tgt's takes 512 KiB),
   * and 256 KiB for blkps_exchange on iscsi:// (the session's first burst:
   * no write waits for an R2T behind the pull's data on its connection).
   * Capped at the largest transfer the device accepts (256 KiB on
   * iser://). */
  uint32_t request_bytes;
  /* Requests kept in flight; 0 = default 16. Files and block devices use
   * libaio with O_DIRECT (buffered, said once on stderr, where O_DIRECT is
   * refused); iscsi:// and iser:// use libiscsi's asynchronous tasks
   * (at most 128 in flight on iser://). */
  uint32_t queue_depth;
  /* iSCSI initiator IQN; NULL = "iqn.2026-11.io.blkps:learner-<host>-<pid>".
   * Copied during blkps_open. */
  const char *initiator_name;
  /* How the device presents the model, as the LUN's --bsopts dtype says:
   * NULL or "float32", "bfloat16", "float16" (doc/server.md, "16-bit wire"). On a
   * 16-bit device parameter i is at byte 2*i; blkps_push and blkps_pull
   * still take float32 arrays and convert (nearest, ties to even). Another
   * name fails blkps_open with -EINVAL. */
  const char *dtype;
  /* iSCSI sessions per LUN (each shard's, over a layout:); 0 or 1 = one.
   * K > 1 logs in K times (initiator names NAME, NAME-s2, ... NAME-sK) and
   * cuts each call's requests into K shares run at once: for a learner that
   * one connection caps (doc/libblkps.md "Several sessions per LUN"). The
   * server still counts one learner per LUN; exactly-once holds per
   * session. A path refuses K > 1 with -EINVAL. */
  uint32_t sessions;
} blkps_open_options;

/* Opens `target`: a path (regular file or block device) or
 * iscsi://host[:port]/<target-iqn>/<lun> or iser://... (same shape).
 * layout:PATH opens a model striped over the shards listed in layout file
 * PATH (doc/server.md "Sharding"): one handle, one connection and thread per shard.
 * opts may be NULL (all defaults).
 * Returns 0 and stores a handle in *out, or a negative errno and writes a
 * one-line message to errbuf (if non-NULL; truncated to errlen bytes with a
 * terminating NUL). A regular file's size is rounded down to whole 512-byte
 * blocks. */
BLKPS_EXPORT int blkps_open(const char *target, const blkps_open_options *opts, blkps_model **out, char *errbuf,
                            size_t errlen);

/* Closes the handle (logs out of the iSCSI session). NULL is ignored. */
BLKPS_EXPORT void blkps_close(blkps_model *m);

/* Device size in bytes: a multiple of the logical block size. */
BLKPS_EXPORT uint64_t blkps_size_bytes(const blkps_model *m);
/* Parameters the device holds: its size over 4 bytes, or 2 on a 16-bit
 * device. */
BLKPS_EXPORT uint64_t blkps_param_capacity(const blkps_model *m);
BLKPS_EXPORT uint32_t blkps_logical_block_size(const blkps_model *m);

/* Gradients for parameters [first_param, first_param+count).
 * A range that does not start or end on a logical block boundary is padded
 * with zero gradients to whole blocks (a zero gradient leaves a parameter
 * unchanged); there is never a read-modify-write. A range past the end of the
 * device fails with -ERANGE and transfers nothing; so does, with -EINVAL, a
 * gradient that is NaN or infinite in a 16-bit device's type.
 * Returns 0 or a negative errno (message in blkps_last_error). After an I/O
 * error, which parts of the range reached the server is unspecified. */
BLKPS_EXPORT int blkps_push(blkps_model *m, uint64_t first_param, const float *grad, uint64_t count);

/* Current weights for parameters [first_param, first_param+count) into
 * `weights`. Same range rules as blkps_push. */
BLKPS_EXPORT int blkps_pull(blkps_model *m, uint64_t first_param, float *weights, uint64_t count);

/* blkps_push(grad) then blkps_pull(out) of the same range, pipelined: each
 * request's pull starts as soon as its push has completed, while later
 * pushes are in flight, so the connection carries both directions at once
 * (doc/libblkps.md "Exchange"). The weights include this push; under bsp a
 * pull waits for the round as blkps_pull does. `out` may be `grad`; no other
 * overlap. Same range rules and return values as blkps_push; after an I/O
 * error `out` is unspecified and no pull follows a push that failed. */
BLKPS_EXPORT int blkps_exchange(blkps_model *m, uint64_t first_param, const float *grad, float *out, uint64_t count);

/* On a 16-bit device (dtype bfloat16 or float16): the 16-bit values as they
 * travel, no conversion (a GPU's .to(bfloat16/float16) rounds as
 * blkps/wire_dtype.hpp does). Same range rules as blkps_push/blkps_pull;
 * -EINVAL on a float32 device, and from blkps_push16 and blkps_exchange16
 * when a value is NaN or infinite (nothing sent). blkps_exchange16 is
 * blkps_exchange in these values (`out` may be `grad`). */
BLKPS_EXPORT int blkps_push16(blkps_model *m, uint64_t first_param, const uint16_t *grad, uint64_t count);
BLKPS_EXPORT int blkps_pull16(blkps_model *m, uint64_t first_param, uint16_t *weights, uint64_t count);
BLKPS_EXPORT int blkps_exchange16(blkps_model *m, uint64_t first_param, const uint16_t *grad, uint16_t *out,
                                  uint64_t count);

/* ---- Streaming (doc/libblkps.md "Streaming") ------------------------------
 *
 * blkps_submit_* return at once with a ticket; the transfer runs on the
 * handle's own thread, and blkps_complete reports it. Every submission
 * waiting when the device is free joins one batch, so the connections'
 * queues stay full across submissions instead of draining after each call.
 * Submissions of different kinds (push, pull, exchange), and those whose
 * ranges share a logical block, run one after the other in submission
 * order; the others complete in any order.
 *
 * Each checks its input as the call of its name does (same range rules,
 * -ERANGE / -EINVAL, nothing sent, no ticket; message in blkps_last_error)
 * and on success returns 0 and stores a ticket (> 0, increasing) in
 * *ticket. The caller's memory belongs to the handle until that ticket
 * completes (a float32 push to a 16-bit device is narrowed at once, so
 * its grad may be reused). Pushes are applied exactly once across
 * reconnects, as for the synchronous calls. */
typedef uint64_t blkps_ticket;
BLKPS_EXPORT int blkps_submit_push(blkps_model *m, uint64_t first_param, const float *grad, uint64_t count,
                                   blkps_ticket *ticket);
BLKPS_EXPORT int blkps_submit_pull(blkps_model *m, uint64_t first_param, float *weights, uint64_t count,
                                   blkps_ticket *ticket);
BLKPS_EXPORT int blkps_submit_exchange(blkps_model *m, uint64_t first_param, const float *grad, float *out,
                                       uint64_t count, blkps_ticket *ticket);
BLKPS_EXPORT int blkps_submit_push16(blkps_model *m, uint64_t first_param, const uint16_t *grad, uint64_t count,
                                     blkps_ticket *ticket);
BLKPS_EXPORT int blkps_submit_pull16(blkps_model *m, uint64_t first_param, uint16_t *weights, uint64_t count,
                                     blkps_ticket *ticket);
BLKPS_EXPORT int blkps_submit_exchange16(blkps_model *m, uint64_t first_param, const uint16_t *grad, uint16_t *out,
                                         uint64_t count, blkps_ticket *ticket);

/* A ticket's outcome: result 0, or the negative errno and the one-line
 * message (truncated to fit) that the synchronous call would give. When a
 * batch fails, each of its tickets fails with the batch's first error
 * (which of their requests reached the server is then unspecified); later
 * submissions still run. */
typedef struct blkps_completion {
  blkps_ticket ticket;
  int32_t result;
  char error[512];
} blkps_completion;

/* Stores up to `max` completions in out[0..], in the order they ended,
 * each ticket once. Waits up to timeout_ms (< 0: without limit) for the
 * first when none has ended; returns at once when nothing is outstanding.
 * Returns how many were stored (0 on timeout) or a negative errno. */
BLKPS_EXPORT int blkps_complete(blkps_model *m, blkps_completion *out, size_t max, int timeout_ms);
/* Tickets submitted and not yet returned by blkps_complete. */
BLKPS_EXPORT uint64_t blkps_outstanding(const blkps_model *m);
/* Ends the wait of a blkps_complete now waiting on m, or else of the next
 * one, as if its timeout had passed. Any thread may call it at any time (it
 * does not wait for submissions): a thread that waits both for completions
 * and for work other threads queue calls blkps_complete without limit, and
 * they call blkps_wake after queueing, instead of it polling. */
BLKPS_EXPORT void blkps_wake(blkps_model *m);
/* Every other call on m first waits until no submission waits or runs
 * (their completions stay for blkps_complete); blkps_close waits too. */

/* Raw byte transfers; offset and len must be multiples of the logical block
 * size (else -EINVAL with a message), and lie within the device (else
 * -ERANGE). */
BLKPS_EXPORT int blkps_write_bytes(blkps_model *m, uint64_t offset, const void *buf, uint64_t len);
BLKPS_EXPORT int blkps_read_bytes(blkps_model *m, uint64_t offset, void *buf, uint64_t len);

/* Tables (doc/embeddings.md): rows of `width` float32 values, row r at byte
 * r*width*4. blkps_pull_rows reads rows ids[0..n) into rows[k*width ...], in
 * the order given (ids may repeat); blkps_push_rows sends grads[k*width ...]
 * for row ids[k], the gradients of a repeated id summed and sent once. On a
 * blkps table the rows go in batches through the server's row windows
 * (blkps/control_lun.h); elsewhere as few block-aligned requests as their
 * places allow, many in flight. Returns as blkps::Model::PullRows /
 * PushRows (blkps/model.hpp). */
BLKPS_EXPORT int blkps_pull_rows(blkps_model *m, const uint64_t *ids, uint64_t n, uint64_t width, float *rows);
BLKPS_EXPORT int blkps_push_rows(blkps_model *m, const uint64_t *ids, uint64_t n, uint64_t width, const float *grads);
/* The table's values per row, the only width the two above take; 0 for a
 * dense model or a device that does not say (blkps::Model::table_width). */
BLKPS_EXPORT uint64_t blkps_table_width(const blkps_model *m);
/* 1 when the table is hashed (table=hash:CAPACITY:WIDTH, on one server or a
 * kind = hashed layout): its row ids are any 64-bit value; else 0
 * (blkps::Model::table_hashed). */
BLKPS_EXPORT int blkps_table_hashed(const blkps_model *m);

/* fsync / SCSI SYNCHRONIZE CACHE: the server checkpoints the model durably
 * before this returns. */
BLKPS_EXPORT int blkps_sync(blkps_model *m);

/* Bytes of pushes the server acknowledged and then lost with a restart from
 * its checkpoint (doc/libblkps.md "Faults"); 0 if none. Every other push is applied
 * exactly once, across reconnects. */
BLKPS_EXPORT uint64_t blkps_pushed_bytes_lost(const blkps_model *m);

/* Lost iSCSI sessions m re-established, and the seconds it spent
 * reconnecting (a failed attempt included); 0 for a file. Read them
 * between calls, on the thread making them. */
BLKPS_EXPORT uint64_t blkps_reconnects(const blkps_model *m);
BLKPS_EXPORT double blkps_reconnect_seconds(const blkps_model *m);

/* Message of the last failed call on m (successful calls leave it); "" if
 * none has failed. Valid until the next call on m. */
BLKPS_EXPORT const char *blkps_last_error(const blkps_model *m);

/* The size in bytes of the public struct `name` ("blkps_open_options",
 * "blkps_engine_options", "blkps_engine_metrics", "blkps_control_layout",
 * "blkps_control_counters", "blkps_control_receipt", "blkps_completion"), or 0
 * for another name.
 * A binding that mirrors these structs (the Python package's ctypes) checks
 * each copy against it when it loads the library, so that a package and a
 * library of different builds fail in one line instead of misreading. */
BLKPS_EXPORT size_t blkps_struct_size(const char *name);

/* ---- The control LUN (layout and record in blkps/control_lun.h) -----------
 *
 * Its layout as values, for bindings that cannot include a C header (the
 * Python package's blkps.control): the same numbers and key lists as the
 * macros of control_lun.h. */
typedef struct blkps_control_layout {
  uint32_t format_version;
  uint64_t status_offset, status_bytes;
  uint64_t commands_offset, commands_bytes;
  uint64_t counters_offset, counters_bytes;
  uint64_t weights_offset;
  const char *status_keys; /* static strings, space-separated */
  const char *status_checkpoint_keys;
  const char *status_learner_keys;
  uint64_t exchange_bytes; /* the exchange region, the control LUN's last bytes */
  uint64_t receipt_unit;   /* device bytes per receipt counter (BLKPS_CONTROL_RECEIPT_UNIT) */
} blkps_control_layout;
BLKPS_EXPORT void blkps_control_layout_get(blkps_control_layout *out);

/* Reads the counters record from m, a control LUN. Returns 0, a failed
 * read's negative errno, or -EPROTO when m holds no record of this format
 * (not a control LUN, or a server of another version); message in
 * blkps_last_error. */
BLKPS_EXPORT int blkps_control_read_counters(blkps_model *m, blkps_control_counters *out);

/* Reads, from m, a control LUN, the receipt the server keeps for m's
 * initiator name on learner LUN `lun` of `device_bytes` (doc/libblkps.md "Faults"):
 * the header into *header and, if counts is not NULL, the per-unit counters
 * into counts[0 .. blkps_control_receipt_units(device_bytes)). Returns
 * 0, a failed read's negative errno, or -EPROTO when m holds no receipt of
 * this format for lun; message in blkps_last_error. */
BLKPS_EXPORT int blkps_control_read_receipt(blkps_model *m, uint32_t lun, uint64_t device_bytes,
                                            blkps_control_receipt *header, uint32_t *counts);
/* The number of receipt counters of a learner LUN of device_bytes: one per
 * BLKPS_CONTROL_RECEIPT_UNIT bytes, rounded up. */
BLKPS_EXPORT uint64_t blkps_control_receipt_units(uint64_t device_bytes);

/* ---- Sharded models (layout files: doc/server.md "Sharding") --------------
 *
 * For bindings that keep the job's control over a striped model
 * (blkps.control): the layout file as values, and the stripe arithmetic.
 *
 * Reads layout file `path` and writes it to out as one NUL-terminated line
 * of JSON: {"kind": "striped", "stripe_unit": BYTES, "dtype": "float32",
 * "shards": [TARGET, ...], "controls": [TARGET, ...]} (kind "hashed", with
 * stripe_unit 0, for a hashed table's layout; controls: each shard's
 * control LUN in shard order, or []; relative paths resolved against the
 * file's folder).
 * Returns 0; -ERANGE when out_len is too small; or the parser's negative
 * errno with its one-line message in out. */
BLKPS_EXPORT int blkps_layout_describe(const char *path, char *out, size_t out_len);
/* Copies each shard's part of `model`, model_bytes striped in units of
 * stripe_unit bytes over `shards` shards (unit k on shard k mod shards),
 * to shard_parts[s], which holds at least shard s's part. */
BLKPS_EXPORT void blkps_stripe_scatter(uint64_t stripe_unit, uint32_t shards, const void *model, uint64_t model_bytes,
                                       void *const *shard_parts);

/* ---- Hashed feature ids (blkps/feature_id.h) --------------------------------
 *
 * Writes to out[k] the shard, 0 .. shards-1, that holds the row of feature
 * id ids[k], k = 0 .. n-1: blkps_feature_id_shard() of blkps/feature_id.h,
 * the one rule by which a hashed table's rows are split over shards
 * (doc/embeddings.md "Hashed ids"), for bindings that cannot include a C
 * header (the Python package's blkps.feature_ids). REQUIRES: shards > 0. */
BLKPS_EXPORT void blkps_feature_id_shards(const uint64_t *ids, size_t n, uint32_t shards, uint32_t *out);

/* ---- Learner engine: double buffering and adaptive pulling ----------------
 *
 * An engine trains on one buffer while its own threads push the previous
 * gradient and pull the next weights into the other; blkps_engine_step()
 * swaps them (no copy). The C++ header blkps/engine.hpp documents the
 * contract in full: buffer ownership, the pull's timing (bubble), metrics,
 * and what happens to gradients on error (each is pushed exactly once, in
 * order; after a failed push or pull the engine is failed, every later
 * step/finish returns the error, and blkps_engine_gradients_pushed() counts
 * the gradients that reached the server whole).
 *
 *   blkps_engine_options o;
 *   blkps_engine_options_init(&o);
 *   blkps_engine *e;
 *   if (blkps_engine_open(url, &o, &e, err, sizeof err) != 0) ...
 *   for (t = 0; t < T; ++t) {
 *     compute(blkps_engine_weights(e), blkps_engine_gradient(e), n);
 *     if (blkps_engine_step(e) != 0) ... blkps_engine_last_error(e) ...
 *   }
 *   blkps_engine_finish(e);  (pushes the last gradient)
 *   blkps_engine_close(e);
 *
 * Thread-safety: an engine is driven by one thread at a time. */

typedef struct blkps_engine blkps_engine;

typedef struct blkps_engine_options {
  blkps_open_options open;    /* for every connection the engine opens */
  uint64_t first_param;       /* range served: [first_param, +param_count) */
  uint64_t param_count;       /* 0 = up to the end of the device */
  int double_buffering;       /* 0: baseline, step pushes then pulls itself */
  int adaptive_pull;          /* 0: each pull starts as soon as it may */
  double smoothing;           /* weight of the newest sample, in (0, 1] */
  const char *control_target; /* NULL, or the control LUN (staleness) */
  /* Gradient dropping (engine.hpp, EngineOptions::drop_ratio): 0 = off; in
   * (0, 1): push only the largest runs, keep the rest as a residual. */
  double drop_ratio;
  uint64_t drop_run_params;   /* 0 = the default (engine.hpp) */
  uint64_t drop_group_params; /* 0 = the whole range (ssp: the model block) */
} blkps_engine_options;

/* Sets the defaults: zeros, double_buffering = 1, adaptive_pull = 1,
 * smoothing = 0.25. Use it before setting fields: a zeroed struct would
 * select the baseline without double buffering. */
BLKPS_EXPORT void blkps_engine_options_init(blkps_engine_options *opts);

typedef struct blkps_engine_metrics {
  uint64_t iteration;
  double compute_s;  /* previous step's return to this step */
  double stall_s;    /* this step's wait for communication */
  double push_s;     /* the previous gradient's push */
  double pull_s;     /* the next weights' pull */
  double bubble_s;   /* iteration start to pull start */
  int64_t staleness; /* model updates between pull and use; -1 unknown */
  int concurrent;    /* push and pull ran at the same time */
} blkps_engine_metrics;

/* Opens an engine on `target` (as blkps_open) and pulls the first weights.
 * opts NULL = defaults. Returns 0 and stores the engine in *out, or a
 * negative errno with a one-line message in errbuf (if non-NULL). */
BLKPS_EXPORT int blkps_engine_open(const char *target, const blkps_engine_options *opts, blkps_engine **out,
                                   char *errbuf, size_t errlen);

/* Parameters served: the length of the weights and gradient buffers. */
BLKPS_EXPORT uint64_t blkps_engine_param_count(const blkps_engine *e);

/* This iteration's weights (read only) and gradient buffer (to be filled);
 * both valid until the next blkps_engine_step(). */
BLKPS_EXPORT const float *blkps_engine_weights(const blkps_engine *e);
BLKPS_EXPORT float *blkps_engine_gradient(blkps_engine *e);

/* The gradient is complete: hand it over, wait for the next weights, swap.
 * Returns 0 or a negative errno. */
BLKPS_EXPORT int blkps_engine_step(blkps_engine *e);

/* Pushes the current gradient, waits for every push, stops the threads and
 * syncs (the server checkpoints, if it keeps one), so that every push is
 * durable or counted in blkps_engine_pushed_bytes_lost(). Returns 0 or a
 * negative errno. */
BLKPS_EXPORT int blkps_engine_finish(blkps_engine *e);

/* The metrics of the iteration the last successful step ended. */
BLKPS_EXPORT void blkps_engine_last_metrics(const blkps_engine *e, blkps_engine_metrics *out);

/* Gradients that reached the server whole so far. */
BLKPS_EXPORT uint64_t blkps_engine_gradients_pushed(const blkps_engine *e);

/* 1 when the job is asked to stop (control stop=1): a fresh read of the
 * control LUN's counters; 0 otherwise, without a control_target, or when
 * the read fails. Call it from the thread that steps the engine. */
BLKPS_EXPORT int blkps_engine_stop_requested(blkps_engine *e);

/* Parameters sent to the server so far (with dropping: the runs pushed). */
BLKPS_EXPORT uint64_t blkps_engine_params_pushed(const blkps_engine *e);

/* With drop_ratio > 0: the dropped gradient not pushed yet, param_count
 * floats (zeros after a successful finish); readable after finish, after a
 * failure, or between steps with double_buffering = 0. NULL without
 * dropping. */
BLKPS_EXPORT const float *blkps_engine_residual(const blkps_engine *e);

/* Bytes of pushes the server acknowledged and then lost with a restart from
 * its checkpoint (doc/libblkps.md "Faults"); 0 if none. */
BLKPS_EXPORT uint64_t blkps_engine_pushed_bytes_lost(const blkps_engine *e);

/* Message of the last failure on e; "" if none. */
BLKPS_EXPORT const char *blkps_engine_last_error(const blkps_engine *e);

/* Stops the threads (gradients already handed to step are still pushed;
 * the current one is not: call blkps_engine_finish first) and frees the
 * engine. NULL is ignored. */
BLKPS_EXPORT void blkps_engine_close(blkps_engine *e);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* BLKPS_BLKPS_H_ */
