// Checkpoint files: the documented format, and what happens when the file or
// the folder is damaged. Each test works in its own folder under /tmp.
#include "checkpoint_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "crc32c.h"

namespace blkps::server {
namespace {

namespace fs = std::filesystem;

std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// ---- Checkpoint files --------------------------------------------------------

// The checkpoint most tests use: metadata with awkward values, and sections
// of awkward sizes (not multiples of 4096, empty, a name with a space).
struct Sample {
  std::map<std::string, std::string> meta = {
      {"num_params", "2500"}, {"rule", "adam"}, {"mode", "bsp"}, {"note", "a=b c"}, {"empty", ""}};
  std::vector<std::pair<std::string, std::string>> sections;  // name, bytes
};

Sample MakeSample(uint64_t seed = 1) {
  Sample s;
  s.sections = {{"weights", RandomBytes(10000, seed)},
                {"empty", ""},
                {"adam m", RandomBytes(4096, seed + 1)},
                {"adam.v", RandomBytes(1, seed + 2)},
                {"clock", RandomBytes(24, seed + 3)}};
  return s;
}

Status Write(const std::string& path, const Sample& sample) {
  std::vector<CheckpointSection> sections;
  for (const auto& [name, bytes] : sample.sections) sections.push_back({name, bytes.data(), bytes.size()});
  return WriteCheckpointFile(path, sample.meta, sections);
}

std::vector<CheckpointDest> DestsFor(std::vector<std::pair<std::string, std::string>>* sections) {
  std::vector<CheckpointDest> dests;
  for (auto& [name, bytes] : *sections) dests.push_back({name, bytes.data(), bytes.size()});
  return dests;
}

// Loads `path` as a caller does: the header, then sections sized from it.
Status Load(const std::string& path, Sample* out) {
  CheckpointHeader header;
  Status s = ReadCheckpointHeader(path, &header);
  if (!s.ok()) return s;
  out->meta = header.meta;
  out->sections.clear();
  for (const auto& [name, bytes] : header.sections) out->sections.emplace_back(name, std::string(bytes, '\xAA'));
  return ReadCheckpointSections(path, DestsFor(&out->sections));
}

class CheckpointFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char folder[] = "/tmp/checkpoint_file_test.XXXXXX";
    ASSERT_NE(::mkdtemp(folder), nullptr) << std::strerror(errno);
    dir_ = folder;
    path_ = dir_ + "/model.ckpt";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Loads path_, which holds `good`, with byte `at` flipped (all 8 bits),
  // then puts the byte back. In place: rewriting the file each time would
  // cost ext4 a flush (auto_da_alloc).
  Status LoadWithFlippedByte(const std::string& good, size_t at) {
    const int fd = ::open(path_.c_str(), O_WRONLY);
    EXPECT_GE(fd, 0) << std::strerror(errno);
    const char bad = static_cast<char>(~good[at]);
    EXPECT_EQ(::pwrite(fd, &bad, 1, static_cast<off_t>(at)), 1);
    Sample loaded;
    Status s = Load(path_, &loaded);
    EXPECT_EQ(::pwrite(fd, &good[at], 1, static_cast<off_t>(at)), 1);
    ::close(fd);
    return s;
  }

