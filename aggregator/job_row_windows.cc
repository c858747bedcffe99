// Job's row windows (job.h "Row windows"; the bytes are blkps/control_lun.h's
// "Row windows", served by target-plugin/row_window_server.cc): a table's rows
// in batches, checked whole before anything is applied, with a receipt per
// batch (the window's last push sequence and tag) that makes a resent push
// apply once. Runs on tgt's worker threads, concurrently; a window's state is
// guarded by mu_, and a push marks its window busy while it applies, so that
// a resend of the same batch waits for it and then finds it applied.
#include <cmath>
#include <cstring>

#include "blkps/wire_convert.h"
#include "job.h"

namespace blkps::server {

size_t Job::SlotOfLunLocked(uint64_t lun) const {
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].lun == lun && slots_[i].attached) return i;
  }
  return slots_.size();
}

Status Job::CheckRowBatch(const char* what, const RowBatch& batch) const {
  const TableShape& table = model_->table();
  if (!table.is_table()) {
    return Status::InvalidArgument(std::string(what) +
                                   ": row windows serve a table (--bsopts table=ROWS:WIDTH); this model is dense: "
                                   "read and write its bytes on the learner LUN");
  }
  if (batch.window >= kRowWindowsPerLun) {
    return Status::InvalidArgument(std::string(what) + ": no window " + std::to_string(batch.window) + "; there are " +
                                   std::to_string(kRowWindowsPerLun) + " per learner LUN");
  }
  if (batch.width != table.width) {
    const std::string shape =
        hashed_ != nullptr ? "hash:" + std::to_string(hashed_->capacity()) : std::to_string(table.rows);
    return Status::InvalidArgument(std::string(what) + ": rows of " + std::to_string(batch.width) +
                                   " values, but the table's are " + std::to_string(table.width) +
                                   " wide (table=" + shape + ":" + std::to_string(table.width) +
                                   "); send rows of its width; nothing was applied");
  }
  // A hashed table's ids are any 64-bit value.
  for (uint64_t k = 0; hashed_ == nullptr && k < batch.count; ++k) {
    if (batch.ids[k] >= table.rows) {
      return Status::OutOfRange(std::string(what) + ": id " + std::to_string(batch.ids[k]) + " (position " +
                                std::to_string(k) + ") is past the table's end (" + std::to_string(table.rows) +
                                " rows); nothing was applied");
    }
  }
  if (batch.rows == nullptr) return Status::OK();
  const uint64_t values = batch.count * batch.width;
  const uint64_t i = wire::FirstNonFinite32(batch.rows, values);
  if (i != values) {
    return Status::InvalidArgument(std::string(what) + ": the gradient of id " +
                                   std::to_string(batch.ids[i / batch.width]) + " (position " +
                                   std::to_string(i / batch.width) + ") is " +
                                   (std::isnan(batch.rows[i]) ? "NaN" : "infinite") + "; nothing was applied");
  }
  return Status::OK();
}

