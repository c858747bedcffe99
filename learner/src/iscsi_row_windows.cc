// IscsiDevice's row windows (device.h TransferRows; the contract is
// blkps/control_lun.h "Row windows"): a batch of a table's rows cut into
// pieces, one per window of this device's LUN on the control LUN, all in
// flight at once: a push is one WRITE per piece, a pull one WRITE of ids and
// one READ of rows per piece. Commands dropped with the session are sent
// again as they were: the server applies a push's sequence and tag once, and
// a pull's write only names ids. After a reconnect, the windows' states say
// which acknowledged pushes a server restart lost (pushed_bytes_lost).

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include "iscsi_device.h"

namespace blkps::iscsi {
namespace {

// A piece of a batch is at least this many rows (or the whole batch): a
// command costs the server tens of microseconds, a row about a third of one,
// so a smaller piece pays its command more than its rows. Measured on the
// 2-core VM (batches of 2,048 and 4,096 Zipf ids, 128-byte rows): 1,024 a
// piece pulled 1.6x and 1.3x the rows per second of 128 a piece; 256 and
// 2,048 did worse than 1,024.
constexpr uint64_t kMinRowsPerWindow = 1024;

// The READ of a window's state (and nothing else).
constexpr uint64_t kStateBytes = BLKPS_ROW_WINDOW_HEADER_BYTES;

// A window's buffer is kept between batches up to this size: a rare huge
// batch does not hold its megabytes for the device's life.
constexpr uint64_t kKeptWindowBytes = 4 << 20;

// bytes as `size` bytes whose [0, zeros_before) and [zeros_from, size) are
// zero; the bytes between are the caller's to fill. Keeps its memory.
void Shape(std::vector<uint8_t>& bytes, uint64_t size, uint64_t zeros_before, uint64_t zeros_from) {
  bytes.resize(size);
  std::memset(bytes.data(), 0, zeros_before);
  std::memset(bytes.data() + zeros_from, 0, size - zeros_from);
}

}  // namespace

struct IscsiDevice::RowWindowRequest {
  uint64_t window = 0;
  std::vector<uint8_t> bytes;     // written from, or read into
  uint64_t first = 0, count = 0;  // the batch's ids [first, first + count)
  uint64_t sequence = 0, tag = 0;
};

Status IscsiDevice::RunWindowCommands(Direction direction, const std::vector<RowWindowRequest>& requests,
                                      uint32_t queue_depth) {
  std::vector<iovec> iov(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    iov[i] = {const_cast<uint8_t*>(requests[i].bytes.data()), requests[i].bytes.size()};
  }
  auto lba = [&](size_t index) {
    return blkps_control_window_offset(size_bytes_, static_cast<uint64_t>(control_lun_), static_cast<uint64_t>(lun_),
                                       requests[index].window) /
           block_size_;
  };
  auto start = [&](size_t index, Command* command) {
    const uint32_t length = static_cast<uint32_t>(iov[index].iov_len);
    scsi_iovec* v = reinterpret_cast<scsi_iovec*>(&iov[index]);
    return direction == Direction::kRead
               ? iscsi_read16_iov_task(iscsi_, control_lun_, lba(index), length, block_size_, 0, 0, 0, 0, 0,
                                       OnCommandDone, command, v, 1)
               : iscsi_write16_iov_task(iscsi_, control_lun_, lba(index), nullptr, length, block_size_, 0, 0, 0, 0, 0,
                                        OnCommandDone, command, v, 1);
  };
  auto describe = [&](size_t index) {
    return std::string(direction == Direction::kRead ? "read of" : "request to") + " row window " +
           std::to_string(requests[index].window) + " of " + name_;
  };
  // No receipts by unit here (writes null): whatever the session dropped is
  // sent again, which the windows make safe.
  return RunCommands(requests.size(), queue_depth, start, describe, nullptr);
}

Status IscsiDevice::SyncRowWindows(uint64_t row_bytes) {
  const bool first = row_windows_.empty();
  if (!first && row_windows_reconnects_ == reconnects_) return Status();
  std::vector<RowWindowRequest> reads(BLKPS_CONTROL_WINDOWS_PER_LUN);
  for (uint64_t w = 0; w < reads.size(); ++w) {
    reads[w].window = w;
    reads[w].bytes.assign(kStateBytes, 0);
  }
  Status s = RunWindowCommands(Direction::kRead, reads, BLKPS_CONTROL_WINDOWS_PER_LUN);
  if (!s.ok()) return s;
  if (first) row_windows_.resize(BLKPS_CONTROL_WINDOWS_PER_LUN);
  uint64_t lost_rows = 0;
  for (uint64_t w = 0; w < reads.size(); ++w) {
    blkps_row_window_state state{};
    if (blkps_row_window_state_decode(reads[w].bytes.data(), kStateBytes, static_cast<uint64_t>(lun_), w, &state) !=
        0) {
      return Status::Error(EIO, "%s: row window %llu holds no state of format %u", name_.c_str(),
                           static_cast<unsigned long long>(w), BLKPS_CONTROL_FORMAT_VERSION);
    }
    RowWindowCursor& cursor = row_windows_[w];
    if (!first && cursor.rows_acknowledged > state.rows_applied) {
      lost_rows += cursor.rows_acknowledged - state.rows_applied;
    }
    cursor.rows_acknowledged = state.rows_applied;
    cursor.sequence = std::max({cursor.sequence, state.push_sequence, state.pull_sequence});
  }
  if (lost_rows > 0) {
    pushed_bytes_lost_ += lost_rows * row_bytes;
    fprintf(stderr,
            "blkps: %s: the target restarted from a checkpoint older than %llu acknowledged rows pushed through its "
            "row windows (%llu bytes); those gradients are not in the table\n",
            name_.c_str(), static_cast<unsigned long long>(lost_rows),
            static_cast<unsigned long long>(lost_rows * row_bytes));
  }
  row_windows_reconnects_ = reconnects_;
  return Status();
}

Status IscsiDevice::TransferRows(Direction direction, const uint64_t* ids, uint64_t n, uint64_t width, float* rows,
                                 uint32_t queue_depth) {
  const uint64_t row_bytes = width * sizeof(float);
  Status s = SyncRowWindows(row_bytes);
  if (!s.ok()) return s;
  if (row_window_tags_ == 0) row_window_tags_ = std::random_device{}() | (uint64_t{std::random_device{}()} << 32);
  const uint32_t op = direction == Direction::kRead ? BLKPS_ROW_WINDOW_PULL : BLKPS_ROW_WINDOW_PUSH;
  const uint64_t windows = std::min<uint64_t>(std::max<uint32_t>(queue_depth, 1), BLKPS_CONTROL_WINDOWS_PER_LUN);
  // A request is one command, so it fits the largest the LUN takes (256
  // KiB on iser://) as well as a window.
  const uint64_t fits_command = max_request_bytes_ > BLKPS_ROW_WINDOW_HEADER_BYTES + 1024
                                    ? (max_request_bytes_ - BLKPS_ROW_WINDOW_HEADER_BYTES - 1024) / (8 + row_bytes)
                                    : 1;
  const uint64_t capacity = std::max<uint64_t>(1, std::min(blkps_row_window_capacity(width), fits_command));
  row_window_buffers_.resize(windows);
  // Rounds of up to `windows` pieces, each piece in its own window, its
  // bytes in that window's buffer (taken, and given back once the round
  // went well).
  for (uint64_t done = 0; done < n;) {
    const uint64_t left = n - done;
    const uint64_t per_window = std::min(capacity, std::max(kMinRowsPerWindow, (left + windows - 1) / windows));
    std::vector<RowWindowRequest> requests;
    requests.reserve(windows);
    for (uint64_t w = 0; w < windows && done < n; ++w) {
      RowWindowRequest r;
      r.window = w;
      r.first = done;
      r.count = std::min(per_window, n - done);
      r.sequence = ++row_windows_[w].sequence;
      r.tag = ++row_window_tags_;
      r.bytes.swap(row_window_buffers_[w]);
      const uint64_t ids_end = BLKPS_ROW_WINDOW_HEADER_BYTES + r.count * sizeof(uint64_t);
      const uint64_t rows_end =
          op == BLKPS_ROW_WINDOW_PUSH ? blkps_row_window_rows_offset(r.count) + r.count * row_bytes : ids_end;
      Shape(r.bytes, blkps_row_window_request_bytes(op, r.count, width), BLKPS_ROW_WINDOW_HEADER_BYTES, rows_end);
      if (op == BLKPS_ROW_WINDOW_PUSH) {  // the padding between the ids and the rows
        std::memset(r.bytes.data() + ids_end, 0, blkps_row_window_rows_offset(r.count) - ids_end);
      }
      blkps_row_window_request header{};
      header.op = op;
      header.sequence = r.sequence;
      header.tag = r.tag;
      header.count = r.count;
      header.width = width;
      blkps_row_window_request_encode(header, r.bytes.data());
      std::memcpy(r.bytes.data() + BLKPS_ROW_WINDOW_HEADER_BYTES, ids + r.first, r.count * sizeof(uint64_t));
      if (op == BLKPS_ROW_WINDOW_PUSH) {
        std::memcpy(r.bytes.data() + blkps_row_window_rows_offset(r.count), rows + r.first * width,
                    r.count * row_bytes);
      }
      done += r.count;
      requests.push_back(std::move(r));
    }
    s = RunWindowCommands(Direction::kWrite, requests, queue_depth);
    if (!s.ok()) return s;
    if (op == BLKPS_ROW_WINDOW_PUSH) {
      for (const RowWindowRequest& r : requests) row_windows_[r.window].rows_acknowledged += r.count;
    } else {
      for (RowWindowRequest& r : requests) {  // the READ fills it; a stale header would not match
        Shape(r.bytes,
              (BLKPS_ROW_WINDOW_HEADER_BYTES + r.count * row_bytes + block_size_ - 1) / block_size_ * block_size_,
              BLKPS_ROW_WINDOW_HEADER_BYTES, BLKPS_ROW_WINDOW_HEADER_BYTES + r.count * row_bytes);
      }
      s = RunWindowCommands(Direction::kRead, requests, queue_depth);
      if (!s.ok()) return s;
      for (const RowWindowRequest& r : requests) {
        blkps_row_window_state state{};
        const bool same = blkps_row_window_state_decode(r.bytes.data(), r.bytes.size(), static_cast<uint64_t>(lun_),
                                                        r.window, &state) == 0 &&
                          state.pull_sequence == r.sequence && state.pull_tag == r.tag && state.pull_count == r.count;
        if (!same) {
          // The server forgot the pull between its write and read: it
          // restarted. The caller may pull again.
          return Status::Error(EAGAIN,
                               "pull_rows: row window %llu of %s no longer holds this pull (the target restarted "
                               "meanwhile); pull again",
                               static_cast<unsigned long long>(r.window), name_.c_str());
        }
        std::memcpy(rows + r.first * width, r.bytes.data() + BLKPS_ROW_WINDOW_HEADER_BYTES, r.count * row_bytes);
      }
    }
    for (RowWindowRequest& r : requests) {
      if (r.bytes.capacity() <= kKeptWindowBytes) r.bytes.swap(row_window_buffers_[r.window]);
    }
  }
  // A reconnect during this batch: what did a restart lose?
  return SyncRowWindows(row_bytes);
}

}  // namespace blkps::iscsi