  std::string dir_;
  std::string path_;
};

TEST_F(CheckpointFileTest, RoundTripIsBitIdentical) {
  const Sample sample = MakeSample();
  ASSERT_TRUE(Write(path_, sample).ok());
  Sample loaded;
  Status s = Load(path_, &loaded);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(loaded.meta, sample.meta);
  EXPECT_EQ(loaded.sections, sample.sections);
  EXPECT_FALSE(fs::exists(path_ + ".tmp"));
}

TEST_F(CheckpointFileTest, HeaderListsMetaAndSectionsInFileOrder) {
  const Sample sample = MakeSample();
  ASSERT_TRUE(Write(path_, sample).ok());
  CheckpointHeader header;
  ASSERT_TRUE(ReadCheckpointHeader(path_, &header).ok());
  EXPECT_EQ(header.meta, sample.meta);
  const std::vector<std::pair<std::string, uint64_t>> expected = {
      {"weights", 10000}, {"empty", 0}, {"adam m", 4096}, {"adam.v", 1}, {"clock", 24}};
  EXPECT_EQ(header.sections, expected);
}

TEST_F(CheckpointFileTest, HeaderIsReadableText) {
  ASSERT_TRUE(Write(path_, MakeSample()).ok());
  const std::string first_page = ReadBytes(path_).substr(0, 4096);
  const std::string text = first_page.substr(0, first_page.find('\0'));
  EXPECT_EQ(text, "BLKPS-CHECKPOINT\n"
                  "version 1\n"
                  "meta empty=\n"
                  "meta mode=bsp\n"
                  "meta note=a=b c\n"
                  "meta num_params=2500\n"
                  "meta rule=adam\n"
                  "section 4096 10000 weights\n"
                  "section 16384 0 empty\n"
                  "section 16384 4096 adam m\n"
                  "section 20480 1 adam.v\n"
                  "section 24576 24 clock\n"
                  "end\n");
  EXPECT_EQ(first_page.substr(text.size()), std::string(4096 - text.size(), '\0'));
}

// A reader written from the header comment alone finds everything.
TEST_F(CheckpointFileTest, FileFollowsTheDocumentedLayout) {
  const Sample sample = MakeSample();
  ASSERT_TRUE(Write(path_, sample).ok());
  const std::string file = ReadBytes(path_);
  size_t line_start = file.find("section ");
  for (const auto& [name, bytes] : sample.sections) {
    uint64_t offset = 0, size = 0;
    char parsed_name[64] = {};
    ASSERT_EQ(std::sscanf(file.c_str() + line_start, "section %lu %lu %63[^\n]", &offset, &size, parsed_name), 3);
    EXPECT_EQ(parsed_name, name);
    EXPECT_EQ(offset % 4096, 0u) << name;
    EXPECT_EQ(file.substr(offset, size), bytes) << name;
    line_start = file.find('\n', line_start) + 1;
  }
  const size_t trailer = 28672;  // clock at 24576, 24 bytes, rounded up
  ASSERT_EQ(file.size(), trailer + 12);
  const auto* t = reinterpret_cast<const uint8_t*>(file.data() + trailer);
  EXPECT_EQ(uint32_t{t[0]} | t[1] << 8 | t[2] << 16 | uint32_t{t[3]} << 24, Crc32c(0, file.data(), trailer));
  EXPECT_EQ(file.substr(trailer + 4), "BLKPSEND");
}

TEST_F(CheckpointFileTest, EmptyCheckpointRoundTrips) {
  ASSERT_TRUE(WriteCheckpointFile(path_, {}, {}).ok());
  EXPECT_EQ(fs::file_size(path_), 4096u + 12);
  Sample loaded;
  Status s = Load(path_, &loaded);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_TRUE(loaded.meta.empty());
  EXPECT_TRUE(loaded.sections.empty());
}

TEST_F(CheckpointFileTest, HeaderLongerThanAPageRoundTrips) {
  Sample sample;
  for (int i = 0; i < 400; ++i) sample.meta["key" + std::to_string(i)] = std::string(i % 40, 'v');
  for (int i = 0; i < 300; ++i) sample.sections.emplace_back("s" + std::to_string(i), RandomBytes(i * 37, i));
  ASSERT_TRUE(Write(path_, sample).ok());
  Sample loaded;
  Status s = Load(path_, &loaded);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(loaded.meta, sample.meta);
  EXPECT_EQ(loaded.sections, sample.sections);
}

// Sections pass through several write() and read() calls of a few MiB.
TEST_F(CheckpointFileTest, SectionsLargerThanAnIoChunkRoundTrip) {
  Sample sample;
  sample.sections = {{"weights", RandomBytes((9 << 20) + 3, 1)}, {"m", RandomBytes(5 << 20, 2)}};
  ASSERT_TRUE(Write(path_, sample).ok());
  Sample loaded;
  Status s = Load(path_, &loaded);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_TRUE(loaded.sections == sample.sections);
}

TEST_F(CheckpointFileTest, FlippedSectionByteIsAChecksumMismatch) {
  ASSERT_TRUE(Write(path_, MakeSample()).ok());
  const std::string good = ReadBytes(path_);
  for (size_t at : {4096u, 4096u + 9999, 16384u, 20480u, 24576u + 23}) {
    Status s = LoadWithFlippedByte(good, at);
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << at;
    EXPECT_EQ(s.message(), path_ + ": checksum mismatch: the file is corrupt; it was not loaded") << at;
  }
}

TEST_F(CheckpointFileTest, FlippedHeaderByteIsRefused) {
  ASSERT_TRUE(Write(path_, MakeSample()).ok());
  const std::string good = ReadBytes(path_);
  for (size_t at = 0; at < 4096; ++at) {
    Status s = LoadWithFlippedByte(good, at);
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << at << ": " << s.message();
    EXPECT_TRUE(Contains(s.message(), path_)) << s.message();
  }
}

TEST_F(CheckpointFileTest, FlippedTrailerByteIsRefused) {
  ASSERT_TRUE(Write(path_, MakeSample()).ok());
  const std::string good = ReadBytes(path_);
  for (size_t at = good.size() - 12; at < good.size(); ++at) {
    Status s = LoadWithFlippedByte(good, at);
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << at;
    EXPECT_TRUE(Contains(s.message(), "the file is corrupt; it was not loaded")) << s.message();
  }
}

// Every byte of the file counts: header, padding, sections and trailer.
TEST_F(CheckpointFileTest, FlippedByteAnywhereIsRefused) {
  ASSERT_TRUE(Write(path_, MakeSample()).ok());
  const std::string good = ReadBytes(path_);
  for (size_t at = 0; at < good.size(); ++at) {
    Status s = LoadWithFlippedByte(good, at);
    ASSERT_EQ(s.code(), Status::Code::kInvalidArgument) << at;
  }
}

TEST_F(CheckpointFileTest, TruncatedFileIsRefused) {
  const Sample sample = MakeSample();
  ASSERT_TRUE(Write(path_, sample).ok());
  const std::string good = ReadBytes(path_);
  for (size_t size : {0u, 5u, 17u, 26u, 100u, 200u, 4096u, 5000u, 16384u, 20481u, 28672u, 28676u, 28683u}) {
    ASSERT_LT(size, good.size());
    WriteBytes(path_, good.substr(0, size));
    Sample loaded;
    Status s = Load(path_, &loaded);
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << size;
    EXPECT_TRUE(Contains(s.message(), path_ + ": ")) << s.message();
    // Also when the caller goes straight to the sections.
    std::vector<std::pair<std::string, std::string>> sections = sample.sections;
    s = ReadCheckpointSections(path_, DestsFor(&sections));
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << size;
  }
}

TEST_F(CheckpointFileTest, TruncatedInTheHeaderSaysSo) {
  ASSERT_TRUE(Write(path_, MakeSample()).ok());
  WriteBytes(path_, ReadBytes(path_).substr(0, 60));
  CheckpointHeader header;
  Status s = ReadCheckpointHeader(path_, &header);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(s.message(), path_ + ": truncated header");
}

// A damaged "end" line is found at the padding, not by reading on.
TEST_F(CheckpointFileTest, DamagedEndLineIsMalformed) {
  ASSERT_TRUE(Write(path_, MakeSample()).ok());
  std::string file = ReadBytes(path_);
  file.replace(file.find("\nend\n"), 5, "\nEND\n");
  WriteBytes(path_, file);
  CheckpointHeader header;
  Status s = ReadCheckpointHeader(path_, &header);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(s.message(), path_ + ": malformed header: it has no end line");
}

TEST_F(CheckpointFileTest, TrailingBytesAreRefused) {
  ASSERT_TRUE(Write(path_, MakeSample()).ok());
  WriteBytes(path_, ReadBytes(path_) + "x");
  Sample loaded;
  Status s = Load(path_, &loaded);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "the file is corrupt; it was not loaded")) << s.message();
}

