// The C++ core of one blkps logical unit: its options, its job, and the
// control LUN's regions (layout in wire/include/blkps/control_lun.h).
#include "lu.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "blkps/control_lun.h"
#include "blkps/wire_convert.h"
#include "blkps/wire_dtype.hpp"
#include "job.h"
#include "lu_options.h"

namespace server = blkps::server;

namespace {

constexpr uint64_t kStatusOffset = BLKPS_CONTROL_STATUS_OFFSET;
constexpr uint64_t kCommandsOffset = BLKPS_CONTROL_COMMANDS_OFFSET;
constexpr uint64_t kCountersOffset = BLKPS_CONTROL_COUNTERS_OFFSET;
constexpr uint64_t kWeightsOffset = BLKPS_CONTROL_WEIGHTS_OFFSET;
static_assert(server::Job::kReceiptUnit == BLKPS_CONTROL_RECEIPT_UNIT, "one receipt unit");

void (*g_log)(const char*) = nullptr;

void Log(const std::string& line) {
  if (g_log) g_log(line.c_str());
}

}  // namespace

struct blkps_lu {
  std::string bsopts;
  server::LuOptions options;
  std::shared_ptr<server::Job> job;  // null until opened
  size_t slot = 0;                   // learner LUNs: the job's slot
  uint64_t lun = 0;
  std::deque<server::Job::Released> released;  // main thread only

  // The initiator name of each admitted command, from blkps_lu_admit until
  // it runs or fails.
  std::mutex initiators_mu;
  std::map<void*, std::string> initiators;

  // Control LUN: the status snapshot reads are served from.
  std::mutex status_mu;
  std::string status;

  // Control LUN: the exchange region's bytes (control_lun.h), allocated on
  // its first write; empty reads as zeros.
  std::mutex exchange_mu;
  std::vector<char> exchange;
};

namespace {

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
    server::Status s = server::Job::Create(
        name, lu.options.job, [name](const std::string& line) { Log("model '" + name + "': " + line); }, out);
    if (!s.ok()) return s;
    entry = Entry{*out, lu.options.model_bsopts};
    return server::Status::OK();
  }

 private:
  struct Entry {
    std::weak_ptr<server::Job> job;
    std::string bsopts;  // what created it, dtype aside (LuOptions::model_bsopts)
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
    default: return BLKPS_IO_BAD_DATA;
  }
}

// Where the control LUN's exchange region starts: after a receipt for every
// LUN before the control LUN's own.
uint64_t ExchangeOffset(const blkps_lu& lu) { return blkps_control_exchange_offset(lu.job->size_bytes(), lu.lun); }

// The control LUN's size: its regions, the weights as long as the model's
// device, the receipts, then the exchange region.
uint64_t ControlSizeBytes(const blkps_lu& lu) { return blkps_control_lun_bytes(lu.job->size_bytes(), lu.lun); }

// Bytes [at, at + n) of the exchange region, read into `out`.
void ReadExchange(blkps_lu* lu, uint64_t at, uint64_t n, char* out) {
  std::lock_guard<std::mutex> lock(lu->exchange_mu);
  if (lu->exchange.empty()) {
    std::memset(out, 0, n);
  } else {
    std::memcpy(out, lu->exchange.data() + at, n);
  }
}

// Bytes [at, at + n) of the exchange region, written from `in`.
void WriteExchange(blkps_lu* lu, uint64_t at, uint64_t n, const char* in) {
  std::lock_guard<std::mutex> lock(lu->exchange_mu);
  if (lu->exchange.empty()) lu->exchange.assign(BLKPS_CONTROL_EXCHANGE_BYTES, '\0');
  std::memcpy(lu->exchange.data() + at, in, n);
}

// "Initiator: <name> alias: ..." (tgt's it_nexus info) -> <name>.
std::string InitiatorName(const char* nexus) {
  const std::string info = nexus ? nexus : "";
  const std::string key = "Initiator: ";
  const size_t at = info.find(key);
  if (at == std::string::npos) return "";
  const size_t start = at + key.size();
  return info.substr(start, info.find_first_of(" \n", start) - start);
}

// The initiator name blkps_lu_admit recorded for `cmd`, forgotten here.
std::string TakeInitiator(blkps_lu* lu, void* cmd) {
  std::lock_guard<std::mutex> lock(lu->initiators_mu);
  auto it = lu->initiators.find(cmd);
  if (it == lu->initiators.end()) return "";
  std::string name = std::move(it->second);
  lu->initiators.erase(it);
  return name;
}

