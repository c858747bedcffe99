#include "checkpoint_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <utility>

#include "crc32c.h"
#include "number_text.h"
#include "parallel.h"

namespace blkps::server {
namespace {

inline uint32_t LoadLe32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

inline void StoreLe32(uint32_t v, uint8_t* p) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

constexpr char kMagicLine[] = "BLKPS-CHECKPOINT\n";
constexpr size_t kMagicLineBytes = sizeof(kMagicLine) - 1;
constexpr uint64_t kVersion = 1;
constexpr char kHeaderEnd[] = "\nend\n";  // the line before "end", then "end"
constexpr size_t kHeaderEndBytes = sizeof(kHeaderEnd) - 1;
constexpr char kEndMarker[] = "BLKPSEND";
constexpr size_t kEndMarkerBytes = sizeof(kEndMarker) - 1;
constexpr size_t kTrailerBytes = 4 + kEndMarkerBytes;
constexpr uint64_t kAlign = 4096;
// Bounds that keep a damaged header from costing memory or overflowing:
// no caller comes near them.
constexpr size_t kMaxHeaderBytes = 64 << 20;
constexpr uint64_t kMaxSectionBytes = uint64_t{1} << 56;
// Each write() and read() moves at most this much: large enough to amortise
// the system call, small enough that the CRC still finds it in cache.
constexpr size_t kIoChunkBytes = 4 << 20;

const char kZeros[kAlign] = {};

uint64_t AlignUp(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

std::string Errno(int err) { return std::strerror(err); }

// `s` for a one-line message: quoted, control bytes escaped, long ones cut.
std::string Quote(const std::string& s) {
  static const char kHex[] = "0123456789abcdef";
  std::string out = "'";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i == 60) {
      out += "...";
      break;
    }
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c == 0x7f) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "'";
}

bool HasByte(const std::string& s, char c) { return s.find(c) != std::string::npos; }

// Closes the descriptor it holds when it goes.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;

  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

// Where each section goes in a file with `header_bytes` of header text, and
// where the trailer goes (*trailer). `offsets` gets one entry per size.
void Layout(uint64_t header_bytes, const std::vector<uint64_t>& sizes, std::vector<uint64_t>* offsets,
            uint64_t* trailer) {
  offsets->clear();
  uint64_t next = AlignUp(header_bytes);
  for (uint64_t bytes : sizes) {
    offsets->push_back(next);
    next = AlignUp(next + bytes);
  }
  *trailer = next;
}

// ---- Writing ---------------------------------------------------------------

Status CheckWritable(const std::string& path, const std::map<std::string, std::string>& meta,
                     const std::vector<CheckpointSection>& sections) {
  const std::string prefix = path + ": cannot write a checkpoint with ";
  for (const auto& [key, value] : meta) {
    if (key.empty() || HasByte(key, '=') || HasByte(key, '\n') || HasByte(key, '\0')) {
      return Status::InvalidArgument(prefix + "meta key " + Quote(key) +
                                     ": a key is non-empty, without '=', newline or NUL");
    }
    if (HasByte(value, '\n') || HasByte(value, '\0')) {
      return Status::InvalidArgument(prefix + "meta " + Quote(key) + " = " + Quote(value) +
                                     ": a value holds no newline or NUL");
    }
  }
  std::set<std::string> names;
  for (const CheckpointSection& s : sections) {
    if (s.name.empty() || HasByte(s.name, '\n') || HasByte(s.name, '\0')) {
      return Status::InvalidArgument(prefix + "section name " + Quote(s.name) +
                                     ": a name is non-empty, without newline or NUL");
    }
    if (!names.insert(s.name).second) {
      return Status::InvalidArgument(prefix + "two sections named " + Quote(s.name));
    }
    if (s.bytes > 0 && s.data == nullptr && !s.fill) {
      return Status::InvalidArgument(prefix + "section " + Quote(s.name) + " of " + std::to_string(s.bytes) +
                                     " bytes at nullptr");
    }
    if (s.bytes > kMaxSectionBytes) {
      return Status::InvalidArgument(prefix + "section " + Quote(s.name) + " of " + std::to_string(s.bytes) +
                                     " bytes: more than a file holds");
    }
  }
  return Status::OK();
}

// The header text, NUL-padded to the data start; *offsets and *trailer as
// Layout() says for it.
std::string BuildHeader(const std::map<std::string, std::string>& meta, const std::vector<CheckpointSection>& sections,
                        std::vector<uint64_t>* offsets, uint64_t* trailer) {
  std::vector<uint64_t> sizes;
  for (const CheckpointSection& s : sections) sizes.push_back(s.bytes);
  // The header holds the offsets, which depend on the header's length: guess
  // a data start, and move it up until the text fits (a few rounds at most:
  // it only grows, and each round it grows a digit at most per section).
  uint64_t data_start = kAlign;
  for (;;) {
    Layout(data_start, sizes, offsets, trailer);
    std::string text = kMagicLine;
    text += "version " + std::to_string(kVersion) + "\n";
    for (const auto& [key, value] : meta) text += "meta " + key + "=" + value + "\n";
    for (size_t i = 0; i < sections.size(); ++i) {
      text += "section " + std::to_string((*offsets)[i]) + " " + std::to_string(sections[i].bytes) + " " +
              sections[i].name + "\n";
    }
    text += "end\n";
    if (AlignUp(text.size()) <= data_start) {
      text.resize(data_start, '\0');
      return text;
    }
    data_start = AlignUp(text.size());
  }
}

// Writes to a file, keeping the CRC32C of everything it wrote.
class ChecksummedWriter {
 public:
  ChecksummedWriter(int fd, const std::string& path, const std::string& tmp) : fd_(fd), path_(path), tmp_(tmp) {}

