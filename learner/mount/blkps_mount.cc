// blkps-mount: the model as regular files, for hosts without a kernel iSCSI
// initiator (containers, these machines). A FUSE file system in which each
// file is one model device (a learner slot's LUN, the control LUN, or a
// sharded model as one `layout:PATH`) reached through libblkps's Device API
// (libiscsi for iscsi:// and iser://). Any program can then open, pread,
// pwrite and fsync the model, with O_DIRECT and libaio truly asynchronous.
//
//   blkps-mount [options] MOUNTPOINT NAME=TARGET [NAME=TARGET...]
//   blkps mount MOUNTPOINT --dir DIR [options]   (runs this with a target's LUNs)
//
// Semantics (doc/learner-nodes.md "Mounting the model (FUSE)"):
//   - every file is opened with direct_io: no page cache, every read and
//     write reaches the device; async DIO lets the kernel send the pieces of
//     one O_DIRECT aio request concurrently (up to max_background);
//   - a write's whole 512-byte logical blocks go straight to the device; its
//     partial first and last blocks are assembled across the pieces the kernel
//     cut it into and sent once complete (split_write_assembler.h: exactly
//     once, zero-completed at close/fsync/read, partial floats are an error).
//     No timer flushes pending blocks after a quiet time: it could not tell a
//     finished small write from a piece that is merely late, and a block
//     sent early and then completed would be sent twice (counted twice by
//     the server's bsp clocks). A small unaligned write is applied at the
//     latest at close, fsync, or a read that overlaps it;
//   - fsync sends every pending block and then SYNCHRONIZE CACHE (on a blkps
//     server: a checkpoint);
//   - FUSE worker threads borrow a Device each from the file's pool
//     (device_pool.h): one iSCSI session per concurrent request.
//
// Thread-safety: the FUSE loop calls the operations below from many threads;
// the files' table is fixed after start-up, and each file's pool and
// assembler lock themselves.

#define FUSE_USE_VERSION 312

#include <fuse.h>
#include <malloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "blkps/byte_size.hpp"
#include "blkps/wire_dtype.hpp"
#include "device.h"
#include "device_pool.h"
#include "split_write_assembler.h"
#include "transfer_plan.h"

