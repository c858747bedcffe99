// blkps::Model: a learner's handle on a blkps model device. C++ API.
//
// The model is a flat vector of float32 parameters stored on a block device:
// byte offset 4*i holds parameter i (little-endian), or 2*i on a 16-bit
// device (OpenOptions::dtype). Push() sends gradients (the server applies
// them), Pull() reads the current weights.
//
//   std::string error;
//   auto model = blkps::Model::Open(
//       "iscsi://10.0.0.1/iqn.2026-11.io.blkps:t1/1", blkps::OpenOptions(),
//       &error);
//   if (!model) { fprintf(stderr, "%s\n", error.c_str()); return 1; }
//   if (model->Pull(0, weights.data(), n) != 0) { ... model->last_error() ... }
//
// Errors are values: methods return 0 or a negative errno value, and
// last_error() holds the one-line message of the last failure. No method
// throws.
//
// iSCSI sessions: a dropped connection is re-established transparently;
// reads are resent, and a push is resent only where the server's receipt
// shows it was not applied, so every push is applied exactly once
// (doc/libblkps.md "Faults"; pushed_bytes_lost() counts pushes a target restarted from an
// older checkpoint lost). When reconnecting fails for the reconnect
// deadline (BLKPS_RECONNECT_SECONDS; by default 60 s plus 1 s per 64 MiB of
// model), the call fails with -EIO and so does every later call: close the
// Model and open it again. A command the target does not answer within 30 s fails with -EIO.
//
// Thread-safety: a Model is used by one thread at a time (libiscsi allows one
// thread per connection). Distinct Models are independent: open one per
// thread, or several in one thread. Submissions (Streaming, below) run on
// a thread of the Model's own; the rules for its user stay the same.

#ifndef BLKPS_MODEL_HPP_
#define BLKPS_MODEL_HPP_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "blkps/control_lun.h"
#include "blkps/export.h"
#include "blkps/wire_dtype.hpp"

namespace blkps {

class Device;
class Status;
class Stream;

struct OpenOptions {
  // Bytes per I/O request, rounded down to whole logical blocks (at least
  // one); 0 = 1 MiB, or 256 KiB for iser:// (libiscsi 1.19's iSER limit),
  // and 256 KiB for Exchange on iscsi:// (the session's first burst: no
  // write waits for an R2T behind the pull's data on its connection).
  // Capped at the largest transfer the device accepts (256 KiB on iser://).
  uint32_t request_bytes = 0;
  // Requests in flight; 0 = 16. Files and block devices use libaio with
  // O_DIRECT (buffered, said once on stderr, where O_DIRECT is refused).
  uint32_t queue_depth = 0;
  // iSCSI initiator IQN; empty = "iqn.2026-11.io.blkps:learner-<host>-<pid>".
  std::string initiator_name;
  // How the device presents the model: "float32" (empty = float32),
  // "bfloat16" or "float16", as the LUN's --bsopts dtype says
  // (doc/server.md, "16-bit wire"). On a 16-bit device parameter i is at byte 2*i; Push and
  // Pull still take float32 arrays and convert (blkps/wire_dtype.hpp).
  // Open() fails with -EINVAL on another name.
  std::string dtype;
  // iSCSI sessions per LUN (each shard's, over a layout:); 0 or 1 = one. K >
  // 1 logs in K times (initiator names NAME, NAME-s2, ... NAME-sK) and cuts
  // each call's requests into K shares run at once, for a learner that one
  // connection caps (doc/libblkps.md "Several sessions per LUN"). The
  // server still counts one learner per LUN (its slot); exactly-once holds
  // per session. Open() fails with -EINVAL for a path and K > 1.
  uint32_t sessions = 0;
};

class BLKPS_EXPORT Model {
 public:
  // Opens `target`: a path (regular file or block device),
  // iscsi://host[:port]/<target-iqn>/<lun>, or iser://... of the same shape.
  // layout:PATH opens a model striped over the shards listed in layout file
  // PATH (doc/server.md "Sharding"): one connection and thread per shard.
  // On failure returns nullptr, stores a one-line message in *error and,
  // when `error_code` is not null, the negative errno in *error_code.
  static std::unique_ptr<Model> Open(const std::string& target, const OpenOptions& options, std::string* error,
                                     int* error_code = nullptr);

  ~Model();  // closes the device (logs out of the iSCSI session)
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
  // A moved-from Model may only be destroyed or assigned to.
  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;