server::Status OutsideControlLun(uint64_t offset, uint64_t len, uint64_t size) {
  return server::Status::OutOfRange("bytes [" + std::to_string(offset) + ", " + std::to_string(offset + len) +
                                    ") pass the end of the control LUN (" + std::to_string(size) + " bytes)");
}

// Whether [offset, offset + len) touches a read-only region: status,
// counters or receipts.
bool TouchesReadOnlyRegion(const blkps_lu& lu, uint64_t offset, uint64_t len) {
  const auto touches = [&](uint64_t start, uint64_t bytes) { return offset < start + bytes && start < offset + len; };
  return touches(kStatusOffset, BLKPS_CONTROL_STATUS_BYTES) || touches(kCountersOffset, BLKPS_CONTROL_COUNTERS_BYTES) ||
         touches(blkps_control_receipts_offset(lu.job->size_bytes()),
                 ExchangeOffset(lu) - blkps_control_receipts_offset(lu.job->size_bytes()));
}

// Splits [offset, offset + len) of the control LUN at its region borders and
// calls piece(region_start, piece_offset, piece_len, piece_pos_in_buffer).
template <typename Piece>
server::Status ForEachControlRegion(const blkps_lu& lu, uint64_t offset, uint64_t len, Piece piece) {
  const uint64_t borders[] = {kStatusOffset,
                              kCommandsOffset,
                              kCountersOffset,
                              kWeightsOffset,
                              blkps_control_receipts_offset(lu.job->size_bytes()),
                              ExchangeOffset(lu),
                              UINT64_MAX};
  for (size_t r = 0; r + 1 < std::size(borders); ++r) {
    const uint64_t start = std::max(offset, borders[r]), end = std::min(offset + len, borders[r + 1]);
    if (start >= end) continue;
    server::Status s = piece(borders[r], start, end - start, start - offset);
    if (!s.ok()) return s;
  }
  return server::Status::OK();
}

// The counters record as control_lun.h lays it out (little-endian, as this
// host), then zeros to the end of the region.
std::string CountersRegion(const server::Job& job) {
  const server::Job::Counters c = job.GetCounters();
  blkps_control_counters record{};
  std::memcpy(record.magic, BLKPS_CONTROL_COUNTERS_MAGIC, sizeof record.magic);
  record.format_version = BLKPS_CONTROL_FORMAT_VERSION;
  record.record_bytes = sizeof record;
  record.params = c.params;
  record.blocks = c.blocks;
  record.global_step = c.global_step;
  record.updates = c.updates;
  record.rejected_writes = c.rejected_writes;
  record.failed = c.failed ? 1 : 0;
  record.stop = c.stop ? 1 : 0;
  std::string region(BLKPS_CONTROL_COUNTERS_BYTES, '\0');
  std::memcpy(region.data(), &record, sizeof record);
  return region;
}

// Bytes [at, at + n) of the receipts region (control_lun.h), as
// `initiator` sees it, into out.
void ReceiptsRegion(const server::Job& job, const std::string& initiator, uint64_t at, uint64_t n, char* out) {
  const uint64_t stride = blkps_control_receipt_bytes(job.size_bytes());
  const uint64_t header_bytes = BLKPS_CONTROL_RECEIPT_HEADER_BYTES;
  for (uint64_t done = 0; done < n;) {
    // Bytes [from, from + piece) of LUN `lun`'s record: its header page,
    // then one uint32 per unit (little-endian, as this host).
    const uint64_t lun = (at + done) / stride, from = (at + done) % stride;
    const uint64_t piece = std::min(n - done, stride - from);
    const uint64_t first_unit = from > header_bytes ? (from - header_bytes) / 4 : 0;
    const uint64_t end_unit = from + piece > header_bytes ? (from + piece - header_bytes + 3) / 4 : 0;
    std::vector<uint32_t> counts(end_unit > first_unit ? end_unit - first_unit : 0);
    const server::Job::ReceiptNumbers numbers = job.GetReceipt(lun, initiator, first_unit, &counts);
    std::string header_page(header_bytes, '\0');
    blkps_control_receipt header{};
    std::memcpy(header.magic, BLKPS_CONTROL_RECEIPT_MAGIC, sizeof header.magic);
    header.format_version = BLKPS_CONTROL_FORMAT_VERSION;
    header.record_bytes = sizeof header;
    header.lun = lun;
    header.writes_applied = numbers.writes_applied;
    header.writes_in_progress = numbers.writes_in_progress;
    std::memcpy(header_page.data(), &header, sizeof header);
    const char* units = reinterpret_cast<const char*>(counts.data());
    for (uint64_t i = 0; i < piece; ++i) {
      const uint64_t byte = from + i;
      out[done + i] = byte < header_bytes ? header_page[byte] : units[byte - header_bytes - first_unit * 4];
    }
    done += piece;
  }
}

