// Model: parameter ranges and byte ranges onto Device requests. Range checks
// live here; cutting into block-aligned requests lives in TransferPlan.

#include "blkps/model.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <new>
#include <vector>

#include "blkps/wire_convert.h"
#include "device.h"
#include "model_checks.h"
#include "row_batch.h"
#include "status.h"
#include "stream.h"
#include "transfer_plan.h"

namespace blkps {
namespace {

constexpr uint32_t kDefaultQueueDepth = 16;

using ull = unsigned long long;

// Runs one transfer of `length` bytes at device byte `offset`.
// REQUIRES: the range lies on the device (the callers check it).
Status Transfer(Device& device, Direction direction, uint64_t offset, void* buffer, uint64_t length,
                uint64_t request_bytes, uint32_t queue_depth) {
  if (length == 0) return Status();
  try {
    TransferPlan plan(direction, offset, buffer, length, device.logical_block_size(), request_bytes);
    Status status = device.Transfer(direction, plan.requests(), queue_depth);
    if (status.ok()) plan.FinishRead();
    return status;
  } catch (const std::bad_alloc&) {
    return Status::Error(ENOMEM, "out of memory planning a %s of %llu bytes", DirectionName(direction),
                         static_cast<ull>(length));
  }
}

Status CheckByteRange(const char* operation, uint64_t offset, uint64_t length, const Device& device) {
  const uint32_t block = device.logical_block_size();
  if (offset % block != 0 || length % block != 0) {
    return Status::Error(EINVAL,
                         "%s: offset %llu and length %llu must be multiples "
                         "of the logical block size %u",
                         operation, static_cast<ull>(offset), static_cast<ull>(length), block);
  }
  if (offset > device.size_bytes() || length > device.size_bytes() - offset) {
    return Status::Error(ERANGE,
                         "%s of %llu bytes at offset %llu is past the end of "
                         "the device (%llu bytes)",
                         operation, static_cast<ull>(length), static_cast<ull>(offset),
                         static_cast<ull>(device.size_bytes()));
  }
  return Status();
}

// row[0..n) += g[0..n): a batch's gradients never alias its sums, and with
// that said (__restrict) the compiler vectorises the loop; without it perf
// saw push_rows spend an eighth of the learner's time in this sum, scalar.
void AddRow(float* __restrict row, const float* __restrict g, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) row[i] += g[i];
}

// TransferRows on a device with row windows: each distinct row once (a
// push's gradients summed per row, checked finite before anything is sent),
// a batch in a few commands (device.h TransferRows). A pull that the server
// forgot by restarting between its write and read (EAGAIN) is pulled again,
// once. `values`: room for the distinct rows, kept by the caller between
// batches.
Status TransferRowsThroughWindows(Device& device, uint32_t queue_depth, Direction direction, const uint64_t* ids,
                                  uint64_t n, uint64_t width, const float* grads, float* rows,
                                  std::vector<float>& values) {
  try {
    // In first-seen order: a dense table's server sorts them (it visits
    // rows by id), a hashed table's takes them as they come. Measured with
    // the two orders alternated, one learner, 10^6 rows of 128 bytes: the
    // learner's sort cost it more than it spared the server.
    const DistinctRows distinct(ids, n, DistinctRows::Order::kFirstSeen);
    const uint64_t m = distinct.rows.size();
    values.resize(m * width);  // a pull's are all read; a push's are sums
    if (direction == Direction::kWrite) {
      std::fill(values.begin(), values.end(), 0.0f);
      for (uint64_t k = 0; k < n; ++k) AddRow(values.data() + distinct.row_of_id[k] * width, grads + k * width, width);
      const size_t bad = wire::FirstNonFinite32(values.data(), values.size());
      if (bad != values.size()) {
        return Status::Error(EINVAL, "push_rows: a summed gradient is %s; nothing was sent",
                             std::isnan(values[bad]) ? "NaN" : "infinite");
      }
      return device.TransferRows(direction, distinct.rows.data(), m, width, values.data(), queue_depth);
    }
    Status status = device.TransferRows(direction, distinct.rows.data(), m, width, values.data(), queue_depth);
    if (status.code() == EAGAIN) {
      status = device.TransferRows(direction, distinct.rows.data(), m, width, values.data(), queue_depth);
    }
    if (!status.ok()) return status;
    for (uint64_t k = 0; k < n; ++k) {
      std::memcpy(rows + k * width, values.data() + distinct.row_of_id[k] * width, width * sizeof(float));
    }
    return status;
  } catch (const std::bad_alloc&) {
    return Status::Error(ENOMEM, "%s: out of memory planning %llu rows",
                         direction == Direction::kRead ? "pull_rows" : "push_rows", static_cast<ull>(n));
  }
}

// After a batch: the Model keeps its rows' buffer for the next, unless a
// rare huge batch made it larger than 64 MiB.
void KeepRowValues(std::vector<float>& values) {
  constexpr size_t kKeptRowValues = size_t{16} << 20;
  if (values.capacity() > kKeptRowValues) std::vector<float>().swap(values);
}

// Model::PullRows (grads null) and PushRows (rows null) on `device`;
// `values` is the Model's room for a batch's rows.
Status TransferRows(Device& device, wire::Dtype dtype, uint64_t request_bytes, uint32_t queue_depth,
                    Direction direction, const uint64_t* ids, uint64_t n, uint64_t width, const float* grads,
                    float* rows, std::vector<float>& values) {
  const char* operation = direction == Direction::kRead ? "pull_rows" : "push_rows";
  if (width == 0) return Status::Error(EINVAL, "%s: a row needs a width of at least 1 value", operation);
  if (dtype != wire::Dtype::kFloat32) {
    return Status::Error(EINVAL, "%s: rows need a float32 device; this one is %s", operation, wire::DtypeName(dtype));
  }
  const uint64_t table_width = device.table_width();
  if (table_width != 0 && width != table_width) {
    return Status::Error(EINVAL,
                         "%s: the table's rows are %llu values wide (its server's table=ROWS:%llu), not %llu: "
                         "pass rows of %llu values; nothing was sent",
                         operation, static_cast<ull>(table_width), static_cast<ull>(table_width),
                         static_cast<ull>(width), static_cast<ull>(table_width));
  }
  // A hashed table's ids are any 64-bit value; a table's, its row numbers.
  const uint64_t row_count = device.size_bytes() / sizeof(float) / width;
  for (uint64_t k = 0; !device.table_hashed() && k < n; ++k) {
    if (ids[k] >= row_count) {
      return Status::Error(ERANGE, "%s: row id %llu (position %llu) is past the table's end: %llu rows of %llu values",
                           operation, static_cast<ull>(ids[k]), static_cast<ull>(k), static_cast<ull>(row_count),
                           static_cast<ull>(width));
    }
  }
  if (n == 0) return Status();
  if (device.has_row_windows()) {
    return TransferRowsThroughWindows(device, queue_depth, direction, ids, n, width, grads, rows, values);
  }
  try {
    RowBatch batch(direction, ids, n, width, grads, device.logical_block_size(), request_bytes);
    if (direction == Direction::kWrite) {
      const float* bad = batch.FirstNonFinite();
      if (bad != nullptr) {
        return Status::Error(EINVAL, "push_rows: a summed gradient is %s; nothing was sent",
                             *bad != *bad ? "NaN" : "infinite");
      }
    }
    Status status = device.Transfer(direction, batch.requests(), queue_depth);
    if (status.ok() && direction == Direction::kRead) batch.CopyRowsOut(rows);
    return status;
  } catch (const std::bad_alloc&) {
    return Status::Error(ENOMEM, "%s: out of memory planning %llu rows", operation, static_cast<ull>(n));
  }
}

}  // namespace