  // Gradients for parameters [first_param, first_param + count).
  // A range that does not start or end on a logical block boundary is padded
  // with zero gradients to whole blocks (a zero gradient leaves a parameter
  // unchanged); there is never a read-modify-write. Block-aligned ranges go
  // straight from `grad` to the device (no copy) on a float32 device; a
  // 16-bit device gets them rounded to its type (nearest, ties to even).
  // Returns 0, -ERANGE (range past the end; nothing transferred), -EINVAL (a
  // 16-bit device: a value that is NaN or infinite in its type, e.g. beyond
  // float16's 65504; nothing transferred) or another negative errno. After
  // an I/O error, which parts of the range reached the server is
  // unspecified.
  int Push(uint64_t first_param, const float* grad, uint64_t count);

  // Current weights for parameters [first_param, first_param + count) into
  // `weights`. Partial blocks are read whole into a bounce buffer and the
  // requested part copied out. Same return values as Push().
  int Pull(uint64_t first_param, float* weights, uint64_t count);

  // Push(first_param, grad, count) then Pull(first_param, out, count), one
  // request at a time: the pull of each request's range starts as soon as
  // its push has completed, while later pushes are still in flight, so the
  // connection carries gradients and weights at once (doc/libblkps.md
  // "Exchange"). Every block is pushed before it is pulled: the weights
  // include this learner's own gradient, and under bsp a pull waits for the
  // round as Pull() does. `out` may be `grad` (in place); no other overlap.
  // Same range rules and return values as Push(): -ERANGE or -EINVAL (a
  // 16-bit device: a gradient NaN or infinite in its type) send nothing.
  // After an I/O error no further request is started, the pull of a push
  // that failed or never started is not started, and which parts of the
  // range reached the server is unspecified; `out` is then unspecified.
  int Exchange(uint64_t first_param, const float* grad, float* out, uint64_t count);

  // On a 16-bit device: the values as they travel, no conversion. `grad`
  // holds 16-bit values of the device's dtype (bfloat16 or float16 bit
  // patterns, e.g. a GPU's .to(torch.bfloat16), whose rounding equals
  // blkps/wire_dtype.hpp's); Pull16 stores the device's 16-bit values.
  // Same range rules and return values as Push/Pull; -EINVAL on a float32
  // device, and from Push16 when a value is NaN or infinite (nothing sent).
  // Exchange16 is Exchange's pipelined push and pull in those values (`out`
  // may be `grad`), and returns what Push16 returns on bad input.
  int Push16(uint64_t first_param, const uint16_t* grad, uint64_t count);
  int Pull16(uint64_t first_param, uint16_t* weights, uint64_t count);
  int Exchange16(uint64_t first_param, const uint16_t* grad, uint16_t* out, uint64_t count);

  // Raw transfers of `length` bytes at device byte `offset`.
  // Returns -EINVAL unless offset and length are multiples of
  // logical_block_size(), -ERANGE past the end of the device.
  int WriteBytes(uint64_t offset, const void* buffer, uint64_t length);
  int ReadBytes(uint64_t offset, void* buffer, uint64_t length);

  // Tables (doc/embeddings.md): rows of `width` float32 values, row r at
  // device byte r * width * 4, on a float32 device.
  // PullRows: the current values of rows ids[0..n) into rows[k * width ..
  // (k + 1) * width), in the order given (ids may repeat).
  // PushRows: grads[k * width ..] is a gradient for row ids[k]; the
  // gradients of a repeated id are summed and sent once, the other rows
  // sharing its blocks as zeros (none to a table).
  // Both keep each row once. On a blkps table (iscsi://, iser://, or a
  // layout: of such shards) the rows go as batches through the server's row
  // windows (blkps/control_lun.h "Row windows"; a few commands per batch, up
  // to queue_depth() windows in flight per shard, pushes applied exactly
  // once across reconnects); elsewhere they are sorted and sent as few
  // block-aligned requests as their places allow (rows whose blocks touch
  // share one), up to queue_depth() in flight. Returns 0, -ERANGE (an id
  // past the device's last whole row; nothing transferred), -EINVAL (width
  // 0, a width other
  // than table_width(), a 16-bit device, or a push whose summed gradient is
  // NaN or infinite; nothing transferred) or another negative errno as
  // Push() and Pull().
  int PullRows(const uint64_t* ids, uint64_t n, uint64_t width, float* rows);
  int PushRows(const uint64_t* ids, uint64_t n, uint64_t width, const float* grads);
  // The values per row of the table the server serves (its
  // table=ROWS:WIDTH, read from its control LUN at open), the only width
  // PullRows and PushRows take; 0 for a dense model or a device that does
  // not say (a file or block device, a target without a blkps control
  // LUN), where any width is taken.
  uint64_t table_width() const;
  // Whether that table is hashed (table=hash:CAPACITY:WIDTH, on one server
  // or over a `kind = hashed` layout): PullRows and PushRows then take any
  // 64-bit id, and plain Pull and Push are refused.
  bool table_hashed() const;