server::Status ControlRead(blkps_lu* lu, uint64_t offset, char* buf, uint64_t len, const std::string& initiator) {
  const uint64_t size = ControlSizeBytes(*lu);
  if (offset > size || len > size - offset) return OutsideControlLun(offset, len, size);
  const uint64_t receipts = blkps_control_receipts_offset(lu->job->size_bytes());
  return ForEachControlRegion(*lu, offset, len, [&](uint64_t region, uint64_t at, uint64_t n, uint64_t pos) {
    if (region == kStatusOffset) {
      std::lock_guard<std::mutex> lock(lu->status_mu);
      if (at == kStatusOffset || lu->status.empty()) lu->status = lu->job->StatusJson();
      std::string& text = lu->status;
      const uint64_t copy = at < text.size() ? std::min<uint64_t>(n, text.size() - at) : 0;
      std::memcpy(buf + pos, text.data() + at, copy);
      std::memset(buf + pos + copy, 0, n - copy);
      return server::Status::OK();
    }
    if (region == kCommandsOffset) {
      std::memset(buf + pos, 0, n);
      return server::Status::OK();
    }
    if (region == kCountersOffset) {
      std::memcpy(buf + pos, CountersRegion(*lu->job).data() + (at - kCountersOffset), n);
      return server::Status::OK();
    }
    if (region == receipts) {
      ReceiptsRegion(*lu->job, initiator, at - receipts, n, buf + pos);
      return server::Status::OK();
    }
    if (region == ExchangeOffset(*lu)) {
      ReadExchange(lu, at - region, n, buf + pos);
      return server::Status::OK();
    }
    // The weights, then zeros up to the receipts' MiB boundary.
    const uint64_t from = at - kWeightsOffset, device = lu->job->size_bytes();
    const uint64_t weights = from < device ? std::min(n, device - from) : 0;
    std::memset(buf + pos + weights, 0, n - weights);
    return weights ? lu->job->ReadWeights(from, buf + pos, weights) : server::Status::OK();
  });
}

server::Status ControlWrite(blkps_lu* lu, uint64_t offset, const char* buf, uint64_t len,
                            const std::string& initiator) {
  const uint64_t size = ControlSizeBytes(*lu);
  if (offset > size || len > size - offset) return OutsideControlLun(offset, len, size);
  // Who may write what is the LUN's, never the initiator's name: any client
  // picks its own (--bsopts access=). The exchange region (collectives) is
  // open to learners: it holds only what they put there.
  const server::Job::ControlRights rights =
      lu->options.learners_access ? server::Job::ControlRights::kLearner : server::Job::ControlRights::kOperator;
  if (rights == server::Job::ControlRights::kLearner && offset + len > kWeightsOffset && offset < ExchangeOffset(*lu)) {
    return server::Status::PermissionDenied(
        "the learners' control LUN does not take weights; operators write them through the model's operator "
        "target");
  }
  // REQUIRES !TouchesReadOnlyRegion(offset, len).
  return ForEachControlRegion(*lu, offset, len, [&](uint64_t region, uint64_t at, uint64_t n, uint64_t pos) {
    if (region == kCommandsOffset) return lu->job->Control(std::string(buf + pos, n), initiator, rights);
    if (region == ExchangeOffset(*lu)) {
      WriteExchange(lu, at - region, n, buf + pos);
      return server::Status::OK();
    }
    return lu->job->AssignWeights(at - kWeightsOffset, buf + pos, n);
  });
}

// ---- The 16-bit wire (--bsopts dtype=bfloat16|float16) ----
// A 16-bit learner LUN is a view of the float32 model: device byte 2*i holds
// parameter i. Its READ and WRITE are converted here, at the LUN boundary,
// and go on to the job as float32 (blkps/wire_dtype.hpp says how values
// round); admission, clocks and the rule never see 16-bit values.

bool IsWire16(const blkps_lu& lu) { return lu.options.dtype != blkps::wire::Dtype::kFloat32; }

uint64_t WireSizeBytes(const blkps_lu& lu) {
  const uint64_t bytes = lu.job->options().model.num_params * blkps::wire::BytesPerParam(lu.options.dtype);
  return (bytes + server::kDeviceSectorBytes - 1) / server::kDeviceSectorBytes * server::kDeviceSectorBytes;
}

