#include "device_pool.h"

namespace blkps {

DevicePool::Lease::~Lease() {
  if (device_ != nullptr) pool_->GiveBack(std::move(device_));
}

void DevicePool::Lease::Discard() {
  if (device_ == nullptr) return;
  device_.reset();
  pool_->Forget();
}

DevicePool::DevicePool(std::string target, std::string initiator_prefix, std::unique_ptr<Device> first,
                       uint32_t max_devices)
    : target_(std::move(target)),
      initiator_prefix_(std::move(initiator_prefix)),
      max_devices_(max_devices),
      size_bytes_(first->size_bytes()),
      block_size_(first->logical_block_size()),
      default_request_bytes_(first->default_request_bytes()),
      max_request_bytes_(first->max_request_bytes()) {
  idle_.push_back(std::move(first));
  opened_ = 1;
}

DevicePool::Lease DevicePool::Acquire(Status* status) {
  uint32_t number;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    freed_.wait(lock, [&] { return !idle_.empty() || opened_ < max_devices_; });
    if (!idle_.empty()) {
      std::unique_ptr<Device> device = std::move(idle_.back());
      idle_.pop_back();
      return Lease(this, std::move(device));
    }
    number = ++opened_;
  }
  // Opening logs in a new session (milliseconds): not under the lock.
  std::unique_ptr<Device> device = OpenDevice(target_, initiator_prefix_ + "-" + std::to_string(number), status);
  if (device == nullptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    --opened_;
    freed_.notify_one();
    return Lease(this, nullptr);
  }
  return Lease(this, std::move(device));
}

void DevicePool::GiveBack(std::unique_ptr<Device> device) {
  std::lock_guard<std::mutex> lock(mutex_);
  idle_.push_back(std::move(device));
  freed_.notify_one();
}

void DevicePool::Forget() {
  std::lock_guard<std::mutex> lock(mutex_);
  --opened_;
  freed_.notify_one();
}

uint32_t DevicePool::open_devices() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return opened_;
}

}  // namespace blkps
