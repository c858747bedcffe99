// Job: one training job's server side — the model, its learner slots and
// their clocks, consistency control (async / bsp / ssp), learner liveness,
// checkpoints, and the status and controls people read and set.
//
// Who calls what (the tgt plugin, in target-plugin/lu.cc):
//   - tgtd's main thread: AddLearner / RemoveLearner, Admit, TakeReleased.
//     These never wait for I/O or model work: only for the Job's own short
//     critical sections.
//   - tgt's worker threads: Read, Write, Checkpoint, and the control calls,
//     concurrently.
//   - the Job's own ticker thread: hold limits, liveness, bsp rounds freed by
//     a death, periodic checkpoints.
//
// Holding commands (holds.h). A read (or a bsp write, or an ssp write past a round
// boundary being written) that may not run yet is kept by the Job, never by
// a blocked thread: Admit() returns kHold and keeps the caller's opaque
// command pointer. When it may run, or when it has waited
// hold_limit, the Job puts it on its slot's released list and calls the
// slot's wake callback; the caller's main thread then takes it with
// TakeReleased() and runs it (OK) or fails it (DeadlineExceeded or
// Unavailable, with a message for the log).
//
// Liveness. A learner slot is live from AddLearner until it has had no I/O
// for dead_after seconds while none of its commands was held; it is then
// declared dead (logged), and bsp/ssp go on with the live learners. Its next
// I/O rejoins it (logged). When the dead reach max_dead (if set), the job
// fails: every learner I/O returns Unavailable with the reason, and status
// says why, until a control command `resume=1`; then it goes on with the
// live learners, and fails again when another learner dies.
//
// Receipts (receipts.h; exactly-once pushes; doc/libblkps.md "Faults"). For every learner slot
// and initiator the Job counts the writes it has applied, by the 512-byte
// unit each write starts at. A learner whose connection dropped reads its
// receipt (the control LUN's receipts region, blkps/control_lun.h) after
// reconnecting and resends only the writes it does not show; a fence first
// fails that initiator's held writes, and writes_in_progress says when the
// ones already running have finished. A gradient and its receipt count are
// one step for checkpoints: a checkpoint's instant comes when the running
// writes have finished, with new ones held back for that moment, so a
// restarted server's receipts are exactly its checkpoint's. Each slot keeps the receipts of its kReceiptsPerSlot most
// recently active initiators (a read, a write admitted or ended);
// an older one, with no write in progress, is dropped, in memory and from
// the next checkpoint. A learner's receipt therefore survives its reconnects
// unless that many other initiator names have used its LUN meanwhile.
//
// Tables (model.h "Tables"; CheckTableJob). A table job is async, applies
// pushes as written, and shows its shape and rows made in status ("table";
// null for a dense model).
//
// Hashed tables (job_hashed_table.cc; doc/embeddings.md "Hashed ids"). A
// job with hashed_capacity keeps its rows in a HashedTable, keyed by any
// 64-bit id, and serves them through the row windows only: a learner LUN's
// plain READ and WRITE are refused (the plugin says so), the model is a
// one-row stand-in that only sizes the LUNs. Status "table" shows its
// capacity, rows made, eviction rule and evictions. A checkpoint holds the
// rows made (section "hashed.rows", at the same instant as the receipts).
// Not yet sharded: CheckTableJob refuses shard= for one.
//
// Checkpoints (doc/server.md "Checkpoints"). Checkpoint() writes the
// weights, the rule's state and parameters, the bsp accumulator, every
// clock and the receipts, all as at one instant, to the checkpoint file
// (durably: temporary file, fsync, rename; checksummed), as the next
// generation of the job's checkpoint set (checkpoint_set.h): a scaled-out
// job's shard writes its part, and commits the generation if its part was
// the last one missing. Writes wait only
// for the instant (the running writes finish, every block is locked for a
// moment: a Model::Snapshot is taken); then they go on while the snapshot
// is written, reads always do. Create() loads an existing checkpoint; a
// corrupt one, or one written for another geometry, rule or mode, fails
// Create().
//
// One round on every shard (doc/server.md "One round on every shard"). A
// scaled-out bsp or ssp job (shards > 1) takes each generation at a round
// boundary R, the same on every shard, so that a restored job is one model
// at one round: a learner's fsync asks for R = its own iteration (it has
// pushed its whole gradient to every shard before it syncs, so every shard
// hears the same R); a control checkpoint=1 for R = the highest round any
// block of the shard has reached (ssp: the furthest iteration a live
// learner pushes towards). A shard at R already written answers at once.
// The request waits (at most hold_limit) until the shard is at R, then
// writes the part; a shard already past R fails the request.
//   bsp: every block has finished round R. The part holds the weights and
//   rule state after round R, and leaves out what was given towards round
//   R+1 (others' pushes that came before the request): the round's sum,
//   those gradients on the clocks, and those writes on the receipts, which
//   a restart then reports as lost. Rounds never go past R meanwhile: round
//   R+1 needs the asking learner's next gradient.
//   ssp: every live learner has given exactly R gradients of every block.
//   Pushes are applied on arrival, so nothing can be left out: from the
//   request until the part is written, a write towards an iteration past R
//   is held (job_holds.cc), and the slower learners catch up meanwhile.
// A set of one and async keep the instant above.
//
// The code, by what it does:
//   job.cc             lifetime and learner slots
//   job_holds.cc       admission: whether a command may run now, held
//                      commands and their release; the held and released
//                      commands themselves are an object (holds.h)
//   job_gradients.cc   reads, gradient writes and bsp rounds
//   job_liveness.cc    the ticker: hold limits, dead learners, max_dead,
//                      periodic checkpoints
//   job_checkpoint.cc  the job's state to and from a checkpoint file
//   job_status.cc      status JSON and the control LUN's counters
//   job_control.cc     control commands (lr=..., resume=1, fence=<lun>)
//   job_receipts.cc    receipts: the write gate, counting applied writes,
//                      reading them, fences; the receipts themselves, their
//                      bound and checkpoint section are an object of their
//                      own (receipts.h), as the clocks are (learner_clocks.h)
//   job_round_boundary.cc  a scaled-out bsp or ssp job's checkpoints at one
//                      round on every shard
//   job_row_windows.cc row windows: a table's rows in batches, one command
//                      each way, with a receipt per batch (below)
//   job_hashed_table.cc  a hashed table: its creation, checks and status
//   job_replica.cc     replicas: a primary's pushes sent to its backup, a
//                      backup's records applied, promotion (the records
//                      themselves: replication.h), and a leased primary's
//                      fence (lease_fence.h)
//   job_catch_up.cc    replicas: a returning backup caught up from a
//                      snapshot plus the stream, on both sides
//
// Row windows (blkps/control_lun.h "Row windows"). A table's rows also move
// in batches through windows on the control LUN, BLKPS_CONTROL_WINDOWS_PER_LUN
// per learner LUN. A window's state is kept per initiator beside its
// receipt (and dropped with it): the last push applied (sequence, tag, the
// batches and rows applied), checkpointed with the receipts, and the ids of
// the last pull, in memory only. A push runs inside the write gate: its
// rows and its window's counters are one step for checkpoints.
//
// Replicas (doc/replicas.md "Replicas"; replication.h). A primary
// (opts.replica_channel) sends, for every push it applied, the new state of
// the blocks it touched, with its receipt and clocks, and Write() returns
// only once the backup has applied it; if it cannot, the write fails and
// the job fails (nothing is acknowledged without the backup). A backup
// (opts.backup) is on standby: its learners' READ, WRITE and checkpoints
// are refused (Standby) and it applies its primary's records
// (ApplyReplica) until Promote(). A promoted backup has no backup (status
// `backup` says it is outdated) until the control command
// replicate_to=HOST:PORT names a new one, which it then catches up as a
// returning one (CatchUp). Async dense jobs only. A primary that
// holds a lease (control lease_until=, doc/replicas.md "Failover by a
// lease") admits and acknowledges learner writes only until the lease's
// deadline (LeaseFence); without lease_until= there is no such deadline.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backup_verdict.h"
#include "hashed_table.h"
#include "holds.h"
#include "learner_clocks.h"
#include "lease_fence.h"
#include "model.h"
#include "mutex.h"
#include "receipts.h"
#include "replication.h"
#include "status.h"

