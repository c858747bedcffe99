// Unit tests of Stream::Wake (learner/src/stream.h): a thread waiting in
// Complete() for completions is woken by another thread's Wake(), so a
// communication thread that also waits for work of its own never polls.
// The device holds every transfer until the test opens its gate, so what
// has ended at each point is known without timing (a gate left shut opens
// by itself after kGateLimit, so a broken Wake fails a test, not hangs it).

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "device.h"
#include "stream.h"

namespace blkps {
namespace {

constexpr uint32_t kBlock = 512;
constexpr std::chrono::seconds kGateLimit(30);

// A device of 1 MiB whose Transfer waits until Open() is called (at most
// kGateLimit).
class GatedDevice : public Device {
 public:
  GatedDevice() = default;
  uint64_t size_bytes() const override { return 1 << 20; }
  uint32_t logical_block_size() const override { return kBlock; }
  uint64_t default_request_bytes() const override { return 1 << 20; }
  uint64_t max_request_bytes() const override { return 1 << 20; }
  Status Transfer(Direction, const std::vector<IoRequest>&, uint32_t) override {
    std::unique_lock<std::mutex> lock(mutex_);
    opened_.wait_for(lock, kGateLimit, [this] { return open_; });
    return Status();
  }
  Status Sync() override { return Status(); }

  void Open() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      open_ = true;
    }
    opened_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable opened_;
  bool open_ = false;
};

std::unique_ptr<Submission> Push(uint64_t ticket, std::vector<uint8_t>* bytes) {
  auto submission = std::make_unique<Submission>();
  submission->ticket = ticket;
  submission->kind = Submission::Kind::kPush;
  submission->first_block = 0;
  submission->end_block = bytes->size() / kBlock;
  submission->write.reset(new TransferPlan(Direction::kWrite, 0, bytes->data(), bytes->size(), kBlock, bytes->size()));
  return submission;
}

TEST(StreamWake, AWakeEndsAWaitWithoutLimitWhileTheSubmissionRuns) {
  GatedDevice device;
  std::vector<uint8_t> bytes(4 * kBlock, 1);
  Stream stream(&device, 16);
  stream.Submit(Push(1, &bytes));
  std::vector<StreamCompletion> ended;
  std::thread waiter([&] { stream.Complete(&ended, 16, -1); });
  stream.Wake();
  waiter.join();  // without the Wake: only once the gate opens by itself, with the ticket
  EXPECT_TRUE(ended.empty());
  EXPECT_EQ(stream.outstanding(), 1u);
  device.Open();
  EXPECT_EQ(stream.Complete(&ended, 16, -1), 1u);
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].ticket, 1u);
  EXPECT_TRUE(ended[0].status.ok());
}

TEST(StreamWake, AWakeBeforeTheWaitEndsTheNextWait) {
  GatedDevice device;
  std::vector<uint8_t> bytes(4 * kBlock, 1);
  Stream stream(&device, 16);
  stream.Submit(Push(1, &bytes));
  stream.Wake();
  stream.Wake();
  std::vector<StreamCompletion> ended;
  EXPECT_EQ(stream.Complete(&ended, 16, -1), 0u);
  device.Open();
  EXPECT_EQ(stream.Complete(&ended, 16, -1), 1u);
}

}  // namespace
}  // namespace blkps