namespace blkps {
namespace {

constexpr char kUsage[] = "usage: blkps-mount [options] MOUNTPOINT NAME=TARGET [NAME=TARGET...]\n"
                          "       blkps mount MOUNTPOINT --dir DIR [options]   (a blkps target's LUNs)\n"
                          "\n"
                          "Presents each model device as a regular file MOUNTPOINT/NAME of the\n"
                          "device's size. TARGET is anything libblkps opens: "
                          "iscsi://host[:port]/<iqn>/<lun>,\n"
                          "iser://..., layout:PATH (a sharded model), or a file or block device.\n"
                          "`blkps mount --dir DIR` presents a `blkps target start --dir DIR`'s\n"
                          "learner slots as files slot1..slotN and its control LUN as 'control'.\n"
                          "CHAP: BLKPS_CHAP_FILE=FILE in the environment names the credentials\n"
                          "(doc/server.md \"Authentication and access\"); iscsi://USER%SECRET@host/...\n"
                          "works too, but shows the secret in ps for as long as this runs.\n"
                          "\n"
                          "options:\n"
                          "  --control NAME=TARGET the model's control LUN as file NAME (its writes\n"
                          "                        are commands, not gradients)\n"
                          "  --request-bytes N     bytes per device command (K, M suffixes; default:\n"
                          "                        the device's, 1M for iSCSI); larger FUSE requests\n"
                          "                        are cut into commands of this size\n"
                          "  --queue-depth N       commands in flight per FUSE request (default 16)\n"
                          "  --dtype T             float32 (default), bfloat16 or float16: the\n"
                          "                        model files' LUNs' --bsopts dtype; a 16-bit file\n"
                          "                        holds parameter i at byte 2*i (doc/server.md\n"
                          "                        \"16-bit wire\"), and a partly written value is 2 bytes\n"
                          "  --initiator IQN       initiator name stem: file NAME's sessions are\n"
                          "                        IQN-NAME-1..IQN-NAME-N (default\n"
                          "                        iqn.2026-11.io.blkps:mount-<host>-<pid>); name\n"
                          "                        them in the target's ACL (tgt's iSER needs it)\n"
                          "  --sessions N          devices (iSCSI sessions) per file, opened on\n"
                          "                        demand, one per concurrent request (default 16)\n"
                          "  --threads N           most FUSE worker threads (default 32)\n"
                          "  --max-background N    FUSE requests the kernel keeps in flight for\n"
                          "                        async I/O (default 64)\n"
                          "  -f, --foreground      stay in the foreground (default: daemonize;\n"
                          "                        iser:// files need -f)\n"
                          "  --debug               log every read, write, flush and fsync on stderr\n"
                          "                        (implies -f)\n"
                          "  -h, --help            this text\n"
                          "\n"
                          "environment:\n"
                          "  BLKPS_RECONNECT_SECONDS  how long a lost iSCSI session is retried before\n"
                          "                        its I/O fails (default 60 + 1 per 64 MiB of model)\n"
                          "\n"
                          "Writes: the whole 512-byte blocks of a write go to the device at once;\n"
                          "the partial first/last block of each piece the kernel cuts a write into\n"
                          "is held until all of it is written, then sent once. A block still\n"
                          "partial at close, fsync, or a read of it is sent completed with zeros\n"
                          "(a zero gradient changes nothing); if a float in it is only partly\n"
                          "written it is dropped, logged, and close/fsync fail with EIO.\n"
                          "fsync: sends pending blocks, then SYNCHRONIZE CACHE (server checkpoint).\n"
                          "\n"
                          "Unmount: SIGINT or SIGTERM to blkps-mount, or `fusermount3 -u "
                          "MOUNTPOINT`.\n"
                          "After a crash (\"Transport endpoint is not connected\"): "
                          "fusermount3 -u MOUNTPOINT\n";

struct Options {
  std::string mountpoint;
  std::vector<std::pair<std::string, std::string>> files;  // name, target
  std::string control_name;                                // the file holding the control LUN, if any
  uint64_t request_bytes = 0;                              // 0: the device's default
  uint32_t queue_depth = 16;
  wire::Dtype dtype = wire::Dtype::kFloat32;  // of the model files
  std::string initiator;                      // the sessions' initiator name stem; empty: per host and pid
  uint32_t sessions = 16;
  uint32_t threads = 32;
  uint32_t max_background = 64;
  bool foreground = false;
  bool debug = false;
};

[[noreturn]] void Fail(const std::string& message) {
  fprintf(stderr, "blkps-mount: %s\n", message.c_str());
  exit(2);
}

void Log(const char* format, ...) __attribute__((format(printf, 1, 2)));
void Log(const char* format, ...) {
  char line[1024];
  va_list args;
  va_start(args, format);
  vsnprintf(line, sizeof(line), format, args);
  va_end(args);
  fprintf(stderr, "blkps-mount: %s\n", line);
}

uint32_t ParseCount(const std::string& option, const std::string& text, uint32_t most) {
  uint64_t value = 0;
  if (!ParseByteSize(text, &value) || value < 1 || value > most) {
    Fail(option + ": expected a whole number in [1, " + std::to_string(most) + "], got '" + text + "'");
  }
  return static_cast<uint32_t>(value);
}

Options ParseOptions(int argc, char** argv) {
  Options options;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Fail(arg + " needs a value; see --help");
      return argv[++i];
    };
    if (arg == "-h" || arg == "--help") {
      fputs(kUsage, stdout);
      exit(0);
    } else if (arg == "-f" || arg == "--foreground") {
      options.foreground = true;
    } else if (arg == "--debug") {
      options.debug = options.foreground = true;
    } else if (arg == "--control") {
      const std::string spec = value();
      const size_t eq = spec.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size()) {
        Fail("--control: expected NAME=TARGET, got '" + spec + "'");
      }
      options.control_name = spec.substr(0, eq);
      options.files.emplace_back(options.control_name, spec.substr(eq + 1));
    } else if (arg == "--request-bytes") {
      const std::string text = value();
      if (!ParseByteSize(text, &options.request_bytes) || options.request_bytes == 0) {
        Fail("--request-bytes: expected a size such as 256K or 1M, got '" + text + "'");
      }
    } else if (arg == "--queue-depth") {
      options.queue_depth = ParseCount(arg, value(), 1024);
    } else if (arg == "--dtype") {
      const std::string name = value();
      if (!wire::ParseDtype(name, &options.dtype)) {
        Fail("--dtype: expected one of " + std::string(wire::kDtypeNames) + ", got '" + name + "'");
      }
    } else if (arg == "--initiator") {
      options.initiator = value();
    } else if (arg == "--sessions") {
      options.sessions = ParseCount(arg, value(), 1024);
    } else if (arg == "--threads") {
      options.threads = ParseCount(arg, value(), 1024);
    } else if (arg == "--max-background") {
      options.max_background = ParseCount(arg, value(), 65535);
    } else if (arg.size() > 1 && arg[0] == '-') {
      Fail("unknown option '" + arg + "'; see --help");
    } else {
      positional.push_back(arg);
    }
  }
  if (positional.empty()) Fail("no MOUNTPOINT given; see --help");
  options.mountpoint = positional[0];
  for (size_t i = 1; i < positional.size(); ++i) {
    const std::string& spec = positional[i];
    const size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size()) {
      Fail("expected NAME=TARGET, got '" + spec + "'");
    }
    options.files.emplace_back(spec.substr(0, eq), spec.substr(eq + 1));
  }
  if (options.files.empty()) {
    Fail("no files to present: give NAME=TARGET, or use blkps mount MOUNTPOINT --dir DIR");
  }
  std::map<std::string, int> seen;
  for (const auto& file : options.files) {
    const std::string& name = file.first;
    if (name == "." || name == ".." || name.find('/') != std::string::npos) {
      Fail("bad file name '" + name + "': a name has no '/' and is not . or ..");
    }
    if (seen[name]++ > 0) Fail("file name '" + name + "' given twice");
    // Going to the background forks after the files are opened, and an
    // RDMA session does not survive a fork (libiscsi's iSER connection
    // thread stays behind; the child's RDMA state is the parent's).
    if (!options.foreground && file.second.rfind("iser://", 0) == 0) {
      Fail(name + ": an iser:// file needs -f (an RDMA session does not survive going to the background)");
    }
  }
  return options;
}

