// DevicePool: the model devices (sessions) that serve one mounted file.
//
// A Device is used by one thread at a time, and a FUSE request runs on one
// worker thread from start to end, so each request borrows a whole Device for
// its duration. The pool opens Devices on demand, up to `max_devices`, all on
// the same target; a request that finds none free waits for one.
//
// Thread-safety: Acquire and the Lease's release may be called concurrently.

#ifndef BLKPS_MOUNT_DEVICE_POOL_H_
#define BLKPS_MOUNT_DEVICE_POOL_H_

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "device.h"
#include "status.h"

namespace blkps {

class DevicePool {
 public:
  // Borrowed Device; given back to the pool when the Lease is destroyed.
  class Lease {
   public:
    Lease(DevicePool* pool, std::unique_ptr<Device> device) : pool_(pool), device_(std::move(device)) {}
    ~Lease();
    Lease(Lease&&) = default;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    Device* operator->() const { return device_.get(); }
    Device* get() const { return device_.get(); }
    // After a failed transfer: closes the Device instead of giving it back
    // (its session may be lost for good), so a later Acquire opens a fresh
    // one.
    void Discard();

   private:
    DevicePool* pool_;
    std::unique_ptr<Device> device_;
  };

  // `first`: an open Device on `target` (it tells the geometry); the pool
  // owns it. Devices it opens later use the initiator name
  // `initiator_prefix` + "-" + their number.
  // REQUIRES: first != nullptr; max_devices >= 1.
  DevicePool(std::string target, std::string initiator_prefix, std::unique_ptr<Device> first, uint32_t max_devices);

  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  // Borrows a free Device, opening one when none is free and fewer than
  // max_devices are open, else waiting for one. On failure to open returns
  // an empty Lease (get() == nullptr) and stores the reason in *status.
  Lease Acquire(Status* status);

  uint64_t size_bytes() const { return size_bytes_; }
  uint32_t logical_block_size() const { return block_size_; }
  uint64_t default_request_bytes() const { return default_request_bytes_; }
  uint64_t max_request_bytes() const { return max_request_bytes_; }
  uint32_t open_devices() const;

 private:
  void GiveBack(std::unique_ptr<Device> device);
  void Forget();  // a lent Device was closed

  const std::string target_;
  const std::string initiator_prefix_;
  const uint32_t max_devices_;
  const uint64_t size_bytes_;
  const uint32_t block_size_;
  const uint64_t default_request_bytes_;
  const uint64_t max_request_bytes_;

  mutable std::mutex mutex_;
  std::condition_variable freed_;
  std::vector<std::unique_ptr<Device>> idle_;
  uint32_t opened_ = 0;  // idle, lent, or being opened
};

}  // namespace blkps

#endif  // BLKPS_MOUNT_DEVICE_POOL_H_
