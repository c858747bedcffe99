// Receipts: what each initiator's writes to each learner slot have done
// (job.h "Receipts"; exactly-once pushes, doc/libblkps.md "Faults"). For
// every slot and initiator, the writes applied, counted by the 512-byte
// unit each starts at, the writes in progress, and the initiator's row
// windows (job.h "Row windows"). With the model and the clocks, this is
// what a copy of a job's state must hold: a learner resends only the writes
// its receipt does not show, wherever it reads it.
//
// Each slot keeps the receipts of its kPerSlot most recently used
// initiators; an older one with no write in progress is dropped.
//
// Not thread-safe: the Job keeps its Receipts GUARDED_BY its mu_ and calls
// them under it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "status.h"

namespace blkps::server {

// Who sent a learner's command: its iSCSI initiator name, which keys its
// receipt, and the session it came on, which a fence names once it ended:
// the token libblkps chooses at each login and sends as the session's
// initiator alias ("blkps-session-<16 hex digits>"); 0 for any other
// initiator. Made from a name alone where the session does not matter.
struct Initiator {
  Initiator(std::string initiator_name = "", uint64_t session_id = 0)  // NOLINT: a name converts
      : name(std::move(initiator_name)), session(session_id) {}
  Initiator(const char* initiator_name) : name(initiator_name) {}  // NOLINT: a name converts
  std::string name;
  uint64_t session = 0;
};

// One initiator's row window: its last push applied, its last pull.
struct RowWindow {
  uint64_t push_sequence = 0, push_tag = 0, pushes_applied = 0, rows_applied = 0;
  uint64_t pull_sequence = 0, pull_tag = 0, pull_width = 0;
  std::vector<uint64_t> pull_ids;
  bool busy = false;  // a push is being applied (a resend waits for it)
};

class Receipts {
 public:
  // Receipts count writes by the unit of this many device bytes they start
  // at (blkps/control_lun.h's BLKPS_CONTROL_RECEIPT_UNIT).
  static constexpr uint64_t kUnit = 512;
  // Receipts kept per learner slot.
  static constexpr size_t kPerSlot = 8;
  // Ended sessions kept per receipt: a learner's last reconnects.
  static constexpr size_t kEndedSessions = 8;

  // One initiator's writes to one slot.
  struct Receipt {
    // unit -> writes applied that start there (mod 2^32). Hashed: a table's
    // pushes touch units all over the device, and a tree's walk (a cache
    // miss a level) was the largest part of a pushed row's cost in the
    // plugin (doc/embeddings.md "Bench").
    std::unordered_map<uint64_t, uint32_t> applied;
    uint64_t writes_applied = 0;
    uint64_t in_progress = 0;  // admitted, not yet ended (EndWrite)
    uint64_t last_use = 0;     // the Receipts' use count at its initiator's last I/O
    // The last kEndedSessions sessions its initiator's fences ended: their
    // writes are refused (Initiator::session).
    std::vector<uint64_t> ended_sessions;
    // Its row windows (job.h "Row windows"), made on first use.
    std::vector<RowWindow> windows;

    // counts[i] = its writes applied that start at unit first_unit + i, for
    // counts->size() units; the others are left as they are.
    void CopyCounts(uint64_t first_unit, std::vector<uint32_t>* counts) const;
  };
  // A write applied at receipt unit `unit` by `initiator` on `slot`.
  struct Write {
    size_t slot;
    std::string initiator;
    uint64_t unit;
  };

  // A learner slot with no receipts yet; slots are numbered from 0 in the
  // order they are added.
  void AddSlot();
  size_t slots() const { return by_slot_.size(); }

  // `initiator` does I/O on `slot`: its receipt (made for a write, found for
  // a read; nullptr if none) becomes the most recently used, and the slot's
  // least recently used one beyond kPerSlot is dropped. The pointer is
  // valid until the next call that may drop or make a receipt.
  Receipt* Use(size_t slot, const std::string& initiator, bool write);
  // `initiator`'s receipt on `slot`, made if there is none; its use is not
  // counted and nothing is dropped.
  Receipt& At(size_t slot, const std::string& initiator) { return by_slot_[slot][initiator]; }
  // `initiator`'s receipt on `slot`, or nullptr; its use is not counted.
  const Receipt* Find(size_t slot, const std::string& initiator) const;
  // The slot's receipts, by initiator.
  const std::map<std::string, Receipt>& of(size_t slot) const { return by_slot_[slot]; }

  // A write admitted on `initiator`'s receipt is counted: applied (at
  // `unit`) or not; the receipt becomes the most recently used. It stays in
  // progress until EndWrite().
  void FinishWrite(size_t slot, const std::string& initiator, uint64_t unit, bool applied);
  // A write of `initiator` is no longer in progress: it ended (counted by
  // FinishWrite and, on a primary, on its backup or judged without it), or
  // it was held and will never run (failed, fenced, or its LUN went away).
  void EndWrite(size_t slot, const std::string& initiator);
  // A fence of `initiator` on `slot` ended `session` (not 0): the receipt,
  // made if there is none, keeps it among its kEndedSessions most recent.
  void EndSession(size_t slot, const std::string& initiator, uint64_t session);
  // Whether `initiator`'s session is one a fence of its name on `slot` ended.
  bool Ended(size_t slot, const Initiator& initiator) const;

  // The receipts as words for a checkpoint's "receipts" section, and back
  // (into receipts of slots already added; InvalidArgument if the words are
  // malformed). Restore adds to *pushed each slot with a write applied.
  std::vector<uint64_t> Save() const;
  // The same, as if the writes in `left_out` had not been applied (each
  // counted once per entry; a receipt since dropped is skipped).
  std::vector<uint64_t> SaveWithout(const std::vector<Write>& left_out);
  Status Restore(const std::vector<uint64_t>& words, std::vector<size_t>* pushed);

 private:
  std::vector<std::map<std::string, Receipt>> by_slot_;  // by initiator name
  uint64_t uses_ = 0;                                    // orders Receipt::last_use
};

}  // namespace blkps::server