// One file of the mount: a model device.
struct MountedFile {
  std::string name;
  std::string target;
  std::unique_ptr<DevicePool> pool;
  std::unique_ptr<SplitWriteAssembler> assembler;
  uint64_t request_bytes = 0;  // per device command; a multiple of the block
  // A pending block was dropped (partial float) since the last flush/fsync
  // reported it; the next flush or fsync returns EIO.
  std::atomic<bool> dropped{false};
};

struct Mount {
  Options options;
  std::vector<std::unique_ptr<MountedFile>> files;
  std::atomic<uint64_t> next_handle{1};
  time_t started = time(nullptr);  // the files' times
};

Mount* TheMount() { return static_cast<Mount*>(fuse_get_context()->private_data); }

MountedFile* FindFile(const char* path) {
  if (path == nullptr || path[0] != '/') return nullptr;
  for (auto& file : TheMount()->files) {
    if (file->name == path + 1) return file.get();
  }
  return nullptr;
}

std::string Describe(const MountedFile& file, const char* what, uint64_t offset, uint64_t length) {
  return file.name + ": " + what + " of " + std::to_string(length) + " bytes at " + std::to_string(offset);
}

// Runs `requests` on a borrowed device; logs and returns -EIO on failure,
// and closes that device (a later request opens a fresh session).
int RunOn(MountedFile* file, DevicePool::Lease* device, Direction direction, const std::vector<IoRequest>& requests) {
  if (requests.empty()) return 0;
  Status status = (*device)->Transfer(direction, requests, TheMount()->options.queue_depth);
  if (!status.ok()) {
    Log("%s: %s", file->name.c_str(), status.message().c_str());
    device->Discard();
    return -EIO;
  }
  return 0;
}