// Parameters [first_param, first_param + count) as a byte range of a device
// of `dtype`, or -ERANGE when it does not fit on the device.
Status ParamsToBytes(const char* operation, uint64_t first_param, uint64_t count, uint64_t size_bytes,
                     wire::Dtype dtype, uint64_t* offset, uint64_t* length) {
  const uint64_t per_param = wire::BytesPerParam(dtype);
  const uint64_t params_on_device = size_bytes / per_param;
  if (first_param > params_on_device || count > params_on_device - first_param) {
    return Status::Error(ERANGE,
                         "%s of %llu parameters from parameter %llu is past the end of the "
                         "model (%llu parameters, %llu bytes)",
                         operation, static_cast<ull>(count), static_cast<ull>(first_param),
                         static_cast<ull>(params_on_device), static_cast<ull>(size_bytes));
  }
  *offset = first_param * per_param;
  *length = count * per_param;
  return Status();
}

// The device must be 16-bit for Push16/Pull16.
Status Check16(const char* operation, wire::Dtype dtype) {
  if (dtype != wire::Dtype::kFloat32) return Status();
  return Status::Error(EINVAL,
                       "%s: the device is float32; 16-bit values go only to a LUN with --bsopts "
                       "dtype=bfloat16 or float16 (open it with that dtype)",
                       operation);
}

