#include "backup_verdict.h"

namespace blkps::server {

std::shared_ptr<ReplicaChannel> BackupVerdict::ChannelForWrite() const {
  MutexLock lock(&mu_);
  return channel_;
}

bool BackupVerdict::outdated() const {
  MutexLock lock(&mu_);
  return state_ == State::kOutdated;
}

BackupVerdict::Loss BackupVerdict::Failed(const ReplicaChannel* channel, const std::string& why) {
  MutexLock lock(&mu_);
  if (channel != channel_.get()) return Loss::kAlone;
  switch (state_) {
    case State::kInSync:
      state_ = State::kLost;
      why_ = why;
      return Loss::kLostNow;
    case State::kLost: return Loss::kLost;
    case State::kCatchingUp:
      state_ = State::kOutdated;
      why_ = "its catch-up failed: " + why;
      channel_.reset();
      changed_.notify_all();
      return Loss::kCatchUpEnded;
    case State::kOutdated: break;
  }
  return Loss::kAlone;
}

bool BackupVerdict::AwaitOutdated() {
  const auto deadline = std::chrono::steady_clock::now() + kVerdictSeconds;
  MutexLock lock(&mu_);
  while (state_ == State::kLost && std::chrono::steady_clock::now() < deadline) lock.WaitUntil(changed_, deadline);
  // Declared outdated, and maybe catching up or caught up since: the
  // write's state is the primary's, and in any snapshot taken after it.
  return state_ != State::kLost;
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
    channel_.reset();
  }
  changed_.notify_all();
  return Status::OK();
}

void BackupVerdict::None(const std::string& why) {
  {
    MutexLock lock(&mu_);
    state_ = State::kOutdated;
    why_ = why;
    channel_.reset();
  }
  changed_.notify_all();
}

bool BackupVerdict::BeginCatchUp(std::shared_ptr<ReplicaChannel> channel) {
  MutexLock lock(&mu_);
  if (state_ != State::kOutdated) return false;
  state_ = State::kCatchingUp;
  why_ = channel->peer();
  channel_ = std::move(channel);
  return true;
}

bool BackupVerdict::CaughtUp(const ReplicaChannel* channel) {
  MutexLock lock(&mu_);
  if (state_ != State::kCatchingUp || channel != channel_.get()) return false;
  state_ = State::kInSync;
  why_.clear();
  return true;
}

void BackupVerdict::CatchUpFailed(const ReplicaChannel* channel, const std::string& why) {
  MutexLock lock(&mu_);
  if (state_ != State::kCatchingUp || channel != channel_.get()) return;
  state_ = State::kOutdated;
  why_ = "its catch-up failed: " + why;
  channel_.reset();
}

std::string BackupVerdict::Describe() const {
  MutexLock lock(&mu_);
  switch (state_) {
    case State::kInSync: return "";
    case State::kLost: return "lost: " + why_;
    case State::kOutdated: return "outdated: " + why_;
    case State::kCatchingUp: return "catching up: " + why_;
  }
  return "";
}

}  // namespace blkps::server
