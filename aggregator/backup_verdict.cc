#include "backup_verdict.h"

namespace blkps::server {

bool BackupVerdict::outdated() const {
  MutexLock lock(&mu_);
  return state_ == State::kOutdated;
}

bool BackupVerdict::Lost(const std::string& why) {
  MutexLock lock(&mu_);
  if (state_ != State::kInSync) return false;
  state_ = State::kLost;
  why_ = why;
  return true;
}

bool BackupVerdict::AwaitOutdated() {
  const auto deadline = std::chrono::steady_clock::now() + kVerdictSeconds;
  MutexLock lock(&mu_);
  while (state_ == State::kLost && std::chrono::steady_clock::now() < deadline) lock.WaitUntil(changed_, deadline);
  return state_ == State::kOutdated;
}

Status BackupVerdict::DeclareOutdated() {
  {
    MutexLock lock(&mu_);
    if (state_ == State::kOutdated) return Status::OK();
    if (state_ != State::kLost) {
      return Status::InvalidArgument(
          "control: backup_outdated: this primary's backup is not lost; only a backup that missed writes is "
          "declared outdated");
    }
    state_ = State::kOutdated;
  }
  changed_.notify_all();
  return Status::OK();
}

std::string BackupVerdict::Describe() const {
  MutexLock lock(&mu_);
  switch (state_) {
    case State::kInSync: return "";
    case State::kLost: return "lost: " + why_;
    case State::kOutdated: return "outdated: " + why_;
  }
  return "";
}

}  // namespace blkps::server