  uint32_t crc() const { return crc_; }

  Status Write(const void* data, uint64_t bytes) {
    const auto* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(bytes, kIoChunkBytes));
      crc_ = Crc32c(crc_, p, n);
      Status s = WriteUnchecksummed(p, n);
      if (!s.ok()) return s;
      p += n;
      bytes -= n;
    }
    return Status::OK();
  }

  Status WriteUnchecksummed(const char* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        return Status::IOError(path_ + ": cannot write " + tmp_ + ": " +
                               (w < 0 ? Errno(errno) : std::string("write() wrote nothing")));
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
    return Status::OK();
  }

 private:
  const int fd_;
  const std::string& path_;
  const std::string& tmp_;
  uint32_t crc_ = 0;
};

std::string FolderOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

Status WriteAndSyncTemporary(int fd, const std::string& path, const std::string& tmp, const std::string& header,
                             const std::vector<CheckpointSection>& sections, const std::vector<uint64_t>& offsets,
                             uint64_t trailer) {
  ChecksummedWriter out(fd, path, tmp);
  Status s = out.Write(header.data(), header.size());
  std::unique_ptr<char[]> filled;  // for sections with fill
  for (size_t i = 0; i < sections.size() && s.ok(); ++i) {
    const CheckpointSection& section = sections[i];
    if (!section.fill) {
      s = out.Write(section.data, section.bytes);
    } else {
      if (!filled) filled.reset(new char[kIoChunkBytes]);
      for (uint64_t pos = 0; pos < section.bytes && s.ok(); pos += kIoChunkBytes) {
        const uint64_t n = std::min<uint64_t>(kIoChunkBytes, section.bytes - pos);
        section.fill(pos, n, filled.get());
        s = out.Write(filled.get(), n);
      }
    }
    const uint64_t end = offsets[i] + sections[i].bytes;
    const uint64_t next = i + 1 < sections.size() ? offsets[i + 1] : trailer;
    if (s.ok()) s = out.Write(kZeros, next - end);
  }
  if (!s.ok()) return s;
  char tail[kTrailerBytes];
  StoreLe32(out.crc(), reinterpret_cast<uint8_t*>(tail));
  std::memcpy(tail + 4, kEndMarker, kEndMarkerBytes);
  s = out.WriteUnchecksummed(tail, sizeof(tail));
  if (!s.ok()) return s;
  if (::fsync(fd) != 0) return Status::IOError(path + ": cannot fsync " + tmp + ": " + Errno(errno));
  return Status::OK();
}

// ---- Reading ---------------------------------------------------------------

// A parsed header and where everything is in the file.
struct ParsedHeader {
  CheckpointHeader header;
  std::vector<uint64_t> offsets;  // of each section
  uint64_t data_start = 0;
  uint64_t trailer = 0;
  std::string head;  // the file's first bytes, at least through the "end" line
};

Status Corrupt(const std::string& path, const std::string& why) {
  return Status::InvalidArgument(path + ": " + why + ": the file is corrupt; it was not loaded");
}

