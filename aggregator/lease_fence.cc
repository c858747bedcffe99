#include "lease_fence.h"

#include <time.h>

#include <cstdio>

namespace blkps::server {

namespace {

std::string Seconds(uint64_t ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(ms) / 1000.0);
  return buf;
}

}  // namespace

uint64_t LeaseFence::NowMs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000 + static_cast<uint64_t>(ts.tv_nsec) / 1000000;
}

bool LeaseFence::Extend(uint64_t until_ms) {
  uint64_t held = until_ms_.load();
  while (held < until_ms && !until_ms_.compare_exchange_weak(held, until_ms)) {
  }
  return NowMs() <= until_ms_.load() && refused_.exchange(false);
}

Status LeaseFence::Admit(bool* lapsed_first) {
  const uint64_t until = until_ms_.load();
  if (until == 0) return Status::OK();
  const uint64_t now = NowMs();
  if (now <= until) return Status::OK();
  if (!refused_.exchange(true)) *lapsed_first = true;
  return Status::Standby("lease: " + Describe());
}

std::string LeaseFence::Describe() const {
  const uint64_t until = until_ms_.load();
  if (until == 0) return "";
  const uint64_t now = NowMs();
  if (now <= until) return "held: " + Seconds(until - now) + " s left";
  return "lapsed " + Seconds(now - until) +
         " s ago: this primary acknowledges no write until its lease keeper renews it; its backup takes over "
         "once etcd lets the lease go";
}

}  // namespace blkps::server
