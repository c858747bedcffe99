// blkps-layout: the stripe arithmetic and the layout file (StripeMap,
// ShardLayout, ParseByteSize) as a command, so that the blkps CLI and
// blkps login never compute or parse them again.
//
//   blkps-layout sizes --stripe-unit BYTES --shards S --params N [--block BYTES] [--device]
//       each shard's part of a model of N float32 parameters, in bytes, one
//       line per shard (shard 0 first); --device rounds each up to 512-byte
//       blocks (the size of the shard's LUN). --block: the servers' model
//       block, which must divide the stripe unit.
//   blkps-layout read FILE
//       the layout file's stripe unit on the first line, then each shard's
//       target, one per line, in stripe order, followed on its line by the
//       shard's other replicas (its replica lines), space-separated, in
//       the order the layout gives them. A hashed table's layout
//       (kind = hashed) has no stripe to present as one device: refused,
//       since a hashed table is reached through the row windows only.
//   blkps-layout split --stripe-unit BYTES --shards S --params N FILE OUT...
//       writes each shard's part of the model file FILE (N parameters) to its
//       OUT (one per shard), e.g. to give every shard its initial weights.
//   blkps-layout bytes SIZE
//       SIZE (e.g. 1M) in bytes.
//   blkps-layout dm-table --stripe-unit BYTES DEVICE=BYTES...
//       a device-mapper table that stripes the shard devices (in stripe
//       order, with their sizes) into one model device: whole rows as one
//       "striped" segment, the last row's units as "linear" segments.
//
// BYTES take K, M or G suffixes. Every failure prints one line,
// "blkps: layout <command>: <what>", and exits 1; bad usage exits 2.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "blkps/byte_size.hpp"
#include "shard_layout.h"
#include "stripe_map.h"

namespace {

constexpr uint64_t kSector = 512;
std::string command = "layout";

[[noreturn]] void Fail(const std::string& message) {
  std::fprintf(stderr, "blkps: layout %s: %s\n", command.c_str(), message.c_str());
  std::exit(1);
}

[[noreturn]] void Usage(const std::string& message) {
  std::fprintf(stderr, "blkps: layout: %s; see blkps-layout --help\n", message.c_str());
  std::exit(2);
}

uint64_t Bytes(const std::string& option, const std::string& text) {
  uint64_t bytes = 0;
  if (!blkps::ParseByteSize(text, &bytes) || bytes == 0) {
    Fail(option + ": expected a positive number of bytes (K, M, G allowed), got '" + text + "'");
  }
  return bytes;
}

uint64_t Count(const std::string& option, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || text[0] < '0' || text[0] > '9' || *end != '\0' || errno != 0 || n == 0) {
    Fail(option + ": expected a positive integer, got '" + text + "'");
  }
  return n;
}

// The options every command shares, and the rest of the command line.
struct Args {
  uint64_t stripe_unit = 0, shards = 0, params = 0, block = 0;
  bool device = false;
  std::vector<std::string> operands;
};

Args ParseArgs(int argc, char** argv) {
  Args a;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--stripe-unit") {
      a.stripe_unit = Bytes(arg, value());
      if (a.stripe_unit % kSector != 0) {
        Fail("--stripe-unit: expected a positive multiple of 512 bytes, got " + std::to_string(a.stripe_unit));
      }
    } else if (arg == "--shards") {
      a.shards = Count(arg, value());
    } else if (arg == "--params") {
      a.params = Count(arg, value());
    } else if (arg == "--block") {
      a.block = Bytes(arg, value());
    } else if (arg == "--device") {
      a.device = true;
    } else if (arg.rfind("--", 0) == 0) {
      Usage("unknown option '" + arg + "'");
    } else {
      a.operands.push_back(arg);
    }
  }
  return a;
}

void Require(bool given, const char* option) {
  if (!given) Usage(std::string(command) + " needs " + option);
}