namespace blkps::server {

struct JobOptions {
  ModelOptions model;  // model.accumulator is set from the mode
  // A hashed table (table=hash:CAPACITY:WIDTH; "Hashed tables" below): its
  // capacity, 0 for none, and its eviction rule (evict=). Its model is a
  // one-row stand-in, model.table = {1, WIDTH}: the learner LUN's size.
  uint64_t hashed_capacity = 0;
  EvictionRule evict;
  ConsistencyOptions consistency;
  // bsp: blocks whose gradient comes in parts (CheckGradientParts;
  // doc/server.md "A gradient in parts").
  GradientParts parts;
  double dead_after_s = 10;  // no I/O this long: a learner is dead
  double hold_limit_s = 20;  // longest a command is held; under the
                             // initiators' ~30 s command timeout
  uint32_t max_dead = 0;     // dead learners that fail the job; 0: never
  std::string checkpoint;    // checkpoint file; empty: none
  // The checkpoint's identity (checkpoint_set.h): the job's id (empty: the
  // loaded set's, else a new one), this server's part of a scaled-out job
  // (shard of shards; shards 1: a set of one, the file `checkpoint`), how
  // many committed generations a scaled-out job keeps, and whether to start
  // a new job over an existing checkpoint instead of loading it.
  std::string job_id;
  uint32_t shard = 0, shards = 1;
  uint32_t keep_generations = 2;
  bool fresh = false;
  double checkpoint_every_s = 0;  // periodic checkpoints; 0: only on fsync
  // Replicas ("Replicas" below): a primary's channel to its backup (the
  // plugin makes it from replicate_to=), or this job is a backup (backup=).
  std::shared_ptr<ReplicaChannel> replica_channel;
  bool backup = false;
  // Where the control command replicate_to=HOST:PORT goes (the plugin: it
  // watches that address for a new backup and catches it up, Job::CatchUp);
  // its error refuses the command. Unset: the command is refused.
  std::function<Status(const std::string& address)> watch_new_backup;
  // Async and ssp (doc/server.md "Asynchronous training"): a push's staleness τ is
  // the number of other learners' updates applied to its block between the
  // pusher's last read of that block and the push. With staleness_aware, the push is
  // applied with UpdateRule::ApplyStale(τ) (staleness-aware steps, Zhang et
  // al. 2016); τ = 0 (one learner) applies it as written. bsp: never.
  bool staleness_aware = true;
  // A push with τ above this is counted (status stale_pushes) and its
  // learner told so in the log, once per slot until its pushes are fresh
  // again.
  uint64_t stale_bound = 32;
  // Tests only: called by the checkpoint writer before it reads each piece
  // (a few MiB) of a model array's section, with the section's name and the
  // piece's offset in it; writes go on meanwhile.
  std::function<void(const std::string& section, uint64_t offset)> checkpoint_hook;
};

// A table (opts.model.table, model.h "Tables") is served async only: bsp
// and ssp count a learner's iteration by whole model blocks written, and a
// batch writes a few rows. Its pushes are applied as written: staleness is
// counted per model block, not per row, so staleness_aware is off. Returns
// InvalidArgument with a one-line reason for a table job that asks for
// anything else; OK for a dense one.
Status CheckTableJob(const JobOptions& opts);
// Replicas ("Replicas" below): a primary (`primary`: it has a backup) or a
// backup (opts.backup) serves an async dense model only for now; not both.
// InvalidArgument with a one-line reason, naming the option; OK for a job
// without replicas.
Status CheckReplicaJob(const JobOptions& opts, bool primary);

class Job {
 public:
  using Logger = std::function<void(const std::string&)>;

