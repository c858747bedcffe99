// DeviceWorker: a thread that runs one job at a time for one Device, so that
// a Device made of several (StripedDevice's shards, SessionGroup's
// sessions) drives them all at once, each from one thread at a time.
//
// RunEach runs job(k) for every k with busy[k]: the first on the caller's
// thread, the others on workers[k], and returns every result once all have
// ended; SumOver adds up the parts' counters. Thread-safety: a worker and
// RunEach are driven by one thread.

#ifndef BLKPS_LEARNER_DEVICE_WORKER_H_
#define BLKPS_LEARNER_DEVICE_WORKER_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "device.h"
#include "status.h"

namespace blkps {

class DeviceWorker {
 public:
  // Throws std::system_error when no thread can be started.
  DeviceWorker() : thread_(&DeviceWorker::Run, this) {}

  ~DeviceWorker() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }

  DeviceWorker(const DeviceWorker&) = delete;
  DeviceWorker& operator=(const DeviceWorker&) = delete;

  // REQUIRES: no job running (Wait() returned since the last Start()).
  void Start(std::function<Status()> job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = std::move(job);
      busy_ = true;
    }
    changed_.notify_all();
  }

  // Waits for the job given to Start() and returns its result.
  Status Wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return !busy_; });
    return result_;
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      changed_.wait(lock, [this] { return stop_ || job_ != nullptr; });
      if (stop_) return;
      std::function<Status()> job = std::move(job_);
      job_ = nullptr;
      lock.unlock();
      Status result = job();
      lock.lock();
      result_ = std::move(result);
      busy_ = false;
      changed_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::function<Status()> job_;  // guarded by mutex_
  Status result_;                // guarded by mutex_
  bool busy_ = false;            // guarded by mutex_
  bool stop_ = false;            // guarded by mutex_
  std::thread thread_;           // last: starts once the members above exist
};

// REQUIRES: workers.size() == busy.size() (workers[k] may be null for the
// k that runs on the caller's thread: the first busy one).
inline std::vector<Status> RunEach(std::vector<std::unique_ptr<DeviceWorker>>& workers, const std::vector<bool>& busy,
                                   const std::function<Status(uint32_t)>& job) {
  const uint32_t count = static_cast<uint32_t>(busy.size());
  std::vector<Status> results(count);  // before any worker starts
  uint32_t first = count;
  for (uint32_t k = 0; k < count; ++k) {
    if (!busy[k]) continue;
    if (first == count) {
      first = k;
    } else {
      workers[k]->Start([&job, k] { return job(k); });
    }
  }
  if (first == count) return results;
  results[first] = job(first);
  for (uint32_t k = first + 1; k < count; ++k) {
    if (busy[k]) results[k] = workers[k]->Wait();
  }
  return results;
}

// A counter of a device made of `parts` (pushed_bytes_lost, reconnects,
// reconnect_seconds): the sum of the parts'.
template <typename T>
T SumOver(const std::vector<std::unique_ptr<Device>>& parts, T (Device::*counter)() const) {
  T sum = 0;
  for (const auto& part : parts) sum += ((*part).*counter)();
  return sum;
}

}  // namespace blkps

#endif  // BLKPS_LEARNER_DEVICE_WORKER_H_
