// blkps-iobench: throughput of libblkps's byte-level API.
//
// Transfers the byte range [offset, offset + span) again and again, in
// requests of --bs bytes with --qd in flight, for --seconds, and prints one
// line: op=write bs=1048576 qd=16 bytes=... seconds=... MBps=... (MB = 1e6 B)
// cpu_user=... cpu_sys=... (this process's CPU seconds over the run, all
// threads: the learner side's cost).
// Writes send zeros: to a blkps server they are gradients that change nothing.
// --op push / pull move float32 parameters through Model::Push / Pull instead
// of bytes: on a 16-bit LUN (--dtype) they convert, and span and bytes count
// float32 bytes (4 per parameter), so rates compare across dtypes.

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include <sys/resource.h>
#include <sys/time.h>

#include "blkps/byte_size.hpp"
#include "blkps/model.hpp"

namespace {

constexpr char kUsage[] = "usage: blkps-iobench --target URL_OR_PATH --op read|write|push|pull [--bs 1M] "
                          "[--qd 16] [--span 64M] [--seconds 5] [--offset 0] [--dtype float32]\n"
                          "  --target   a file, block device, iscsi://host[:port]/<iqn>/<lun> or "
                          "iser://...\n"
                          "  --op       read or write bytes (writes send zero gradients); push or pull\n"
                          "             float32 parameters (converted on a 16-bit LUN)\n"
                          "  --bs       bytes per request (K, M, G: powers of 1024)\n"
                          "  --qd       requests in flight\n"
                          "  --span     bytes transferred per pass (default: 64M, or up to the end "
                          "of the device)\n"
                          "  --seconds  how long to run\n"
                          "  --offset   device byte where each pass starts (push, pull: float32 byte)\n"
                          "  --dtype    the LUN's dtype: float32, bfloat16 or float16\n";

struct Options {
  std::string target;
  std::string op;  // read, write, push, pull
  std::string dtype;
  uint64_t bs = 1 << 20;
  uint32_t qd = 16;
  uint64_t span = 0;  // 0: 64M, or up to the end of the device
  double seconds = 5;
  uint64_t offset = 0;
};

[[noreturn]] void Fail(const std::string& message) {
  fprintf(stderr, "blkps-iobench: %s\n", message.c_str());
  exit(2);
}

uint64_t SizeOption(const std::string& name, const std::string& value) {
  uint64_t bytes = 0;
  if (!blkps::ParseByteSize(value, &bytes)) {
    Fail(name + ": expected a size like 1M, got '" + value + "'");
  }
  return bytes;
}

Options ParseOptions(int argc, char** argv) {
  Options options;
  bool have_op = false;
  for (int i = 1; i < argc; ++i) {
    std::string name = argv[i];
    if (name == "--help" || name == "-h") {
      fputs(kUsage, stdout);
      exit(0);
    }
    std::string value;
    const size_t equals = name.find('=');
    if (equals != std::string::npos) {
      value = name.substr(equals + 1);
      name.resize(equals);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      Fail(name + ": missing value (see --help)");
    }

    if (name == "--target") {
      options.target = value;
    } else if (name == "--op") {
      if (value != "read" && value != "write" && value != "push" && value != "pull") {
        Fail("--op: expected read, write, push or pull, got '" + value + "'");
      }
      options.op = value;
      have_op = true;
    } else if (name == "--bs") {
      options.bs = SizeOption(name, value);
      if (options.bs == 0 || options.bs > UINT32_MAX) {
        Fail("--bs: expected a size from 1 to 4G-1 bytes, got '" + value + "'");
      }
    } else if (name == "--qd") {
      uint64_t qd = 0;
      if (value.find_first_not_of("0123456789") != std::string::npos || !blkps::ParseByteSize(value, &qd) || qd == 0 ||
          qd > UINT32_MAX) {
        Fail("--qd: expected a positive integer, got '" + value + "'");
      }
      options.qd = static_cast<uint32_t>(qd);
    } else if (name == "--span") {
      options.span = SizeOption(name, value);
      if (options.span == 0) Fail("--span: expected a size > 0, got '0'");
    } else if (name == "--seconds") {
      char* end = nullptr;
      options.seconds = strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || !std::isfinite(options.seconds) || options.seconds <= 0) {
        Fail("--seconds: expected a positive number, got '" + value + "'");
      }
    } else if (name == "--offset") {
      options.offset = SizeOption(name, value);
    } else if (name == "--dtype") {
      options.dtype = value;  // Model::Open checks it
    } else {
      Fail("unknown option '" + name + "' (see --help)");
    }
  }
  if (options.target.empty()) Fail("--target is required (see --help)");
  if (!have_op) Fail("--op is required: read, write, push or pull (see --help)");
  if ((options.op == "push" || options.op == "pull") && (options.offset % 4 != 0 || options.span % 4 != 0)) {
    Fail("--op " + options.op + ": --offset and --span must be whole float32 parameters (multiples of 4)");
  }
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = ParseOptions(argc, argv);

  blkps::OpenOptions open_options;
  open_options.request_bytes = static_cast<uint32_t>(options.bs);
  open_options.queue_depth = options.qd;
  open_options.dtype = options.dtype;
  std::string error;
  std::unique_ptr<blkps::Model> model = blkps::Model::Open(options.target, open_options, &error);
  if (model == nullptr) Fail(error);

  // Push and pull count in float32 bytes whatever the LUN carries.
  const bool params = options.op == "push" || options.op == "pull";
  const uint64_t device_bytes = params ? model->param_capacity() * 4 : model->size_bytes();
  uint64_t span = options.span;
  if (span == 0) {
    if (options.offset >= device_bytes) {
      Fail("--offset " + std::to_string(options.offset) + " is past the end of the device (" +
           std::to_string(device_bytes) + " bytes)");
    }
    span = std::min<uint64_t>(64 << 20, device_bytes - options.offset);
  }

  void* buffer = nullptr;
  if (posix_memalign(&buffer, 4096, span) != 0) {
    Fail("cannot allocate a " + std::to_string(span) + "-byte buffer");
  }
  memset(buffer, 0, span);  // 0.0f: a gradient that changes nothing

  auto pass = [&]() {
    float* values = static_cast<float*>(buffer);
    if (options.op == "write") return model->WriteBytes(options.offset, buffer, span);
    if (options.op == "read") return model->ReadBytes(options.offset, buffer, span);
    if (options.op == "push") return model->Push(options.offset / 4, values, span / 4);
    return model->Pull(options.offset / 4, values, span / 4);
  };
  using Clock = std::chrono::steady_clock;
  rusage usage_before{};
  getrusage(RUSAGE_SELF, &usage_before);
  const Clock::time_point start = Clock::now();
  double elapsed = 0;
  uint64_t bytes = 0;
  do {
    if (pass() != 0) Fail(model->last_error());
    bytes += span;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } while (elapsed < options.seconds);
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  free(buffer);

  auto seconds = [](const timeval& a, const timeval& b) {
    return (b.tv_sec - a.tv_sec) + (b.tv_usec - a.tv_usec) / 1e6;
  };
  printf("op=%s bs=%llu qd=%u bytes=%llu seconds=%.3f MBps=%.1f cpu_user=%.3f cpu_sys=%.3f\n", options.op.c_str(),
         static_cast<unsigned long long>(model->request_bytes()), model->queue_depth(),
         static_cast<unsigned long long>(bytes), elapsed, bytes / elapsed / 1e6,
         seconds(usage_before.ru_utime, usage.ru_utime), seconds(usage_before.ru_stime, usage.ru_stime));
  return 0;
}