// Reads up to n bytes at `offset`; *got < n only at the end of the file.
Status PreadFull(int fd, const std::string& path, void* buf, size_t n, uint64_t offset, size_t* got) {
  auto* p = static_cast<char*>(buf);
  *got = 0;
  while (*got < n) {
    const ssize_t r = ::pread(fd, p + *got, n - *got, static_cast<off_t>(offset + *got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::IOError(path + ": cannot read: " + Errno(errno));
    if (r == 0) break;
    *got += static_cast<size_t>(r);
  }
  return Status::OK();
}

// A decimal number without sign or leading zeros, at most kMaxSectionBytes.
bool ParseNumber(const std::string& s, uint64_t* out) {
  uint64_t v = 0;
  if (!ParseDecimal(s, &v) || v > kMaxSectionBytes) return false;
  *out = v;
  return true;
}

Status Malformed(const std::string& path, size_t line_number, const std::string& line) {
  return Status::InvalidArgument(path + ": malformed header line " + std::to_string(line_number) + ": " + Quote(line));
}

// Checks the version line, the first line after the magic line.
Status CheckVersion(const std::string& path, const std::string& line) {
  const std::string prefix = "version ";
  uint64_t version = 0;
  if (line.compare(0, prefix.size(), prefix) != 0 || !ParseNumber(line.substr(prefix.size()), &version)) {
    return Malformed(path, 2, line);
  }
  if (version != kVersion) {
    return Status::InvalidArgument(path + ": unsupported version " + std::to_string(version) +
                                   " (this build reads version " + std::to_string(kVersion) + ")");
  }
  return Status::OK();
}

// Parses the meta and section lines in text[begin, end), line 3 onward.
Status ParseBody(const std::string& path, const std::string& text, size_t begin, size_t end, ParsedHeader* out) {
  std::set<std::string> names;
  size_t line_number = 2;
  for (size_t pos = begin; pos < end;) {
    const size_t eol = text.find('\n', pos);
    const std::string line = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_number;
    if (HasByte(line, '\0')) return Malformed(path, line_number, line);
    if (line.compare(0, 5, "meta ") == 0) {
      const size_t eq = line.find('=', 5);
      if (eq == std::string::npos || eq == 5) return Malformed(path, line_number, line);
      if (!out->header.meta.emplace(line.substr(5, eq - 5), line.substr(eq + 1)).second) {
        return Malformed(path, line_number, line);
      }
    } else if (line.compare(0, 8, "section ") == 0) {
      const size_t sp1 = line.find(' ', 8);
      const size_t sp2 = sp1 == std::string::npos ? sp1 : line.find(' ', sp1 + 1);
      uint64_t offset = 0, bytes = 0;
      if (sp2 == std::string::npos || sp2 + 1 == line.size() || !ParseNumber(line.substr(8, sp1 - 8), &offset) ||
          !ParseNumber(line.substr(sp1 + 1, sp2 - sp1 - 1), &bytes)) {
        return Malformed(path, line_number, line);
      }
      std::string name = line.substr(sp2 + 1);
      if (!names.insert(name).second) return Malformed(path, line_number, line);
      out->offsets.push_back(offset);
      out->header.sections.emplace_back(std::move(name), bytes);
    } else {
      return Malformed(path, line_number, line);
    }
  }
  return Status::OK();
}

// Opens `path`, parses its header, and checks the layout and the file size.
Status OpenAndParse(const std::string& path, FileDescriptor* fd_out, ParsedHeader* out) {
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) return Status::NotFound(path + ": no such checkpoint file");
    return Status::IOError(path + ": cannot open: " + Errno(err));
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Status::IOError(path + ": cannot stat: " + Errno(errno));
  if (!S_ISREG(st.st_mode)) return Status::InvalidArgument(path + ": not a regular file");
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);

  // Read until the "end" line, checking the magic and the version as soon as
  // they are in, so that a large file of another kind costs one small read.
  std::string& head = out->head;
  size_t header_end = std::string::npos;  // where kHeaderEnd starts
  bool version_checked = false;
  for (bool eof = false; header_end == std::string::npos;) {
    if (eof) return Status::InvalidArgument(path + ": truncated header");
    if (head.size() >= kMaxHeaderBytes) {
      return Status::InvalidArgument(path + ": malformed header: no end line in its first " +
                                     std::to_string(kMaxHeaderBytes >> 20) + " MiB");
    }
    const size_t old = head.size();
    const size_t want = std::min(kMaxHeaderBytes, std::max<size_t>(2 * old, kAlign)) - old;
    head.resize(old + want);
    size_t got = 0;
    Status s = PreadFull(fd.get(), path, &head[old], want, old, &got);
    if (!s.ok()) return s;
    head.resize(old + got);
    eof = got < want;

    const size_t magic_seen = std::min(head.size(), kMagicLineBytes);
    if (head.compare(0, magic_seen, kMagicLine, magic_seen) != 0) {
      return Status::InvalidArgument(path + ": not a blkps checkpoint (bad magic)");
    }
    if (!version_checked && head.size() > kMagicLineBytes) {
      const size_t eol = head.find('\n', kMagicLineBytes);
      if (eol != std::string::npos) {
        s = CheckVersion(path, head.substr(kMagicLineBytes, eol - kMagicLineBytes));
        if (!s.ok()) return s;
        version_checked = true;
      }
    }
    if (version_checked) {
      // The header text holds no NUL: one before the end line means the
      // end line is damaged, and the rest of the file need not be searched.
      header_end = head.find(kHeaderEnd, kMagicLineBytes);
      if (head.find('\0', kMagicLineBytes) < header_end) {
        return Status::InvalidArgument(path + ": malformed header: it has no end line");
      }
    }
  }
  const size_t body = head.find('\n', kMagicLineBytes) + 1;
  Status s = ParseBody(path, head, body, header_end + 1, out);
  if (!s.ok()) return s;

  // The layout Layout() gives, checked as it goes against the file size so
  // that no sum overflows.
  out->data_start = AlignUp(header_end + kHeaderEndBytes);
  uint64_t next = out->data_start;
  for (size_t i = 0; i < out->offsets.size(); ++i) {
    const auto& [name, bytes] = out->header.sections[i];
    if (out->offsets[i] != next) {
      return Status::InvalidArgument(path + ": malformed header: section " + Quote(name) + " at offset " +
                                     std::to_string(out->offsets[i]) + ", expected " + std::to_string(next));
    }
    if (next > file_bytes || bytes > file_bytes - next) {
      return Corrupt(path, "truncated: " + std::to_string(file_bytes) + " bytes, section " + Quote(name) + " ends at " +
                               std::to_string(next + bytes));
    }
    next = AlignUp(next + bytes);
  }
  out->trailer = next;
  const uint64_t expected = out->trailer + kTrailerBytes;
  if (file_bytes < expected) {
    return Corrupt(path,
                   "truncated: " + std::to_string(file_bytes) + " bytes, the header says " + std::to_string(expected));
  }
  if (file_bytes > expected) {
    return Corrupt(path, std::to_string(file_bytes - expected) + " bytes past the end (" + std::to_string(file_bytes) +
                             " bytes, the header says " + std::to_string(expected) + ")");
  }
  fd_out->reset(fd.release());
  return Status::OK();
}