// The map of a model of a.params parameters over a.shards shards; fails when
// a shard would hold nothing or a model block would straddle two shards.
blkps::StripeMap CheckedMap(const Args& a) {
  Require(a.stripe_unit, "--stripe-unit");
  Require(a.shards, "--shards");
  Require(a.params, "--params");
  if (a.block && a.stripe_unit % a.block != 0) {
    Fail("--stripe-unit " + std::to_string(a.stripe_unit) + " is not a multiple of the model block (" +
         std::to_string(a.block) + " bytes, bsopts block=); a model block must not straddle two shards");
  }
  const uint64_t bytes = 4 * a.params;
  const uint64_t units = (bytes + a.stripe_unit - 1) / a.stripe_unit;
  if (a.shards > units) {
    Fail("a model of " + std::to_string(a.params) + " parameters has only " + std::to_string(units) +
         " stripe unit(s) of " + std::to_string(a.stripe_unit) + " bytes; use at most " + std::to_string(units) +
         " shard(s) or a smaller stripe unit");
  }
  return blkps::StripeMap(a.stripe_unit, static_cast<uint32_t>(a.shards), bytes);
}

int Sizes(const Args& a) {
  const blkps::StripeMap map = CheckedMap(a);
  for (uint32_t s = 0; s < map.shard_count(); ++s) {
    const uint64_t bytes = map.ShardBytes(s);
    std::printf("%llu\n",
                static_cast<unsigned long long>(a.device ? (bytes + kSector - 1) / kSector * kSector : bytes));
  }
  return 0;
}

int Read(const Args& a) {
  if (a.operands.size() != 1) Usage("read needs one layout FILE");
  blkps::ShardLayout layout;
  const blkps::Status s = blkps::ReadShardLayout(a.operands[0], &layout);
  if (!s.ok()) {
    // ShardLayout's messages already start with "blkps: <file>:<line>: ...".
    std::fprintf(stderr, "%s\n", s.message().c_str());
    return 1;
  }
  if (layout.kind == blkps::ShardLayout::Kind::kHashed) {
    std::fprintf(stderr,
                 "blkps: layout read: %s is a hashed table's layout (kind = hashed), which is no block device: a "
                 "hashed table is reached through the row windows only (pull_rows and push_rows, doc/embeddings.md)\n",
                 a.operands[0].c_str());
    return 1;
  }
  std::printf("%llu\n", static_cast<unsigned long long>(layout.stripe_unit));
  for (const auto& shard : layout.shards) {
    std::printf("%s", shard.target.c_str());
    for (const auto& replica : shard.replicas) std::printf(" %s", replica.c_str());
    std::printf("\n");
  }
  return 0;
}

int Split(const Args& a) {
  const blkps::StripeMap map = CheckedMap(a);
  if (a.operands.size() != map.shard_count() + 1) {
    Usage("split needs FILE and one OUT per shard (" + std::to_string(map.shard_count()) + ")");
  }
  const std::string& path = a.operands[0];
  const int in = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) Fail("cannot open " + path + ": " + std::strerror(errno));
  const off_t size = lseek(in, 0, SEEK_END);
  if (size < 0 || static_cast<uint64_t>(size) != map.size_bytes()) {
    Fail(path + " holds " + std::to_string(size) + " bytes; a model of " + std::to_string(a.params) +
         " parameters needs " + std::to_string(map.size_bytes()));
  }
  std::vector<int> outs;
  for (size_t k = 1; k < a.operands.size(); ++k) {
    const int fd = open(a.operands[k].c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) Fail("cannot create " + a.operands[k] + ": " + std::strerror(errno));
    outs.push_back(fd);
  }
  std::vector<char> buf(map.stripe_unit());
  std::vector<blkps::StripePiece> pieces;
  for (uint64_t offset = 0; offset < map.size_bytes(); offset += map.stripe_unit()) {
    const uint64_t length = std::min<uint64_t>(map.stripe_unit(), map.size_bytes() - offset);
    if (pread(in, buf.data(), length, static_cast<off_t>(offset)) != static_cast<ssize_t>(length)) {
      Fail("cannot read " + path + ": " + std::strerror(errno));
    }
    pieces.clear();
    map.Map(offset, length, &pieces);
    uint64_t at = 0;
    for (const auto& p : pieces) {
      if (pwrite(outs[p.shard], buf.data() + at, p.length, static_cast<off_t>(p.shard_offset)) !=
          static_cast<ssize_t>(p.length)) {
        Fail("cannot write " + a.operands[p.shard + 1] + ": " + std::strerror(errno));
      }
      at += p.length;
    }
  }
  for (int fd : outs) {
    if (close(fd) != 0) Fail(std::string("cannot write a shard's part: ") + std::strerror(errno));
  }
  close(in);
  return 0;
}

