// The C ABI of lu.h and one LU's lifecycle: its options, the job it opens
// (shared by name among this tgtd's LUNs), admission and release of held
// commands, and dispatch of each READ/WRITE to the learner path, the 16-bit
// wire (wire16.cc) or the control LUN (control_lun_server.cc).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "blkps/control_lun.h"
#include "blkps/wire_dtype.hpp"
#include "lu_core.h"
#include "replica_link.h"

namespace server = blkps::server;
using blkps::server::lu_core::ControlRead;
using blkps::server::lu_core::ControlSizeBytes;
using blkps::server::lu_core::ControlWrite;
using blkps::server::lu_core::IsWire16;
using blkps::server::lu_core::TouchesReadOnlyRegion;
using blkps::server::lu_core::WireRead;
using blkps::server::lu_core::WireSizeBytes;
using blkps::server::lu_core::WireWrite;

namespace {

void (*g_log)(const char*) = nullptr;

void Log(const std::string& line) {
  if (g_log) g_log(line.c_str());
}

// All LUNs whose --backing-store names the same model are windows onto one
// Job: one LUN per learner slot, and a control LUN. The first learner LUN to
// open a name creates the job from its --bsopts; a learner LUN joining it must
// give the same --bsopts. The job lives while any LUN has it open.
class JobRegistry {
 public:
  static JobRegistry& Get() {
    static JobRegistry registry;
    return registry;
  }

  server::Status Open(const std::string& name, const blkps_lu& lu, std::shared_ptr<server::Job>* out) {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& entry = jobs_[name];
    std::shared_ptr<server::Job> open = entry.job.lock();
    if (lu.options.control) {
      if (!open) {
        return server::Status::NotFound("role=control: no model '" + name +
                                        "' is served by this tgtd; create its learner LUNs first");
      }
      *out = open;
      return server::Status::OK();
    }
    if (open) {
      if (entry.bsopts != lu.options.model_bsopts) {
        return server::Status::InvalidArgument("model '" + name + "' is already served with --bsopts '" + entry.bsopts +
                                               "'; a LUN joining it must give the same "
                                               "(dtype aside)");
      }
      *out = open;
      return server::Status::OK();
    }
    const server::Job::Logger log = [name](const std::string& line) { Log("model '" + name + "': " + line); };
    server::JobOptions options = lu.options.job;
    if (!lu.options.replicate_to.empty()) {  // a primary: its backup first (doc/replicas.md)
      std::shared_ptr<server::ReplicaLink> link;
      server::Status s = server::ReplicaLink::Connect(lu.options.replicate_to, &link);
      if (!s.ok())
        return server::Status::Unavailable("replicate_to: backup " + lu.options.replicate_to + ": " + s.message());
      options.replica_channel = std::move(link);
    }
    // replicate_to= on a primary without a backup (a promoted one): watch
    // that address as for a returning backup.
    options.watch_new_backup = [this, name, log](const std::string& address) {
      sockaddr_in parsed;
      server::Status s = server::ParseReplicaAddress(address, &parsed);
      if (!s.ok()) return s;
      std::unique_ptr<server::BackupRejoiner> before;  // ended outside the lock: it may be waiting on a HELLO
      {
        std::lock_guard<std::mutex> lock(mu_);
        Entry& entry = jobs_[name];
        before = std::move(entry.rejoiner);
        entry.rejoiner = std::make_unique<server::BackupRejoiner>(address, entry.job, log);
      }
      return server::Status::OK();
    };
    entry.listener.reset();  // a backup's port, if a job of this name had it
    entry.rejoiner.reset();
    server::Status s = server::Job::Create(name, options, log, out);
    if (!s.ok()) return s;
    std::unique_ptr<server::ReplicaListener> listener;
    if (!lu.options.backup_at.empty()) {
      s = server::ReplicaListener::Listen(lu.options.backup_at, *out, log, &listener);
      if (!s.ok()) {
        out->reset();
        return s;
      }
      log("a backup on standby: follows its primary at " + lu.options.backup_at + " until promoted");
    }
    std::unique_ptr<server::BackupRejoiner> rejoiner;
    if (!lu.options.replicate_to.empty()) {
      rejoiner = std::make_unique<server::BackupRejoiner>(lu.options.replicate_to, *out, log);
    }
    entry = Entry{*out, lu.options.model_bsopts, std::move(listener), std::move(rejoiner)};
    return server::Status::OK();
  }