// Device requests for whole blocks; `iov` receives their iovecs and must not
// reallocate while the requests live.
void AddBlockRequests(std::vector<ReadyBlock>* blocks, std::vector<iovec>* iov, std::vector<IoRequest>* requests) {
  iov->reserve(iov->size() + blocks->size());
  for (ReadyBlock& block : *blocks) {
    iov->push_back({block.bytes.data(), block.bytes.size()});
    requests->push_back({block.offset, block.bytes.size(), &iov->back(), 1});
  }
}

// Sends drained blocks (zero-completed pending blocks); logs what was
// dropped. Returns 0, or -EIO when a block was dropped or a send failed.
int SendDrained(MountedFile* file, Drained* drained, const char* why) {
  int result = 0;
  for (const std::string& line : drained->dropped) {
    Log("%s: at %s: %s", file->name.c_str(), why, line.c_str());
    result = -EIO;
  }
  if (drained->blocks.empty()) return result;
  if (TheMount()->options.debug) {
    Log("%s: %s sends %zu pending block(s) completed with zeros", file->name.c_str(), why, drained->blocks.size());
  }
  Status status;
  DevicePool::Lease device = file->pool->Acquire(&status);
  if (device.get() == nullptr) {
    Log("%s: %s", file->name.c_str(), status.message().c_str());
    return -EIO;
  }
  std::vector<iovec> iov;
  std::vector<IoRequest> requests;
  AddBlockRequests(&drained->blocks, &iov, &requests);
  const int sent = RunOn(file, &device, Direction::kWrite, requests);
  return sent != 0 ? sent : result;
}

void* Init(fuse_conn_info* conn, fuse_config* config) {
  Mount* mount = TheMount();
  config->direct_io = 1;  // no page cache: every byte reaches the device
  config->kernel_cache = 0;
  // The files and their sizes never change while mounted.
  config->entry_timeout = 3600;
  config->attr_timeout = 3600;
  config->negative_timeout = 3600;
  conn->max_background = mount->options.max_background;
  conn->congestion_threshold = mount->options.max_background * 3 / 4;
  if (conn->capable & FUSE_CAP_ASYNC_DIO) conn->want |= FUSE_CAP_ASYNC_DIO;
  conn->max_write = 1 << 20;  // libfuse caps it to its buffer (1 MiB)
  conn->max_readahead = 0;
  return mount;
}

void Destroy(void* data) {
  Mount* mount = static_cast<Mount*>(data);
  for (auto& file : mount->files) {
    Drained drained = file->assembler->TakeAll();
    for (const std::string& line : drained.dropped) {
      Log("%s: at unmount: %s", file->name.c_str(), line.c_str());
    }
    if (drained.blocks.empty()) continue;
    Status status;
    DevicePool::Lease device = file->pool->Acquire(&status);
    if (device.get() == nullptr) continue;
    std::vector<iovec> iov;
    std::vector<IoRequest> requests;
    AddBlockRequests(&drained.blocks, &iov, &requests);
    Status sent = device->Transfer(Direction::kWrite, requests, mount->options.queue_depth);
    if (!sent.ok()) Log("%s: %s", file->name.c_str(), sent.message().c_str());
  }
}

int GetAttr(const char* path, struct stat* st, fuse_file_info*) {
  memset(st, 0, sizeof(*st));
  st->st_uid = getuid();
  st->st_gid = getgid();
  if (strcmp(path, "/") == 0) {
    st->st_mode = S_IFDIR | 0755;
    st->st_nlink = 2;
    return 0;
  }
  MountedFile* file = FindFile(path);
  if (file == nullptr) return -ENOENT;
  st->st_atime = st->st_mtime = st->st_ctime = TheMount()->started;
  st->st_mode = S_IFREG | 0644;
  st->st_nlink = 1;
  st->st_size = static_cast<off_t>(file->pool->size_bytes());
  st->st_blksize = static_cast<blksize_t>(file->request_bytes);
  st->st_blocks = st->st_size / 512;
  return 0;
}

int ReadDir(const char* path, void* buffer, fuse_fill_dir_t fill, off_t, fuse_file_info*, fuse_readdir_flags) {
  if (strcmp(path, "/") != 0) return -ENOTDIR;
  fill(buffer, ".", nullptr, 0, static_cast<fuse_fill_dir_flags>(0));
  fill(buffer, "..", nullptr, 0, static_cast<fuse_fill_dir_flags>(0));
  for (auto& file : TheMount()->files) {
    fill(buffer, file->name.c_str(), nullptr, 0, static_cast<fuse_fill_dir_flags>(0));
  }
  return 0;
}