  // Creates the model (loading `opts.checkpoint` if that file exists) and
  // starts the ticker. `name` names the job in status and logs; `log`
  // receives one line per event (learner dead or back, job failed, a hold
  // limit hit, checkpoint written). On failure returns non-OK with a one-line
  // reason and leaves *out untouched.
  static Status Create(const std::string& name, const JobOptions& opts, Logger log, std::shared_ptr<Job>* out);

  // Bytes of memory the model of a job with `opts` needs (Model::MemoryBytes
  // with the mode's accumulator; for a hashed table, its stand-in's plus the
  // table's fixed part, HashedTable::StartBytes): what Create() checks
  // against the available memory or memory=. Tools ask it for co-located
  // shards, which share one host's memory (blkps-bsopts). Non-OK with the
  // reason for an unknown rule.
  static Status MemoryBytes(const JobOptions& opts, uint64_t* out);
  ~Job();
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  const std::string& name() const { return name_; }
  const JobOptions& options() const { return opts_; }
  uint64_t size_bytes() const { return model_->size_bytes(); }

  // Adds the learner slot served by LUN `lun` and returns its index. A slot
  // for that LUN in a loaded checkpoint is taken over, clocks and all.
  // `wake` is called, possibly from any thread and with the Job's lock held
  // (so it must not call the Job), when the slot has released commands.
  // `dtype` is the LUN's wire type as status shows it (the job itself
  // always sees float32).
  size_t AddLearner(uint64_t lun, std::function<void()> wake, const std::string& dtype = "float32");
  // The slot's LUN is going away: its held commands are dropped and it is
  // treated as dead.
  void RemoveLearner(size_t slot);

  enum class Admission { kRun, kHold };
  // Whether learner `slot`'s read or write of device bytes [offset,
  // offset + len) may run now. kHold: the Job keeps `cmd`. Counts the I/O
  // for liveness and status; a dead slot rejoins. `initiator` (the iSCSI
  // initiator name) keys the receipt; a write is in progress on it from
  // here until Write() returns or its hold fails.
  Admission Admit(size_t slot, bool write, uint64_t offset, uint64_t len, void* cmd, const std::string& initiator = "");
  using Released = Holds::Released;  // OK: run it now; otherwise fail it
  std::vector<Released> TakeReleased(size_t slot);

  // A learner's READ: the weights. Unavailable if the job has failed.
  Status Read(size_t slot, uint64_t offset, void* dst, size_t len);
  // The same READ as Model::ReadParams (the 16-bit wire's).
  Status ReadParams(uint64_t first, uint64_t count, const Model::TakeWeights& take);
  // A learner's WRITE: its gradient, applied per the consistency mode
  // (Model::ApplyGradient) and counted on the learner's clocks and on
  // `initiator`'s receipt. Errors as Model::ApplyGradient (nothing applied,
  // nothing counted), or Unavailable; DeadlineExceeded for a write of a
  // session a fence of its initiator ended (the learner reconnected and
  // resends what its receipt lacks). REQUIRES:
  // admitted by Admit() with the same slot and initiator name.
  Status Write(size_t slot, uint64_t offset, const void* src, size_t len, const Initiator& initiator = {}) {
    return Write(slot, offset, src, len, initiator, offset);
  }
  // The same, for a LUN whose device bytes are not the model's float32 bytes
  // (a 16-bit wire LUN): offset and len are the model's float32 device
  // bytes, src holds the gradient as `values` (Model::ApplyGradient), and
  // the receipt counts the write at `device_offset`, where the learner's
  // write started on its own device.
  Status Write(size_t slot, uint64_t offset, const void* src, size_t len, const Initiator& initiator,
               uint64_t device_offset, wire::Dtype values = wire::Dtype::kFloat32);
  // Durable checkpoint: the job's next generation; OK and nothing written
  // if no file is configured. A scaled-out job's shard returns once its
  // part is durable and, if it was the last part of its generation, the
  // generation is committed. On failure the generation fails (status
  // "checkpoint" "error" says so) and the committed one stays.
  Status Checkpoint();
  // The same, asked by learner `slot`'s fsync: in a scaled-out bsp or ssp
  // job at the round boundary of its iteration ("One round on every shard").
  Status Checkpoint(size_t slot);

