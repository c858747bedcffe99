// libFuzzer harness: blkps-mount's split-write assembler
// (learner/mount/split_write_assembler.h) driven by a random sequence of
// pieces, flushes, reads and fsyncs on a small device.
//
// Input: a byte choosing the block size and whole_floats, then operations,
// each an opcode byte and its arguments (see Step). The oracle, for files
// without whole_floats: every byte written goes out exactly once, so after a
// final TakeAll the per-byte sum of what was sent (direct ranges and drained
// blocks, zeros included) equals the per-byte sum of what was written, and
// nothing is left pending. With whole_floats, blocks may be dropped (a float
// partly written): then only the shape of what comes out is checked. Never a
// crash, leak or undefined behaviour (ASan, UBSan).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "split_write_assembler.h"

namespace {

constexpr uint64_t kBlocks = 16;

// Reads the input front to back; past its end every read is 0.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return at_ >= size_; }
  uint8_t Byte() { return at_ < size_ ? data_[at_++] : 0; }
  uint16_t Word() { return static_cast<uint16_t>(Byte() | Byte() << 8); }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

class Check {
 public:
  Check(uint32_t block_size, bool whole_floats)
      : block_size_(block_size),
        whole_floats_(whole_floats),
        written_(kBlocks * block_size),
        sent_(kBlocks * block_size) {}

  uint64_t device_bytes() const { return written_.size(); }

  void Written(uint64_t offset, const std::vector<uint8_t>& bytes) {
    for (size_t i = 0; i < bytes.size(); ++i) written_[offset + i] += bytes[i];
  }
  void Sent(const blkps::SplitWriteAssembler::PieceResult& r, uint64_t offset, const std::vector<uint8_t>& bytes) {
    if (r.direct_begin > r.direct_end) std::abort();
    if (r.direct_begin < r.direct_end &&  // whole blocks of the piece
        (r.direct_begin % block_size_ || r.direct_end % block_size_ || r.direct_begin < offset ||
         r.direct_end > offset + bytes.size())) {
      std::abort();
    }
    for (uint64_t at = r.direct_begin; at < r.direct_end; ++at) sent_[at] += bytes[at - offset];
    Sent(r.drained);
  }
  void Sent(const blkps::Drained& d) {
    if (!whole_floats_ && !d.dropped.empty()) std::abort();
    for (const blkps::ReadyBlock& b : d.blocks) {
      if (b.offset % block_size_ || b.bytes.size() != block_size_ || b.offset + block_size_ > device_bytes()) {
        std::abort();
      }
      for (uint32_t i = 0; i < block_size_; ++i) sent_[b.offset + i] += b.bytes[i];
    }
  }
  void Finish(const blkps::SplitWriteAssembler& a) const {
    if (a.pending_blocks() != 0) std::abort();
    if (!whole_floats_ && sent_ != written_) std::abort();
  }

 private:
  const uint32_t block_size_;
  const bool whole_floats_;
  std::vector<uint64_t> written_, sent_;  // per device byte, sums of byte values
};

// One operation: 0-3 a piece, 4 flush of an owner, 5 a read, 6 fsync.
void Step(Input& in, blkps::SplitWriteAssembler& a, Check& check) {
  const uint8_t op = in.Byte() % 7;
  if (op < 4) {
    const uint64_t offset = in.Word() % check.device_bytes();
    const uint64_t length = 1 + in.Word() % (check.device_bytes() - offset);
    const uint64_t owner = in.Byte() % 3;
    std::vector<uint8_t> bytes(length);
    for (auto& b : bytes) b = in.done() ? 1 : in.Byte();
    check.Written(offset, bytes);
    check.Sent(a.AddPiece(offset, bytes.data(), length, owner), offset, bytes);
  } else if (op == 4) {
    check.Sent(a.TakeOwnedBy(in.Byte() % 3));
  } else if (op == 5) {
    const uint64_t begin = in.Word() % check.device_bytes();
    const uint64_t end = begin + in.Word() % (check.device_bytes() - begin + 1);
    check.Sent(a.TakeOverlapping(begin, end));
  } else {
    check.Sent(a.TakeAll());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  const uint8_t shape = in.Byte();
  static constexpr uint32_t kBlockSizes[] = {4, 8, 64, 512};
  const uint32_t block_size = kBlockSizes[shape % 4];
  const bool whole_floats = shape & 4;
  blkps::SplitWriteAssembler assembler(block_size, whole_floats);
  Check check(block_size, whole_floats);
  for (int ops = 0; !in.done() && ops < 256; ++ops) Step(in, assembler, check);
  check.Sent(assembler.TakeAll());
  check.Finish(assembler);
  return 0;
}
