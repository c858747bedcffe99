// Authentication (issue 15, item 5): a real tgtd started by `blkps target
// start --chap-user/--mutual-user`, reached through libblkps with the
// credentials in the URL (libiscsi's iscsi://USER%SECRET@host/...) or in a
// BLKPS_CHAP_FILE; wrong or missing ones are refused, and no secret shows in
// an error, tgtd's log, target.env or `blkps target show`.
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <blkps/model.hpp>

#include <atomic>
#include <fstream>
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

std::string ChapOptions(const TempDir& dir, bool mutual) {
  std::string options = std::string("--chap-user ") + kUser + " --chap-secret-file " + WriteSecret(dir, "in", kSecret);
  if (mutual)
    options += std::string(" --mutual-user ") + kTargetUser + " --mutual-secret-file " +
               WriteSecret(dir, "out", std::string(kTargetSecret) + "\n");
  return options;
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
  RunCommand(std::string(BLKPS_COMMAND) + " target show --dir " + target.dir() + " --json", &shown);
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
  const std::string cases[][2] = {
      {"--chap-user a --chap-secret-file " + WriteSecret(dir, "open", kSecret, 0640), "readable by group or others"},
      {"--chap-user a --chap-secret-file " + WriteSecret(dir, "short", "short-secret"), ""},  // 12: allowed
      {"--chap-user a --chap-secret-file " + WriteSecret(dir, "tooshort", "too-short"), "12 to 16"},
      {"--chap-user a --chap-secret-file " + WriteSecret(dir, "toolong", "much-too-long-secret"), "12 to 16"},
      {"--chap-user a --chap-secret-file " + WriteSecret(dir, "comma", "secret,with,14"), "12 to 16"},
      {"--chap-user a", "--chap-user: needs --chap-secret-file"},
      {"--chap-user a --chap-secret-file " + WriteSecret(dir, "same", kSecret) +
           " --mutual-user b --mutual-secret-file " + WriteSecret(dir, "same2", kSecret),
       "must differ"},
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

}  // namespace
}  // namespace blkps_test