TEST_F(CheckpointFileTest, MissingFileIsNotFound) {
  CheckpointHeader header;
  Status s = ReadCheckpointHeader(path_, &header);
  EXPECT_EQ(s.code(), Status::Code::kNotFound);
  EXPECT_TRUE(Contains(s.message(), path_)) << s.message();
  EXPECT_EQ(ReadCheckpointSections(path_, {}).code(), Status::Code::kNotFound);
  EXPECT_EQ(ReadCheckpointHeader(dir_ + "/no/such/folder/x", &header).code(), Status::Code::kNotFound);
}

TEST_F(CheckpointFileTest, OtherFileIsBadMagic) {
  WriteBytes(path_, RandomBytes(1 << 20, 9));
  CheckpointHeader header;
  Status s = ReadCheckpointHeader(path_, &header);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(s.message(), path_ + ": not a blkps checkpoint (bad magic)");
}

TEST_F(CheckpointFileTest, FolderIsNotACheckpoint) {
  CheckpointHeader header;
  Status s = ReadCheckpointHeader(dir_, &header);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(s.message(), dir_ + ": not a regular file");
}

TEST_F(CheckpointFileTest, LaterVersionIsUnsupported) {
  ASSERT_TRUE(Write(path_, MakeSample()).ok());
  std::string file = ReadBytes(path_);
  file.replace(file.find("version 1\n"), 10, "version 2\n");
  WriteBytes(path_, file);
  CheckpointHeader header;
  Status s = ReadCheckpointHeader(path_, &header);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), path_ + ": unsupported version 2")) << s.message();
}