std::unique_ptr<Model> Model::Open(const std::string& target, const OpenOptions& options, std::string* error,
                                   int* error_code) {
  try {
    Status status;
    wire::Dtype dtype = wire::Dtype::kFloat32;
    if (!options.dtype.empty() && !wire::ParseDtype(options.dtype, &dtype)) {
      *error =
          "blkps: dtype '" + options.dtype + "' is not one of " + wire::kDtypeNames + " (the LUN's --bsopts dtype)";
      if (error_code != nullptr) *error_code = -EINVAL;
      return nullptr;
    }
    std::unique_ptr<Device> device = OpenDevice(target, options.initiator_name, options.sessions, &status);
    if (device == nullptr) {
      *error = status.message();
      if (error_code != nullptr) *error_code = -status.code();
      return nullptr;
    }
    const uint64_t block = device->logical_block_size();
    // At most the device's largest request, whole blocks, at least one.
    auto usable = [&](uint64_t bytes) {
      return std::max(std::min(bytes, device->max_request_bytes()) / block * block, block);
    };
    const bool chosen = options.request_bytes != 0;
    const uint64_t request_bytes = usable(chosen ? options.request_bytes : device->default_request_bytes());
    const uint64_t exchange_request_bytes = chosen ? request_bytes : usable(device->default_exchange_request_bytes());
    const uint32_t queue_depth = options.queue_depth != 0 ? options.queue_depth : kDefaultQueueDepth;
    return std::unique_ptr<Model>(
        new Model(std::move(device), request_bytes, exchange_request_bytes, queue_depth, dtype));
  } catch (const std::bad_alloc&) {
    *error = "blkps: out of memory opening " + target;
    if (error_code != nullptr) *error_code = -ENOMEM;
    return nullptr;
  }
}

Model::Model(std::unique_ptr<Device> device, uint64_t request_bytes, uint64_t exchange_request_bytes,
             uint32_t queue_depth, wire::Dtype dtype)
    : device_(std::move(device)),
      request_bytes_(request_bytes),
      exchange_request_bytes_(exchange_request_bytes),
      queue_depth_(queue_depth),
      dtype_(dtype),
      stream_(new Stream(device_.get(), queue_depth)) {}

Model::~Model() = default;
Model::Model(Model&&) noexcept = default;

// By hand: this Model's stream must end before its device goes.
Model& Model::operator=(Model&& other) noexcept {
  if (this == &other) return *this;
  stream_ = std::move(other.stream_);
  device_ = std::move(other.device_);
  request_bytes_ = other.request_bytes_;
  exchange_request_bytes_ = other.exchange_request_bytes_;
  queue_depth_ = other.queue_depth_;
  dtype_ = other.dtype_;
  wire_buffer_ = std::move(other.wire_buffer_);
  row_values_ = std::move(other.row_values_);
  last_error_ = std::move(other.last_error_);
  next_ticket_ = other.next_ticket_;
  return *this;
}

uint64_t Model::size_bytes() const { return device_->size_bytes(); }

uint32_t Model::logical_block_size() const { return device_->logical_block_size(); }

uint64_t Model::param_capacity() const { return device_->size_bytes() / wire::BytesPerParam(dtype_); }

const char* Model::dtype() const { return wire::DtypeName(dtype_); }

int Model::Record(const Status& status) {
  if (status.ok()) return 0;
  last_error_ = status.message();
  return -status.code();
}

int Model::Push(uint64_t first_param, const float* grad, uint64_t count) {
  Settle();
  uint64_t offset = 0, length = 0;
  Status status = ParamsToBytes("push", first_param, count, device_->size_bytes(), dtype_, &offset, &length);
  if (!status.ok()) return Record(status);
  if (dtype_ == wire::Dtype::kFloat32) {
    // A write only reads the buffer; TransferPlan's iovecs are not const.
    return Record(
        Transfer(*device_, Direction::kWrite, offset, const_cast<float*>(grad), length, request_bytes_, queue_depth_));
  }
  status = Narrow("push", first_param, grad, count, &wire_buffer_);
  if (!status.ok()) return Record(status);
  return Record(
      Transfer(*device_, Direction::kWrite, offset, wire_buffer_.data(), length, request_bytes_, queue_depth_));
}

