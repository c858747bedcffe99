// Checkpoint files: named byte sections plus key=value metadata, written
// durably and atomically, and read back only if every byte checks out.
//
// The format knows nothing of what it stores. Its caller (the training job)
// keeps weights, optimizer state, the accumulator and clock bookkeeping as
// sections, and the settings they depend on (num_params, rule, mode, ...) as
// metadata, which it checks before it decides where the sections go.
// Every file the job writes also says whose it is (job, generation, shard,
// shards, step: checkpoint_set.h, which also uses this format, with no
// sections, for a scaled-out job's manifest).
//
// File format, version 1. Numbers are unsigned decimal ASCII (no sign, no
// leading zeros); offsets and sizes are in bytes from the start of the file.
//
//   0     A text header, each line ending in '\n':
//           BLKPS-CHECKPOINT                  the magic line
//           version 1
//           meta <key>=<value>                one per metadata entry, keys in
//                                             bytewise order
//           section <offset> <bytes> <name>   one per section, in file order
//           end
//         then NUL bytes up to D, the first multiple of 4096 at or after the
//         end of the "end" line.
//   D     The sections' bytes. The first section starts at D, each next one
//         at the first multiple of 4096 at or after the end of the one before
//         (an empty section takes no room: it shares its offset with the
//         next); NUL bytes fill the gaps.
//   T     The trailer, 12 bytes: the CRC32C of bytes [0, T) as a little-endian
//         uint32, then the 8 ASCII bytes "BLKPSEND". T is the first multiple
//         of 4096 at or after the end of the last section (D if none).
//   T+12  The end of the file.
//
// Keys are non-empty and hold no '=', '\n' or NUL; values hold no '\n' or
// NUL; names are non-empty, distinct, and hold no '\n' or NUL. Anything else
// is the caller's bytes (UTF-8 by convention). Since the header is text,
// `head -c 4096 FILE` shows it. A reader refuses a file whose offsets are not
// this layout, whose size is not T+12, or whose CRC does not match. In Python
// (crc32c(bytes) -> int, e.g. from the crc32c package):
//
//   def read_checkpoint(path):
//       data = open(path, "rb").read()
//       head = data[:data.index(b"\nend\n")].split(b"\n")
//       assert head[0] == b"BLKPS-CHECKPOINT" and head[1] == b"version 1"
//       meta, sections = {}, {}
//       for line in head[2:]:
//           kind, rest = line.split(b" ", 1)
//           if kind == b"meta":
//               key, value = rest.split(b"=", 1)
//               meta[key.decode()] = value.decode()
//           else:
//               offset, size, name = rest.split(b" ", 2)
//               sections[name.decode()] = data[int(offset):int(offset) + int(size)]
//       crc, marker = struct.unpack("<I8s", data[-12:])
//       assert marker == b"BLKPSEND" and crc == crc32c(data[:-12])
//       return meta, sections
//
// Errors are one-line messages that name the file. Thread safety: the
// functions may run concurrently on different paths; a path has one writer
// at a time, and a reader of a path that is being rewritten sees the old
// file or the new one, never a mix, since the writer renames into place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "status.h"

namespace blkps::server {

// ---- Writing ---------------------------------------------------------------

// A section to write: `bytes` bytes at `data` (nullptr only if bytes == 0
// or `fill` is set), owned by the caller and written straight from its
// memory: no copy is made. Or, with `fill` set, bytes the writer asks for:
// fill(offset, len, out) puts the section's bytes [offset, offset + len)
// into out; the writer asks for each byte once, in order, a few MiB at a
// time (a Model::Snapshot's Read()).
struct CheckpointSection {
  using Fill = std::function<void(uint64_t offset, uint64_t len, void* out)>;
  CheckpointSection(std::string n, const void* d, uint64_t b) : name(std::move(n)), data(d), bytes(b) {}
  CheckpointSection(std::string n, uint64_t b, Fill f) : name(std::move(n)), bytes(b), fill(std::move(f)) {}

  std::string name;
  const void* data = nullptr;
  uint64_t bytes = 0;
  Fill fill;
};

// Writes a checkpoint of `meta` and `sections` (in that order) to `path`,
// durably and atomically: into `path` + ".tmp" in the same folder (replacing
// a stale one a crash left behind), with the CRC computed as the bytes go
// out in writes of a few MiB; then fsync, rename over `path`, fsync the
// folder. A crash at any point leaves the old `path` or the new one.
//
// Returns:
//   InvalidArgument  for a key, value or name the format cannot hold (see
//                    above); nothing is written.
//   IOError          if a file operation fails (the message names the path
//                    and the system's reason). The temporary file is removed
//                    and an existing `path` is untouched, except when only
//                    the final folder fsync failed: then the new file is in
//                    place but may not survive a crash.
// REQUIRES: the sections' memory (and what fill gives) does not change
// during the call (else the file fails its checksum when read).
Status WriteCheckpointFile(const std::string& path, const std::map<std::string, std::string>& meta,
                           const std::vector<CheckpointSection>& sections);

// ---- Reading, in two steps ---------------------------------------------------
// The caller reads the header, checks the metadata and section sizes, makes
// room, and then reads the sections.

struct CheckpointHeader {
  std::map<std::string, std::string> meta;
  std::vector<std::pair<std::string, uint64_t>> sections;  // name, bytes; file order
};

// Reads and parses the header of `path` into *out (untouched on failure),
// and checks that the file has the size the header implies. Does not read
// the sections, so it does not verify the checksum. Returns:
//   NotFound         if the file does not exist;
//   InvalidArgument  "<path>: not a blkps checkpoint (bad magic)",
//                    "<path>: truncated header", "<path>: unsupported
//                    version N ...", a malformed header line, or a file size
//                    other than the header implies;
//   IOError          if the file cannot be opened or read otherwise.
Status ReadCheckpointHeader(const std::string& path, CheckpointHeader* out);

// Where a section goes: `bytes` bytes of the caller's memory at `data`.
struct CheckpointDest {
  std::string name;
  void* data = nullptr;
  uint64_t bytes = 0;
};

// Reads every section of `path` into its destination in one pass, reading
// straight into the destination in chunks of a few MiB, from one thread per
// core, each computing the CRC of its chunks as it reads them (the chunks'
// CRCs are then combined into the file's). The destinations must name exactly the
// file's sections, in file order, with the same sizes: otherwise returns
// InvalidArgument naming the first difference, before reading any section.
// Returns InvalidArgument "<path>: checksum mismatch: the file is corrupt; it
// was not loaded" if the checksum does not match (or, with its own reason,
// if the file is truncated, has trailing bytes, or a damaged end marker),
// and the codes of ReadCheckpointHeader() for its failures. On failure the
// destinations may hold part of the file: the caller discards them.
Status ReadCheckpointSections(const std::string& path, const std::vector<CheckpointDest>& dests);

}  // namespace blkps::server
