// PageBuffer: a zero-filled, page-aligned array owned by the aggregator —
// the model's weights and the update rules' per-parameter state.
//
// Mapped anonymously: pages are committed when first written, so creating a
// buffer does not take memory before Model::Create has checked that the
// model fits, and the kernel hands out zeroed pages. Move-only.
//
// A buffer of 2 MiB or more asks for transparent huge pages (MADV_HUGEPAGE;
// Debian's kernels give them only to who asks): fewer TLB misses, and where
// the kernel has them its memory is committed in 2 MiB pieces as it is
// first written. A dense table's arrays take 4 KiB pages back
// (AdviseSmallPages): its rows are made one by one where pushes first land,
// and a 2 MiB page committed for one row would cost the memory of thousands
// (a table costs the rows it holds); on this project's VM a huge page's
// first touch also cost five times the 4 KiB pages it replaces
// (doc/embeddings.md "Click model").
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "status.h"

namespace blkps::server {

class PageBuffer {
 public:
  PageBuffer() = default;
  ~PageBuffer() {
    if (data_ != nullptr) munmap(data_, mapped_);
  }
  PageBuffer(PageBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        bytes_(std::exchange(other.bytes_, 0)),
        mapped_(std::exchange(other.mapped_, 0)) {}
  PageBuffer& operator=(PageBuffer&&) = delete;

  // Maps `count` elements of `elem_bytes` each; `what` names the buffer in
  // errors ("the weights", "the adam state"). count == 0 maps nothing and
  // data() stays nullptr. On failure returns ResourceExhausted (starting
  // "params:", the option to change) and leaves *out untouched.
  static Status Allocate(uint64_t count, size_t elem_bytes, const std::string& what, PageBuffer* out) {
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    if (count == 0) return Status::OK();
    if (count > (std::numeric_limits<uint64_t>::max() - page) / elem_bytes) {
      return Status::ResourceExhausted("params: " + std::to_string(count) + " parameters are too many for " + what);
    }
    const uint64_t bytes = count * elem_bytes;
    const uint64_t mapped = (bytes + page - 1) / page * page;
    void* mem = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
      return Status::ResourceExhausted("params: cannot allocate " + std::to_string((mapped + (1 << 20) - 1) >> 20) +
                                       " MiB for " + what + ": " + std::strerror(errno) +
                                       "; use fewer parameters, shard the model, or a rule with less state");
    }
    if (mapped >= kHugePageBytes) madvise(mem, mapped, MADV_HUGEPAGE);  // advice: ignored where not had
    out->data_ = mem;
    out->bytes_ = bytes;
    out->mapped_ = mapped;
    return Status::OK();
  }

  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }

 private:
  static constexpr uint64_t kHugePageBytes = 2u << 20;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  size_t mapped_ = 0;
};

// Asks that [data, data + bytes) be committed in 4 KiB pages (advice, as
// MADV_HUGEPAGE is). data is page-aligned, as a PageBuffer's is.
inline void AdviseSmallPages(void* data, size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  if (data != nullptr) madvise(data, (bytes + page - 1) / page * page, MADV_NOHUGEPAGE);
}

}  // namespace blkps::server
