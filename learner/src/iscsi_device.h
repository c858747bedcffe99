// IscsiDevice: the model device as a LUN reached through libiscsi, one
// session per device: iscsi:// over TCP, iser:// over RDMA. Opened by
// OpenIscsiDevice (device.h, iscsi_session.cc).
//
// Data moves as READ(16)/WRITE(16) commands whose scsi_iovecs point at the
// caller's memory (zero copy), queue_depth of them in flight, driven by poll()
// on the context's descriptor (iscsi_device.cc).
//
// Exactly-once writes (doc/libblkps.md "Faults"; iscsi_reconnect.cc). A write
// is a gradient: resending one the server has already applied counts it twice.
// So the device, not libiscsi, reconnects a dropped session (libiscsi would
// resend every command in flight): it logs in again, fences its old writes
// (the control LUN's fence=<lun>:<the ended session's token>: held ones
// fail, and any of that session that tgtd reads only now is refused), waits
// until the server has none in progress, reads its receipt (how many of its writes starting at each
// 512-byte unit the server has applied; blkps/control_lun.h) and resends only
// the writes the receipt lacks. Reads and syncs are resent as they are. The
// device keeps what it expects the receipt to say (expected_); after a target
// restart from a checkpoint the receipt is the checkpoint's, and writes it
// acknowledged that the receipt lacks were lost with the server's memory:
// counted in writes_lost() and said on stderr. A LUN with several replicas
// (a layout's replica lines) reconnects to the first that serves, from the
// current one on, and reads the receipt there: a backup holds every write
// its primary acknowledged (doc/replicas.md "Learners follow a failover").
// Without a control LUN (a target
// not made by blkps) the device resends every write in flight, as libiscsi
// would.
#ifndef BLKPS_LEARNER_ISCSI_DEVICE_H_
#define BLKPS_LEARNER_ISCSI_DEVICE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "blkps/control_lun.h"
#include "device.h"
#include "iscsi_session.h"

namespace blkps::iscsi {

// One SCSI command in flight; OnCommandDone fills in the outcome.
struct Command {
  scsi_task* task = nullptr;  // nullptr: this slot is free
  size_t index = 0;           // which of the batch's commands
  bool done = false;
  int status = SCSI_STATUS_GOOD;
  scsi_sense sense{};
  std::string transport_error;  // libiscsi's message when status says so
  std::chrono::steady_clock::time_point started;
};

// libiscsi's callback for every command of a batch: fills in the Command
// its private data points at.
void OnCommandDone(iscsi_context* iscsi, int status, void* command_data, void* private_data);

// The reconnect deadline: BLKPS_RECONNECT_SECONDS (seconds > 0) if set, else
// the default for a device of `device_bytes`.
Status ReconnectSeconds(uint64_t device_bytes, double* seconds);

class IscsiDevice : public Device {
 public:
  // Takes ownership of the logged-in context, a session with replica
  // `replica` of spec.replicas that logged in with token `session`
  // (NewSessionToken). `control_lun`: the target's control LUN, whose
  // receipts make writes exactly-once; -1 if none.
  IscsiDevice(iscsi_context* iscsi, uint64_t session, SessionSpec spec, size_t replica, uint64_t size_bytes,
              uint32_t block_size, uint64_t default_request_bytes, uint64_t max_request_bytes, int control_lun)
      : iscsi_(iscsi),
        session_(session),
        spec_(std::move(spec)),
        replica_(replica),
        name_(spec_.name),
        lun_(spec_.lun),
        size_bytes_(size_bytes),
        block_size_(block_size),
        default_request_bytes_(default_request_bytes),
        max_request_bytes_(max_request_bytes),
        control_lun_(control_lun) {}

  ~IscsiDevice() override {
    if (iscsi_ == nullptr) return;
    if (lost_.ok() && iscsi_is_logged_in(iscsi_)) LogOut();
    // Runs the callbacks of commands libiscsi still holds (after a lost
    // connection); they land in commands_, which is still alive.
    iscsi_destroy_context(iscsi_);
    FreeTasks();
  }

