// libFuzzer harness: the control LUN (target-plugin/lu.h, served by lu.cc;
// commands parsed by Job::Control in aggregator/job_control.cc). One model
// and its control LUN live for the whole run, as in tgtd; each input is one
// WRITE to the control LUN, followed by a READ of its status and counters.
// The same write goes first to a second control LUN restricted to an
// operator (--bsopts operators=): the harness's commands come from no
// operator, so they take Job::Control's learner path.
//
// Input: 4 bytes, little-endian, taken modulo the control LUN's size as the
// write's byte offset (most offsets fall in the commands region); the rest is
// the data written. Contract checked: the write returns one of the results
// lu.h lists, and the status that follows is still one JSON object. Never a
// crash, leak or undefined behaviour (ASan, UBSan).
#include <sys/eventfd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "blkps/control_lun.h"
#include "lu.h"

namespace {

struct ControlLun {
  blkps_lu* model = nullptr;
  blkps_lu* control = nullptr;
  blkps_lu* restricted = nullptr;  // operators=: the harness is no operator
  uint64_t size = 0;
};

ControlLun Open() {
  blkps_set_log([](const char*) {});
  char err[512];
  ControlLun c;
  uint64_t model_size = 0;
  const int wake = eventfd(0, EFD_NONBLOCK);
  c.model = blkps_lu_create("params=1000;block=1K;rule=adam", err, sizeof(err));
  if (!c.model || blkps_lu_open(c.model, "fuzz-model", 1, wake, &model_size, err, sizeof(err)) != 0) std::abort();
  c.control = blkps_lu_create("role=control", err, sizeof(err));
  if (!c.control || blkps_lu_open(c.control, "fuzz-model", 2, wake, &c.size, err, sizeof(err)) != 0) std::abort();
  uint64_t restricted_size = 0;
  c.restricted = blkps_lu_create("role=control;operators=iqn.2026-11.io.blkps:fuzz-operator", err, sizeof(err));
  if (!c.restricted || blkps_lu_open(c.restricted, "fuzz-model", 3, wake, &restricted_size, err, sizeof(err)) != 0) {
    std::abort();
  }
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ControlLun lun = Open();
  if (size < 4) return 0;
  uint32_t at;
  std::memcpy(&at, data, 4);
  const uint64_t offset = at % lun.size;
  const uint64_t len = std::min<uint64_t>(size - 4, lun.size - offset);
  char err[512];
  for (blkps_lu* control : {lun.restricted, lun.control}) {
    const blkps_io_result r = blkps_lu_write(control, offset, data + 4, len, nullptr, err, sizeof(err));
    // A write gets done or one of the plugin's clear errors: a bad command,
    // a read-only region (or one this initiator may not write), or bytes past
    // what a region holds (the gap between the weights and the receipts).
    if (r != BLKPS_IO_OK && r != BLKPS_IO_BAD_DATA && r != BLKPS_IO_WRITE_PROTECT && r != BLKPS_IO_OUT_OF_RANGE) {
      std::fprintf(stderr, "control_fuzz: result %d for a write at %llu (%llu bytes): %s\n", r,
                   static_cast<unsigned long long>(offset), static_cast<unsigned long long>(len), err);
      std::abort();
    }
  }

  static std::vector<char> status(4096);
  if (blkps_lu_read(lun.control, BLKPS_CONTROL_STATUS_OFFSET, status.data(), status.size(), nullptr, err,
                    sizeof(err)) != BLKPS_IO_OK ||
      status[0] != '{') {
    std::abort();
  }
  static std::vector<char> counters(BLKPS_CONTROL_COUNTERS_BYTES);
  if (blkps_lu_read(lun.control, BLKPS_CONTROL_COUNTERS_OFFSET, counters.data(), counters.size(), nullptr, err,
                    sizeof(err)) != BLKPS_IO_OK) {
    std::abort();
  }
  return 0;
}
