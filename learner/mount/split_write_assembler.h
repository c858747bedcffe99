// SplitWriteAssembler: turns the pieces of gradient writes into whole logical
// blocks for the model device, sending every block exactly once.
//
// Why: with direct_io the kernel may cut one write(2) into several FUSE
// writes at page boundaries of the CALLER'S buffer, so a piece may start or
// end at any byte of the file, even inside a value; with async DIO the pieces
// may arrive concurrently and in any order. The blkps server applies
// gradients in whole 512-byte logical blocks, and must see each block once.
//
// The rule, per mounted file:
//   - the whole logical blocks of a piece go straight to the device (the
//     caller of AddPiece sends them; the assembler returns their range);
//   - the partial first and last block of a piece are merged into a table of
//     pending blocks (the bytes, and which bytes are written); a block is
//     returned for sending the moment every byte of it is written;
//   - a pending block is completed with zeros (a zero gradient changes
//     nothing) and returned when it must go out early: at flush (close),
//     fsync and release, when a read overlaps it, and when a new piece writes
//     a byte of it that is already written (a second gradient for the same
//     parameter: the first one goes out alone, the new one starts a fresh
//     pending block);
//   - a block completed with zeros must hold whole values only (for files
//     of `value_bytes` V > 0; bytes V*k..V*k+V-1 of the block are one value:
//     a float32, or a 16-bit value of a 16-bit LUN): a value only partly
//     written is an error. At flush/fsync/release/overlap
//     the block is dropped and one line says so (the caller returns EIO); a
//     read leaves such a block pending, since its other bytes are most
//     likely still on their way.
// A block leaves the table exactly once (returned or dropped), so no block
// is ever sent twice by the assembler.
//
// Thread-safety: all methods may be called concurrently (one mutex guards
// the table). The returned blocks belong to the caller.

#ifndef BLKPS_MOUNT_SPLIT_WRITE_ASSEMBLER_H_
#define BLKPS_MOUNT_SPLIT_WRITE_ASSEMBLER_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace blkps {

// A whole logical block ready for the device.
struct ReadyBlock {
  uint64_t offset;             // device byte; a multiple of the block size
  std::vector<uint8_t> bytes;  // block size bytes
};

// What the caller must send (blocks), and the blocks dropped (one message
// each, e.g. "block at byte 4096: the value at byte 4100 is only partly
// written (bytes 4100,4101 of 4100..4103); ... dropped").
struct Drained {
  std::vector<ReadyBlock> blocks;
  std::vector<std::string> dropped;
};

class SplitWriteAssembler {
 public:
  // REQUIRES: block_size > 0 and a multiple of 4; value_bytes 0, 2 or 4.
  // `value_bytes`: the file holds gradients of this size (4: float32, 2: a
  // 16-bit LUN), so zero-completing a block with a partly written value is
  // an error; 0 for byte files such as the control LUN, whose commands are
  // NUL-padded text.
  SplitWriteAssembler(uint32_t block_size, uint32_t value_bytes);

  SplitWriteAssembler(const SplitWriteAssembler&) = delete;
  SplitWriteAssembler& operator=(const SplitWriteAssembler&) = delete;

  // The outcome of one piece.
  struct PieceResult {
    // [direct_begin, direct_end): the piece's whole blocks, as device bytes,
    // for the caller to send from its own data; empty when begin == end.
    uint64_t direct_begin = 0;
    uint64_t direct_end = 0;
    // Blocks this piece completed, and pending blocks it pushed out early
    // (overlap), to be sent by the caller.
    Drained drained;
  };

  // Takes the piece `data[0, length)` written at device byte `offset` through
  // the open file `owner` (any id that the caller's Flush uses). Copies what
  // it keeps; `data` is not referenced after the call.
  // REQUIRES: length > 0.
  PieceResult AddPiece(uint64_t offset, const uint8_t* data, uint64_t length, uint64_t owner);

  // Pending blocks first written through `owner`, zero-completed (flush and
  // release of that open file).
  Drained TakeOwnedBy(uint64_t owner);
  // Every pending block, zero-completed (fsync, unmount).
  Drained TakeAll();
  // Pending blocks that overlap [begin, end) and hold whole values only,
  // zero-completed (before a read, so that it sees the reader's own writes).
  Drained TakeOverlapping(uint64_t begin, uint64_t end);

  size_t pending_blocks() const;

 private:
  struct PendingBlock {
    std::vector<uint8_t> bytes;    // zero where not written
    std::vector<uint8_t> written;  // 1 per written byte
    uint32_t written_count = 0;
    uint64_t owner = 0;
  };

  // Merges [offset, offset + length) of one block (REQUIRES: within one
  // block) into the table; completed or pushed-out blocks go to *out.
  void MergeLocked(uint64_t offset, const uint8_t* data, uint64_t length, uint64_t owner, Drained* out);
  // Moves the pending block `it` out of the table, zero-completed, into
  // *out (or drops it, with a message, when it must hold whole values and
  // does not).
  void EvictLocked(std::map<uint64_t, PendingBlock>::iterator it, Drained* out);
  // The first value of `block` that is only partly written, or -1 (always
  // -1 for byte files).
  int64_t PartialValue(const PendingBlock& block) const;

  const uint32_t block_size_;
  const uint32_t value_bytes_;
  mutable std::mutex mutex_;
  std::map<uint64_t, PendingBlock> pending_;  // by device byte of the block
};

}  // namespace blkps

#endif  // BLKPS_MOUNT_SPLIT_WRITE_ASSEMBLER_H_