  uint64_t size_bytes() const override { return size_bytes_; }
  uint32_t logical_block_size() const override { return block_size_; }
  uint64_t default_request_bytes() const override { return std::min(default_request_bytes_, max_request_bytes_); }
  uint64_t max_request_bytes() const override { return max_request_bytes_; }
  // Over TCP, no larger than the first burst: such a write goes whole as
  // immediate data and never waits for an R2T queued behind the Data-In of
  // the reads on the same connection. (iSER moves all data by RDMA.)
  uint64_t default_exchange_request_bytes() const override;
  uint64_t pushed_bytes_lost() const override { return pushed_bytes_lost_; }
  uint64_t table_width() const override { return table_width_; }
  bool table_hashed() const override { return table_hashed_; }
  // A table on a blkps server: its control LUN's row windows
  // (iscsi_row_windows.cc).
  bool has_row_windows() const override { return control_lun_ >= 0 && table_width_ > 0; }
  Status TransferRows(Direction direction, const uint64_t* ids, uint64_t n, uint64_t width, float* rows,
                      uint32_t queue_depth) override;
  uint64_t reconnects() const override { return reconnects_; }
  double reconnect_seconds() const override { return reconnect_seconds_; }

  Status Transfer(Direction direction, const std::vector<IoRequest>& requests, uint32_t queue_depth) override;
  Status ReadConsuming(const std::vector<IoRequest>& requests, uint32_t queue_depth, const ConsumeFn& consume) override;
  // Writes and reads share the queue_depth slots: read k is queued (ahead
  // of the writes not yet started) when write k ends GOOD, or when a
  // reconnect finds write k applied.
  Status Exchange(const std::vector<IoRequest>& writes, const std::vector<IoRequest>& reads, uint32_t queue_depth,
                  const ConsumeFn* consume) override;
  Status Sync() override;

  // Reads this session's receipt into *counts (one per unit of the device).
  // REQUIRES: control_lun_ >= 0 and no command in flight.
  Status ReadReceipt(std::vector<uint32_t>* counts, blkps_control_receipt* header, Deadline deadline = kNoDeadline);
  // The receipt is what the device expects from now on.
  void ExpectReceipt(std::vector<uint32_t> counts) { expected_ = std::move(counts); }
  // Reads the table's width and whether it is hashed from the control LUN's
  // counters into table_width() and table_hashed() (0 and false from a
  // server whose record has none). REQUIRES:
  // control_lun_ >= 0 and no command in flight.
  Status ReadTableWidth();

 private:
  // Queues command `index` with OnCommandDone and `command` as its callback
  // data; returns the task, or nullptr when libiscsi refuses it.
  using StartFn = std::function<scsi_task*(size_t index, Command* command)>;
  // Names command `index` for messages.
  using DescribeFn = std::function<std::string(size_t index)>;

  // `writes`: the batch's write requests, or null when it has none; commands
  // [0, writes->size()) are writes. With `exchange`, the batch is an
  // Exchange: commands [N, 2N) (N = writes->size()) are reads, command N + k
  // started only after write k ended GOOD (or was found applied by a
  // reconnect). `consume`: called with read k's index among the reads as it
  // ends GOOD, or null.
  Status RunCommands(size_t count, uint32_t queue_depth, const StartFn& start, const DescribeFn& describe,
                     const std::vector<IoRequest>* writes, const ConsumeFn* consume = nullptr, bool exchange = false);
  // Transfer and ReadConsuming (`consume` null for Transfer).
  Status RunRequests(Direction direction, const std::vector<IoRequest>& requests, uint32_t queue_depth,
                     const ConsumeFn* consume);
  Status Service();
  // The session dropped (or, with several replicas, its replica answered
  // standby) and every command of it has ended; `dropped` lists the batch's
  // commands that were in flight or refused as standby. Logs in again, to
  // the first replica that serves from the current one on (the next one on
  // if `silent`), and stores in
  // *resend those to send again: all of them, except writes (commands
  // [0, writes->size())) that the receipt shows applied.
  // `silent`: the replica left no answer (kReplicaSilenceSeconds): the
  // next replica is tried first, this one last.
  Status Reconnect(const std::vector<size_t>& dropped, const std::vector<IoRequest>* writes,
                   std::vector<size_t>* resend, bool silent);
  // Fences this initiator's writes on the server, the session with token
  // `ended` included, and waits until none is in progress; then reads the
  // receipt. Gives up at `deadline`.
  Status FenceAndReadReceipt(uint64_t ended, std::vector<uint32_t>* counts, Deadline deadline);
  void FreeTasks();
  void LogOut();

