// Receipts (receipts.h): counting, the per-slot bound, and the checkpoint
// section.
#include "receipts.h"

#include <algorithm>
#include <cstring>

namespace blkps::server {

void Receipts::Receipt::CopyCounts(uint64_t first_unit, std::vector<uint32_t>* counts) const {
  for (const auto& [unit, count] : applied) {
    if (unit >= first_unit && unit - first_unit < counts->size()) (*counts)[unit - first_unit] = count;
  }
}

void Receipts::AddSlot() { by_slot_.emplace_back(); }

Receipts::Receipt* Receipts::Use(size_t slot, const std::string& initiator, bool write) {
  std::map<std::string, Receipt>& receipts = by_slot_[slot];
  auto it = write ? receipts.try_emplace(initiator).first : receipts.find(initiator);
  if (it == receipts.end()) return nullptr;
  it->second.last_use = ++uses_;
  if (receipts.size() > kPerSlot) {
    // The least recently used receipt with no write in progress (a write in
    // progress will count on it, or fail and uncount).
    auto oldest = receipts.end();
    for (auto r = receipts.begin(); r != receipts.end(); ++r) {
      if (r->second.in_progress == 0 && (oldest == receipts.end() || r->second.last_use < oldest->second.last_use)) {
        oldest = r;
      }
    }
    if (oldest != receipts.end() && oldest != it) receipts.erase(oldest);
  }
  return &it->second;
}

const Receipts::Receipt* Receipts::Find(size_t slot, const std::string& initiator) const {
  auto it = by_slot_[slot].find(initiator);
  return it == by_slot_[slot].end() ? nullptr : &it->second;
}

void Receipts::FinishWrite(size_t slot, const std::string& initiator, uint64_t unit, bool applied) {
  Receipt& r = At(slot, initiator);
  r.last_use = ++uses_;
  if (!applied) return;
  ++r.applied[unit];
  ++r.writes_applied;
}

void Receipts::EndWrite(size_t slot, const std::string& initiator) {
  Receipt& r = At(slot, initiator);
  if (r.in_progress > 0) --r.in_progress;
}

void Receipts::EndSession(size_t slot, const std::string& initiator, uint64_t session) {
  std::vector<uint64_t>& ended = Use(slot, initiator, true)->ended_sessions;
  if (std::find(ended.begin(), ended.end(), session) != ended.end()) return;
  if (ended.size() == kEndedSessions) ended.erase(ended.begin());
  ended.push_back(session);
}

bool Receipts::Ended(size_t slot, const Initiator& initiator) const {
  const Receipt* r = initiator.session == 0 ? nullptr : Find(slot, initiator.name);
  return r != nullptr &&
         std::find(r->ended_sessions.begin(), r->ended_sessions.end(), initiator.session) != r->ended_sessions.end();
}

// Layout: receipts; per receipt: slot, writes_applied, initiator length,
// its bytes in words (zero-padded), number of counters, then (unit, count)
// pairs. A slot's receipts are saved least recently used first, and restored
// in that order of use.
std::vector<uint64_t> Receipts::Save() const {
  std::vector<uint64_t> words{0};
  for (size_t slot = 0; slot < by_slot_.size(); ++slot) {
    std::vector<std::pair<const std::string*, const Receipt*>> by_use;
    for (const auto& [initiator, r] : by_slot_[slot]) by_use.emplace_back(&initiator, &r);
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

std::vector<uint64_t> Receipts::SaveWithout(const std::vector<Write>& left_out) {
  // Uncount, save, count again: the caller's lock keeps anyone from seeing
  // the receipts in between.
  std::vector<std::pair<Receipt*, uint64_t>> uncounted;
  for (const Write& w : left_out) {
    auto it = by_slot_[w.slot].find(w.initiator);
    if (it == by_slot_[w.slot].end()) continue;  // dropped (kPerSlot): nothing to uncount
    Receipt& r = it->second;
    --r.applied[w.unit];
    --r.writes_applied;
    uncounted.emplace_back(&r, w.unit);
  }
  std::vector<uint64_t> words = Save();
  for (const auto& [r, unit] : uncounted) {
    ++r->applied[unit];
    ++r->writes_applied;
  }
  return words;
}

Status Receipts::Restore(const std::vector<uint64_t>& words, std::vector<size_t>* pushed) {
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
    if (!next(&slot) || !next(&applied) || !next(&name_len) || slot >= by_slot_.size()) return bad;
    const uint64_t name_words = (name_len + 7) / 8;
    if (name_words > words.size() - i) return bad;
    std::string initiator(reinterpret_cast<const char*>(words.data() + i), name_len);
    i += name_words;
    if (!next(&counters) || counters > (words.size() - i) / 2) return bad;
    Receipt& r = *Use(slot, initiator, true);  // files before the bound may hold more
    r.writes_applied = applied;
    if (applied > 0) pushed->push_back(slot);
    for (uint64_t c = 0; c < counters; ++c, i += 2) r.applied[words[i]] = static_cast<uint32_t>(words[i + 1]);
  }
  return i == words.size() ? Status::OK() : bad;
}

}  // namespace blkps::server