Status Job::PushRowBatch(uint64_t lun, const std::string& initiator, const RowBatch& batch) {
  Status s = CheckRowBatch("row window push", batch);
  if (!s.ok()) return s;
  if (batch.sequence == 0) {
    return Status::InvalidArgument("row window push: sequence 0; number a window's pushes from 1");
  }
  EnterWriteGate();
  size_t slot;
  RowWindow* window = nullptr;
  {
    MutexLock lock(&mu_);
    slot = SlotOfLunLocked(lun);
    if (slot == slots_.size()) {
      lock.Unlock();
      LeaveWriteGate();
      return Status::InvalidArgument("row window push: no learner LUN " + std::to_string(lun) + " in this model");
    }
    Receipt* r = receipts_.Use(slot, initiator, true);
    if (r->windows.empty()) r->windows.resize(kRowWindowsPerLun);
    window = &r->windows[batch.window];
    ++r->in_progress;  // keeps the receipt (and the window) from being dropped
    while (window->busy) lock.Wait(windows_cv_);
    // Ends a push refused or resent: then mu_ is released, then the gate.
    auto finish = [&]() REQUIRES(mu_) { --r->in_progress; };
    if (batch.sequence == window->push_sequence && batch.tag == window->push_tag) {
      finish();  // a resend of the batch applied last: acknowledged, not applied again
      lock.Unlock();
      LeaveWriteGate();
      return Status::OK();
    }
    if (batch.sequence <= window->push_sequence) {
      const std::string last = std::to_string(window->push_sequence);
      finish();
      lock.Unlock();
      LeaveWriteGate();
      return Status::InvalidArgument("row window push: sequence " + std::to_string(batch.sequence) +
                                     " does not follow the window's last push " + last +
                                     " (nor resend it: another tag); read the window's state and go on from " + last +
                                     " + 1; nothing was applied");
    }
    if (FailedLocked()) {
      const std::string why = failure_;
      finish();
      lock.Unlock();
      LeaveWriteGate();
      return Status::Unavailable(why);
    }
    window->busy = true;
    Slot& sl = slots_[slot];
    sl.last_io = sl.last_push = Clock::now();
    ++sl.writes;
    sl.bytes_written += batch.count * batch.width * sizeof(float);
    if (!clocks_.live(slot)) clocks_.Rejoin(slot);
  }
  // In one pass by block; counted as a write of each row alone would be (a
  // block's clock ticks per block's worth of parameters). A hashed table's
  // rows count on its stand-in model's one block; a push that needs rows
  // the full table cannot free is refused whole (ResourceExhausted). A
  // table is async (CheckTableJob): no bsp round to finish.
  auto count_rows = [&](uint64_t b, uint64_t rows) {
    MutexLock lock(&mu_);
    for (uint64_t k = 0; k < rows; ++k) CountGradientLocked(slot, b, batch.width);
  };
  if (hashed_ != nullptr) {
    s = hashed_->PushRows(batch.ids, batch.count, batch.rows);
    if (s.ok()) count_rows(0, batch.count);
  } else {
    s = model_->ApplyRows(batch.ids, batch.count, batch.rows, count_rows);
  }
  if (!s.ok()) rejected_writes_.fetch_add(1);
  {
    MutexLock lock(&mu_);
    // A checked batch applies whole: its rows are in range, of the table's
    // width and finite, and a job failing meanwhile does not stop it; or,
    // refused by a full hashed table, not at all.
    if (s.ok()) {
      window->push_sequence = batch.sequence;
      window->push_tag = batch.tag;
      ++window->pushes_applied;
      window->rows_applied += batch.count;
    }
    window->busy = false;
    Receipt& r = receipts_.At(slot, initiator);
    --r.in_progress;
    if (s.ok()) ++r.writes_applied;
  }
  windows_cv_.notify_all();
  LeaveWriteGate();
  return s;
}

Status Job::PullRowBatch(uint64_t lun, const std::string& initiator, const RowBatch& batch) {
  Status s = CheckRowBatch("row window pull", batch);
  if (!s.ok()) return s;
  MutexLock lock(&mu_);
  const size_t slot = SlotOfLunLocked(lun);
  if (slot == slots_.size()) {
    return Status::InvalidArgument("row window pull: no learner LUN " + std::to_string(lun) + " in this model");
  }
  Slot& sl = slots_[slot];
  sl.last_io = Clock::now();
  ++sl.reads;
  sl.bytes_read += batch.count * batch.width * sizeof(float);
  Receipt* r = receipts_.Use(slot, initiator, true);
  if (r->windows.empty()) r->windows.resize(kRowWindowsPerLun);
  RowWindow& window = r->windows[batch.window];
  window.pull_sequence = batch.sequence;
  window.pull_tag = batch.tag;
  window.pull_width = batch.width;
  window.pull_ids.assign(batch.ids, batch.ids + batch.count);
  return Status::OK();
}

