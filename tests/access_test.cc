// Authentication (issue 15, item 5): a real tgtd started by `blkps target
// start --chap-file`, reached through libblkps with the
// credentials in the URL (libiscsi's iscsi://USER%SECRET@host/...) or in a
// BLKPS_CHAP_FILE; wrong or missing ones are refused, and no secret shows in
// an error, tgtd's log, target.env or `blkps target show`.
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <blkps/control_lun.h>
#include <gtest/gtest.h>
#include <blkps/model.hpp>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "target_process.h"

namespace blkps_test {
namespace {

constexpr uint64_t kParams = 1024;
const char kUser[] = "learner";
const char kSecret[] = "in-Secret-0123";  // 14 characters
const char kTargetUser[] = "server";
const char kTargetSecret[] = "out-Secret-456";

// Writes `text` to file `name` in `dir` with `mode`; returns its path.
std::string WriteSecret(const TempDir& dir, const std::string& name, const std::string& text, mode_t mode = 0600) {
  const std::string file = dir.path + "/" + name;
  std::ofstream(file, std::ios::trunc) << text;
  chmod(file.c_str(), mode);
  return file;
}

std::string InitiatorName() {
  static std::atomic<int> counter{0};
  return "iqn.2026-11.io.blkps:access-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
}

// iscsi://USER%SECRET@host:port/iqn/lun[?query] from the target's URL.
std::string WithCredentials(const std::string& url, const std::string& user, const std::string& secret,
                            const std::string& query = "") {
  const size_t host = url.find("://") + 3;
  return url.substr(0, host) + user + "%" + secret + "@" + url.substr(host) + query;
}

// Opens `url` and pushes/pulls once; "" on success, else the error.
std::string UseModel(const std::string& url) {
  blkps::OpenOptions o;
  o.initiator_name = InitiatorName();
  std::string error;
  auto m = blkps::Model::Open(url, o, &error);
  if (!m) return error.empty() ? "open failed" : error;
  std::vector<float> g(kParams, 1.0f), w(kParams);
  if (m->Push(0, g.data(), kParams) != 0 || m->Pull(0, w.data(), kParams) != 0) return m->last_error();
  return "";
}

// Runs UseModel with BLKPS_CHAP_FILE set to `file` ("" unsets it).
std::string UseModelWithChapFile(const std::string& url, const std::string& file) {
  if (file.empty()) {
    unsetenv("BLKPS_CHAP_FILE");
  } else {
    setenv("BLKPS_CHAP_FILE", file.c_str(), 1);
  }
  std::string result = UseModel(url);
  unsetenv("BLKPS_CHAP_FILE");
  return result;
}

// `blkps target start --chap-file FILE` with kUser's account (and with
// `mutual`, kTargetUser's).
std::string ChapOptions(const TempDir& dir, bool mutual) {
  std::string text = std::string("user=") + kUser + "\nsecret=" + kSecret + "\n";
  if (mutual) text += std::string("target_user=") + kTargetUser + "\ntarget_secret=" + kTargetSecret + "\n";
  return "--chap-file " + WriteSecret(dir, mutual ? "mutual.chap" : "one-way.chap", text);
}

TEST(Access, OneWayChapRefusesMissingAndWrongSecretsAndAdmitsTheRightOne) {
  TempDir dir;
  TargetProcess target("params=1024;rule=sum", ChapOptions(dir, false));
  ASSERT_TRUE(target.ok()) << target.start_output();
  const std::string url = target.url();

  std::string missing = UseModel(url);
  EXPECT_NE(missing, "") << "a login without credentials was admitted";
  std::string wrong = UseModel(WithCredentials(url, kUser, "wrong-Secret-0"));
  EXPECT_NE(wrong, "") << "a login with a wrong secret was admitted";
  EXPECT_FALSE(Contains(wrong, "wrong-Secret-0")) << wrong;
  EXPECT_TRUE(Contains(wrong, "CHAP")) << wrong;
  EXPECT_NE(UseModel(WithCredentials(url, "someone", kSecret)), "") << "a wrong user name was admitted";

  EXPECT_EQ(UseModel(WithCredentials(url, kUser, kSecret)), "");
  const std::string file =
      WriteSecret(dir, "chap", std::string("# learner credentials\nuser=") + kUser + "\nsecret=" + kSecret + "\n");
  EXPECT_EQ(UseModelWithChapFile(url, file), "");
  const std::string bad_file = WriteSecret(dir, "bad", std::string("user=") + kUser + "\nsecret=wrong-Secret-0\n");
  EXPECT_NE(UseModelWithChapFile(url, bad_file), "");
  const std::string open_file =
      WriteSecret(dir, "open", std::string("user=") + kUser + "\nsecret=" + kSecret + "\n", 0644);
  const std::string refused = UseModelWithChapFile(url, open_file);
  EXPECT_TRUE(Contains(refused, "readable by group or others")) << refused;

  // No secret anywhere a person or another user can read.
  std::string shown;
  RunCommand(blkps_test::Blkps() + " target show --dir " + target.dir() + " --json", &shown);
  for (const std::string& text : {target.Log(), target.start_output(), shown}) {
    EXPECT_FALSE(Contains(text, kSecret)) << text;
  }
  std::ifstream env(target.dir() + "/target.env");
  const std::string env_text((std::istreambuf_iterator<char>(env)), std::istreambuf_iterator<char>());
  EXPECT_FALSE(Contains(env_text, kSecret)) << env_text;
}

TEST(Access, MutualChapRefusesATargetThatProvesAWrongSecret) {
  TempDir dir;
  TargetProcess target("params=1024;rule=sum", ChapOptions(dir, true));
  ASSERT_TRUE(target.ok()) << target.start_output();
  const std::string url = target.url();
  const std::string mutual = std::string("?target_user=") + kTargetUser + "&target_password=";

  EXPECT_EQ(UseModel(WithCredentials(url, kUser, kSecret, mutual + kTargetSecret)), "");
  const std::string wrong = UseModel(WithCredentials(url, kUser, kSecret, mutual + "not-the-Target"));
  EXPECT_NE(wrong, "") << "the initiator accepted a target that proved a wrong secret";
  EXPECT_FALSE(Contains(wrong, "not-the-Target")) << wrong;
  const std::string file = WriteSecret(dir, "chap",
                                       std::string("user=") + kUser + "\nsecret=" + kSecret +
                                           "\ntarget_user=" + kTargetUser + "\ntarget_secret=" + kTargetSecret);
  EXPECT_EQ(UseModelWithChapFile(url, file), "");
  const std::string wrong_file = WriteSecret(dir, "wrong",
                                             std::string("user=") + kUser + "\nsecret=" + kSecret +
                                                 "\ntarget_user=" + kTargetUser + "\ntarget_secret=x-wrong-x-x-x");
  EXPECT_NE(UseModelWithChapFile(url, wrong_file), "");
}

TEST(Access, TargetStartRefusesUnsafeOrMalformedSecretsInOneLine) {
  TempDir dir;
  auto file = [&](const std::string& name, const std::string& text, mode_t mode = 0600) {
    return "--chap-file " + WriteSecret(dir, name, text, mode);
  };
  const std::string same = std::string("user=a\nsecret=") + kSecret + "\ntarget_user=b\ntarget_secret=" + kSecret;
  const std::string cases[][2] = {
      {file("open", std::string("user=a\nsecret=") + kSecret, 0640), "readable by group or others"},
      {file("short", "user=a\nsecret=short-secret"), ""},  // 12: allowed
      {file("tooshort", "user=a\nsecret=too-short"), "12 to 16"},
      {file("toolong", "user=a\nsecret=much-too-long-secret"), "12 to 16"},
      {file("comma", "user=a\nsecret=secret,with,14"), "12 to 16"},
      {file("user-only", "user=a\n"), "--chap-file: CHAP file "},
      {file("same", same), "must differ"},
  };
  for (const auto& [options, expected] : cases) {
    TargetProcess target("params=1024", options);
    if (expected[0] == '\0') {
      EXPECT_TRUE(target.ok()) << options << ": " << target.start_output();
      continue;
    }
    EXPECT_FALSE(target.ok()) << options;
    const std::string out = target.start_output();
    EXPECT_TRUE(Contains(out, expected)) << options << ": " << out;
    EXPECT_EQ(out.find('\n'), out.size() - 1) << "not one line: " << out;
    EXPECT_FALSE(Contains(out, "much-too-long")) << out;
  }
}

// D3 with CHAP: each role of doc/server.md's "Authentication and access" table,
// tried. A learner holding the learners' secret reads the learners' control
// LUN but may not set the rule there, and cannot log in to the operator
// target; the operator's file (which also holds the mutual credentials)
// opens it.
TEST(Access, EachRoleCanDoWhatReadmeSaysAndNoMore) {
  TempDir dir;
  TargetProcess target("params=1024", ChapOptions(dir, true) + " --operator");
  ASSERT_TRUE(target.ok()) << target.start_output();
  ASSERT_NE(target.operator_url(), "");
  const std::string learner =
      WriteSecret(dir, "learner.chap",
                  std::string("user=") + kUser + "\nsecret=" + kSecret + "\ntarget_user=" + kTargetUser +
                      "\ntarget_secret=" + kTargetSecret + "\n");
  std::string command = "lr=0.5\n";
  command.resize(512, '\0');
  auto open = [&](const std::string& url, const std::string& chap_file, std::string* error) {
    if (chap_file.empty()) {
      unsetenv("BLKPS_CHAP_FILE");
    } else {
      setenv("BLKPS_CHAP_FILE", chap_file.c_str(), 1);
    }
    blkps::OpenOptions o;
    o.initiator_name = InitiatorName();
    auto m = blkps::Model::Open(url, o, error);
    unsetenv("BLKPS_CHAP_FILE");
    return m;
  };
  std::string error;
  // Anyone admitted, without a secret: no learner LUN, no operator target.
  EXPECT_EQ(open(target.url(), "", &error), nullptr);
  EXPECT_EQ(open(target.operator_url(), "", &error), nullptr);
  EXPECT_TRUE(Contains(error, "Authentication failure")) << error;
  // A learner: its LUN and the learners' control LUN's reads, not the rule.
  EXPECT_EQ(UseModelWithChapFile(target.url(), learner), "");
  auto control = open(target.control_url(), learner, &error);
  ASSERT_NE(control, nullptr) << error;
  std::vector<char> status(512);
  EXPECT_EQ(control->ReadBytes(0, status.data(), status.size()), 0) << control->last_error();
  EXPECT_NE(control->WriteBytes(BLKPS_CONTROL_COMMANDS_OFFSET, command.data(), command.size()), 0);
  EXPECT_TRUE(Contains(control->last_error(), "DATA PROTECT / WRITE PROTECTED")) << control->last_error();
  EXPECT_EQ(open(target.operator_url(), learner, &error), nullptr);
  EXPECT_TRUE(Contains(error, "Authentication failure")) << error;
  // The operator.
  auto op = open(target.operator_url(), target.operator_chap_file(), &error);
  ASSERT_NE(op, nullptr) << error;
  EXPECT_EQ(op->WriteBytes(BLKPS_CONTROL_COMMANDS_OFFSET, command.data(), command.size()), 0) << op->last_error();
  // Its secret is in no file but operator.chap, mode 0600.
  struct stat st {};
  ASSERT_EQ(stat(target.operator_chap_file().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

// D8: doc/server.md's credentials file sample, copied exactly (inline comment
// and all), starts a target (--chap-file) and logs in to it (BLKPS_CHAP_FILE).
TEST(Access, ReadmeChapFileSampleLogsIn) {
  const std::string command = BLKPS_COMMAND;
  std::ifstream in(command.substr(0, command.rfind("/scripts/")) + "/doc/server.md");
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t start = doc.find("# blkps CHAP credentials");
  ASSERT_NE(start, std::string::npos) << "doc/server.md has no BLKPS_CHAP_FILE sample";
  std::string sample = doc.substr(start, doc.find("```", start) - start);
  // Drop the block's indentation, as a reader copying it does.
  std::string copied;
  for (size_t at = 0; at < sample.size();) {
    const size_t end = std::min(sample.find('\n', at), sample.size());
    const std::string line = sample.substr(at, end - at);
    copied += line.substr(std::min(line.find_first_not_of(' '), line.size())) + "\n";
    at = end + 1;
  }
  TempDir dir;
  const std::string file = WriteSecret(dir, "chap", copied);
  TargetProcess target("params=1024;rule=sum", "--chap-file " + file);
  ASSERT_TRUE(target.ok()) << target.start_output();
  EXPECT_EQ(UseModelWithChapFile(target.url(), file), "") << copied;
}

// D9: --allow takes subnets; a learner its ACL does not admit is told so.
TEST(Access, AllowAdmitsSubnetsAndARefusedLearnerIsToldItsAddressIsNotAdmitted) {
  {
    TargetProcess target("params=1024;rule=sum", "--allow 127.0.0.0/8");
    ASSERT_TRUE(target.ok()) << target.start_output();
    EXPECT_TRUE(Contains(target.start_output(), "admits: 127.0.0.0/8")) << target.start_output();
    EXPECT_EQ(UseModel(target.url()), "");
  }
  {
    TargetProcess target("params=1024;rule=sum", "--allow 10.1.2.3/16 --allow 192.0.2.7");
    ASSERT_TRUE(target.ok()) << target.start_output();
    EXPECT_TRUE(Contains(target.start_output(), "admits: 10.1.0.0/16 192.0.2.7")) << target.start_output();
    const std::string refused = UseModel(target.url());
    EXPECT_TRUE(Contains(refused, "does not admit this host's address")) << refused;
  }
}

}  // namespace
}  // namespace blkps_test