int PrintBytes(const Args& a) {
  if (a.operands.size() != 1) Usage("bytes needs one SIZE");
  std::printf("%llu\n", static_cast<unsigned long long>(Bytes("SIZE", a.operands[0])));
  return 0;
}

int DmTable(const Args& a) {
  Require(a.stripe_unit, "--stripe-unit");
  if (a.operands.empty()) Usage("dm-table needs DEVICE=BYTES for every shard");
  std::vector<std::string> devices;
  std::vector<uint64_t> sizes;
  std::string listed;
  for (const std::string& op : a.operands) {
    const size_t eq = op.rfind('=');
    if (eq == std::string::npos || eq == 0) Usage("expected DEVICE=BYTES, got '" + op + "'");
    devices.push_back(op.substr(0, eq));
    sizes.push_back(Bytes(devices.back(), op.substr(eq + 1)));
    listed += (listed.empty() ? "" : " ") + std::to_string(sizes.back());
  }
  const uint64_t unit = a.stripe_unit, chunk = unit / kSector, shards = devices.size();
  uint64_t min = sizes[0], max = sizes[0];
  for (uint64_t s : sizes) {
    min = std::min(min, s);
    max = std::max(max, s);
  }
  if (max - min > unit) {
    Fail("shard sizes (" + listed + " bytes) differ by more than one stripe unit (" + std::to_string(unit) +
         "): this is not the layout's striping; check the layout");
  }
  const uint64_t rows = min / unit;
  uint64_t start = 0;
  if (rows > 0) {
    if ((chunk & (chunk - 1)) != 0 || chunk < 8) {
      Fail("dm striped needs a stripe unit of a power of two, at least 4096 bytes (stripe_unit = " +
           std::to_string(unit) + "); use --stripe md, or such a stripe_unit");
    }
    std::string line = "0 " + std::to_string(rows * shards * chunk) + " striped " + std::to_string(shards) + " " +
                       std::to_string(chunk);
    for (const auto& d : devices) line += " " + d + " 0";
    std::printf("%s\n", line.c_str());
    start = rows * shards * chunk;
  }
  bool short_unit = false;
  for (size_t j = 0; j < shards; ++j) {
    const uint64_t rest = sizes[j] - rows * unit;
    if (rest == 0) continue;
    if (short_unit) {
      Fail("shard sizes (" + listed +
           " bytes) leave a hole in the model: only the last stripe unit may be "
           "partial; check the layout's shard order");
    }
    const uint64_t len = std::min(rest, unit) / kSector;
    short_unit = rest < unit;
    std::printf("%llu %llu linear %s %llu\n", static_cast<unsigned long long>(start),
                static_cast<unsigned long long>(len), devices[j].c_str(),
                static_cast<unsigned long long>(rows * chunk));
    start += len;
  }
  return 0;
}

void PrintHelp() {
  std::printf("usage: blkps-layout sizes --stripe-unit BYTES --shards S --params N [--block BYTES] [--device]\n"
              "       blkps-layout read FILE\n"
              "       blkps-layout split --stripe-unit BYTES --shards S --params N FILE OUT...\n"
              "       blkps-layout dm-table --stripe-unit BYTES DEVICE=BYTES...\n"
              "       blkps-layout bytes SIZE\n"
              "The stripe arithmetic of a sharded blkps model: stripe unit k lives on shard\n"
              "k mod S at shard byte (k div S) * BYTES; see doc/server.md, \"Sharding\".\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) Usage("expected a command: sizes, read, split, dm-table or bytes");
  command = argv[1];
  if (command == "-h" || command == "--help") {
    PrintHelp();
    return 0;
  }
  const Args a = ParseArgs(argc, argv);
  if (command == "sizes") return Sizes(a);
  if (command == "read") return Read(a);
  if (command == "split") return Split(a);
  if (command == "dm-table") return DmTable(a);
  if (command == "bytes") return PrintBytes(a);
  Usage("unknown command '" + command + "' (sizes, read, split, dm-table, bytes)");
}