Status Model::Narrow(const char* operation, uint64_t first_param, const float* grad, uint64_t count,
                     std::vector<uint16_t>* out) const {
  try {
    out->resize(count);
  } catch (const std::bad_alloc&) {
    return Status::Error(ENOMEM, "%s: out of memory for %llu %s values", operation, static_cast<ull>(count), dtype());
  }
  const uint64_t bad = wire::Narrow(dtype_, grad, out->data(), count);
  if (bad == count) return Status();
  return Status::Error(EINVAL, "%s: gradient for parameter %llu is %g, which is %s in %s; nothing was sent", operation,
                       static_cast<ull>(first_param + bad), static_cast<double>(grad[bad]),
                       grad[bad] != grad[bad] ? "NaN" : "infinite", dtype());
}

// One plan per direction over the same range cuts it into the same
// requests, which Device::Exchange pairs.
Status Model::ExchangeBytes(uint64_t offset, uint64_t length, void* sent, void* received, const RangeFn* arrived) {
  try {
    const uint32_t block = device_->logical_block_size();
    TransferPlan push(Direction::kWrite, offset, sent, length, block, exchange_request_bytes_);
    TransferPlan pull(Direction::kRead, offset, received, length, block, exchange_request_bytes_);
    const std::vector<IoRequest>& reads = pull.requests();
    const Device::ConsumeFn consume = [&](size_t k) { (*arrived)(reads[k].offset, reads[k].offset + reads[k].length); };
    Status status = device_->Exchange(push.requests(), reads, queue_depth_, arrived != nullptr ? &consume : nullptr);
    if (status.ok()) pull.FinishRead();
    return status;
  } catch (const std::bad_alloc&) {
    return Status::Error(ENOMEM, "exchange: out of memory planning %llu bytes", static_cast<ull>(length));
  }
}

// On a 16-bit device the pull lands in the wire buffer the push was sent
// from (read k overwrites write k's values only once write k is done) and
// is widened per request as in PullWidening.
int Model::Exchange(uint64_t first_param, const float* grad, float* out, uint64_t count) {
  Settle();
  uint64_t offset = 0, length = 0;
  Status status = ParamsToBytes("exchange", first_param, count, device_->size_bytes(), dtype_, &offset, &length);
  if (!status.ok()) return Record(status);
  if (length == 0) return 0;
  if (dtype_ == wire::Dtype::kFloat32) {
    // A write only reads the buffer; TransferPlan's iovecs are not const.
    return Record(ExchangeBytes(offset, length, const_cast<float*>(grad), out, nullptr));
  }
  status = Narrow("exchange", first_param, grad, count, &wire_buffer_);
  if (!status.ok()) return Record(status);
  const RangeFn widen = [&](uint64_t from, uint64_t to) { WidenPart(offset, length, out, from, to); };
  status = ExchangeBytes(offset, length, wire_buffer_.data(), wire_buffer_.data(), &widen);
  if (!status.ok()) return Record(status);
  // The partial first and last blocks arrived by FinishRead.
  const uint64_t block = device_->logical_block_size();
  widen(offset, offset + block);
  widen(offset + length - std::min<uint64_t>(length, block), offset + length);
  return 0;
}

int Model::Pull(uint64_t first_param, float* weights, uint64_t count) {
  Settle();
  uint64_t offset = 0, length = 0;
  Status status = ParamsToBytes("pull", first_param, count, device_->size_bytes(), dtype_, &offset, &length);
  if (!status.ok()) return Record(status);
  if (dtype_ == wire::Dtype::kFloat32) {
    return Record(Transfer(*device_, Direction::kRead, offset, weights, length, request_bytes_, queue_depth_));
  }
  try {
    wire_buffer_.resize(count);
  } catch (const std::bad_alloc&) {
    return Record(Status::Error(ENOMEM, "pull: out of memory for %llu %s values", static_cast<ull>(count), dtype()));
  }
  return Record(PullWidening(offset, weights, count));
}