TEST_F(CheckpointFileTest, MismatchedDestinationsAreRefusedBeforeReading) {
  const Sample sample = MakeSample();
  ASSERT_TRUE(Write(path_, sample).ok());
  struct Case {
    const char* what;
    void (*change)(std::vector<std::pair<std::string, std::string>>*);
    const char* message;  // after "<path>: "
  };
  const Case cases[] = {
      {"wrong name", [](auto* s) { (*s)[2].first = "adam v"; }, "section 3 is 'adam m', the caller expects 'adam v'"},
      {"wrong size", [](auto* s) { (*s)[0].second.resize(10004); },
       "section 'weights' holds 10000 bytes, the caller expects 10004"},
      {"one too few", [](auto* s) { s->pop_back(); },
       "the file has a section 'clock' (section 5) the caller does not expect"},
      {"one too many", [](auto* s) { s->emplace_back("extra", "x"); },
       "the file has 5 sections and no 'extra', which the caller expects next"},
      {"swapped", [](auto* s) { std::swap((*s)[0], (*s)[1]); }, "section 1 is 'weights', the caller expects 'empty'"},
  };
  for (const Case& c : cases) {
    std::vector<std::pair<std::string, std::string>> sections = sample.sections;
    for (auto& section : sections) section.second.assign(section.second.size(), '\x55');
    c.change(&sections);
    const auto before = sections;
    Status s = ReadCheckpointSections(path_, DestsFor(&sections));
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << c.what;
    EXPECT_EQ(s.message(), path_ + ": " + c.message) << c.what;
    EXPECT_EQ(sections, before) << c.what;
  }
}

