// Job's side of receipts (job.h, "Receipts"; the receipts themselves:
// receipts.h): the write gate that checkpoints close, a write counted on its
// initiator's receipt as it ends (inside the gate), fences, and a receipt
// read for target-plugin/control_lun_server.cc (which serves it as the
// control LUN's receipts region).
#include <algorithm>

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

void Job::CloseWriteGate() {
  MutexLock gate(&gate_mu_);
  gate_closed_ = true;
  while (writes_running_ > 0) gate.Wait(gate_cv_);
}

void Job::OpenWriteGate() {
  MutexLock gate(&gate_mu_);
  gate_closed_ = false;
  gate_cv_.notify_all();
}

void Job::FinishWrite(size_t slot, const std::string& initiator, uint64_t offset, bool applied, uint64_t round) {
  MutexLock lock(&mu_);
  receipts_.FinishWrite(slot, initiator, offset / kReceiptUnit, applied);
  if (applied && RoundBoundaries()) RecordRoundWriteLocked(slot, initiator, offset / kReceiptUnit, round);
}

void Job::EndWrite(size_t slot, const std::string& initiator) {
  MutexLock lock(&mu_);
  receipts_.EndWrite(slot, initiator);
}

void Job::FenceLocked(uint64_t lun, const std::string& initiator, uint64_t ended_session) {
  // A write of the ended session that tgtd had not read off its socket yet
  // comes after the fence, maybe after the learner read its receipt: it is
  // refused by its session (CheckNotFenced), never applied behind the
  // receipt the learner resends by.
  for (size_t slot = 0; slot < slots_.size(); ++slot) {
    if (slots_[slot].lun == lun && ended_session != 0) receipts_.EndSession(slot, initiator, ended_session);
  }
  holds_.Release([&](const HeldCommand& held) REQUIRES(mu_) -> std::optional<Status> {
    if (!held.write || slots_[held.slot].lun != lun || held.initiator != initiator) return std::nullopt;
    return OnReleaseLocked(held, Status::DeadlineExceeded("write fenced: initiator " + initiator +
                                                          " reconnected and will resend what its receipt lacks"));
  });
}

Status Job::CheckNotFenced(size_t slot, const Initiator& initiator) const {
  MutexLock lock(&mu_);
  if (!receipts_.Ended(slot, initiator)) return Status::OK();
  return Status::DeadlineExceeded("write of an ended session: initiator " + initiator.name +
                                  " reconnected, fenced it, and resends what its receipt lacks");
}

Job::ReceiptNumbers Job::GetReceipt(uint64_t lun, const std::string& initiator, uint64_t first_unit,
                                    std::vector<uint32_t>* counts) const {
  std::fill(counts->begin(), counts->end(), 0);
  MutexLock lock(&mu_);
  for (size_t slot = 0; slot < slots_.size(); ++slot) {
    const Receipt* r = slots_[slot].lun == lun ? receipts_.Find(slot, initiator) : nullptr;
    if (r == nullptr) continue;
    r->CopyCounts(first_unit, counts);
    return ReceiptNumbers{r->writes_applied, r->in_progress};
  }
  return ReceiptNumbers{};
}

}  // namespace blkps::server