  // Status as one JSON object (keys in blkps/control_lun.h, meanings in
  // doc/server.md, "Status and control").
  std::string StatusJson() const;
  // The numbers of the control LUN's counters record, taken together.
  struct Counters {
    uint64_t params = 0, blocks = 0, global_step = 0, updates = 0, rejected_writes = 0;
    bool failed = false;
    bool stop = false;
    uint64_t table_width = 0;       // a table's values per row; 0: a dense model
    uint64_t pushing_learners = 0;  // PushingLearnersLocked()
    bool table_hashed = false;      // a hashed table (opts.hashed_capacity)
  };
  Counters GetCounters() const;
  // Control commands, one `key=value` per line, then NUL padding:
  // a rule parameter (lr, momentum, beta1, beta2, eps), resume=1,
  // fence=<lun>[:<session>] (fails `initiator`'s held writes on learner LUN
  // <lun>, which must be one of this model's; with <session>, 16 lower-case
  // hex digits, the session that ended: its writes there are refused from
  // then on, Initiator::session), stop=1|0 (asks every learner to stop
  // training: status "stop", the counters record's stop; stop=0 withdraws
  // it; nothing else changes), or tag=<text>: an opaque label that
  // learners keep with the model (status "tag"; at most 256 of
  // [A-Za-z0-9._:,=+/-]; empty clears it; not saved in checkpoints).
  // blkps.torch keeps its model fingerprint there. Or checkpoint=1, alone
  // in its block: writes the job's next checkpoint generation, as fsync
  // does (`blkps target stop` asks every shard for its final one); its
  // failure is the write's, InvalidArgument without a checkpoint= file.
  // The grammar is strict: lines end with '\n' (the last one may not); keys
  // and values are printable ASCII without spaces; each key at most once;
  // after the first NUL only NULs. The block is parsed and checked whole,
  // then applied whole: a refused block (InvalidArgument naming the first
  // bad line) changes nothing. The status JSON's control_error holds that
  // reason until a write succeeds; control_refused counts the refusals.
  // A primary's rule parameters reach its backup before the block returns
  // (a PARAMS record: Replicate's waits and errors).
  // rank=<rank>:<run> is a collective rank's heartbeat (blkps.torch,
  // doc/pytorch.md "Horovod's API"): rank a number below
  // kMaxRanks, run 1 to 32 lower-case hex digits naming the run; status
  // "ranks" shows each rank's last one (the latest run's), so that ranks
  // waiting in a collective tell a dead rank from a slow one.
  // pipeline=<lun>:<depth> (depth 0 or 1, the LUN a learner's) is that
  // learner's pipeline depth: its pushes' staleness counts from its
  // depth-th read back (Slot::pipeline_depth;
  // doc/async.md "Pipelined learners").
  // With ControlRights::kLearner (the learners' control LUN) only the
  // commands a learner itself sends are taken: fence= (libblkps,
  // exactly-once after a reconnect), tag= (blkps.torch's fingerprint),
  // rank= and pipeline=; a block with any other line is refused whole with
  // PermissionDenied.
  enum class ControlRights { kOperator, kLearner };
  Status Control(const std::string& commands, const Initiator& initiator = {},
                 ControlRights rights = ControlRights::kOperator);

  // Receipts count writes by the unit of this many device bytes they start
  // at (blkps/control_lun.h's BLKPS_CONTROL_RECEIPT_UNIT).
  static constexpr uint64_t kReceiptUnit = Receipts::kUnit;
  // Ranks that control's rank= takes: 0 .. kMaxRanks - 1.
  static constexpr uint64_t kMaxRanks = 1 << 16;
  // Receipts kept per learner slot (see "Receipts" above).
  static constexpr size_t kReceiptsPerSlot = Receipts::kPerSlot;
  struct ReceiptNumbers {
    uint64_t writes_applied = 0;
    uint64_t writes_in_progress = 0;
  };
  // The receipt of `initiator`'s writes to learner LUN `lun`: counts[i] =
  // its writes applied that start at unit first_unit + i (mod 2^32), for
  // counts->size() units; zeros and no writes where there is none.
  ReceiptNumbers GetReceipt(uint64_t lun, const std::string& initiator, uint64_t first_unit,
                            std::vector<uint32_t>* counts) const;

