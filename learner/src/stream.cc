#include "stream.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <new>
#include <utility>

#include "blkps/wire_convert.h"

namespace blkps {

Stream::Stream(Device* device, uint32_t queue_depth) : device_(device), queue_depth_(queue_depth) {}

Stream::~Stream() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!thread_.joinable()) return;
    changed_.wait(lock, [this] { return waiting_.empty() && running_ == 0; });
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void Stream::Submit(std::unique_ptr<Submission> submission) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!thread_.joinable()) thread_ = std::thread(&Stream::Run, this);  // it waits for mutex_
    waiting_.push_back(std::move(submission));
  }
  changed_.notify_all();
}

size_t Stream::Complete(std::vector<StreamCompletion>* out, size_t max, int timeout_ms) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto ready = [this] { return woken_ || !ended_.empty() || (waiting_.empty() && running_ == 0); };
  if (timeout_ms < 0) {
    changed_.wait(lock, ready);
  } else {
    changed_.wait_for(lock, std::chrono::milliseconds(timeout_ms), ready);
  }
  woken_ = false;
  size_t moved = 0;
  for (; moved < max && !ended_.empty(); ++moved) {
    out->push_back(std::move(ended_.front()));
    ended_.pop_front();
  }
  return moved;
}

void Stream::Wake() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    woken_ = true;
  }
  changed_.notify_all();
}

void Stream::WaitIdle() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return waiting_.empty() && running_ == 0; });
}

size_t Stream::outstanding() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return waiting_.size() + running_ + ended_.size();
}

std::vector<std::unique_ptr<Submission>> Stream::TakeBatch() {
  std::vector<std::unique_ptr<Submission>> batch;
  const Submission::Kind kind = waiting_.front()->kind;
  while (!waiting_.empty() && waiting_.front()->kind == kind) {
    const Submission& next = *waiting_.front();
    const bool overlaps = std::any_of(batch.begin(), batch.end(), [&](const std::unique_ptr<Submission>& s) {
      return next.first_block < s->end_block && s->first_block < next.end_block;
    });
    if (overlaps) break;
    batch.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  return batch;
}

void Stream::Run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [this] { return stop_ || !waiting_.empty(); });
    if (stop_) return;
    std::vector<std::unique_ptr<Submission>> batch = TakeBatch();
    running_ = batch.size();
    lock.unlock();
    const Status status = RunBatch(batch);
    lock.lock();
    for (const std::unique_ptr<Submission>& submission : batch) ended_.push_back({submission->ticket, status});
    running_ = 0;
    changed_.notify_all();
  }
}

// The batch's requests in submission order, as one Transfer or Exchange.
Status Stream::RunBatch(const std::vector<std::unique_ptr<Submission>>& batch) {
  try {
    std::vector<IoRequest> writes, reads;
    for (const std::unique_ptr<Submission>& s : batch) {
      if (s->write) writes.insert(writes.end(), s->write->requests().begin(), s->write->requests().end());
      if (s->read) reads.insert(reads.end(), s->read->requests().begin(), s->read->requests().end());
    }
    Status status;
    switch (batch.front()->kind) {
      case Submission::Kind::kPush: status = device_->Transfer(Direction::kWrite, writes, queue_depth_); break;
      case Submission::Kind::kPull: status = device_->Transfer(Direction::kRead, reads, queue_depth_); break;
      case Submission::Kind::kExchange: status = device_->Exchange(writes, reads, queue_depth_, nullptr); break;
    }
    if (!status.ok()) return status;
    for (const std::unique_ptr<Submission>& s : batch) {
      if (!s->read) continue;
      s->read->FinishRead();
      if (s->widen_to != nullptr) wire::Widen(s->dtype, s->wire.data(), s->widen_to, s->wire.size());
    }
    return status;
  } catch (const std::bad_alloc&) {
    return Status::Error(ENOMEM, "out of memory joining %zu submissions into one batch", batch.size());
  }
}

}  // namespace blkps
