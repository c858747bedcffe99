// Mutex and MutexLock: a std::mutex, and the scoped hold of one, that
// clang's thread-safety analysis understands (thread_annotations.h):
// libstdc++'s std::mutex and std::unique_lock carry no annotations, so a
// member GUARDED_BY a std::mutex could not be checked.
//
// Waiting: a MutexLock waits on a plain std::condition_variable (it holds a
// std::unique_lock<std::mutex> inside), so waits cost what they did. The
// analysis checks a lambda as a function of its own, without its caller's
// locks, so a wait is written as a loop on its condition rather than with a
// predicate lambda:
//   MutexLock lock(&mu_);
//   while (!ready_) lock.Wait(ready_cv_);   // ready_ GUARDED_BY(mu_)
// Spurious wake-ups happen: every wait is in such a loop. A lambda called
// while the lock is held (by std::remove_if, say) says so itself:
//   [&](const Item& x) REQUIRES(mu_) { ... }
#pragma once

#include <condition_variable>
#include <mutex>

#include "thread_annotations.h"

namespace blkps::server {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }

 private:
  friend class MutexLock;
  std::mutex mu_;
};

// Holds `mu` from construction to destruction, except between Unlock() and
// Lock(), and while it waits.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : lock_(mu->mu_) {}
  ~MutexLock() RELEASE() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() RELEASE() { lock_.unlock(); }
  void Lock() ACQUIRE() { lock_.lock(); }
  // Gives the mutex up until `cv` is notified (or a spurious wake-up), then
  // holds it again.
  void Wait(std::condition_variable& cv) { cv.wait(lock_); }
  // The same, returning at `deadline` at the latest.
  template <typename TimePoint>
  void WaitUntil(std::condition_variable& cv, const TimePoint& deadline) {
    cv.wait_until(lock_, deadline);
  }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace blkps::server