// A 16-bit pull widens each request's values as that request completes,
// while they are in cache and later requests are in flight (one pass over
// the wire buffer, overlapped with the transfer). A request's bytes that lie
// in a partial first or last block arrive through the plan's bounce block,
// after FinishRead: the first and last block's worth of values (all of
// any partial block) are widened again then.
Status Model::PullWidening(uint64_t offset, float* weights, uint64_t count) {
  const uint64_t length = count * 2;
  if (length == 0) return Status();
  try {
    TransferPlan plan(Direction::kRead, offset, wire_buffer_.data(), length, device_->logical_block_size(),
                      request_bytes_);
    const std::vector<IoRequest>& requests = plan.requests();
    auto widen = [&](uint64_t from, uint64_t to) { WidenPart(offset, length, weights, from, to); };
    Status status = device_->ReadConsuming(
        requests, queue_depth_, [&](size_t k) { widen(requests[k].offset, requests[k].offset + requests[k].length); });
    if (!status.ok()) return status;
    plan.FinishRead();
    const uint64_t block = device_->logical_block_size();
    widen(offset, offset + block);
    widen(offset + length - std::min(length, block), offset + length);
    return status;
  } catch (const std::bad_alloc&) {
    return Status::Error(ENOMEM, "out of memory planning a read of %llu bytes", static_cast<ull>(length));
  }
}

void Model::WidenPart(uint64_t offset, uint64_t length, float* out, uint64_t from, uint64_t to) {
  from = std::max(from, offset);
  to = std::min(to, offset + length);
  if (from < to) wire::Widen(dtype_, &wire_buffer_[(from - offset) / 2], out + (from - offset) / 2, (to - from) / 2);
}

int Model::Push16(uint64_t first_param, const uint16_t* grad, uint64_t count) {
  Settle();
  uint64_t offset = 0, length = 0;
  Status status = Check16("push16", dtype_);
  if (status.ok())
    status = ParamsToBytes("push16", first_param, count, device_->size_bytes(), dtype_, &offset, &length);
  if (!status.ok()) return Record(status);
  status = CheckFinite16("push16", first_param, grad, count);
  if (!status.ok()) return Record(status);
  return Record(
      Transfer(*device_, Direction::kWrite, offset, const_cast<uint16_t*>(grad), length, request_bytes_, queue_depth_));
}

Status Model::CheckFinite16(const char* operation, uint64_t first_param, const uint16_t* grad, uint64_t count) const {
  const uint64_t bad = wire::FirstNonFinite16(dtype_, grad, count);
  if (bad == count) return Status();
  return Status::Error(EINVAL, "%s: gradient for parameter %llu is %s in %s; nothing was sent", operation,
                       static_cast<ull>(first_param + bad),
                       (grad[bad] & (dtype_ == wire::Dtype::kBfloat16 ? 0x7fu : 0x3ffu)) ? "NaN" : "infinite", dtype());
}

int Model::Exchange16(uint64_t first_param, const uint16_t* grad, uint16_t* out, uint64_t count) {
  Settle();
  uint64_t offset = 0, length = 0;
  Status status = Check16("exchange16", dtype_);
  if (status.ok())
    status = ParamsToBytes("exchange16", first_param, count, device_->size_bytes(), dtype_, &offset, &length);
  if (status.ok()) status = CheckFinite16("exchange16", first_param, grad, count);
  if (!status.ok()) return Record(status);
  if (length == 0) return 0;
  // A write only reads the buffer; TransferPlan's iovecs are not const.
  return Record(ExchangeBytes(offset, length, const_cast<uint16_t*>(grad), out, nullptr));
}

int Model::Pull16(uint64_t first_param, uint16_t* weights, uint64_t count) {
  Settle();
  uint64_t offset = 0, length = 0;
  Status status = Check16("pull16", dtype_);
  if (status.ok())
    status = ParamsToBytes("pull16", first_param, count, device_->size_bytes(), dtype_, &offset, &length);
  if (!status.ok()) return Record(status);
  return Record(Transfer(*device_, Direction::kRead, offset, weights, length, request_bytes_, queue_depth_));
}

int Model::WriteBytes(uint64_t offset, const void* buffer, uint64_t length) {
  Settle();
  Status status = CheckByteRange("write_bytes", offset, length, *device_);
  if (status.ok()) {
    status =
        Transfer(*device_, Direction::kWrite, offset, const_cast<void*>(buffer), length, request_bytes_, queue_depth_);
  }
  return Record(status);
}

