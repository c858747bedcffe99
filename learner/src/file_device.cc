// FileDevice: the model device as a regular file or a block device (a kernel
// iSCSI/iSER session's /dev/sdX), through libaio with O_DIRECT.
//
// Why O_DIRECT: on a kernel block device the page cache would merge a
// partial-page gradient write with weights read earlier and send the server
// those weights as gradient. So the device is opened O_DIRECT, files too (the
// page cache would only add a copy). Requests run as io_submit/io_getevents,
// queue_depth of them in flight:
//   - a request whose memory and lengths meet the direct-I/O alignment
//     (statx STATX_DIOALIGN; else the block size for block devices and 4096
//     for files) goes straight from the caller's iovecs (zero copy);
//   - any other goes through an aligned bounce buffer, one per slot in
//     flight, so memory stays bounded by queue_depth x request_bytes.
// Where open(O_DIRECT) is refused with EINVAL (file systems without direct
// I/O), the device falls back to buffered I/O through the same libaio path
// and says so once on stderr (libblkps has no other channel for notices). A
// regular file whose direct-I/O offset alignment exceeds 512 bytes also has a
// buffered descriptor, used for requests that are not aligned to it.

#include <fcntl.h>
#include <libaio.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "device.h"

namespace blkps {
namespace {

// A regular file has no block size of its own; 512 matches the disks that
// iSCSI targets present, so a file and a LUN holding the same model agree.
constexpr uint32_t kFileBlockSize = 512;
constexpr uint64_t kDefaultRequestBytes = 1 << 20;
// The kernel moves at most about 2 GiB per read/write; stay well below it so a
// request never comes back short for that reason.
constexpr uint64_t kMaxRequestBytes = 1 << 30;
// Direct-I/O alignment of a regular file when statx does not report it.
constexpr uint32_t kFileDirectAlignment = 4096;
// Bounce buffers are page aligned, which satisfies any direct-I/O alignment.
constexpr size_t kBounceAlignment = 4096;
// More in flight than this buys nothing from one file and costs aio slots.
constexpr uint32_t kMaxQueueDepth = 256;

using ull = unsigned long long;

int OpenWithSyscall(const char* path, int flags) { return open(path, flags); }

// One request in flight, and the bounce buffer its slot keeps across batches.
struct Slot {
  iocb cb{};
  size_t index = 0;  // which of the batch's requests
  bool busy = false;
  bool bounced = false;  // the request moves through `bounce`
  void* bounce = nullptr;
  size_t bounce_size = 0;
};

class FileDevice : public Device {
 public:
  // Takes ownership of the descriptors. `buffered_fd` is -1 when every
  // request can use `fd`.
  FileDevice(std::string path, int fd, int buffered_fd, bool direct, uint32_t mem_align, uint32_t offset_align,
             uint64_t size_bytes, uint32_t block_size)
      : path_(std::move(path)),
        fd_(fd),
        buffered_fd_(buffered_fd),
        direct_(direct),
        mem_align_(mem_align),
        offset_align_(offset_align),
        size_bytes_(size_bytes),
        block_size_(block_size) {}

  ~FileDevice() override {
    if (aio_capacity_ > 0) io_destroy(aio_);
    for (Slot& slot : slots_) free(slot.bounce);
    if (buffered_fd_ >= 0) close(buffered_fd_);
    close(fd_);
  }

  uint64_t size_bytes() const override { return size_bytes_; }
  uint32_t logical_block_size() const override { return block_size_; }
  uint64_t default_request_bytes() const override { return kDefaultRequestBytes; }
  uint64_t max_request_bytes() const override { return kMaxRequestBytes / block_size_ * block_size_; }

  Status Transfer(Direction direction, const std::vector<IoRequest>& requests, uint32_t queue_depth) override;

  Status Sync() override {
    if (fsync(fd_) != 0) {
      return Status::Error(errno, "sync of %s failed: %s", path_.c_str(), strerror(errno));
    }
    return Status();
  }