  // Replicas ("Replicas" above; job_replica.cc). A backup: whether its
  // primary's HELLO matches this job (InvalidArgument saying what differs),
  // and one PUSH record applied (its blocks' newer states, its clocks, its
  // receipt). Both return Unavailable once promoted: a promoted backup
  // follows no one.
  Status CheckReplicaHello(const std::string& hello);
  Status ApplyReplica(const std::string& body);
  // A backup serves learners from now on, as a primary without a backup.
  // Unavailable if this job is not a backup on standby.
  Status Promote();
  // A primary without a backup (a promoted one, or one whose backup is
  // outdated): the control command replicate_to=ADDRESS, a new backup at
  // ADDRESS (opts.watch_new_backup). Unavailable on standby,
  // InvalidArgument if this primary has a backup or the address is refused.
  Status ReplicateTo(const std::string& address);
  // A primary whose backup was declared outdated: whether it is (for the
  // plugin, which then looks for the backup's return).
  bool BackupOutdated() const { return backup_.outdated(); }
  // A primary: catches up a backup that returned, reached through
  // `channel` (doc/replicas.md "A backup that returns"; job_catch_up.cc):
  // HELLO; at one instant (writes gated and drained, as for a checkpoint)
  // the counts, and from then on every write's record too; then every
  // block's state as at that instant, while training goes on. OK once the
  // backup is in sync again. FailedPrecondition unless the backup is
  // outdated; the channel's error (the backup stays outdated) if the
  // backup refuses or is lost. A checkpoint waits for a catch-up.
  Status CatchUp(std::shared_ptr<ReplicaChannel> channel);
  // A backup: a catch-up's SNAPSHOT_BEGIN and SNAPSHOT records
  // (wire/include/blkps/replication.h). Unavailable once promoted.
  Status BeginReplicaSnapshot(const std::string& body);
  Status ApplyReplicaSnapshot(const std::string& body);
  // A backup: a PARAMS record, the primary's rule parameters as control
  // lines (Control's errors). Unavailable once promoted.
  Status ApplyReplicaParams(const std::string& body);
  // A backup: a LIVENESS record: the learners its primary holds dead are
  // dead here, every other one live (a return rejoins it). InvalidArgument
  // for a LUN it does not serve; Unavailable once promoted.
  Status ApplyReplicaLiveness(const std::string& body);
  // A backup not promoted: learner I/O and checkpoints are refused.
  bool standby() const { return standby_.load(); }
  // What a backup on standby answers a learner's I/O or a checkpoint.
  static Status StandbyStatus();
  // ---- Row windows (job_row_windows.cc) ----
  // One batch of rows through window `window` of learner LUN `lun`, from
  // `initiator`: ids[0..count) of rows of `width` values; a push's rows
  // (count * width values, row k for ids[k]), null for a pull.
  struct RowBatch {
    uint64_t window = 0;
    uint64_t sequence = 0, tag = 0;
    const uint64_t* ids = nullptr;
    uint64_t count = 0, width = 0;
    const float* rows = nullptr;
  };
  // Checks the whole batch, then applies it (a push) or remembers its ids
  // (a pull). Refused with nothing applied and the window unchanged:
  // OutOfRange for an id past the table's end; InvalidArgument for a dense
  // model, no LUN `lun` or window, a width other than the table's, a push's
  // non-finite value, or a push's sequence that is neither above the
  // window's last nor that one resent (same tag: then OK, nothing applied);
  // ResourceExhausted for a push that needs rows a full hashed table cannot
  // make (HashedTable::PushRows); Unavailable if the job has failed. Each message is one line that says
  // what to do.
  Status PushRowBatch(uint64_t lun, const std::string& initiator, const RowBatch& batch);
  Status PullRowBatch(uint64_t lun, const std::string& initiator, const RowBatch& batch);
  // The numbers of a window as `initiator` sees it (all 0 where it has
  // none, or there is no such LUN or window), and rows [first_row, first_row + rows) of its last pull into
  // out (pull_width values each, the current weights; zeros past the pull's
  // count). Unavailable if the job has failed.
  struct RowWindowNumbers {
    uint64_t push_sequence = 0, push_tag = 0, pushes_applied = 0, rows_applied = 0;
    uint64_t pull_sequence = 0, pull_tag = 0, pull_count = 0, pull_width = 0;
  };
  Status ReadRowWindow(uint64_t lun, const std::string& initiator, uint64_t window, RowWindowNumbers* numbers,
                       uint64_t first_row, uint64_t rows, float* out);
  // Windows per learner LUN (BLKPS_CONTROL_WINDOWS_PER_LUN).
  static constexpr uint64_t kRowWindowsPerLun = 16;

  // The weights window: read, or set (e.g. initial weights). A primary's
  // set weights reach its backup before it returns (a SNAPSHOT record of
  // the parts set, replicated as a write's record is: Replicate).
  Status ReadWeights(uint64_t offset, void* dst, size_t len) const { return model_->Read(offset, dst, len); }
  Status AssignWeights(uint64_t offset, const void* src, size_t len);

 private:
  using Clock = std::chrono::steady_clock;
  static double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
  using HeldCommand = Holds::Command;
  using Receipt = Receipts::Receipt;
  struct Slot {
    uint64_t lun = 0;
    bool attached = false;  // a LUN serves it now
    std::string dtype;      // the LUN's wire type, for status
    Clock::time_point last_io;
    // Its last write's admission; never, before one. A slot that pushed
    // within dead_after takes part in the job's async steps
    // (PushingLearnersLocked).
    Clock::time_point last_push = Clock::time_point::min();
    // Counters for status.
    uint64_t reads = 0, writes = 0, bytes_read = 0, bytes_written = 0;
    uint64_t holds = 0, hold_timeouts = 0, deaths = 0;
    uint64_t lead_last = 0, lead_max = 0, lead_sum = 0, lead_count = 0;  // the lead of its reads
    // Push staleness (async/ssp): block versions at the slot's last read of
    // each block (kNeverRead before one), at its read before that (a read
    // that followed a push of its own to the block: its previous step's),
    // the slot's own complete gradients to it since the last read (they are
    // not stale to it), and what its pushes measured.
    std::vector<uint64_t> read_version, previous_step_read_version, own_since_read;
    // The learner's pipeline depth (control pipeline=<lun>:<depth>, 0 or 1):
    // its gradients are taken on the weights of its depth-th read back of a
    // block, so τ is counted from that read
    // (doc/async.md "Pipelined learners"). Not checkpointed: the learner
    // says it when it opens.
    uint64_t pipeline_depth = 0;
    uint64_t push_staleness_max = 0, push_staleness_sum = 0, pushes_measured = 0, stale_pushes = 0;
    bool told_stale = false;
  };

  Job(const std::string& name, const JobOptions& opts, Logger log, std::unique_ptr<Model> model);
  Status LoadCheckpoint();
  static constexpr size_t kNoSlot = ~size_t{0};
  // Writes the next generation; at round boundary `round` unless it is
  // kNoCheckpointRound (checkpoint_set.h). On failure the generation fails.
  Status WriteCheckpoint(uint64_t round);
  // A generation asked for fails before its instant: it uses its number up
  // (so the shards' numbers stay in step; at round boundary `round`, its
  // round's) and status says why.
  Status FailCheckpoint(const Status& why, uint64_t round);

