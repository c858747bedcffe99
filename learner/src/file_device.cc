// FileDevice: the model device as a regular file or a block device (a kernel
// iSCSI/iSER session's /dev/sdX), through pread/pwrite.
//
// Requests run one after another; queue_depth is not used yet. An
// asynchronous implementation (libaio, O_DIRECT) replaces Transfer() only.

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "device.h"

namespace blkps {
namespace {

// A regular file has no block size of its own; 512 matches the disks that
// iSCSI targets present, so a file and a LUN holding the same model agree.
constexpr uint32_t kFileBlockSize = 512;
constexpr uint64_t kDefaultRequestBytes = 1 << 20;

class FileDevice : public Device {
 public:
  FileDevice(std::string path, int fd, uint64_t size_bytes, uint32_t block_size)
      : path_(std::move(path)),
        fd_(fd),
        size_bytes_(size_bytes),
        block_size_(block_size) {}
  ~FileDevice() override { close(fd_); }

  uint64_t size_bytes() const override { return size_bytes_; }
  uint32_t logical_block_size() const override { return block_size_; }
  uint64_t default_request_bytes() const override {
    return kDefaultRequestBytes;
  }
  uint64_t max_request_bytes() const override {
    return UINT64_MAX / block_size_ * block_size_;
  }

  Status Transfer(Direction direction, const std::vector<IoRequest>& requests,
                  uint32_t /*queue_depth*/) override {
    for (const IoRequest& request : requests) {
      uint64_t offset = request.offset;
      for (int i = 0; i < request.iovcnt; ++i) {
        Status status = TransferAll(direction, offset, request.iov[i]);
        if (!status.ok()) return status;
        offset += request.iov[i].iov_len;
      }
    }
    return Status();
  }

  Status Sync() override {
    if (fsync(fd_) != 0) {
      return Status::Error(errno, "sync of %s failed: %s", path_.c_str(),
                           strerror(errno));
    }
    return Status();
  }

 private:
  // pread/pwrite may move fewer bytes than asked; loop until done.
  Status TransferAll(Direction direction, uint64_t offset, const iovec& iov) {
    uint8_t* memory = static_cast<uint8_t*>(iov.iov_base);
    size_t done = 0;
    while (done < iov.iov_len) {
      const ssize_t n =
          direction == Direction::kRead
              ? pread(fd_, memory + done, iov.iov_len - done, offset + done)
              : pwrite(fd_, memory + done, iov.iov_len - done, offset + done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        return Status::Error(errno, "%s of %s at offset %llu failed: %s",
                             DirectionName(direction), path_.c_str(),
                             static_cast<unsigned long long>(offset + done),
                             strerror(errno));
      }
      if (n == 0) {
        return Status::Error(EIO,
                             "%s of %s at offset %llu: end of file "
                             "(did the file shrink?)",
                             DirectionName(direction), path_.c_str(),
                             static_cast<unsigned long long>(offset + done));
      }
      done += n;
    }
    return Status();
  }

  const std::string path_;
  const int fd_;
  const uint64_t size_bytes_;
  const uint32_t block_size_;
};

}  // namespace

std::unique_ptr<Device> OpenFileDevice(const std::string& path,
                                       Status* status) {
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    *status = Status::Error(errno, "cannot open %s: %s", path.c_str(),
                            strerror(errno));
    return nullptr;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    *status = Status::Error(errno, "cannot stat %s: %s", path.c_str(),
                            strerror(errno));
    close(fd);
    return nullptr;
  }

  uint64_t size_bytes = 0;
  uint32_t block_size = kFileBlockSize;
  if (S_ISREG(st.st_mode)) {
    // A trailing partial block is not addressable: round down.
    size_bytes = static_cast<uint64_t>(st.st_size) / block_size * block_size;
  } else if (S_ISBLK(st.st_mode)) {
    int sector_size = 0;
    if (ioctl(fd, BLKGETSIZE64, &size_bytes) != 0 ||
        ioctl(fd, BLKSSZGET, &sector_size) != 0) {
      *status = Status::Error(errno, "cannot read the geometry of %s: %s",
                              path.c_str(), strerror(errno));
      close(fd);
      return nullptr;
    }
    block_size = static_cast<uint32_t>(sector_size);
  } else {
    *status = Status::Error(ENODEV, "%s is not a regular file or block device",
                            path.c_str());
    close(fd);
    return nullptr;
  }
  return std::make_unique<FileDevice>(path, fd, size_bytes, block_size);
}

}  // namespace blkps