TEST_F(CheckpointFileTest, UnwritableNamesAndValuesAreRefused) {
  const std::string data = "abc";
  const std::vector<std::pair<std::map<std::string, std::string>, std::vector<CheckpointSection>>> cases = {
      {{{"a=b", "1"}}, {}},
      {{{"a\nb", "1"}}, {}},
      {{{"", "1"}}, {}},
      {{{std::string("a\0b", 3), "1"}}, {}},
      {{{"a", "1\n2"}}, {}},
      {{}, {{"a\nb", data.data(), 3}}},
      {{}, {{"", data.data(), 3}}},
      {{}, {{"a", data.data(), 3}, {"a", data.data(), 3}}},
      {{}, {{"a", nullptr, 3}}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    Status s = WriteCheckpointFile(path_, cases[i].first, cases[i].second);
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << i;
    EXPECT_TRUE(Contains(s.message(), path_)) << s.message();
    EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
  }
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(CheckpointFileTest, OverwritingReplacesTheCheckpoint) {
  ASSERT_TRUE(Write(path_, MakeSample(1)).ok());
  Sample second;
  second.meta = {{"step", "2"}};
  second.sections = {{"weights", RandomBytes(70000, 2)}};
  ASSERT_TRUE(Write(path_, second).ok());
  Sample loaded;
  ASSERT_TRUE(Load(path_, &loaded).ok());
  EXPECT_EQ(loaded.meta, second.meta);
  EXPECT_EQ(loaded.sections, second.sections);
  EXPECT_FALSE(fs::exists(path_ + ".tmp"));
}

TEST_F(CheckpointFileTest, StaleTemporaryFileFromACrashIsReplaced) {
  WriteBytes(path_ + ".tmp", RandomBytes(100000, 4));
  const Sample sample = MakeSample();
  ASSERT_TRUE(Write(path_, sample).ok());
  Sample loaded;
  ASSERT_TRUE(Load(path_, &loaded).ok());
  EXPECT_EQ(loaded.sections, sample.sections);
  EXPECT_FALSE(fs::exists(path_ + ".tmp"));
}

TEST_F(CheckpointFileTest, FolderThatIsAFileFailsWithIOError) {
  WriteBytes(dir_ + "/file", "not a folder");
  const std::string path = dir_ + "/file/model.ckpt";
  Status s = Write(path, MakeSample());
  EXPECT_EQ(s.code(), Status::Code::kIOError);
  EXPECT_TRUE(Contains(s.message(), path + ": ")) << s.message();
  EXPECT_TRUE(Contains(s.message(), std::strerror(ENOTDIR))) << s.message();
}

// The rename fails when the path is a folder with files in it.
TEST_F(CheckpointFileTest, FailedRenameLeavesNoTemporaryFile) {
  ASSERT_EQ(::mkdir(path_.c_str(), 0755), 0);
  WriteBytes(path_ + "/keep", "kept");
  Status s = Write(path_, MakeSample());
  EXPECT_EQ(s.code(), Status::Code::kIOError);
  EXPECT_TRUE(Contains(s.message(), path_ + ": cannot rename")) << s.message();
  EXPECT_EQ(ReadBytes(path_ + "/keep"), "kept");
  EXPECT_FALSE(fs::exists(path_ + ".tmp"));
}

// A write that fails halfway (here: past the file size limit, which binds
// root too) leaves the old checkpoint as it was.
TEST_F(CheckpointFileTest, FailedWriteLeavesTheOldCheckpointUntouched) {
  ASSERT_TRUE(Write(path_, MakeSample()).ok());
  const std::string old_file = ReadBytes(path_);
  Sample bigger;
  bigger.sections = {{"weights", RandomBytes(1 << 20, 3)}};

  struct rlimit limit;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &limit), 0);
  const struct rlimit saved = limit;
  limit.rlim_cur = 64 << 10;
  const auto saved_handler = std::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
  Status s = Write(path_, bigger);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &saved), 0);
  std::signal(SIGXFSZ, saved_handler);

  EXPECT_EQ(s.code(), Status::Code::kIOError);
  EXPECT_EQ(s.message(), path_ + ": cannot write " + path_ + ".tmp: " + std::strerror(EFBIG));
  EXPECT_EQ(ReadBytes(path_), old_file);
  EXPECT_FALSE(fs::exists(path_ + ".tmp"));
}

// Something that is not ours where the temporary file goes: refused, and
// left alone.
TEST_F(CheckpointFileTest, UncreatableTemporaryFileLeavesTheOldCheckpointUntouched) {
  ASSERT_TRUE(Write(path_, MakeSample()).ok());
  const std::string old_file = ReadBytes(path_);
  ASSERT_EQ(::mkdir((path_ + ".tmp").c_str(), 0755), 0);
  Status s = Write(path_, MakeSample(2));
  EXPECT_EQ(s.code(), Status::Code::kIOError);
  EXPECT_TRUE(Contains(s.message(), path_ + ": cannot create " + path_ + ".tmp")) << s.message();
  EXPECT_EQ(ReadBytes(path_), old_file);
  EXPECT_TRUE(fs::is_directory(path_ + ".tmp"));
}

}  // namespace
}  // namespace blkps::server