  // ---- Streaming (doc/libblkps.md "Streaming") ----------------------------
  // A submission returns at once with a ticket; the transfer runs on the
  // Model's own thread and ends later, reported by Complete(). Every
  // submission waiting when the device is free joins one batch, so the
  // connections' queues stay full across submissions instead of draining
  // after each call. Submissions of different kinds (push, pull, exchange),
  // and submissions whose ranges share a logical block, run one after the
  // other in submission order; others complete in any order.
  //
  // Each Submit* checks its input as the synchronous call of its name does
  // (same range rules, same -ERANGE / -EINVAL, nothing sent, no ticket), and
  // on success returns 0 and stores a ticket (> 0, increasing) in *ticket.
  // The caller's memory (grad, weights, out) is the Model's until that
  // ticket completes: do not change grad or read out before. A float32 push
  // to a 16-bit device is narrowed at submission (grad may be reused at
  // once); exchange semantics are Exchange()'s (each block pushed before it
  // is pulled; `out` may be `grad`).
  // Exactly-once holds as for the synchronous calls: reconnects resend only
  // what the server's receipt lacks; a gradient is never applied twice.
  using Ticket = uint64_t;
  int SubmitPush(uint64_t first_param, const float* grad, uint64_t count, Ticket* ticket);
  int SubmitPull(uint64_t first_param, float* weights, uint64_t count, Ticket* ticket);
  int SubmitExchange(uint64_t first_param, const float* grad, float* out, uint64_t count, Ticket* ticket);
  int SubmitPush16(uint64_t first_param, const uint16_t* grad, uint64_t count, Ticket* ticket);
  int SubmitPull16(uint64_t first_param, uint16_t* weights, uint64_t count, Ticket* ticket);
  int SubmitExchange16(uint64_t first_param, const uint16_t* grad, uint16_t* out, uint64_t count, Ticket* ticket);

  // A ticket's outcome: result 0, or the negative errno and one-line
  // message the synchronous call would have returned. When a batch fails,
  // every ticket of that batch fails with its first error (which of their
  // requests reached the server is then unspecified, as after a failed
  // synchronous call); later submissions still run.
  struct Completion {
    Ticket ticket;
    int result;
    std::string error;
  };
  // Appends up to `max` completions to *out, in the order they ended, each
  // ticket exactly once. Waits up to `timeout_ms` (< 0: without limit) for
  // the first when none has ended; returns at once when nothing is
  // outstanding. Returns how many were appended (0 on timeout) or -ENOMEM.
  int Complete(std::vector<Completion>* out, size_t max, int timeout_ms);
  // Tickets submitted and not yet returned by Complete().
  size_t outstanding() const;
  // Ends the wait of a Complete() now waiting, or else of the next one, as
  // if its timeout had passed (it returns what has ended, maybe nothing).
  // The one method that any thread may call at any time, and the one that
  // does not wait for submissions: a thread that waits both for
  // completions and for work that others queue waits in Complete() without
  // limit, and the others call Wake() after queueing (doc/libblkps.md
  // "Streaming").
  void Wake();
  // Every other method first waits until no submission waits or runs (their
  // completions stay for Complete()), so synchronous calls, Sync() and the
  // counters below see every earlier submission done. The destructor waits
  // for them too.

  // fsync / SCSI SYNCHRONIZE CACHE: the server checkpoints the model durably
  // before this returns.
  int Sync();

  // Bytes of pushes the server acknowledged and then lost: it restarted
  // from a checkpoint taken before them (iscsi:// and layout: of blkps
  // targets; doc/libblkps.md "Faults"). Those gradients are not in the model; every
  // other push is applied exactly once, across reconnects. A restart is
  // noticed at the next I/O: after Sync() returns, every push made before it
  // is durable in the model or counted here.
  uint64_t pushed_bytes_lost() const;

  // Lost iSCSI sessions re-established (all shards of a layout: summed),
  // and the seconds spent reconnecting, a failed attempt included; 0 for
  // a file. Like every method, read between calls by the thread making
  // them (a learner's metrics copy them after each call).
  uint64_t reconnects() const;
  double reconnect_seconds() const;