 private:
  struct Entry {
    std::weak_ptr<server::Job> job;
    std::string bsopts;  // what created it, dtype aside (LuOptions::model_bsopts)
    // A backup's replication port (backup=): it follows the primary while
    // tgtd runs or until a job of this name is created again.
    std::unique_ptr<server::ReplicaListener> listener;
    // A primary's watch for its outdated backup's return (replicate_to=, the
    // option or the control command).
    std::unique_ptr<server::BackupRejoiner> rejoiner;
  };
  std::mutex mu_;
  std::map<std::string, Entry> jobs_;
};

void SetError(char* err, size_t errlen, const std::string& msg) {
  if (err && errlen) std::snprintf(err, errlen, "%s", msg.c_str());
}

blkps_io_result ToIoResult(const server::Status& s, char* err, size_t errlen) {
  if (s.ok()) return BLKPS_IO_OK;
  SetError(err, errlen, s.message());
  switch (s.code()) {
    case server::Status::Code::kOutOfRange: return BLKPS_IO_OUT_OF_RANGE;
    case server::Status::Code::kDeadlineExceeded: return BLKPS_IO_HOLD_TIMEOUT;
    case server::Status::Code::kUnavailable: return BLKPS_IO_JOB_FAILED;
    case server::Status::Code::kIOError: return BLKPS_IO_CHECKPOINT_FAILED;
    case server::Status::Code::kPermissionDenied: return BLKPS_IO_WRITE_PROTECT;
    case server::Status::Code::kResourceExhausted: return BLKPS_IO_TABLE_FULL;
    case server::Status::Code::kStandby: return BLKPS_IO_STANDBY;
    default: return BLKPS_IO_BAD_DATA;
  }
}

// A hashed table's learner LUN: its rows are reached through the row
// windows only (blkps/control_lun.h "Row windows").
blkps_io_result RefuseHashedTableIo(char* err, size_t errlen) {
  SetError(err, errlen,
           "a hashed table (table=hash:...) is reached through the row windows only: use pull_rows and push_rows, "
           "not READ or WRITE of its learner LUN");
  return BLKPS_IO_WINDOWS_ONLY;
}

// The word after `key` in tgt's it_nexus info ("Initiator: <name> alias:
// <alias>\n..."); empty if there is none.
std::string NexusWord(const std::string& info, const std::string& key) {
  const size_t at = info.find(key);
  if (at == std::string::npos) return "";
  const size_t start = at + key.size();
  return info.substr(start, info.find_first_of(" \n", start) - start);
}

// The initiator of a nexus: its name, and its session token if its alias
// is libblkps's "blkps-session-<16 lower-case hex digits>" (else 0).
server::Initiator InitiatorOf(const char* nexus) {
  const std::string info = nexus ? nexus : "";
  const std::string alias = NexusWord(info, " alias: ");
  const std::string prefix = BLKPS_SESSION_ALIAS_PREFIX;
  const std::string token = alias.rfind(prefix, 0) == 0 ? alias.substr(prefix.size()) : "";
  const bool hex = token.size() == 16 && token.find_first_not_of("0123456789abcdef") == std::string::npos;
  return server::Initiator(NexusWord(info, "Initiator: "), hex ? std::strtoull(token.c_str(), nullptr, 16) : 0);
}

// The initiator blkps_lu_admit recorded for `cmd`, forgotten here.
server::Initiator TakeInitiator(blkps_lu* lu, void* cmd) {
  std::lock_guard<std::mutex> lock(lu->initiators_mu);
  auto it = lu->initiators.find(cmd);
  if (it == lu->initiators.end()) return {};
  server::Initiator initiator = std::move(it->second);
  lu->initiators.erase(it);
  return initiator;
}

}  // namespace