int Open(const char* path, fuse_file_info* info) {
  if (FindFile(path) == nullptr) return -ENOENT;
  info->direct_io = 1;
  info->keep_cache = 0;
  info->fh = TheMount()->next_handle++;  // the owner of its pending blocks
  return 0;
}

// The size is the model's: truncation changes nothing (as O_TRUNC on a block
// device), so `> file` and dd without conv=notrunc still work.
int Truncate(const char* path, off_t, fuse_file_info*) { return FindFile(path) == nullptr ? -ENOENT : 0; }

int Read(const char* path, char* buffer, size_t size, off_t offset, fuse_file_info*) {
  MountedFile* file = FindFile(path);
  if (file == nullptr) return -ENOENT;
  const uint64_t device_size = file->pool->size_bytes();
  if (offset < 0) return -EINVAL;
  const uint64_t at = static_cast<uint64_t>(offset);
  if (at >= device_size || size == 0) return 0;
  const uint64_t length = std::min<uint64_t>(size, device_size - at);
  if (TheMount()->options.debug) {
    Log("%s", Describe(*file, "read", at, length).c_str());
  }
  // A reader sees its own pending writes: send those it overlaps.
  Drained drained = file->assembler->TakeOverlapping(at, at + length);
  if (!drained.blocks.empty()) {
    const int sent = SendDrained(file, &drained, "read");
    if (sent != 0) return sent;
  }
  Status status;
  DevicePool::Lease device = file->pool->Acquire(&status);
  if (device.get() == nullptr) {
    Log("%s: %s", file->name.c_str(), status.message().c_str());
    return -EIO;
  }
  TransferPlan plan(Direction::kRead, at, buffer, length, file->pool->logical_block_size(), file->request_bytes);
  const int result = RunOn(file, &device, Direction::kRead, plan.requests());
  if (result != 0) return result;
  plan.FinishRead();
  return static_cast<int>(length);
}

int Write(const char* path, const char* data, size_t size, off_t offset, fuse_file_info* info) {
  MountedFile* file = FindFile(path);
  if (file == nullptr) return -ENOENT;
  const uint64_t device_size = file->pool->size_bytes();
  if (offset < 0) return -EINVAL;
  const uint64_t at = static_cast<uint64_t>(offset);
  if (size == 0) return 0;
  if (at >= device_size) return -ENOSPC;  // as a block device at its end
  const uint64_t length = std::min<uint64_t>(size, device_size - at);
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(data);
  SplitWriteAssembler::PieceResult piece = file->assembler->AddPiece(at, bytes, length, info->fh);
  if (TheMount()->options.debug) {
    Log("%s: %zu block(s) completed, %zu pending", Describe(*file, "write", at, length).c_str(),
        piece.drained.blocks.size(), file->assembler->pending_blocks());
  }
  for (const std::string& line : piece.drained.dropped) {
    Log("%s: at a write overlapping it: %s", file->name.c_str(), line.c_str());
    file->dropped = true;
  }
  std::vector<IoRequest> requests;
  std::unique_ptr<TransferPlan> plan;
  if (piece.direct_end > piece.direct_begin) {
    // The device only reads this memory.
    plan = std::make_unique<TransferPlan>(
        Direction::kWrite, piece.direct_begin, const_cast<uint8_t*>(bytes + (piece.direct_begin - at)),
        piece.direct_end - piece.direct_begin, file->pool->logical_block_size(), file->request_bytes);
    requests = plan->requests();
  }
  std::vector<iovec> block_iov;
  AddBlockRequests(&piece.drained.blocks, &block_iov, &requests);
  if (requests.empty()) return static_cast<int>(length);  // all pending
  Status status;
  DevicePool::Lease device = file->pool->Acquire(&status);
  if (device.get() == nullptr) {
    Log("%s: %s", file->name.c_str(), status.message().c_str());
    return -EIO;
  }
  const int result = RunOn(file, &device, Direction::kWrite, requests);
  return result != 0 ? result : static_cast<int>(length);
}

