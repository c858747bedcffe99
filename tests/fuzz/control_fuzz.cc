// libFuzzer harness: the control LUN (target-plugin/lu.h, served by
// control_lun_server.cc; commands parsed by Job::Control in
// aggregator/job_control.cc). One model and its control LUN live for the
// whole run, as in tgtd; each input is one WRITE to the control LUN, followed
// by a READ of its status and counters.
// The same write goes first to the learners' control LUN (--bsopts
// access=learners), which takes Job::Control's learner path.
//
// Input: 4 bytes, little-endian, taken modulo the control LUN's size as the
// write's byte offset (most offsets fall in the commands region); the rest is
// the data written. Contract checked: the write returns one of the results
// lu.h lists; after every write the status parses as one JSON object in
// valid UTF-8 (tests/json_check.h); a refused write changed no rule
// parameter, tag or weight. Never a crash, leak or undefined behaviour
// (ASan, UBSan).
#include <sys/eventfd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../json_check.h"
#include "blkps/control_lun.h"
#include "lu.h"

namespace {

struct ControlLun {
  blkps_lu* model = nullptr;
  blkps_lu* control = nullptr;
  blkps_lu* restricted = nullptr;  // access=learners
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
  c.restricted = blkps_lu_create("role=control;access=learners", err, sizeof(err));
  if (!c.restricted || blkps_lu_open(c.restricted, "fuzz-model", 3, wake, &restricted_size, err, sizeof(err)) != 0) {
    std::abort();
  }
  return c;
}

// The status JSON, checked to parse; aborts if it does not.
std::string StatusText(const ControlLun& lun) {
  static std::vector<char> region(BLKPS_CONTROL_STATUS_BYTES);
  char err[512];
  if (blkps_lu_read(lun.control, BLKPS_CONTROL_STATUS_OFFSET, region.data(), region.size(), nullptr, err,
                    sizeof(err)) != BLKPS_IO_OK) {
    std::abort();
  }
  const std::string status(region.data(), strnlen(region.data(), region.size()));
  const std::string problem = blkps_test::JsonCheck::Problem(status);
  if (!problem.empty()) {
    std::fprintf(stderr, "control_fuzz: the status is not valid UTF-8 JSON: %s\n%s\n", problem.c_str(), status.c_str());
    std::abort();
  }
  return status;
}

// What a refused write must leave as it was: the rule parameters and tag
// (as the status shows them) and the weights' bytes.
std::string Guarded(const ControlLun& lun) {
  const std::string status = StatusText(lun);
  const size_t from = status.find("\"tag\""), to = status.find("\"global_step\"");
  if (from == std::string::npos || to == std::string::npos) std::abort();
  std::string weights(4096, '\0');
  char err[512];
  if (blkps_lu_read(lun.control, BLKPS_CONTROL_WEIGHTS_OFFSET, weights.data(), weights.size(), nullptr, err,
                    sizeof(err)) != BLKPS_IO_OK) {
    std::abort();
  }
  return status.substr(from, to - from) + weights;
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
    const std::string before = Guarded(lun);
    const blkps_io_result r = blkps_lu_write(control, offset, data + 4, len, nullptr, err, sizeof(err));
    // A write gets done or one of the plugin's clear errors: a bad command,
    // a read-only region (or one this initiator may not write), or bytes past
    // what a region holds (the gap between the weights and the receipts).
    if (r != BLKPS_IO_OK && r != BLKPS_IO_BAD_DATA && r != BLKPS_IO_WRITE_PROTECT && r != BLKPS_IO_OUT_OF_RANGE) {
      std::fprintf(stderr, "control_fuzz: result %d for a write at %llu (%llu bytes): %s\n", r,
                   static_cast<unsigned long long>(offset), static_cast<unsigned long long>(len), err);
      std::abort();
    }
    if (r != BLKPS_IO_OK && Guarded(lun) != before) {
      std::fprintf(stderr, "control_fuzz: a refused write (result %d, %s) changed the rule, tag or weights\n", r, err);
      std::abort();
    }
  }
  StatusText(lun);
  static std::vector<char> counters(BLKPS_CONTROL_COUNTERS_BYTES);
  if (blkps_lu_read(lun.control, BLKPS_CONTROL_COUNTERS_OFFSET, counters.data(), counters.size(), nullptr, err,
                    sizeof(err)) != BLKPS_IO_OK) {
    std::abort();
  }
  return 0;
}
