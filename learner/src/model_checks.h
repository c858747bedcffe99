// The checks a Model makes before it moves anything, shared by its
// synchronous calls (model.cc) and its submissions (model_stream.cc), so
// that both refuse the same input with the same message.

#ifndef BLKPS_LEARNER_MODEL_CHECKS_H_
#define BLKPS_LEARNER_MODEL_CHECKS_H_

#include <cstdint>

#include "blkps/wire_dtype.hpp"
#include "status.h"

namespace blkps {

// Parameters [first_param, first_param + count) as a byte range of a device
// of `dtype` and `size_bytes`, or -ERANGE when it does not fit on the device.
Status ParamsToBytes(const char* operation, uint64_t first_param, uint64_t count, uint64_t size_bytes,
                     wire::Dtype dtype, uint64_t* offset, uint64_t* length);

// -EINVAL unless the device is 16-bit (16-bit values go only there).
Status Check16(const char* operation, wire::Dtype dtype);

}  // namespace blkps

#endif  // BLKPS_LEARNER_MODEL_CHECKS_H_