// close(2) of one descriptor: its pending blocks go out.
int Flush(const char* path, fuse_file_info* info) {
  MountedFile* file = FindFile(path);
  if (file == nullptr) return -ENOENT;
  if (TheMount()->options.debug) Log("%s: flush", file->name.c_str());
  Drained drained = file->assembler->TakeOwnedBy(info->fh);
  int result = SendDrained(file, &drained, "close");
  if (file->dropped.exchange(false)) result = -EIO;
  return result;
}

int Release(const char* path, fuse_file_info* info) {
  MountedFile* file = FindFile(path);
  if (file == nullptr) return 0;
  Drained drained = file->assembler->TakeOwnedBy(info->fh);
  SendDrained(file, &drained, "release");
  return 0;
}

int Fsync(const char* path, int, fuse_file_info*) {
  MountedFile* file = FindFile(path);
  if (file == nullptr) return -ENOENT;
  if (TheMount()->options.debug) Log("%s: fsync", file->name.c_str());
  Drained drained = file->assembler->TakeAll();
  int result = SendDrained(file, &drained, "fsync");
  if (file->dropped.exchange(false)) result = -EIO;
  Status status;
  DevicePool::Lease device = file->pool->Acquire(&status);
  if (device.get() == nullptr) {
    Log("%s: %s", file->name.c_str(), status.message().c_str());
    return -EIO;
  }
  Status synced = device->Sync();
  if (!synced.ok()) {
    Log("%s: %s", file->name.c_str(), synced.message().c_str());
    device.Discard();
    return -EIO;
  }
  return result;
}

int StatFs(const char*, struct statvfs* st) {
  memset(st, 0, sizeof(*st));
  st->f_bsize = 512;
  st->f_frsize = 512;
  uint64_t blocks = 0;
  for (auto& file : TheMount()->files) blocks += file->pool->size_bytes() / 512;
  st->f_blocks = blocks;
  st->f_files = TheMount()->files.size();
  st->f_namemax = 255;
  return 0;
}

// The iSCSI initiator name stem for a file's sessions: <stem>-<name>, the
// stem being --initiator's or iqn.2026-11.io.blkps:mount-<host>-<pid>; the
// part after the default's colon is folded to IQN characters.
std::string InitiatorPrefix(const std::string& stem, const std::string& name) {
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  const std::string raw =
      (stem.empty() ? std::string("mount-") + host + "-" + std::to_string(getpid()) : "") + "-" + name;
  std::string folded = stem.empty() ? "iqn.2026-11.io.blkps:" : stem;
  for (char c : raw) {
    const unsigned char ch = static_cast<unsigned char>(c);
    folded += (isalnum(ch) || c == '.' || c == '-') ? static_cast<char>(tolower(ch)) : '-';
  }
  return folded;
}

// Opens one device per file (the geometry, and an early clear error for a
// bad target).
void OpenFiles(Mount* mount) {
  for (const auto& spec : mount->options.files) {
    auto file = std::make_unique<MountedFile>();
    file->name = spec.first;
    file->target = spec.second;
    const std::string prefix = InitiatorPrefix(mount->options.initiator, file->name);
    Status status;
    std::unique_ptr<Device> first = OpenDevice(file->target, prefix + "-1", &status);
    if (first == nullptr) Fail(file->name + ": " + status.message());
    if (first->table_hashed()) {
      // Its LUN is a one-row stand-in that takes no READ or WRITE.
      Fail(file->name + ": " + file->target +
           " serves a hashed table (table=hash:...), which is no file of bytes: it is reached through the row "
           "windows only (pull_rows and push_rows, doc/embeddings.md); leave it out of the mount");
    }
    const uint32_t block = first->logical_block_size();
    uint64_t request =
        mount->options.request_bytes != 0 ? mount->options.request_bytes : first->default_request_bytes();
    request = std::min(request, first->max_request_bytes());
    request = std::max<uint64_t>(request / block * block, block);
    file->request_bytes = request;
    file->pool = std::make_unique<DevicePool>(file->target, prefix, std::move(first), mount->options.sessions);
    file->assembler = std::make_unique<SplitWriteAssembler>(
        block, file->name == mount->options.control_name
                   ? 0
                   : static_cast<uint32_t>(wire::BytesPerParam(mount->options.dtype)));
    mount->files.push_back(std::move(file));
  }
}