Status Job::ReadRowWindow(uint64_t lun, const std::string& initiator, uint64_t window, RowWindowNumbers* numbers,
                          uint64_t first_row, uint64_t rows, float* out) {
  if (failed_.load()) {
    MutexLock lock(&mu_);
    return Status::Unavailable(failure_);
  }
  thread_local std::vector<uint64_t> ids;  // the rows asked for, copied out of the window under mu_
  ids.clear();
  *numbers = RowWindowNumbers{};
  {
    MutexLock lock(&mu_);
    // No such LUN or window: zeros, as a receipt where there is none, so
    // that the whole control LUN reads.
    const size_t slot = SlotOfLunLocked(lun);
    const Receipt* r = nullptr;
    if (slot < slots_.size() && window < kRowWindowsPerLun) {
      slots_[slot].last_io = Clock::now();
      r = receipts_.Use(slot, initiator, false);
    }
    if (r != nullptr && !r->windows.empty()) {
      const RowWindow& w = r->windows[window];
      *numbers = RowWindowNumbers{w.push_sequence, w.push_tag, w.pushes_applied,  w.rows_applied,
                                  w.pull_sequence, w.pull_tag, w.pull_ids.size(), w.pull_width};
      if (first_row < w.pull_ids.size()) {
        const uint64_t end = std::min<uint64_t>(w.pull_ids.size(), first_row + rows);
        ids.assign(w.pull_ids.begin() + first_row, w.pull_ids.begin() + end);
      }
    }
  }
  const uint64_t width = numbers->pull_width;
  if (rows > ids.size() && width > 0) {
    std::memset(out + ids.size() * width, 0, (rows - ids.size()) * width * sizeof(float));
  }
  // The pull's width is the table's (CheckRowBatch), its ids in range.
  return ids.empty() ? Status::OK() : ReadTableRows(ids.data(), ids.size(), out);
}

// Layout: entries; per entry: slot, initiator length, its bytes in words
// (zero-padded), window, push_sequence, push_tag, pushes_applied,
// rows_applied. Windows with no push applied are left out.
std::vector<uint64_t> Job::SaveRowWindowsLocked() const {
  std::vector<uint64_t> words{0};
  for (size_t slot = 0; slot < slots_.size(); ++slot) {
    for (const auto& [initiator, r] : receipts_.of(slot)) {
      for (uint64_t w = 0; w < r.windows.size(); ++w) {
        const RowWindow& window = r.windows[w];
        if (window.pushes_applied == 0) continue;
        ++words[0];
        words.insert(words.end(), {slot, initiator.size()});
        std::vector<uint64_t> name((initiator.size() + 7) / 8, 0);
        if (!initiator.empty()) std::memcpy(name.data(), initiator.data(), initiator.size());
        words.insert(words.end(), name.begin(), name.end());
        words.insert(words.end(),
                     {w, window.push_sequence, window.push_tag, window.pushes_applied, window.rows_applied});
      }
    }
  }
  return words;
}

Status Job::RestoreRowWindowsLocked(const std::vector<uint64_t>& words) {
  const Status bad = Status::InvalidArgument("its row windows section is malformed");
  if (words.empty()) return Status::OK();
  size_t i = 1;
  for (uint64_t k = 0; k < words[0]; ++k) {
    if (words.size() - i < 2) return bad;
    const uint64_t slot = words[i], name_len = words[i + 1];
    i += 2;
    const uint64_t name_words = (name_len + 7) / 8;
    if (slot >= slots_.size() || name_words > words.size() - i || words.size() - i - name_words < 5) return bad;
    std::string initiator(reinterpret_cast<const char*>(words.data() + i), name_len);
    i += name_words;
    const uint64_t w = words[i];
    if (w >= kRowWindowsPerLun) return bad;
    Receipt& r = *receipts_.Use(slot, initiator, true);
    if (r.windows.empty()) r.windows.resize(kRowWindowsPerLun);
    RowWindow& window = r.windows[w];
    window.push_sequence = words[i + 1];
    window.push_tag = words[i + 2];
    window.pushes_applied = words[i + 3];
    window.rows_applied = words[i + 4];
    i += 5;
  }
  return i == words.size() ? Status::OK() : bad;
}

}  // namespace blkps::server