extern "C" {

void blkps_set_log(void (*log)(const char*)) { g_log = log; }

blkps_lu* blkps_lu_create(const char* bsopts, char* err, size_t errlen) {
  auto lu = std::make_unique<blkps_lu>();
  lu->bsopts = bsopts ? bsopts : "";
  server::Status s = server::ParseLuOptions(lu->bsopts, &lu->options);
  if (!s.ok()) {
    SetError(err, errlen, s.message());
    return nullptr;
  }
  return lu.release();
}

void blkps_lu_destroy(blkps_lu* lu) { delete lu; }

int blkps_lu_open(blkps_lu* lu, const char* path, uint64_t lun, int wake_fd, uint64_t* size_bytes, char* err,
                  size_t errlen) {
  server::Status s = JobRegistry::Get().Open(path ? path : "", *lu, &lu->job);
  if (!s.ok()) {
    SetError(err, errlen, s.message());
    return -1;
  }
  lu->lun = lun;
  if (lu->options.control) {
    *size_bytes = ControlSizeBytes(*lu);
    return 0;
  }
  lu->slot = lu->job->AddLearner(
      lun,
      [wake_fd] {
        const uint64_t one = 1;
        ssize_t ignored = write(wake_fd, &one, sizeof one);  // eventfd: only fails if the count would overflow
        (void)ignored;
      },
      blkps::wire::DtypeName(lu->options.dtype));
  *size_bytes = IsWire16(*lu) ? WireSizeBytes(*lu) : lu->job->size_bytes();
  return 0;
}

void blkps_lu_close(blkps_lu* lu) {
  if (lu->job && !lu->options.control) lu->job->RemoveLearner(lu->slot);
  lu->released.clear();
  lu->job.reset();
}

int blkps_lu_is_control(const blkps_lu* lu) { return lu->options.control ? 1 : 0; }

int blkps_lu_runs_inline(const blkps_lu* lu, uint64_t len) {
  constexpr uint64_t kInlineBytes = 4096;
  return !lu->options.control && lu->options.job.model.table.is_table() && lu->options.job.hashed_capacity == 0 &&
                 len <= kInlineBytes
             ? 1
             : 0;
}

int blkps_lu_admit(blkps_lu* lu, int write, uint64_t offset, uint64_t len, void* cmd, const char* nexus) {
  if (!lu->job) return 0;
  const server::Initiator initiator = InitiatorOf(nexus);
  {
    std::lock_guard<std::mutex> lock(lu->initiators_mu);
    lu->initiators[cmd] = initiator;
  }
  // Neither control nor a hashed table's learner LUN is admitted: the latter's READ and WRITE are refused.
  if (lu->options.control || lu->options.job.hashed_capacity != 0) return 0;
  if (IsWire16(*lu)) {  // the same parameters in float32 bytes
    const uint64_t per_param = blkps::wire::BytesPerParam(lu->options.dtype);
    offset = offset / per_param * sizeof(float);
    len = len / per_param * sizeof(float);
  }
  return lu->job->Admit(lu->slot, write != 0, offset, len, cmd, initiator.name) == server::Job::Admission::kHold;
}

void* blkps_lu_take_released(blkps_lu* lu, blkps_io_result* result, char* err, size_t errlen) {
  if (lu->released.empty() && lu->job) {
    for (server::Job::Released& r : lu->job->TakeReleased(lu->slot)) lu->released.push_back(std::move(r));
  }
  if (lu->released.empty()) return nullptr;
  server::Job::Released r = std::move(lu->released.front());
  lu->released.pop_front();
  *result = ToIoResult(r.status, err, errlen);
  if (*result != BLKPS_IO_OK) TakeInitiator(lu, r.cmd);  // it will not run
  return r.cmd;
}

blkps_io_result blkps_lu_read(blkps_lu* lu, uint64_t offset, void* buf, uint64_t len, void* cmd, char* err,
                              size_t errlen) {
  const std::string initiator = TakeInitiator(lu, cmd).name;
  if (!lu->job) return BLKPS_IO_NOT_READY;
  if (lu->options.control) {
    return ToIoResult(ControlRead(lu, offset, static_cast<char*>(buf), len, initiator), err, errlen);
  }
  if (lu->options.job.hashed_capacity != 0) return RefuseHashedTableIo(err, errlen);
  if (IsWire16(*lu)) return ToIoResult(WireRead(lu, offset, buf, len), err, errlen);
  return ToIoResult(lu->job->Read(lu->slot, offset, buf, len), err, errlen);
}

blkps_io_result blkps_lu_write(blkps_lu* lu, uint64_t offset, const void* buf, uint64_t len, void* cmd, char* err,
                               size_t errlen) {
  const server::Initiator initiator = TakeInitiator(lu, cmd);
  if (!lu->job) return BLKPS_IO_NOT_READY;
  if (lu->options.control) {
    if (TouchesReadOnlyRegion(*lu, offset, len)) {
      SetError(err, errlen,
               "the control LUN's status [0, 64 KiB), counters [1 MiB - 4 KiB, 1 MiB) and receipts (after the "
               "weights) are read-only; write commands at 64 KiB, weights from 1 MiB, exchange in the last 8 MiB");
      return BLKPS_IO_WRITE_PROTECT;
    }
    return ToIoResult(ControlWrite(lu, offset, static_cast<const char*>(buf), len, initiator), err, errlen);
  }
  if (lu->options.job.hashed_capacity != 0) return RefuseHashedTableIo(err, errlen);
  if (IsWire16(*lu)) return ToIoResult(WireWrite(lu, offset, buf, len, initiator), err, errlen);
  return ToIoResult(lu->job->Write(lu->slot, offset, buf, len, initiator), err, errlen);
}

blkps_io_result blkps_lu_sync(blkps_lu* lu, char* err, size_t errlen) {
  if (!lu->job) return BLKPS_IO_NOT_READY;
  // A learner's fsync asks for the round of its own iteration (job.h "One
  // round on every shard"); the control LUN's, for the shard's.
  return ToIoResult(lu->options.control ? lu->job->Checkpoint() : lu->job->Checkpoint(lu->slot), err, errlen);
}

}  // extern "C"