  // One round on every shard (job_round_boundary.cc).
  // Whether generations are taken at round boundaries: a scaled-out bsp or
  // ssp job.
  bool RoundBoundaries() const;
  // Waits until the shard is at the round boundary a checkpoint asked by
  // `slot` (kNoSlot: control) is for, for at most hold_limit; *round gets
  // it. IOError if it does not come, or the shard is already past it. In
  // ssp, writes past *round are held from here until EndRoundBoundary(),
  // which the caller calls whatever this returns.
  // REQUIRES: RoundBoundaries().
  Status AwaitRoundBoundary(size_t slot, uint64_t* round);
  void EndRoundBoundary(uint64_t round);
  // The round a checkpoint asked by `slot` (kNoSlot: control) is for.
  uint64_t BoundaryAskedLocked(size_t slot) const REQUIRES(mu_);
  // Whether the shard has reached boundary R (it may be past it too).
  bool BoundaryReachedLocked(uint64_t R) const REQUIRES(mu_);
  // "" if no block (bsp) or live learner (ssp) is past R; else what is,
  // in words. Who keeps it from R, in words.
  std::string PastBoundaryLocked(uint64_t R) const REQUIRES(mu_);
  std::string BehindBoundaryLocked(uint64_t R) const REQUIRES(mu_);
  // "lun L<what>I, ..." for each live learner k that at(k) gives an
  // iteration I, in slot order.
  std::string LiveLearnersLocked(const std::string& what,
                                 const std::function<std::optional<uint64_t>(size_t)>& at) const REQUIRES(mu_);
  // "" if the shard is exactly at R (a checkpoint's instant); else why not.
  std::string NotAtBoundaryLocked(uint64_t R) const REQUIRES(mu_);
  // ssp: whether `slot`'s write of blocks [first_block, last_block] is
  // held by a round boundary being written (towards an iteration past it).
  bool HeldAtBoundaryLocked(size_t slot, uint64_t first_block, uint64_t last_block) const REQUIRES(mu_);
  // Whether every block is at one round (a periodic checkpoint's moment).
  bool AtOneRound() const;
  // The generation of round boundary R: numbered by its round, so that
  // every shard gives a round the same number whatever else it was asked.
  uint64_t RoundGeneration(uint64_t R) const;
  // The clocks as words (LearnerClocks::Save) as at round boundary R.
  std::vector<uint64_t> SaveClocksAtRoundLocked(uint64_t R) const REQUIRES(mu_);
  // Learner `slot`'s write `initiator` made, counted at receipt unit `unit`,
  // gave a gradient towards round `round` (its clock then).
  void RecordRoundWriteLocked(size_t slot, const std::string& initiator, uint64_t unit, uint64_t round) REQUIRES(mu_);
  // The receipts as words (Receipts::Save) as at round boundary R: the
  // writes towards rounds R+1 and later uncounted.
  std::vector<uint64_t> SaveReceiptsAtRoundLocked(uint64_t R) REQUIRES(mu_);
  // Write() without the gate and the receipt.
  // `push` (a primary's, else null) gets the new state of each block.
  Status ApplyWrite(size_t slot, uint64_t offset, const void* src, size_t len, wire::Dtype values,
                    ReplicaPush* push = nullptr);
  // ApplyWrite without the failed-job check.
  Status ApplyAdmittedWrite(size_t slot, uint64_t offset, const void* src, size_t len, wire::Dtype values,
                            ReplicaPush* push = nullptr);
  // A primary: sends `push` through `channel` and waits for the backup. If
  // it cannot be acknowledged, a leased primary waits for the backup's
  // verdict (backup_verdict.h) and acknowledges alone once the backup is
  // declared outdated, as it does every write from then on (and at once
  // where `channel` was catching a backup up, or was replaced); otherwise
  // (no lease, or no verdict in time) fails the job and returns
  // Unavailable.
  Status Replicate(ReplicaChannel::Record kind, const std::string& body, ReplicaChannel& channel);
  // A primary with a backup in sync or catching up: every rule parameter
  // as a PARAMS record, replicated as a write's record is (Replicate); OK
  // without one. REQUIRES: rule_params_mu_ held since the values were set.
  Status ReplicateRuleParams() REQUIRES(rule_params_mu_);
  // A primary with a backup in sync or catching up (the ticker's): the
  // learners dead now as a LIVENESS record, if they changed since the last
  // one the backup took; replicated as a write's record is (Replicate). OK
  // without a backup. (A catch-up's counts carry liveness in their clocks.)
  Status ReplicateLiveness() EXCLUDES(liveness_mu_, mu_);
  // OK unless this job holds a lease whose deadline passed (Standby, and
  // one log line per lapse).
  Status CheckLease();
  // Learner `slot`'s gradient for `n` parameters of block b was applied:
  // counted on its clocks; ssp's held commands that may pass are released;
  // a bsp round it completes is finished (FinishRoundIfCompleteLocked),
  // and the gradients to average returned (0: none), for the caller to
  // apply once it has released mu_. REQUIRES: b's write lock.
  uint32_t CountGradientLocked(size_t slot, uint64_t b, uint64_t n) REQUIRES(mu_);
  // A write of `initiator` is counted, applied (at `offset`'s unit) or not;
  // `round`: the round its gradient was towards (RoundBoundaries() only).
  // It is still in progress: a learner reading its receipt after a
  // reconnect waits, until EndWrite(), for its record to reach the backup.
  void FinishWrite(size_t slot, const std::string& initiator, uint64_t offset, bool applied, uint64_t round);
  // Write() returns: the write is no longer in progress on its receipt.
  void EndWrite(size_t slot, const std::string& initiator);
  // The row windows as words for a checkpoint section, and back.
  std::vector<uint64_t> SaveRowWindowsLocked() const REQUIRES(mu_);
  Status RestoreRowWindowsLocked(const std::vector<uint64_t>& words) REQUIRES(mu_);
  // The slot of learner LUN `lun`, or slots_.size().
  size_t SlotOfLunLocked(uint64_t lun) const REQUIRES(mu_);
  // Checks a batch against the table (ids, width, a push's values).
  Status CheckRowBatch(const char* what, const RowBatch& batch) const;
  // ---- Hashed tables (job_hashed_table.cc) ----
  // Makes hashed_ for a job with hashed_capacity (the model's rule, init and
  // memory bound); OK and nothing made for any other job.
  Status CreateHashedTable();
  // Rows by id, as the table's rule gives them: hashed_ or the model's.
  // REQUIRES: the batch passed CheckRowBatch.
  Status ReadTableRows(const uint64_t* ids, uint64_t count, float* out) const;
  // Sets a rule parameter (UpdateRule::SetParam) of the model's rule and,
  // for a hashed table, of its rows' rule: the two never differ.
  Status SetRuleParam(const std::string& key, float value);
  // Status "table": the object of BLKPS_STATUS_TABLE_KEYS, or null.
  std::string TableStatusJson() const;
  // The hashed table's rows made, with their rule state, its clock and
  // evictions, as words for the checkpoint's "hashed.rows" section (empty
  // for any other job), and back (InvalidArgument for malformed words or
  // rows that do not fit the table). REQUIRES: no push running (the write
  // gate closed, or at Create).
  std::vector<uint64_t> SaveHashedRows() const;
  Status RestoreHashedRows(const std::vector<uint64_t>& words);
  // fence=<lun>[:<ended_session>] of `initiator` (0: none named).
  void FenceLocked(uint64_t lun, const std::string& initiator, uint64_t ended_session) REQUIRES(mu_);
  // Whether `initiator`'s write on `slot` comes on a session a fence of
  // its name ended: DeadlineExceeded then, else OK.
  Status CheckNotFenced(size_t slot, const Initiator& initiator) const;
  // Writes hold the checkpoint gate while they apply and count a gradient;
  // Checkpoint and CatchUp close it (new writes wait) and wait for the
  // running ones, take their instant, and open it again.
  void EnterWriteGate();
  void LeaveWriteGate();
  void CloseWriteGate();
  void OpenWriteGate();
  void Tick();
  void TickerLoop();