 private:
  Status PrepareSlots(uint32_t depth);
  Status Prepare(Direction direction, const IoRequest& request, Slot* slot);
  Status Complete(Direction direction, const IoRequest& request, Slot* slot, long result);
  bool Aligned(const IoRequest& request) const;

  const std::string path_;
  const int fd_;           // O_DIRECT unless refused
  const int buffered_fd_;  // for requests fd_ cannot take; -1 if none
  const bool direct_;      // fd_ is O_DIRECT
  const uint32_t mem_align_;
  const uint32_t offset_align_;
  const uint64_t size_bytes_;
  const uint32_t block_size_;

  io_context_t aio_ = nullptr;
  uint32_t aio_capacity_ = 0;  // events io_setup allowed; 0: no context yet
  // Nothing is in flight between batches, so the slots may move.
  std::vector<Slot> slots_;
  // Set when the kernel may still own requests of a failed batch: the slots
  // cannot be reused, and the device refuses further work.
  Status lost_;
};

Status FileDevice::PrepareSlots(uint32_t depth) {
  if (depth > aio_capacity_) {
    if (aio_capacity_ > 0) io_destroy(aio_);
    aio_ = nullptr;
    aio_capacity_ = 0;
    const int rc = io_setup(static_cast<int>(depth), &aio_);
    if (rc < 0) {
      return Status::Error(-rc,
                           "cannot set up asynchronous I/O for %s with %u "
                           "requests in flight: %s (see fs.aio-max-nr)",
                           path_.c_str(), depth, strerror(-rc));
    }
    aio_capacity_ = depth;
  }
  if (slots_.size() < depth) slots_.resize(depth);
  return Status();
}

// Direct I/O takes the caller's memory only when every piece is aligned.
bool FileDevice::Aligned(const IoRequest& request) const {
  if (!direct_) return true;
  for (int i = 0; i < request.iovcnt; ++i) {
    const uintptr_t base = reinterpret_cast<uintptr_t>(request.iov[i].iov_base);
    if (base % mem_align_ != 0 || request.iov[i].iov_len % offset_align_ != 0) {
      return false;
    }
  }
  return true;
}

Status FileDevice::Prepare(Direction direction, const IoRequest& request, Slot* slot) {
  const bool direct_offset = request.offset % offset_align_ == 0 && request.length % offset_align_ == 0;
  const int fd = !direct_ || direct_offset || buffered_fd_ < 0 ? fd_ : buffered_fd_;
  slot->bounced = fd == fd_ && !Aligned(request);
  if (!slot->bounced) {
    if (direction == Direction::kRead) {
      io_prep_preadv(&slot->cb, fd, request.iov, request.iovcnt, static_cast<long long>(request.offset));
    } else {
      io_prep_pwritev(&slot->cb, fd, request.iov, request.iovcnt, static_cast<long long>(request.offset));
    }
    return Status();
  }
  if (slot->bounce_size < request.length) {
    free(slot->bounce);
    slot->bounce = nullptr;
    slot->bounce_size = 0;
    if (posix_memalign(&slot->bounce, kBounceAlignment, request.length) != 0) {
      slot->bounce = nullptr;
      return Status::Error(ENOMEM, "out of memory for a %llu-byte %s buffer", static_cast<ull>(request.length),
                           DirectionName(direction));
    }
    slot->bounce_size = request.length;
  }
  uint8_t* bounce = static_cast<uint8_t*>(slot->bounce);
  if (direction == Direction::kRead) {
    io_prep_pread(&slot->cb, fd, bounce, request.length, static_cast<long long>(request.offset));
  } else {
    for (int i = 0; i < request.iovcnt; ++i) {
      memcpy(bounce, request.iov[i].iov_base, request.iov[i].iov_len);
      bounce += request.iov[i].iov_len;
    }
    io_prep_pwrite(&slot->cb, fd, slot->bounce, request.length, static_cast<long long>(request.offset));
  }
  return Status();
}

Status FileDevice::Complete(Direction direction, const IoRequest& request, Slot* slot, long result) {
  if (result < 0) {
    return Status::Error(static_cast<int>(-result), "%s of %s at offset %llu failed: %s", DirectionName(direction),
                         path_.c_str(), static_cast<ull>(request.offset), strerror(static_cast<int>(-result)));
  }
  if (static_cast<uint64_t>(result) != request.length) {
    return Status::Error(EIO,
                         "%s of %s at offset %llu moved %ld of %llu bytes: "
                         "end of file (did the file shrink?)",
                         DirectionName(direction), path_.c_str(), static_cast<ull>(request.offset), result,
                         static_cast<ull>(request.length));
  }
  if (direction == Direction::kRead && slot->bounced) {
    const uint8_t* bounce = static_cast<const uint8_t*>(slot->bounce);
    for (int i = 0; i < request.iovcnt; ++i) {
      memcpy(request.iov[i].iov_base, bounce, request.iov[i].iov_len);
      bounce += request.iov[i].iov_len;
    }
  }
  return Status();
}

Status FileDevice::Transfer(Direction direction, const std::vector<IoRequest>& requests, uint32_t queue_depth) {
  if (!lost_.ok()) return lost_;
  if (requests.empty()) return Status();
  const uint32_t depth = static_cast<uint32_t>(
      std::min<uint64_t>(std::min(std::max<uint32_t>(queue_depth, 1), kMaxQueueDepth), requests.size()));
  Status result = PrepareSlots(depth);
  if (!result.ok()) return result;

  std::vector<iocb*> to_submit;
  std::vector<io_event> events(depth);
  size_t next = 0;  // the first request not started yet
  size_t in_flight = 0;
  while (true) {
    // Start requests in the free slots, unless a request failed.
    to_submit.clear();
    for (uint32_t i = 0; i < depth && result.ok() && next < requests.size(); ++i) {
      Slot& slot = slots_[i];
      if (slot.busy) continue;
      result = Prepare(direction, requests[next], &slot);
      if (!result.ok()) {
        // No request starts after a failure, not even those prepared.
        for (iocb* cb : to_submit) static_cast<Slot*>(cb->data)->busy = false;
        to_submit.clear();
        break;
      }
      slot.index = next++;
      slot.busy = true;
      slot.cb.data = &slot;
      to_submit.push_back(&slot.cb);
    }
    size_t submitted = 0;
    while (submitted < to_submit.size()) {
      const int rc = io_submit(aio_, static_cast<long>(to_submit.size() - submitted), to_submit.data() + submitted);
      if (rc == -EINTR) continue;
      if (rc == -EAGAIN && in_flight + submitted > 0) break;  // reap first
      if (rc <= 0) {
        const int code = rc < 0 ? -rc : EIO;
        if (result.ok()) {
          result = Status::Error(code, "%s of %s: cannot submit I/O: %s", DirectionName(direction), path_.c_str(),
                                 strerror(code));
        }
        break;
      }
      submitted += static_cast<size_t>(rc);
    }
    in_flight += submitted;
    // Requests prepared but not submitted go back: restart them later, or
    // never after a failure.
    for (size_t i = submitted; i < to_submit.size(); ++i) {
      Slot* slot = static_cast<Slot*>(to_submit[i]->data);
      slot->busy = false;
      next = std::min(next, slot->index);
    }
    if (in_flight == 0) break;

    const int n = io_getevents(aio_, 1, static_cast<long>(in_flight), events.data(), nullptr);
    if (n == -EINTR) continue;
    if (n < 0) {
      // The kernel still owns the requests in flight; the context must not
      // be reused or torn down under them, so give up on this device.
      lost_ = Status::Error(-n,
                            "waiting for I/O on %s failed: %s; reopen the "
                            "model",
                            path_.c_str(), strerror(-n));
      return lost_;
    }
    for (int i = 0; i < n; ++i) {
      Slot* slot = static_cast<Slot*>(events[i].data);
      Status status = Complete(direction, requests[slot->index], slot, static_cast<long>(events[i].res));
      if (result.ok() && !status.ok()) result = status;
      slot->busy = false;
      --in_flight;
    }
    if (!result.ok() && in_flight == 0) break;
    if (result.ok() && next == requests.size() && in_flight == 0) break;
  }
  return result;
}

// Direct-I/O alignment of `fd`: from statx where the kernel reports it.
void DirectAlignment(int fd, bool block_device, uint32_t block_size, uint32_t* mem_align, uint32_t* offset_align) {
  *mem_align = block_device ? block_size : kFileDirectAlignment;
  *offset_align = *mem_align;
  struct statx sx;
  if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN) != 0 &&
      sx.stx_dio_mem_align != 0 && sx.stx_dio_offset_align != 0) {
    *mem_align = sx.stx_dio_mem_align;
    *offset_align = std::max(sx.stx_dio_offset_align, block_size);
  }
}

}  // namespace