int Model::ReadBytes(uint64_t offset, void* buffer, uint64_t length) {
  Settle();
  Status status = CheckByteRange("read_bytes", offset, length, *device_);
  if (status.ok()) {
    status = Transfer(*device_, Direction::kRead, offset, buffer, length, request_bytes_, queue_depth_);
  }
  return Record(status);
}

int Model::PullRows(const uint64_t* ids, uint64_t n, uint64_t width, float* rows) {
  Settle();
  Status status = TransferRows(*device_, dtype_, request_bytes_, queue_depth_, Direction::kRead, ids, n, width, nullptr,
                               rows, row_values_);
  KeepRowValues(row_values_);
  return Record(status);
}

int Model::PushRows(const uint64_t* ids, uint64_t n, uint64_t width, const float* grads) {
  Settle();
  Status status = TransferRows(*device_, dtype_, request_bytes_, queue_depth_, Direction::kWrite, ids, n, width, grads,
                               nullptr, row_values_);
  KeepRowValues(row_values_);
  return Record(status);
}

uint64_t Model::table_width() const { return device_->table_width(); }
bool Model::table_hashed() const { return device_->table_hashed(); }

int Model::Sync() {
  Settle();
  return Record(device_->Sync());
}

uint64_t Model::pushed_bytes_lost() const {
  Settle();
  return device_->pushed_bytes_lost();
}

uint64_t Model::reconnects() const {
  Settle();
  return device_->reconnects();
}

double Model::reconnect_seconds() const {
  Settle();
  return device_->reconnect_seconds();
}

int Model::ReadControlCounters(blkps_control_counters* out) {
  const Status no_record = Status::Error(EPROTO,
                                         "no blkps control counters (format %u) at byte %llu: is this the "
                                         "model's control LUN (CONTROL_URL), served by a blkps of this version?",
                                         BLKPS_CONTROL_FORMAT_VERSION, static_cast<ull>(BLKPS_CONTROL_COUNTERS_OFFSET));
  const uint64_t end = BLKPS_CONTROL_COUNTERS_OFFSET + BLKPS_CONTROL_COUNTERS_BYTES;
  if (device_->size_bytes() < end) return Record(no_record);
  std::vector<char> region(BLKPS_CONTROL_COUNTERS_BYTES);
  const int rc = ReadBytes(BLKPS_CONTROL_COUNTERS_OFFSET, region.data(), region.size());
  if (rc != 0) return rc;
  return blkps_control_counters_decode(region.data(), region.size(), out) == 0 ? 0 : Record(no_record);
}

int Model::ReadControlReceipt(uint32_t lun, uint64_t device_bytes, blkps_control_receipt* header,
                              std::vector<uint32_t>* counts) {
  const uint64_t record = blkps_control_receipt_offset(device_bytes, lun);
  const Status no_receipt =
      Status::Error(EPROTO,
                    "no blkps receipt (format %u) for LUN %u at byte %llu: is this the "
                    "control LUN of a blkps model of %llu bytes per learner LUN?",
                    BLKPS_CONTROL_FORMAT_VERSION, lun, static_cast<ull>(record), static_cast<ull>(device_bytes));
  const uint64_t units = blkps_control_receipt_unit_count(device_bytes);
  // Whole logical blocks (ReadBytes' contract); a record is whole 4 KiB pages.
  const uint64_t needed = counts != nullptr ? BLKPS_CONTROL_RECEIPT_HEADER_BYTES + units * 4 : sizeof *header;
  const uint64_t block = logical_block_size();
  const uint64_t wanted = (needed + block - 1) / block * block;
  if (device_->size_bytes() < record + wanted) return Record(no_receipt);
  std::vector<char> region(wanted);
  const int rc = ReadBytes(record, region.data(), region.size());
  if (rc != 0) return rc;
  if (blkps_control_receipt_decode(region.data(), region.size(), lun, header) != 0) return Record(no_receipt);
  if (counts != nullptr) {
    counts->resize(units);
    std::memcpy(counts->data(), region.data() + BLKPS_CONTROL_RECEIPT_HEADER_BYTES, units * 4);
  }
  return 0;
}

}  // namespace blkps