  // Whether `slot`'s read or write of blocks [first_block, last_block] may
  // run now.
  bool MayPassLocked(size_t slot, bool write, uint64_t first_block, uint64_t last_block) const REQUIRES(mu_);
  // Moves held commands that may now run (or must fail) to their slots'
  // released lists and wakes those slots.
  void ReleaseLocked() REQUIRES(mu_);
  // The Job's part in releasing a held command with `status` (Holds::Release
  // does the rest): a read's lead is recorded, a failed write's receipt no
  // longer counts it in progress. Returns `status`.
  Status OnReleaseLocked(const HeldCommand& held, Status status) REQUIRES(mu_);
  // A new learner slot: in slots_ and in the parts kept by slot.
  void AddSlotLocked() REQUIRES(mu_);
  // A read of blocks [first_block, last_block] is admitted: its lead (ssp
  // staleness) and the blocks' versions it will see.
  void RecordLeadLocked(size_t slot, uint64_t first_block, uint64_t last_block) REQUIRES(mu_);
  // Async/ssp: the push staleness of `slot`'s push to block b, counted for
  // status and the guard rail; returns the staleness its gradient is
  // applied with (UpdateRule::ApplyStale; 0 without staleness_aware).
  uint64_t PushStalenessLocked(size_t slot, uint64_t b) REQUIRES(mu_);
  // The learners taking part in async steps at `now`: slots whose last push
  // is at most dead_after old (read-only and spare LUNs never count). The N
  // of doc/async.md: a push is applied as at least N-1 updates stale, and
  // blkps.torch scales its pushes by the same N (status and counters
  // "pushing_learners").
  size_t PushingLearnersLocked(Clock::time_point now) const REQUIRES(mu_);
  static constexpr uint64_t kNeverRead = ~uint64_t{0};
  bool FailedLocked() const REQUIRES(mu_) { return !failure_.empty(); }
  // Control's tag=: OK if `tag` may be one.
  static Status CheckTag(const std::string& tag);
  std::string WhoIsBehindLocked(const HeldCommand& held) const REQUIRES(mu_);
  // bsp: finishes block b's round if complete: releases what waited for it
  // and returns the number of gradients given, which the caller applies
  // with Model::ApplyAverageLocked once it has released mu_ (still holding
  // b's write lock, so that the readers released see the round's update);
  // 0 if the round is not complete. REQUIRES: b's write lock.
  uint32_t FinishRoundIfCompleteLocked(uint64_t b) REQUIRES(mu_);

  const std::string name_;
  const JobOptions opts_;
  const Logger log_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<HashedTable> hashed_;  // a hashed table's rows; null for any other job