// The parameters device bytes [offset, offset + len) of a 16-bit LUN hold,
// the padding past the model excluded. OutOfRange past the LUN's end;
// InvalidArgument for half a value.
struct WireRange {
  uint64_t first = 0, count = 0;
};
server::Status ToWireRange(const blkps_lu& lu, uint64_t offset, uint64_t len, WireRange* out) {
  const uint64_t size = WireSizeBytes(lu);
  if (offset > size || len > size - offset) {
    return server::Status::OutOfRange("bytes [" + std::to_string(offset) + ", " + std::to_string(offset + len) +
                                      ") pass the end of the model device (" + std::to_string(size) + " bytes, " +
                                      blkps::wire::DtypeName(lu.options.dtype) + ")");
  }
  if (offset % 2 != 0 || len % 2 != 0) {
    return server::Status::InvalidArgument("bytes [" + std::to_string(offset) + ", " + std::to_string(offset + len) +
                                           ") do not start and end on a 16-bit parameter (multiples of 2)");
  }
  const uint64_t params = lu.job->options().model.num_params;
  out->first = offset / 2;
  out->count = out->first < params ? std::min(len / 2, params - out->first) : 0;
  return server::Status::OK();
}

// Per worker thread: the float32 side of a 16-bit transfer.
std::vector<float>& WideScratch(uint64_t count) {
  thread_local std::vector<float> scratch;
  if (scratch.size() < count) scratch.resize(count);
  return scratch;
}

server::Status WireRead(blkps_lu* lu, uint64_t offset, void* buf, uint64_t len) {
  WireRange r;
  server::Status s = ToWireRange(*lu, offset, len, &r);
  if (!s.ok()) return s;
  std::vector<float>& wide = WideScratch(r.count);
  s = lu->job->Read(lu->slot, r.first * sizeof(float), wide.data(), r.count * sizeof(float));
  if (!s.ok()) return s;
  uint16_t* narrow = static_cast<uint16_t*>(buf);
  // A read returns what each weight rounds to, float16 overflow (Inf) included.
  (void)blkps::wire::Narrow(lu->options.dtype, wide.data(), narrow, r.count);
  std::memset(narrow + r.count, 0, len - r.count * 2);  // padding
  return server::Status::OK();
}

// Widening is exact and keeps NaN and Inf, so the job's own check refuses
// such a gradient whole (and counts it) as it does a float32 one.
server::Status WireWrite(blkps_lu* lu, uint64_t offset, const void* buf, uint64_t len, const std::string& initiator) {
  WireRange r;
  server::Status s = ToWireRange(*lu, offset, len, &r);
  if (!s.ok()) return s;
  std::vector<float>& wide = WideScratch(r.count);
  blkps::wire::Widen(lu->options.dtype, static_cast<const uint16_t*>(buf), wide.data(), r.count);
  return lu->job->Write(lu->slot, r.first * sizeof(float), wide.data(), r.count * sizeof(float), initiator, offset);
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

int blkps_lu_admit(blkps_lu* lu, int write, uint64_t offset, uint64_t len, void* cmd, const char* nexus) {
  if (!lu->job) return 0;
  const std::string initiator = InitiatorName(nexus);
  {
    std::lock_guard<std::mutex> lock(lu->initiators_mu);
    lu->initiators[cmd] = initiator;
  }
  if (lu->options.control) return 0;
  if (IsWire16(*lu)) {  // the same parameters in float32 bytes
    const uint64_t per_param = blkps::wire::BytesPerParam(lu->options.dtype);
    offset = offset / per_param * sizeof(float);
    len = len / per_param * sizeof(float);
  }
  return lu->job->Admit(lu->slot, write != 0, offset, len, cmd, initiator) == server::Job::Admission::kHold;
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
  const std::string initiator = TakeInitiator(lu, cmd);
  if (!lu->job) return BLKPS_IO_NOT_READY;
  if (lu->options.control) {
    return ToIoResult(ControlRead(lu, offset, static_cast<char*>(buf), len, initiator), err, errlen);
  }
  if (IsWire16(*lu)) return ToIoResult(WireRead(lu, offset, buf, len), err, errlen);
  return ToIoResult(lu->job->Read(lu->slot, offset, buf, len), err, errlen);
}

blkps_io_result blkps_lu_write(blkps_lu* lu, uint64_t offset, const void* buf, uint64_t len, void* cmd, char* err,
                               size_t errlen) {
  const std::string initiator = TakeInitiator(lu, cmd);
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
  if (IsWire16(*lu)) return ToIoResult(WireWrite(lu, offset, buf, len, initiator), err, errlen);
  return ToIoResult(lu->job->Write(lu->slot, offset, buf, len, initiator), err, errlen);
}

blkps_io_result blkps_lu_sync(blkps_lu* lu, char* err, size_t errlen) {
  if (!lu->job) return BLKPS_IO_NOT_READY;
  return ToIoResult(lu->job->Checkpoint(), err, errlen);
}

}  // extern "C"