std::unique_ptr<Device> OpenFileDeviceWith(const std::string& path, OpenFileFn open_file, Status* status) {
  bool direct = true;
  int fd = open_file(path.c_str(), O_RDWR | O_CLOEXEC | O_DIRECT);
  if (fd < 0 && errno == EINVAL) {
    direct = false;
    fd = open_file(path.c_str(), O_RDWR | O_CLOEXEC);
  }
  if (fd < 0) {
    *status = Status::Error(errno, "cannot open %s: %s", path.c_str(), strerror(errno));
    return nullptr;
  }
  auto fail = [&](Status error) {
    *status = std::move(error);
    close(fd);
    return nullptr;
  };
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return fail(Status::Error(errno, "cannot stat %s: %s", path.c_str(), strerror(errno)));
  }

  uint64_t size_bytes = 0;
  uint32_t block_size = kFileBlockSize;
  if (S_ISREG(st.st_mode)) {
    // A trailing partial block is not addressable: round down.
    size_bytes = static_cast<uint64_t>(st.st_size) / block_size * block_size;
  } else if (S_ISBLK(st.st_mode)) {
    int sector_size = 0;
    if (ioctl(fd, BLKGETSIZE64, &size_bytes) != 0 || ioctl(fd, BLKSSZGET, &sector_size) != 0) {
      return fail(Status::Error(errno, "cannot read the geometry of %s: %s", path.c_str(), strerror(errno)));
    }
    block_size = static_cast<uint32_t>(sector_size);
  } else {
    return fail(Status::Error(ENODEV, "%s is not a regular file or block device", path.c_str()));
  }

  uint32_t mem_align = 1;
  uint32_t offset_align = block_size;
  int buffered_fd = -1;
  if (direct) {
    DirectAlignment(fd, S_ISBLK(st.st_mode), block_size, &mem_align, &offset_align);
    // A block device's requests are whole sectors, its direct-I/O unit. A
    // file's 512-byte blocks may be finer than its file system's: those
    // requests go through the page cache, coherent with direct I/O.
    if (S_ISREG(st.st_mode) && offset_align > block_size) {
      buffered_fd = open_file(path.c_str(), O_RDWR | O_CLOEXEC);
      if (buffered_fd < 0) {
        return fail(Status::Error(errno, "cannot open %s: %s", path.c_str(), strerror(errno)));
      }
    }
  } else {
    fprintf(stderr, "blkps: %s refuses O_DIRECT (EINVAL); using buffered I/O\n", path.c_str());
  }
  return std::make_unique<FileDevice>(path, fd, buffered_fd, direct, mem_align, offset_align, size_bytes, block_size);
}

std::unique_ptr<Device> OpenFileDevice(const std::string& path, Status* status) {
  return OpenFileDeviceWith(path, OpenWithSyscall, status);
}

}  // namespace blkps
