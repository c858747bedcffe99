// libFuzzer harness: the checkpoint loader — a Job created with a checkpoint
// file that holds the input (aggregator/job_checkpoint.cc over
// checkpoint_file.cc: header, metadata checks, sections, clocks).
//
// So that mutations get past the checksum, the harness rewrites the CRC of
// any input that ends in the trailer marker "BLKPSEND" (the mismatch path is
// checkpoint_file_test's). Contract checked: Create() loads the file or
// refuses it with one line; never a crash, leak or undefined behaviour
// (ASan, UBSan), never an allocation the file's size does not justify
// (libFuzzer's -rss_limit_mb / -malloc_limit_mb).
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "crc32c.h"
#include "job.h"
#include "lu_options.h"

namespace {

// The seeds in corpus/checkpoint/ were written by a job of these options.
constexpr const char* kBsopts = "params=1000;block=1K;rule=adam;mode=bsp";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/blkps-checkpoint-fuzz-" + std::to_string(getpid());
  static blkps::server::LuOptions options = [] {
    blkps::server::LuOptions o;
    if (!blkps::server::ParseLuOptions(kBsopts, &o).ok()) std::abort();
    o.job.checkpoint = path;
    std::atexit([] { unlink(path.c_str()); });  // the run leaves no file behind
    return o;
  }();

  std::vector<uint8_t> file(data, data + size);
  constexpr char kMarker[] = "BLKPSEND";
  if (size >= 12 && std::memcmp(data + size - 8, kMarker, 8) == 0) {
    const uint32_t crc = blkps::server::Crc32c(0, file.data(), size - 12);
    std::memcpy(file.data() + size - 12, &crc, 4);  // little-endian on x86-64
  }
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || write(fd, file.data(), file.size()) != static_cast<ssize_t>(file.size()) || close(fd) != 0) {
    std::abort();
  }
  std::shared_ptr<blkps::server::Job> job;
  const blkps::server::Status s = blkps::server::Job::Create(
      "fuzz", options.job, [](const std::string&) {}, &job);
  if (!s.ok() && s.message().find('\n') != std::string::npos) std::abort();
  return 0;
}