  // On a control LUN (blkps/control_lun.h): reads its counters record into
  // *out. Returns 0, a read's negative errno, or -EPROTO (*out untouched) if
  // the device holds no record of this format.
  int ReadControlCounters(blkps_control_counters* out);

  // On a control LUN: reads the receipt (blkps/control_lun.h) that the
  // server keeps for this session's initiator name on learner LUN `lun`,
  // a device of `device_bytes`: its header into *header and, if `counts` is
  // not null, its per-512-byte-unit counters (ceil(device_bytes / 512) of
  // them) into *counts. Returns 0, a read's negative errno, or -EPROTO if
  // the device holds no receipt of this format for `lun`.
  int ReadControlReceipt(uint32_t lun, uint64_t device_bytes, blkps_control_receipt* header,
                         std::vector<uint32_t>* counts);

  uint64_t size_bytes() const;  // a multiple of logical_block_size()
  uint32_t logical_block_size() const;
  // The parameters the device holds: size_bytes() / bytes per parameter
  // (4, or 2 on a 16-bit device; the model may be smaller: the device's
  // size is rounded up to whole blocks).
  uint64_t param_capacity() const;
  // The dtype in effect: "float32", "bfloat16" or "float16".
  const char* dtype() const;
  // The request size and queue depth in effect, after defaults and caps;
  // Exchange's request size (OpenOptions::request_bytes).
  uint64_t request_bytes() const { return request_bytes_; }
  uint64_t exchange_request_bytes() const { return exchange_request_bytes_; }
  uint32_t queue_depth() const { return queue_depth_; }

  // Message of the last failed call (successful calls leave it); empty if
  // none has failed.
  const std::string& last_error() const { return last_error_; }

 private:
  Model(std::unique_ptr<Device> device, uint64_t request_bytes, uint64_t exchange_request_bytes, uint32_t queue_depth,
        wire::Dtype dtype);

  // Records a failure in last_error_; returns 0 or the negative errno.
  int Record(const Status& status);
  // Pull's 16-bit transfer into wire_buffer_, widened into `weights`.
  Status PullWidening(uint64_t offset, float* weights, uint64_t count);
  // Exchange's transfer of `length` device bytes at `offset`: pushes from
  // `sent` and pulls into `received` (which may be `sent`), in requests of
  // exchange_request_bytes_; `arrived` (may be null) gets each pull
  // request's device byte range [from, to) as it completes, on this thread.
  using RangeFn = std::function<void(uint64_t from, uint64_t to)>;
  Status ExchangeBytes(uint64_t offset, uint64_t length, void* sent, void* received, const RangeFn* arrived);
  // -EINVAL naming the first of `grad`'s 16-bit values that is not finite.
  Status CheckFinite16(const char* operation, uint64_t first_param, const uint16_t* grad, uint64_t count) const;
  // Widens wire_buffer_'s values of device bytes [from, to), clipped to a
  // 16-bit transfer of `length` bytes at device byte `offset` whose values
  // go to out (out[0]: the value at `offset`).
  void WidenPart(uint64_t offset, uint64_t length, float* out, uint64_t from, uint64_t to);
  // Narrows `grad` into *out; -EINVAL naming the first value that is
  // not finite in the device's type. `operation` names the call.
  Status Narrow(const char* operation, uint64_t first_param, const float* grad, uint64_t count,
                std::vector<uint16_t>* out) const;
  // The submission behind every Submit*: a push of `grad` (null: none) and
  // a pull into `out` (null: none) of the same range; `values16`: the
  // caller's values are the device's 16-bit ones.
  int Submit(const char* operation, uint64_t first_param, uint64_t count, const void* grad, void* out, bool values16,
             Ticket* ticket);
  // Waits until the stream, if any, leaves the device to this thread.
  void Settle() const;

  std::unique_ptr<Device> device_;
  uint64_t request_bytes_;
  uint64_t exchange_request_bytes_;  // Exchange's; request_bytes_ when the user chose one
  uint32_t queue_depth_;
  wire::Dtype dtype_;
  std::vector<uint16_t> wire_buffer_;  // 16-bit devices: the values on the wire
  // pull_rows/push_rows: a batch's distinct rows, kept between batches up
  // to 64 MiB (model.cc KeepRowValues).
  std::vector<float> row_values_;
  std::string last_error_;
  // Made with the Model (its thread starts with the first submission);
  // destroyed before device_, which it uses.
  std::unique_ptr<Stream> stream_;
  Ticket next_ticket_ = 1;
};

}  // namespace blkps

#endif  // BLKPS_MODEL_HPP_