Status CheckDestinations(const std::string& path, const CheckpointHeader& header,
                         const std::vector<CheckpointDest>& dests) {
  const auto& sections = header.sections;
  for (size_t i = 0; i < std::max(sections.size(), dests.size()); ++i) {
    if (i >= sections.size()) {
      return Status::InvalidArgument(path + ": the file has " + std::to_string(sections.size()) + " sections and no " +
                                     Quote(dests[i].name) + ", which the caller expects next");
    }
    const std::string& name = sections[i].first;
    const uint64_t bytes = sections[i].second;
    if (i >= dests.size()) {
      return Status::InvalidArgument(path + ": the file has a section " + Quote(name) + " (section " +
                                     std::to_string(i + 1) + ") the caller does not expect");
    }
    if (dests[i].name != name) {
      return Status::InvalidArgument(path + ": section " + std::to_string(i + 1) + " is " + Quote(name) +
                                     ", the caller expects " + Quote(dests[i].name));
    }
    if (dests[i].bytes != bytes) {
      return Status::InvalidArgument(path + ": section " + Quote(name) + " holds " + std::to_string(bytes) +
                                     " bytes, the caller expects " + std::to_string(dests[i].bytes));
    }
    if (bytes > 0 && dests[i].data == nullptr) {
      return Status::InvalidArgument(path + ": no memory given for section " + Quote(name));
    }
  }
  return Status::OK();
}

}  // namespace

