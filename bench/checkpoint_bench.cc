// blkps-checkpoint-bench: a model's start, checkpoint and restart times,
// and how long a pushing learner waits during a checkpoint (doc/server.md
// "Checkpoints"). In process, on the aggregator's Job (no tgtd, no network):
// what the server itself costs. bench/checkpoint.sh builds it against a
// tree's aggregator/ and runs it, so that two trees compare side by side.
//
// Usage: blkps-checkpoint-bench PARAMS DIR   (prints one JSON object)
//   start         Job::Create with init=normal:0.01, no checkpoint file
//   checkpoint    Job::Checkpoint's wall time, while one learner pushes
//                 1 MiB gradients (sgd) across the model without pause
//   stall         the longest of those pushes that overlapped the checkpoint
//   push_max_outside  the longest push outside it (the machine's noise)
//   restart       Job::Create from the checkpoint file, cached and after
//                 posix_fadvise(DONTNEED) drops its pages (from the disk)
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "job.h"

using blkps::server::InitSpec;
using blkps::server::Job;
using blkps::server::JobOptions;
using Clock = std::chrono::steady_clock;

namespace {

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void Die(const std::string& what) {
  std::fprintf(stderr, "checkpoint-bench: %s\n", what.c_str());
  std::exit(1);
}

std::shared_ptr<Job> Create(const JobOptions& o, double* seconds) {
  const Clock::time_point t = Clock::now();
  std::shared_ptr<Job> job;
  const auto s = Job::Create("bench", o, nullptr, &job);
  if (!s.ok()) Die(s.message());
  *seconds = Since(t);
  return job;
}

void DropCache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) Die("cannot open " + path);
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) Die("usage: blkps-checkpoint-bench PARAMS DIR");
  JobOptions o;
  o.model.num_params = std::strtoull(argv[1], nullptr, 10);
  o.model.rule.name = "sgd";
  o.model.init.kind = InitSpec::Kind::kNormal;
  o.model.init.scale = 0.01;
  o.model.init.seed = 1;
  o.checkpoint = std::string(argv[2]) + "/bench.ckpt";
  ::unlink(o.checkpoint.c_str());

  double start = 0, restart_cached = 0, restart_disk = 0;
  std::shared_ptr<Job> job = Create(o, &start);
  const size_t slot = job->AddLearner(0, [] {});

  // The learner: 1 MiB pushes, one after another, across the model.
  constexpr uint64_t kPush = 1 << 20;
  const uint64_t pushes = job->size_bytes() / kPush;
  std::atomic<bool> stop{false}, in_checkpoint{false};
  std::atomic<uint64_t> done{0};
  double stall = 0, outside = 0;
  std::thread learner([&] {
    std::vector<float> g(kPush / 4, 1e-6f);
    int cmd = 0;
    for (uint64_t k = 0; !stop.load(); k = (k + 1) % pushes) {
      const bool overlapped_before = in_checkpoint.load();
      const Clock::time_point t = Clock::now();
      job->Admit(slot, true, k * kPush, kPush, &cmd, "iqn.bench");
      if (!job->Write(slot, k * kPush, g.data(), kPush, "iqn.bench").ok()) Die("a push failed");
      const double took = Since(t);
      double& worst = (overlapped_before || in_checkpoint.load()) ? stall : outside;
      worst = std::max(worst, took);
      done.fetch_add(1);
    }
  });
  while (done.load() < 64) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  in_checkpoint = true;
  const uint64_t before = done.load();
  const Clock::time_point t = Clock::now();
  const auto s = job->Checkpoint();
  const double checkpoint = Since(t);
  in_checkpoint = false;
  const uint64_t during = done.load() - before;
  if (!s.ok()) Die(s.message());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  stop = true;
  learner.join();
  job.reset();

  job = Create(o, &restart_cached);
  job.reset();
  DropCache(o.checkpoint);
  job = Create(o, &restart_disk);
  job.reset();
  ::unlink(o.checkpoint.c_str());
  std::printf(
      "{\"params\": %llu, \"start_s\": %.3f, \"checkpoint_s\": %.3f, \"stall_s\": %.4f, \"push_max_outside_s\": %.4f, "
      "\"pushes_during_checkpoint\": %llu, \"restart_cached_s\": %.3f, \"restart_disk_s\": %.3f}\n",
      static_cast<unsigned long long>(o.model.num_params), start, checkpoint, stall, outside,
      static_cast<unsigned long long>(during), restart_cached, restart_disk);
  return 0;
}