// A clear line for a mount point that cannot be used.
void CheckMountpoint(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    if (errno == ENOTCONN) {
      Fail(path +
           ": Transport endpoint is not connected (a blkps-mount there "
           "crashed); clean up with: fusermount3 -u " +
           path);
    }
    Fail(path + ": " + strerror(errno) + "; the mount point must be a folder: mkdir -p " + path);
  }
  if (!S_ISDIR(st.st_mode)) Fail(path + ": not a folder");
}

// The mount point as an absolute path: unmounting after the daemon's
// chdir("/") must still find it.
std::string AbsolutePath(const std::string& path) {
  char* resolved = realpath(path.c_str(), nullptr);
  if (resolved == nullptr) Fail(path + ": " + strerror(errno));
  std::string absolute = resolved;
  free(resolved);
  return absolute;
}

int Main(int argc, char** argv) {
  // libfuse mallocs a buffer for every read reply and frees it after: keep
  // those 1 MiB buffers on the heap for reuse, instead of an mmap, page
  // faults and clearing per request (read throughput, doc/performance.md).
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  Mount mount;
  mount.options = ParseOptions(argc, argv);
  CheckMountpoint(mount.options.mountpoint);
  mount.options.mountpoint = AbsolutePath(mount.options.mountpoint);
  OpenFiles(&mount);

  fuse_operations operations{};
  operations.init = Init;
  operations.destroy = Destroy;
  operations.getattr = GetAttr;
  operations.readdir = ReadDir;
  operations.open = Open;
  operations.truncate = Truncate;
  operations.read = Read;
  operations.write = Write;
  operations.flush = Flush;
  operations.release = Release;
  operations.fsync = Fsync;
  operations.statfs = StatFs;

  // libfuse's own options: the file system's name in /proc/mounts.
  std::vector<std::string> fuse_argv_text = {argv[0], "-o", "fsname=blkps,subtype=blkps"};
  std::vector<char*> fuse_argv;
  for (std::string& text : fuse_argv_text) fuse_argv.push_back(&text[0]);
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(fuse_argv.size()), fuse_argv.data());
  fuse* fs = fuse_new(&args, &operations, sizeof(operations), &mount);
  if (fs == nullptr) Fail("cannot set up the FUSE file system");
  if (fuse_mount(fs, mount.options.mountpoint.c_str()) != 0) {
    fuse_destroy(fs);
    Fail("cannot mount on " + mount.options.mountpoint + " (is /dev/fuse there, and fusermount3 installed?)");
  }
  fuse_session* session = fuse_get_session(fs);
  // SIGINT, SIGTERM and SIGHUP end the loop; we then unmount cleanly.
  if (fuse_set_signal_handlers(session) != 0) {
    fuse_unmount(fs);
    fuse_destroy(fs);
    Fail("cannot install signal handlers");
  }
  if (fuse_daemonize(mount.options.foreground ? 1 : 0) != 0) {
    fuse_remove_signal_handlers(session);
    fuse_unmount(fs);
    fuse_destroy(fs);
    Fail("cannot go to the background");
  }
  fuse_loop_config* loop = fuse_loop_cfg_create();
  fuse_loop_cfg_set_max_threads(loop, mount.options.threads);
  fuse_loop_cfg_set_idle_threads(loop, mount.options.threads);
  fuse_loop_cfg_set_clone_fd(loop, 1);  // a /dev/fuse descriptor per worker
  const int result = fuse_loop_mt(fs, loop);
  fuse_loop_cfg_destroy(loop);
  fuse_remove_signal_handlers(session);
  fuse_unmount(fs);
  fuse_destroy(fs);  // runs Destroy: pending blocks go out
  fuse_opt_free_args(&args);
  // fuse_loop_mt returns the signal's number when a signal ended it: that is
  // the clean way out; only a negative errno is a failure.
  return result < 0 ? 1 : 0;
}

}  // namespace
}  // namespace blkps

int main(int argc, char** argv) { return blkps::Main(argc, argv); }
