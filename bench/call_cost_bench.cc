// blkps-call-cost-bench: what a libblkps call costs beyond its bytes.
//
// For each operation (push, pull, exchange) and bucket size, moves the same
// `--total` bytes of the model two ways, rounds interleaved: as one call, and
// as total / bucket calls of one bucket each, one after the other (what a
// learner that hands over buckets as they arrive does). The difference over
// the number of calls is the fixed cost of a call: its set-up, its hand-offs
// to the shards' threads, and the drain of every connection's queue at its
// end, when the next call starts with empty queues. Prints a markdown table
// of medians.
//
// bench/call-cost.sh starts co-located shards (blkps shards start), runs
// this on the layout of one learner slot, and stops them.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "blkps/byte_size.hpp"
#include "blkps/model.hpp"

namespace {

using Clock = std::chrono::steady_clock;

constexpr char kUsage[] = "usage: blkps-call-cost-bench --target TARGET [options]\n"
                          "  --target      the model: layout:PATH, iscsi://... or a file\n"
                          "  --total N     bytes moved per measurement (default 32M)\n"
                          "  --buckets 'N ...'  bucket sizes (default '64K 256K 1M 4M 32M')\n"
                          "  --ops 'push pull exchange'  operations to measure (default all three)\n"
                          "  --rounds N    interleaved rounds, medians reported (default 5)\n";

[[noreturn]] void Fail(const std::string& message) {
  fprintf(stderr, "blkps-call-cost-bench: %s\n", message.c_str());
  exit(2);
}

uint64_t Number(const std::string& name, const std::string& value) {
  uint64_t n = 0;
  if (!blkps::ParseByteSize(value, &n) || n == 0) {
    Fail(name + ": expected a positive integer (K, M, G suffixes allowed), got '" + value + "'");
  }
  return n;
}

std::vector<std::string> Words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

struct Options {
  std::string target;
  uint64_t total = 32 << 20;
  std::vector<uint64_t> buckets;
  std::vector<std::string> ops = {"push", "pull", "exchange"};
  int rounds = 5;
};

Options Parse(int argc, char** argv) {
  Options options;
  std::string buckets = "64K 256K 1M 4M 32M";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      fputs(kUsage, stdout);
      exit(0);
    }
    if (i + 1 >= argc) Fail(arg + " needs a value (see --help)");
    const std::string value = argv[++i];
    if (arg == "--target") {
      options.target = value;
    } else if (arg == "--total") {
      options.total = Number(arg, value);
    } else if (arg == "--buckets") {
      buckets = value;
    } else if (arg == "--ops") {
      options.ops = Words(value);
    } else if (arg == "--rounds") {
      options.rounds = static_cast<int>(Number(arg, value));
    } else {
      Fail("unknown option '" + arg + "' (see --help)");
    }
  }
  if (options.target.empty()) Fail("--target is required (see --help)");
  for (const std::string& word : Words(buckets)) options.buckets.push_back(Number("--buckets", word));
  for (const std::string& op : options.ops) {
    if (op != "push" && op != "pull" && op != "exchange") Fail("--ops: unknown operation '" + op + "'");
  }
  return options;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// One synchronous call of `op` on parameters [first, first + count).
int Call(blkps::Model& model, const std::string& op, uint64_t first, float* grad, float* out, uint64_t count) {
  if (op == "push") return model.Push(first, grad, count);
  if (op == "pull") return model.Pull(first, out, count);
  return model.Exchange(first, grad, out, count);
}

// Seconds to move `params` parameters in calls of `bucket` parameters.
double Measure(blkps::Model& model, const std::string& op, uint64_t params, uint64_t bucket, float* grad, float* out) {
  const Clock::time_point start = Clock::now();
  for (uint64_t first = 0; first < params; first += bucket) {
    if (Call(model, op, first, grad + first, out + first, std::min(bucket, params - first)) != 0) {
      Fail(op + " failed: " + model.last_error());
    }
  }
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = Parse(argc, argv);
  std::string error;
  std::unique_ptr<blkps::Model> model = blkps::Model::Open(options.target, blkps::OpenOptions(), &error);
  if (!model) Fail(error);
  const uint64_t params = std::min(options.total / 4, model->param_capacity());
  // Gradients of 1e-30 leave a served model's weights as they are.
  std::vector<float> grad(params, 1e-30f), out(params);
  printf("%s, %llu bytes per measurement, medians of %d rounds (request %llu bytes, exchange %llu, depth %u)\n\n",
         options.target.c_str(), static_cast<unsigned long long>(params * 4), options.rounds,
         static_cast<unsigned long long>(model->request_bytes()),
         static_cast<unsigned long long>(model->exchange_request_bytes()), model->queue_depth());
  printf("| operation | bucket | calls | one call (ms) | in buckets (ms) | cost per call (us) | GB/s one, buckets |\n");
  printf("|---|---:|---:|---:|---:|---:|---|\n");
  for (const std::string& op : options.ops) {
    for (uint64_t bucket_bytes : options.buckets) {
      const uint64_t bucket = std::max<uint64_t>(bucket_bytes / 4, 1);
      const uint64_t calls = (params + bucket - 1) / bucket;
      std::vector<double> whole, split;
      for (int round = 0; round < options.rounds; ++round) {
        whole.push_back(Measure(*model, op, params, params, grad.data(), out.data()));
        split.push_back(Measure(*model, op, params, bucket, grad.data(), out.data()));
      }
      const double one = Median(whole), many = Median(split);
      printf("| %s | %llu | %llu | %.2f | %.2f | %.0f | %.2f, %.2f |\n", op.c_str(),
             static_cast<unsigned long long>(bucket * 4), static_cast<unsigned long long>(calls), one * 1e3, many * 1e3,
             calls > 1 ? (many - one) / static_cast<double>(calls - 1) * 1e6 : 0.0,
             static_cast<double>(params * 4) / one / 1e9, static_cast<double>(params * 4) / many / 1e9);
    }
  }
  return 0;
}
