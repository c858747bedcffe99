// ForEachInParallel: the aggregator's one way to spread work over the
// host's cores (model initialisation, checkpoint loading).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace blkps::server {

// Calls work(i) once for each i in [0, count), from up to one thread per
// core (the caller's included), each taking the next i in turn, and returns
// when all have returned. Whatever work computes must not depend on which
// thread runs it, so results do not depend on the number of cores.
template <typename Work>
void ForEachInParallel(uint64_t count, Work work) {
  const uint64_t cores = std::max(1u, std::thread::hardware_concurrency());
  const uint64_t threads = std::min(cores, count);
  std::atomic<uint64_t> next{0};
  auto run = [&] {
    for (uint64_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) work(i);
  };
  std::vector<std::thread> helpers;
  for (uint64_t t = 1; t < threads; ++t) helpers.emplace_back(run);
  run();
  for (std::thread& t : helpers) t.join();
}

}  // namespace blkps::server