  iscsi_context* iscsi_;  // null while reconnecting failed
  uint64_t session_;      // the token iscsi_'s session logged in with
  const SessionSpec spec_;
  size_t replica_;  // which of spec_.replicas the session is with
  const std::string& name_;
  const int lun_;
  const uint64_t size_bytes_;
  const uint32_t block_size_;
  const uint64_t default_request_bytes_;
  const uint64_t max_request_bytes_;
  const int control_lun_;

  // Slots for the commands in flight. libiscsi keeps pointers to them until
  // each command completes, so they live as long as the context.
  std::vector<Command> commands_;
  // Set once the session is lost for good: the device refuses further work.
  Status lost_;
  bool logout_done_ = false;  // set by the LOGOUT's callback
  // Per 512-byte unit: how many of this session's writes starting there the
  // server has applied, as far as the device knows (receipts only).
  std::vector<uint32_t> expected_;
  // Lost writes in bytes (pushed_bytes_lost). Which writes a restart lost
  // is known by unit: the last `behind` acknowledged at each unit. Their
  // lengths differ where the writes starting at a unit do (a table's runs
  // of rows), so the device keeps, per unit, the caller's bytes (padding
  // aside) of every write acknowledged since the last durable point (a
  // Sync that returned GOOD, or a restart: the server then holds only its
  // checkpoint), as runs of equal lengths. Beyond kMaxUnsyncedRuns runs in
  // all (a learner that pushes rows of many lengths and never syncs) a
  // unit's new length extends its last run; the total is then approximate,
  // said once on stderr.
  struct LengthRun {
    uint64_t length;
    uint64_t count;
  };
  static constexpr size_t kMaxUnsyncedRuns = size_t{1} << 20;
  void RecordWriteLength(uint64_t unit, uint64_t length);
  // Bytes of the last `behind` writes acknowledged at `unit`.
  uint64_t LostBytes(uint64_t unit, uint64_t behind) const;
  void ForgetUnsyncedLengths();
  std::unordered_map<uint64_t, std::vector<LengthRun>> unsynced_lengths_;
  size_t unsynced_runs_ = 0;
  bool said_lengths_approximate_ = false;
  // The caller's bytes in the last write acknowledged at each unit: the
  // length of lost writes older than the runs above.
  std::unordered_map<uint64_t, uint64_t> write_length_;
  uint64_t pushed_bytes_lost_ = 0;
  uint64_t table_width_ = 0;   // see table_width()
  bool table_hashed_ = false;  // see table_hashed()

  // Row windows (iscsi_row_windows.cc; blkps/control_lun.h "Row windows").
  // Per window of this device's LUN: the last sequence this device gave a
  // request (pushes and pulls share it; a window's pushes must rise), and
  // the rows of its pushes the server acknowledged, as its state's
  // rows_applied should count them. Read from the server on first use, so
  // that a learner reopening the model under the same initiator name goes
  // on where it was; checked again after a reconnect: a restart from an
  // older checkpoint shows fewer rows applied, and the difference is lost
  // (pushed_bytes_lost).
  struct RowWindowCursor {
    uint64_t sequence = 0;
    uint64_t rows_acknowledged = 0;
  };
  // One window request: the bytes written (header, ids, a push's rows) and,
  // for a pull, the bytes read back (state, then rows).
  struct RowWindowRequest;
  // Reads every window's state into `cursors` (on first use) or compares
  // them (after a reconnect) and counts lost rows of `row_bytes`.
  Status SyncRowWindows(uint64_t row_bytes);
  // Runs `count` commands of one direction on the control LUN, starting
  // at the given windows' offsets, each with its own buffer.
  Status RunWindowCommands(Direction direction, const std::vector<RowWindowRequest>& requests, uint32_t queue_depth);
  std::vector<RowWindowCursor> row_windows_;  // empty until first use
  // Each window's request buffer, kept between batches (up to 4 MiB each):
  // fresh megabytes a batch cost the learner page faults (a quarter of its
  // time in perf).
  std::vector<std::vector<uint8_t>> row_window_buffers_;
  uint64_t row_windows_reconnects_ = 0;  // reconnects_ when last synced
  uint64_t row_window_tags_ = 0;         // the last tag given; see TransferRows
  uint64_t reconnects_ = 0;              // sessions re-established
  double reconnect_seconds_ = 0;         // time spent in Reconnect, failures included
  bool said_no_receipts_ = false;
};

}  // namespace blkps::iscsi

#endif  // BLKPS_LEARNER_ISCSI_DEVICE_H_
