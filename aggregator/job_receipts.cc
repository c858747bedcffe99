// Job's receipts (job.h, "Receipts"): what each initiator's writes to each
// learner slot have done, counted as they are applied (inside the write gate
// that checkpoints close), read for target-plugin/control_lun_server.cc
// (which serves them as the control LUN's receipts region), fenced, bounded
// per slot, and checkpointed.
#include <algorithm>
#include <cstring>

#include "job.h"

namespace blkps::server {

void Job::EnterWriteGate() {
  MutexLock lock(&gate_mu_);
  while (gate_closed_) lock.Wait(gate_cv_);
  ++writes_running_;
}

void Job::LeaveWriteGate() {
  MutexLock lock(&gate_mu_);
  if (--writes_running_ == 0) gate_cv_.notify_all();
}

void Job::FinishWrite(size_t slot, const std::string& initiator, uint64_t offset, bool applied, uint64_t round) {
  MutexLock lock(&mu_);
  Receipt& r = slots_[slot].receipts[initiator];
  if (r.in_progress > 0) --r.in_progress;
  r.last_use = ++receipt_uses_;
  if (!applied) return;
  ++r.applied[offset / kReceiptUnit];
  ++r.writes_applied;
  if (RoundBoundaries()) RecordRoundWriteLocked(slot, initiator, offset / kReceiptUnit, round);
}

Job::Receipt* Job::UseReceiptLocked(Slot& s, const std::string& initiator, bool write) {
  auto it = write ? s.receipts.try_emplace(initiator).first : s.receipts.find(initiator);
  if (it == s.receipts.end()) return nullptr;
  it->second.last_use = ++receipt_uses_;
  if (s.receipts.size() > kReceiptsPerSlot) {
    // The least recently used receipt with no write in progress (a write in
    // progress will count on it, or fail and uncount).
    auto oldest = s.receipts.end();
    for (auto r = s.receipts.begin(); r != s.receipts.end(); ++r) {
      if (r->second.in_progress == 0 && (oldest == s.receipts.end() || r->second.last_use < oldest->second.last_use)) {
        oldest = r;
      }
    }
    if (oldest != s.receipts.end() && oldest != it) s.receipts.erase(oldest);
  }
  return &it->second;
}

void Job::FenceLocked(uint64_t lun, const std::string& initiator) {
  auto it = std::remove_if(held_.begin(), held_.end(), [&](HeldCommand& held) REQUIRES(mu_) {
    const bool fenced = held.write && slots_[held.slot].lun == lun && held.initiator == initiator;
    if (fenced) {
      ReleaseOneLocked(held, Status::DeadlineExceeded("write fenced: initiator " + initiator +
                                                      " reconnected and will resend what its receipt lacks"));
    }
    return fenced;
  });
  held_.erase(it, held_.end());
}

Job::ReceiptNumbers Job::GetReceipt(uint64_t lun, const std::string& initiator, uint64_t first_unit,
                                    std::vector<uint32_t>* counts) const {
  std::fill(counts->begin(), counts->end(), 0);
  MutexLock lock(&mu_);
  for (const Slot& s : slots_) {
    auto it = s.lun == lun ? s.receipts.find(initiator) : s.receipts.end();
    if (it == s.receipts.end()) continue;
    const Receipt& r = it->second;
    for (const auto& [unit, count] : r.applied) {
      if (unit >= first_unit && unit - first_unit < counts->size()) (*counts)[unit - first_unit] = count;
    }
    return ReceiptNumbers{r.writes_applied, r.in_progress};
  }
  return ReceiptNumbers{};
}

// Layout: receipts; per receipt: slot, writes_applied, initiator length,
// its bytes in words (zero-padded), number of counters, then (unit, count)
// pairs. A slot's receipts are saved least recently used first, and restored
// in that order of use.
std::vector<uint64_t> Job::SaveReceiptsLocked() const {
  std::vector<uint64_t> words{0};
  for (size_t slot = 0; slot < slots_.size(); ++slot) {
    std::vector<std::pair<const std::string*, const Receipt*>> by_use;
    for (const auto& [initiator, r] : slots_[slot].receipts) by_use.emplace_back(&initiator, &r);
    std::sort(by_use.begin(), by_use.end(),
              [](const auto& x, const auto& y) { return x.second->last_use < y.second->last_use; });
    for (const auto& [initiator_name, receipt] : by_use) {
      const std::string& initiator = *initiator_name;
      const Receipt& r = *receipt;
      ++words[0];
      words.insert(words.end(), {slot, r.writes_applied, initiator.size()});
      std::vector<uint64_t> name((initiator.size() + 7) / 8, 0);
      if (!initiator.empty()) std::memcpy(name.data(), initiator.data(), initiator.size());  // "": no data()
      words.insert(words.end(), name.begin(), name.end());
      words.push_back(r.applied.size());
      // By unit: the same receipts give the same bytes, whatever the hash
      // map's history (a restored job saves what it loaded).
      std::vector<std::pair<uint64_t, uint32_t>> counts(r.applied.begin(), r.applied.end());
      std::sort(counts.begin(), counts.end());
      for (const auto& [unit, count] : counts) words.insert(words.end(), {unit, count});
    }
  }
  return words;
}

Status Job::RestoreReceiptsLocked(const std::vector<uint64_t>& words) {
  const Status bad = Status::InvalidArgument("its receipts section is malformed");
  size_t i = 0;
  auto next = [&](uint64_t* w) {
    if (i >= words.size()) return false;
    *w = words[i++];
    return true;
  };
  uint64_t receipts = 0;
  if (!words.empty() && !next(&receipts)) return bad;
  for (uint64_t k = 0; k < receipts; ++k) {
    uint64_t slot, applied, name_len, counters;
    if (!next(&slot) || !next(&applied) || !next(&name_len) || slot >= slots_.size()) return bad;
    const uint64_t name_words = (name_len + 7) / 8;
    if (name_words > words.size() - i) return bad;
    std::string initiator(reinterpret_cast<const char*>(words.data() + i), name_len);
    i += name_words;
    if (!next(&counters) || counters > (words.size() - i) / 2) return bad;
    Receipt& r = *UseReceiptLocked(slots_[slot], initiator, true);  // files before the bound may hold more
    r.writes_applied = applied;
    // A slot that had pushed took part before the restart: it counts for
    // async steps from the restart on (for dead_after, as its learner
    // reconnects), so the restart changes no step's size.
    if (applied > 0) slots_[slot].last_push = Clock::now();
    for (uint64_t c = 0; c < counters; ++c, i += 2) r.applied[words[i]] = static_cast<uint32_t>(words[i + 1]);
  }
  return i == words.size() ? Status::OK() : bad;
}

}  // namespace blkps::server