Status WriteCheckpointFile(const std::string& path, const std::map<std::string, std::string>& meta,
                           const std::vector<CheckpointSection>& sections) {
  Status s = CheckWritable(path, meta, sections);
  if (!s.ok()) return s;
  std::vector<uint64_t> offsets;
  uint64_t trailer = 0;
  const std::string header = BuildHeader(meta, sections, &offsets, &trailer);

  // A temporary file left by a crash is stale (one writer per path): remove
  // it, then create ours exclusively, so a link planted there is not followed.
  // If the removal fails, the creation fails too and says why.
  const std::string tmp = path + ".tmp";
  ::unlink(tmp.c_str());
  FileDescriptor fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) return Status::IOError(path + ": cannot create " + tmp + ": " + Errno(errno));

  s = WriteAndSyncTemporary(fd.get(), path, tmp, header, sections, offsets, trailer);
  if (s.ok() && ::close(fd.release()) != 0) {
    s = Status::IOError(path + ": cannot close " + tmp + ": " + Errno(errno));
  }
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    s = Status::IOError(path + ": cannot rename " + tmp + " over it: " + Errno(errno));
  }
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }

  // The rename is durable once the folder's entry is.
  const std::string folder = FolderOf(path);
  FileDescriptor dir(::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() < 0 || ::fsync(dir.get()) != 0) {
    return Status::IOError(path + ": written, but its folder " + folder + " could not be synced: " + Errno(errno) +
                           "; the checkpoint may not survive a crash");
  }
  return Status::OK();
}

Status ReadCheckpointHeader(const std::string& path, CheckpointHeader* out) {
  FileDescriptor fd(-1);
  ParsedHeader parsed;
  Status s = OpenAndParse(path, &fd, &parsed);
  if (!s.ok()) return s;
  *out = std::move(parsed.header);
  return Status::OK();
}

Status ReadCheckpointSections(const std::string& path, const std::vector<CheckpointDest>& dests) {
  FileDescriptor fd(-1);
  ParsedHeader parsed;
  Status s = OpenAndParse(path, &fd, &parsed);
  if (!s.ok()) return s;
  s = CheckDestinations(path, parsed.header, dests);
  if (!s.ok()) return s;
  ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);

  // The file's bytes [0, trailer) as pieces of at most kIoChunkBytes, in
  // file order: the header (again, whole), each section straight into its
  // destination, the padding into a scratch buffer.
  struct Piece {
    uint64_t offset, bytes;
    char* into;  // nullptr: padding
    uint32_t crc = 0;
  };
  std::vector<Piece> pieces;
  auto add = [&pieces](uint64_t offset, uint64_t bytes, char* into) {
    for (uint64_t done = 0; done < bytes; done += kIoChunkBytes) {
      pieces.push_back({offset + done, std::min<uint64_t>(kIoChunkBytes, bytes - done), into ? into + done : nullptr});
    }
  };
  std::string& head = parsed.head;
  head.resize(parsed.data_start);
  add(0, parsed.data_start, &head[0]);
  const auto& sections = parsed.header.sections;
  for (size_t i = 0; i < sections.size(); ++i) {
    const uint64_t end = parsed.offsets[i] + sections[i].second;
    const uint64_t next = i + 1 < sections.size() ? parsed.offsets[i + 1] : parsed.trailer;
    add(parsed.offsets[i], sections[i].second, static_cast<char*>(dests[i].data));
    add(end, next - end, nullptr);
  }
  std::mutex error_mu;
  Status error;  // the first piece's failure
  ForEachInParallel(pieces.size(), [&](uint64_t k) {
    Piece& piece = pieces[k];
    char padding[kAlign];
    char* into = piece.into ? piece.into : padding;
    size_t got = 0;
    Status r = PreadFull(fd.get(), path, into, piece.bytes, piece.offset, &got);
    if (r.ok() && got < piece.bytes) r = Corrupt(path, "truncated while being read");
    if (!r.ok()) {
      std::lock_guard<std::mutex> lock(error_mu);
      if (error.ok()) error = r;
      return;
    }
    piece.crc = Crc32c(0, into, piece.bytes);
  });
  if (!error.ok()) return error;
  uint32_t crc = 0;
  for (const Piece& piece : pieces) crc = Crc32cCombine(crc, piece.crc, piece.bytes);
  uint8_t tail[kTrailerBytes];
  size_t got = 0;
  s = PreadFull(fd.get(), path, tail, sizeof(tail), parsed.trailer, &got);
  if (!s.ok()) return s;
  if (got < sizeof(tail)) return Corrupt(path, "truncated while being read");
  if (std::memcmp(tail + 4, kEndMarker, kEndMarkerBytes) != 0) return Corrupt(path, "bad end marker");
  if (LoadLe32(tail) != crc) return Corrupt(path, "checksum mismatch");
  return Status::OK();
}

}  // namespace blkps::server
