// The control LUN's row windows (wire/include/blkps/control_lun.h "Row
// windows"): a WRITE at a window's start decoded into a batch for the job
// (aggregator/job_row_windows.cc), and a READ of a window served as its state
// record and its last pull's rows. Contract in lu_core.h.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "blkps/control_lun.h"
#include "lu_core.h"

namespace blkps::server::lu_core {
namespace server = blkps::server;

namespace {

static_assert(server::Job::kRowWindowsPerLun == BLKPS_CONTROL_WINDOWS_PER_LUN, "one count of windows");

constexpr uint64_t kWindowBytes = BLKPS_CONTROL_WINDOW_BYTES;
constexpr uint64_t kHeaderBytes = BLKPS_ROW_WINDOW_HEADER_BYTES;

std::string WindowName(uint64_t lun, uint64_t window) {
  return "row window " + std::to_string(window) + " of LUN " + std::to_string(lun);
}

}  // namespace

server::Status RowWindowsRead(blkps_lu* lu, uint64_t at, char* out, uint64_t n, const std::string& initiator) {
  const uint64_t row_bytes = lu->job->options().model.table.width * sizeof(float);
  thread_local std::vector<float> values;  // a piece's rows when they cannot go straight into out
  for (uint64_t done = 0; done < n;) {
    const uint64_t index = (at + done) / kWindowBytes, from = (at + done) % kWindowBytes;
    const uint64_t piece = std::min(n - done, kWindowBytes - from);
    const uint64_t lun = index / BLKPS_CONTROL_WINDOWS_PER_LUN, window = index % BLKPS_CONTROL_WINDOWS_PER_LUN;
    // The rows this piece touches, from the row at 4 KiB, and where in out
    // its part past the header starts.
    uint64_t first_row = 0, rows = 0;
    const uint64_t rows_from = std::max(from, kHeaderBytes);
    char* rows_out = from + piece > kHeaderBytes ? out + done + (rows_from - from) : nullptr;
    if (row_bytes > 0 && from + piece > kHeaderBytes) {
      first_row = (rows_from - kHeaderBytes) / row_bytes;
      rows = (from + piece - kHeaderBytes + row_bytes - 1) / row_bytes - first_row;
    }
    // Whole rows at a float's alignment (a READ of a pull as the learner
    // sends it, of rows a multiple of 512 bytes) are read straight into out;
    // others through `values`, then the piece's bytes of them copied.
    const bool straight = rows > 0 && (rows_from - kHeaderBytes) % row_bytes == 0 &&
                          (from + piece - kHeaderBytes) % row_bytes == 0 &&
                          reinterpret_cast<uintptr_t>(rows_out) % alignof(float) == 0;
    float* rows_into = reinterpret_cast<float*>(rows_out);
    if (!straight) {
      values.resize(rows * (row_bytes / sizeof(float)));
      rows_into = values.data();
    }
    server::Job::RowWindowNumbers numbers;
    server::Status s = lu->job->ReadRowWindow(lun, initiator, window, &numbers, first_row, rows, rows_into);
    if (!s.ok()) return s;
    if (from < kHeaderBytes) {
      char header[kHeaderBytes] = {};
      blkps_row_window_state state{};
      state.lun = lun;
      state.window = window;
      state.push_sequence = numbers.push_sequence;
      state.push_tag = numbers.push_tag;
      state.pushes_applied = numbers.pushes_applied;
      state.rows_applied = numbers.rows_applied;
      state.pull_sequence = numbers.pull_sequence;
      state.pull_tag = numbers.pull_tag;
      state.pull_count = numbers.pull_count;
      state.pull_width = numbers.pull_width;
      blkps_row_window_state_encode(state, header);
      std::memcpy(out + done, header + from, std::min(piece, kHeaderBytes - from));
    }
    if (from + piece > kHeaderBytes) {
      const uint64_t bytes = from + piece - rows_from;
      if (rows == 0) {
        std::memset(rows_out, 0, bytes);  // a dense model: no rows
      } else if (!straight) {
        std::memcpy(rows_out, reinterpret_cast<const char*>(values.data()) + (rows_from - kHeaderBytes) % row_bytes,
                    bytes);
      }
    }
    done += piece;
  }
  return server::Status::OK();
}

server::Status RowWindowsWrite(blkps_lu* lu, uint64_t at, const char* in, uint64_t n, const std::string& initiator) {
  const uint64_t index = at / kWindowBytes;
  const uint64_t lun = index / BLKPS_CONTROL_WINDOWS_PER_LUN, window = index % BLKPS_CONTROL_WINDOWS_PER_LUN;
  const std::string name = WindowName(lun, window);
  if (at % kWindowBytes != 0 || n > kWindowBytes) {
    return server::Status::InvalidArgument(
        name + ": a request is one WRITE from the window's first byte, within the window (control_lun.h "
               "\"Row windows\")");
  }
  blkps_row_window_request request{};
  if (blkps_row_window_request_decode(in, n, &request) != 0) {
    return server::Status::InvalidArgument(name + ": no request header of format " +
                                           std::to_string(BLKPS_CONTROL_FORMAT_VERSION) +
                                           " (magic blkpsrow, op 1 pull or 2 push) at the window's start");
  }
  const uint64_t capacity = blkps_row_window_capacity(request.width);
  if (request.count == 0 || request.count > capacity) {
    return server::Status::InvalidArgument(name + ": a batch of " + std::to_string(request.count) +
                                           " ids; a window takes 1 to " + std::to_string(capacity) + " rows of " +
                                           std::to_string(request.width) + " values: split the batch over windows");
  }
  const uint64_t need = blkps_row_window_request_bytes(request.op, request.count, request.width);
  if (n < need) {
    return server::Status::InvalidArgument(name + ": the write holds " + std::to_string(n) + " bytes but its " +
                                           std::to_string(request.count) + " ids" +
                                           (request.op == BLKPS_ROW_WINDOW_PUSH ? " and rows" : "") + " need " +
                                           std::to_string(need) + "; nothing was applied");
  }
  server::Job::RowBatch batch;
  batch.window = window;
  batch.sequence = request.sequence;
  batch.tag = request.tag;
  batch.ids = reinterpret_cast<const uint64_t*>(in + kHeaderBytes);
  batch.count = request.count;
  batch.width = request.width;
  if (request.op == BLKPS_ROW_WINDOW_PULL) return lu->job->PullRowBatch(lun, initiator, batch);
  batch.rows = reinterpret_cast<const float*>(in + blkps_row_window_rows_offset(request.count));
  return lu->job->PushRowBatch(lun, initiator, batch);
}

}  // namespace blkps::server::lu_core
