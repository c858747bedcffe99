// The control LUN's server: its READs and WRITEs split at the region borders
// of wire/include/blkps/control_lun.h and served from the LU's job (status,
// commands, counters, weights, receipts) or from the LU's exchange region.
// Contract in lu_core.h; lu.cc checks the read-only regions before a write.
#include <algorithm>
#include <cstring>
#include <iterator>
#include <mutex>
#include <string>
#include <vector>

#include "blkps/control_lun.h"
#include "lu_core.h"

namespace blkps::server::lu_core {
namespace server = blkps::server;

namespace {

constexpr uint64_t kStatusOffset = BLKPS_CONTROL_STATUS_OFFSET;
constexpr uint64_t kCommandsOffset = BLKPS_CONTROL_COMMANDS_OFFSET;
constexpr uint64_t kCountersOffset = BLKPS_CONTROL_COUNTERS_OFFSET;
constexpr uint64_t kWeightsOffset = BLKPS_CONTROL_WEIGHTS_OFFSET;
static_assert(server::Job::kReceiptUnit == BLKPS_CONTROL_RECEIPT_UNIT, "one receipt unit");

// Where the control LUN's exchange region starts: after a receipt for every
// LUN before the control LUN's own.
uint64_t ExchangeOffset(const blkps_lu& lu) { return blkps_control_exchange_offset(lu.job->size_bytes(), lu.lun); }
// Where its row windows start: after the receipts.
uint64_t WindowsOffset(const blkps_lu& lu) { return blkps_control_windows_offset(lu.job->size_bytes(), lu.lun); }

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

server::Status OutsideControlLun(uint64_t offset, uint64_t len, uint64_t size) {
  return server::Status::OutOfRange("bytes [" + std::to_string(offset) + ", " + std::to_string(offset + len) +
                                    ") pass the end of the control LUN (" + std::to_string(size) + " bytes)");
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
                              WindowsOffset(lu),
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

// The counters region: the record (control_lun.h's encoder), then zeros.
std::string CountersRegion(const server::Job& job) {
  const server::Job::Counters c = job.GetCounters();
  blkps_control_counters record{};
  record.params = c.params;
  record.blocks = c.blocks;
  record.global_step = c.global_step;
  record.updates = c.updates;
  record.rejected_writes = c.rejected_writes;
  record.failed = c.failed ? 1 : 0;
  record.stop = c.stop ? 1 : 0;
  record.table_width = c.table_width;
  record.pushing_learners = c.pushing_learners;
  record.table_hashed = c.table_hashed ? 1 : 0;
  std::string region(BLKPS_CONTROL_COUNTERS_BYTES, '\0');
  blkps_control_counters_encode(record, region.data());
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
    header.lun = lun;
    header.writes_applied = numbers.writes_applied;
    header.writes_in_progress = numbers.writes_in_progress;
    blkps_control_receipt_encode(header, header_page.data());
    const char* units = reinterpret_cast<const char*>(counts.data());
    for (uint64_t i = 0; i < piece; ++i) {
      const uint64_t byte = from + i;
      out[done + i] = byte < header_bytes ? header_page[byte] : units[byte - header_bytes - first_unit * 4];
    }
    done += piece;
  }
}

}  // namespace

// The control LUN's size: its regions, the weights as long as the model's
// device, the receipts, then the exchange region.
uint64_t ControlSizeBytes(const blkps_lu& lu) { return blkps_control_lun_bytes(lu.job->size_bytes(), lu.lun); }

// Whether [offset, offset + len) touches a read-only region: status,
// counters or receipts.
bool TouchesReadOnlyRegion(const blkps_lu& lu, uint64_t offset, uint64_t len) {
  const auto touches = [&](uint64_t start, uint64_t bytes) { return offset < start + bytes && start < offset + len; };
  return touches(kStatusOffset, BLKPS_CONTROL_STATUS_BYTES) || touches(kCountersOffset, BLKPS_CONTROL_COUNTERS_BYTES) ||
         touches(blkps_control_receipts_offset(lu.job->size_bytes()),
                 WindowsOffset(lu) - blkps_control_receipts_offset(lu.job->size_bytes()));
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
    if (region == WindowsOffset(*lu)) return RowWindowsRead(lu, at - region, buf + pos, n, initiator);
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
                            const server::Initiator& initiator) {
  const uint64_t size = ControlSizeBytes(*lu);
  if (offset > size || len > size - offset) return OutsideControlLun(offset, len, size);
  // Who may write what is the LUN's, never the initiator's name: any client
  // picks its own (--bsopts access=). The row windows and the exchange
  // region (collectives) are open to learners: they hold only what they
  // put there, and a push's rows are gradients, as on a learner LUN.
  const server::Job::ControlRights rights =
      lu->options.learners_access ? server::Job::ControlRights::kLearner : server::Job::ControlRights::kOperator;
  if (rights == server::Job::ControlRights::kLearner && offset + len > kWeightsOffset && offset < WindowsOffset(*lu)) {
    return server::Status::PermissionDenied(
        "the learners' control LUN does not take weights; operators write them through the model's operator "
        "target");
  }
  // REQUIRES !TouchesReadOnlyRegion(offset, len).
  return ForEachControlRegion(*lu, offset, len, [&](uint64_t region, uint64_t at, uint64_t n, uint64_t pos) {
    if (region == kCommandsOffset) return lu->job->Control(std::string(buf + pos, n), initiator, rights);
    if (region == WindowsOffset(*lu)) return RowWindowsWrite(lu, at - region, buf + pos, n, initiator.name);
    if (region == ExchangeOffset(*lu)) {
      WriteExchange(lu, at - region, n, buf + pos);
      return server::Status::OK();
    }
    return lu->job->AssignWeights(at - kWeightsOffset, buf + pos, n);
  });
}

}  // namespace blkps::server::lu_core
