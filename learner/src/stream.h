// Stream: a Model's submissions (Model::SubmitPush, SubmitPull,
// SubmitExchange and their 16-bit forms) that return at once with a ticket
// and complete later, in any order, on the stream's own thread.
//
// Why: a synchronous call drains every connection before it returns, so the
// next call starts on empty queues and pays the pipeline's fill and drain
// again (bench/call_cost_bench.cc measures it). The stream takes every
// submission waiting when its device is free and runs them as one device
// batch: the requests of all of them share the queue_depth slots, and the
// queues drain only when nothing more was submitted.
//
// Batches. A batch is the longest run of waiting submissions, in submission
// order, of one kind (push, pull or exchange) whose device blocks do not
// overlap: so submissions of different kinds, and submissions that touch a
// common block, run one after the other in submission order, and within a
// batch no two writes start at one receipt unit (what a reconnect's
// exactly-once resend needs, iscsi_device.h). A batch runs through the
// Device's Transfer or Exchange, which reconnect and resend exactly once as
// for a synchronous call.
//
// Failure: when a batch fails (the device's first failed request), every
// ticket of the batch completes with that error: as after a failed
// synchronous call, which of its requests reached the server is
// unspecified (a gradient is still never applied twice). Later batches run.
//
// Thread-safety: Submit, Complete, WaitIdle and outstanding() are called by
// the Model's one user thread at a time; Wake() by any thread. The stream's
// thread (started by the first Submit) alone touches the Device while a
// submission is waiting or running. WaitIdle() hands the Device back to the
// caller's thread.

#ifndef BLKPS_LEARNER_STREAM_H_
#define BLKPS_LEARNER_STREAM_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "blkps/wire_dtype.hpp"
#include "device.h"
#include "status.h"
#include "transfer_plan.h"

namespace blkps {

// One submitted transfer, planned by the Model at submission (its range
// checked, its 16-bit values narrowed); the caller's memory that the plans
// point at stays the caller's until the ticket completes.
struct Submission {
  enum class Kind { kPush, kPull, kExchange };
  uint64_t ticket = 0;
  Kind kind = Kind::kPush;
  uint64_t first_block = 0, end_block = 0;    // device blocks touched, [first, end)
  std::unique_ptr<TransferPlan> write, read;  // as the kind needs
  // A float32 submission on a 16-bit device: the values on the wire,
  // owned here, and where a pull's are widened to once it completes.
  std::vector<uint16_t> wire;
  float* widen_to = nullptr;
  wire::Dtype dtype = wire::Dtype::kFloat32;
};

struct StreamCompletion {
  uint64_t ticket;
  Status status;
};

class Stream {
 public:
  // `device` outlives the stream. Starts no thread yet.
  Stream(Device* device, uint32_t queue_depth);
  // Waits for every submission to end, then stops the thread.
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Queues `submission`; returns at once. Throws std::bad_alloc, and
  // std::system_error when the stream's thread cannot be started.
  void Submit(std::unique_ptr<Submission> submission);

  // Moves up to `max` ended submissions' outcomes to `out`, in the order
  // they ended; waits up to `timeout_ms` (< 0: without limit) for the first
  // when none has ended. Returns how many were moved: 0 on timeout, and at
  // once when nothing is outstanding or after a Wake().
  size_t Complete(std::vector<StreamCompletion>* out, size_t max, int timeout_ms);

  // Ends the wait of a Complete() now waiting, or else of the next one, as
  // if its timeout had passed: a caller that also waits for work of its own
  // (a queue that another thread fills) waits in Complete() without limit
  // and has the filling thread call Wake() after each item, instead of
  // polling with a short timeout. A Complete() that returns, for whatever
  // reason, takes every Wake() made before it.
  void Wake();

  // Waits until no submission waits or runs (ended ones may still wait for
  // Complete): the caller's thread may then use the Device.
  void WaitIdle();

  // Submitted and not yet returned by Complete.
  size_t outstanding() const;

 private:
  void Run();
  // The next batch, taken off waiting_. REQUIRES: mutex_ held, waiting_ not
  // empty.
  std::vector<std::unique_ptr<Submission>> TakeBatch();
  Status RunBatch(const std::vector<std::unique_ptr<Submission>>& batch);

  Device* const device_;
  const uint32_t queue_depth_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::unique_ptr<Submission>> waiting_;  // guarded by mutex_
  std::deque<StreamCompletion> ended_;               // guarded by mutex_
  size_t running_ = 0;                               // guarded by mutex_: in the batch on the device
  bool stop_ = false;                                // guarded by mutex_
  bool woken_ = false;                               // guarded by mutex_: a Wake() not yet taken
  std::thread thread_;                               // guarded by mutex_: started by the first Submit
};

}  // namespace blkps

#endif  // BLKPS_LEARNER_STREAM_H_
