// The C++ side of struct blkps_lu (lu.h), shared by the three files of the
// plugin's core, one job each:
//   lu.cc                  the C ABI to bs_blkps.c and the LU's lifecycle
//                          (options, opening the job, admission, dispatch);
//   control_lun_server.cc  the control LUN's reads and writes (its regions as
//                          wire/include/blkps/control_lun.h lays them out);
//   row_window_server.cc   its row windows: a table's rows in batches;
//   wire16.cc              the 16-bit wire (--bsopts dtype=bfloat16|float16):
//                          a learner LUN's READ/WRITE converted to float32.
// Threading as lu.h says: the Control*/Wire* functions run on tgt's worker
// threads, concurrently; each locks what of the LU it shares.
#ifndef BLKPS_TARGET_PLUGIN_LU_CORE_H
#define BLKPS_TARGET_PLUGIN_LU_CORE_H

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "job.h"
#include "lu.h"
#include "lu_options.h"

struct blkps_lu {
  std::string bsopts;
  blkps::server::LuOptions options;
  std::shared_ptr<blkps::server::Job> job;  // null until opened
  size_t slot = 0;                          // learner LUNs: the job's slot
  uint64_t lun = 0;
  std::deque<blkps::server::Job::Released> released;  // main thread only

  // The initiator name of each admitted command, from blkps_lu_admit until
  // it runs or fails.
  std::mutex initiators_mu;
  std::map<void*, blkps::server::Initiator> initiators;

  // Control LUN: the status snapshot reads are served from.
  std::mutex status_mu;
  std::string status;

  // Control LUN: the exchange region's bytes (control_lun.h), allocated on
  // its first write; empty reads as zeros.
  std::mutex exchange_mu;
  std::vector<char> exchange;
};

namespace blkps::server::lu_core {

// ---- The control LUN (control_lun_server.cc) ----
// REQUIRES for each: lu->job is open and lu->options.control.

// The control LUN's size: its regions, the weights as long as the model's
// device, the receipts, then the exchange region.
uint64_t ControlSizeBytes(const blkps_lu& lu);
// Whether [offset, offset + len) touches a read-only region: status,
// counters or receipts.
bool TouchesReadOnlyRegion(const blkps_lu& lu, uint64_t offset, uint64_t len);
// READ of [offset, offset + len) as `initiator` sees it (its receipts).
Status ControlRead(blkps_lu* lu, uint64_t offset, char* buf, uint64_t len, const std::string& initiator);
// WRITE of [offset, offset + len) by `initiator` (its fence= names its
// session). REQUIRES !TouchesReadOnlyRegion(offset, len).
Status ControlWrite(blkps_lu* lu, uint64_t offset, const char* buf, uint64_t len, const Initiator& initiator);

// ---- The row windows (row_window_server.cc) ----
// REQUIRES for each: lu->job is open and lu->options.control; `at` counts
// from the windows region's start (blkps_control_windows_offset).

// READ of windows bytes [at, at + n) as `initiator` sees them: each
// window's state record, then its last pull's rows.
Status RowWindowsRead(blkps_lu* lu, uint64_t at, char* out, uint64_t n, const std::string& initiator);
// WRITE of windows bytes [at, at + n): one request, from a window's start.
// Refused whole (the job's errors, or InvalidArgument for a malformed
// request) with nothing applied.
Status RowWindowsWrite(blkps_lu* lu, uint64_t at, const char* in, uint64_t n, const std::string& initiator);

// ---- The 16-bit wire (wire16.cc) ----
// REQUIRES for each but IsWire16: lu->job is open and IsWire16(*lu).

bool IsWire16(const blkps_lu& lu);
// The 16-bit LUN's size: 2 bytes per parameter, rounded up to a sector.
uint64_t WireSizeBytes(const blkps_lu& lu);
Status WireRead(blkps_lu* lu, uint64_t offset, void* buf, uint64_t len);
Status WireWrite(blkps_lu* lu, uint64_t offset, const void* buf, uint64_t len, const Initiator& initiator);

}  // namespace blkps::server::lu_core

#endif  // BLKPS_TARGET_PLUGIN_LU_CORE_H