  // Lock order: a model block's lock, then mu_; never the other way.
  // Which lock guards a member, and which a *Locked call needs, are
  // annotations (thread_annotations.h) that clang builds check.
  // A copy of the job's state (a checkpoint, a replica) holds
  // the model, clocks_ and receipts_ (with their row windows); holds_ are
  // the commands a server that takes over must have the learners resend.
  mutable Mutex mu_;
  LearnerClocks clocks_ GUARDED_BY(mu_);
  std::vector<Slot> slots_ GUARDED_BY(mu_);       // index = clocks_ learner
  Holds holds_ GUARDED_BY(mu_);                   // by slots_ index
  std::string failure_ GUARDED_BY(mu_);           // non-empty: failed
  std::string tag_ GUARDED_BY(mu_);               // control's tag=
  std::string control_error_ GUARDED_BY(mu_);     // why the last control write was refused
  uint64_t control_refused_ GUARDED_BY(mu_) = 0;  // control writes refused since the start
  bool stop_ GUARDED_BY(mu_) = false;             // control's stop=1
  // Control's rank= heartbeats: rank -> its run and when it last beat.
  struct RankBeat {
    std::string run;
    Clock::time_point last;
  };
  std::map<uint64_t, RankBeat> ranks_ GUARDED_BY(mu_);
  Receipts receipts_ GUARDED_BY(mu_);                    // by slots_ index
  std::condition_variable windows_cv_;                   // with mu_: a RowWindow stopped being busy
  bool rounds_may_be_complete_ GUARDED_BY(mu_) = false;  // a slot went away, or a promotion
  // A primary's LIVENESS records one at a time, in the order of the sets
  // they carry; the last set its backup took.
  Mutex liveness_mu_;  // taken before mu_
  std::vector<uint64_t> liveness_sent_ GUARDED_BY(liveness_mu_);
  std::atomic<bool> failed_{false};  // failure_ non-empty, for the data path
  // RoundBoundaries(): the writes applied towards rounds the shard has not
  // finished on every block (older ones are pruned), and a wake-up for
  // checkpoints waiting for a round.
  struct RoundWrite {
    Receipts::Write write;
    uint64_t round;
  };
  std::vector<RoundWrite> round_writes_ GUARDED_BY(mu_);
  size_t round_writes_prune_at_ GUARDED_BY(mu_) = 64;
  std::condition_variable round_cv_;                  // with mu_: a round finished
  uint32_t checkpoints_waiting_ GUARDED_BY(mu_) = 0;  // in AwaitRoundBoundary
  uint64_t waiting_round_ GUARDED_BY(mu_) = 0;        // the round the last of them waits for
  // ssp: round boundary -> checkpoints between their AwaitRoundBoundary
  // and EndRoundBoundary. Writes past the lowest are held.
  std::map<uint64_t, uint32_t> boundaries_ GUARDED_BY(mu_);
  std::atomic<uint64_t> rejected_writes_{0};
  // Replicas: the model's parts and each one's state number (replication.h),
  // a backup not yet promoted, and the records acknowledged (primary) or
  // applied (backup).
  ReplicaParts replica_parts_;
  std::atomic<bool> standby_{false};
  std::atomic<uint64_t> replica_records_{0};
  LeaseFence lease_;      // lease_until=: the writes a leased primary acknowledges
  BackupVerdict backup_;  // a primary's backup: in sync, lost, outdated or catching up
  // Whether this job may have a backup to send records to: a primary made
  // with one, or a promoted backup given a new one (replicate_to=).
  std::atomic<bool> replicated_;
  // The state number of each block's clocks (wire/include/blkps/replication.h
  // PUSH): a primary's last sent, a backup's last taken.
  std::vector<uint64_t> clock_sequence_ GUARDED_BY(mu_);
  // Held from setting rule parameters until their PARAMS record is sent:
  // records carry the values in the order they were set.
  Mutex rule_params_mu_;
  const Clock::time_point started_ = Clock::now();

  Mutex checkpoint_mu_;                                 // one checkpoint at a time
  std::string job_id_;                                  // set by LoadCheckpoint, then constant
  uint64_t generation_ GUARDED_BY(checkpoint_mu_) = 0;  // the last one asked for
  // RoundBoundaries(): the round boundary of this shard's last part written
  // since the start; none yet: kNoRound.
  static constexpr uint64_t kNoRound = ~uint64_t{0};
  uint64_t round_written_ GUARDED_BY(checkpoint_mu_) = kNoRound;
  // Whether this shard has written a part at boundary `round` or a later
  // one.
  bool RoundWrittenLocked(uint64_t round) const REQUIRES(checkpoint_mu_);
  // RoundBoundaries(): round R is generation round_generation_base_ + 1 +
  // R - round_base_, both fixed at the start: the generation loaded and its
  // round (a new job: the newest number in the folder, round 0), the same on
  // every shard. Set by LoadCheckpoint, then constant.
  uint64_t round_generation_base_ = 0, round_base_ = 0;
  Mutex gate_mu_;
  std::condition_variable gate_cv_;
  uint32_t writes_running_ GUARDED_BY(gate_mu_) = 0;
  bool gate_closed_ GUARDED_BY(gate_mu_) = false;
  uint64_t checkpoints_ GUARDED_BY(mu_) = 0;
  uint64_t written_generation_ GUARDED_BY(mu_) = 0;  // this server's last durable part (or the loaded one)
  std::string checkpoint_error_ GUARDED_BY(mu_);
  double checkpoint_seconds_ GUARDED_BY(mu_) = 0;
  double checkpoint_stall_seconds_ GUARDED_BY(mu_) = 0;  // writes waited this long for the last
  Clock::time_point last_checkpoint_ GUARDED_BY(mu_);

  Mutex ticker_mu_;
  std::condition_variable ticker_cv_;
  bool stopping_ GUARDED_BY(ticker_mu_) = false;
  std::thread ticker_;
};

}  // namespace blkps::server
