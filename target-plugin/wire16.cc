// The 16-bit wire (--bsopts dtype=bfloat16|float16): a 16-bit learner LUN
// is a view of the float32 model, device byte 2*i holding parameter i. Its
// READ is narrowed here, straight out of the model; its WRITE goes to the
// job as the model's float32 range with its 16-bit values, which the model
// checks as they are and widens piece by piece as it applies them
// (Model::ApplyGradient; blkps/wire_dtype.hpp says how values round).
// Admission, clocks and receipts count it as a float32 write of the same
// parameters. Contract in lu_core.h.
#include <algorithm>
#include <cstring>
#include <string>

#include "blkps/wire_convert.h"
#include "blkps/wire_dtype.hpp"
#include "lu_core.h"

namespace blkps::server::lu_core {
namespace server = blkps::server;

bool IsWire16(const blkps_lu& lu) { return lu.options.dtype != blkps::wire::Dtype::kFloat32; }

uint64_t WireSizeBytes(const blkps_lu& lu) {
  const uint64_t bytes = lu.job->options().model.num_params * blkps::wire::BytesPerParam(lu.options.dtype);
  return (bytes + server::kDeviceSectorBytes - 1) / server::kDeviceSectorBytes * server::kDeviceSectorBytes;
}

namespace {

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

}  // namespace

// One pass: each block's weights are narrowed straight into tgt's buffer
// under the block's read lock (Model::ReadParams), with no float32 copy.
server::Status WireRead(blkps_lu* lu, uint64_t offset, void* buf, uint64_t len) {
  WireRange r;
  server::Status s = ToWireRange(*lu, offset, len, &r);
  if (!s.ok()) return s;
  uint16_t* narrow = static_cast<uint16_t*>(buf);
  const blkps::wire::Dtype dtype = lu->options.dtype;
  // A read returns what each weight rounds to, float16 overflow (Inf) included.
  s = lu->job->ReadParams(r.first, r.count, [narrow, dtype](const float* weights, uint64_t n, uint64_t done) {
    (void)blkps::wire::Narrow(dtype, weights, narrow + done, n);
  });
  if (!s.ok()) return s;
  std::memset(narrow + r.count, 0, len - r.count * 2);  // padding
  return server::Status::OK();
}

// No float32 copy: the model refuses a gradient with a NaN or Inf in the
// 16-bit type whole (and the job counts it) as it does a float32 one, then
// widens it exactly as it applies it, so the rule's bits are those of the
// widened values written to a float32 LUN.
server::Status WireWrite(blkps_lu* lu, uint64_t offset, const void* buf, uint64_t len,
                         const server::Initiator& initiator) {
  WireRange r;
  server::Status s = ToWireRange(*lu, offset, len, &r);
  if (!s.ok()) return s;
  return lu->job->Write(lu->slot, r.first * sizeof(float), buf, r.count * sizeof(float), initiator, offset,
                        lu->options.dtype);
}

}  // namespace blkps::server::lu_core
