// Integration tests: a real tgtd with the built bs_blkps plugin on loopback,
// reached through libiscsi (libblkps, and raw SCSI commands where the test
// must bypass the library's own checks).
#include <blkps/blkps.h>
#include <iscsi/iscsi.h>
#include <iscsi/scsi-lowlevel.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "raw_lun.h"
#include "target_process.h"

namespace blkps_test {
namespace {

constexpr uint64_t kBlockParams = 65536;  // model block of 256 KiB

struct ModelHandle {
  blkps_model* m = nullptr;
  std::string error;
  explicit ModelHandle(const std::string& url, uint32_t request_bytes = 0) {
    blkps_open_options o{};
    o.request_bytes = request_bytes;
    char err[512] = "";
    if (blkps_open(url.c_str(), &o, &m, err, sizeof err) != 0) error = err;
  }
  ~ModelHandle() { blkps_close(m); }
};

// Runs body(i) in n child processes; returns how many failed. A child's
// failure message goes to stderr.
int RunInProcesses(int n, const std::function<std::string(int)>& body) {
  std::vector<pid_t> kids;
  for (int i = 0; i < n; ++i) {
    pid_t pid = fork();
    if (pid == 0) {
      std::string err = body(i);
      if (!err.empty()) fprintf(stderr, "learner %d: %s\n", i, err.c_str());
      _exit(err.empty() ? 0 : 1);
    }
    kids.push_back(pid);
  }
  int failed = 0;
  for (pid_t k : kids) {
    int status = 0;
    waitpid(k, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  return failed;
}

// Learner p's gradient for parameter i at round r: a small integer, so that
// float sums stay exact and the expected weights are known exactly.
float Gradient(int p, int r, uint64_t i) { return static_cast<float>(((p + 1) * (i % 5 + r)) % 9) - 4.0f; }

// Asserts that the 1000-parameter, lr=1 model at `url`, all zeros, takes a
// push of `g` everywhere and then reads back -g everywhere.
void ExpectServesZeroModel(const std::string& url, float g) {
  ModelHandle h(url);
  ASSERT_NE(h.m, nullptr) << h.error;
  std::vector<float> grad(1000, g), w(1000);
  ASSERT_EQ(blkps_push(h.m, 0, grad.data(), 1000), 0) << blkps_last_error(h.m);
  ASSERT_EQ(blkps_pull(h.m, 0, w.data(), 1000), 0) << blkps_last_error(h.m);
  for (float x : w) ASSERT_EQ(x, -g);
}

TEST(Target, ConcurrentLearnersAllUpdatesApplied) {
  constexpr uint64_t kParams = 5 * kBlockParams + 1234;  // blocks and a ragged tail
  constexpr int kLearners = 4, kRounds = 12;
  TargetProcess target("params=" + std::to_string(kParams) + ";block=256K;lr=1;init=zeros");
  ASSERT_TRUE(target.ok()) << target.start_output();

  int failed = RunInProcesses(kLearners, [&](int p) -> std::string {
    ModelHandle h(target.url());
    if (!h.m) return h.error;
    std::mt19937 rng(100 + p);
    std::vector<float> g(kParams);
    for (int r = 0; r < kRounds; ++r) {
      // The whole model, then a random sub-range starting and ending mid-block.
      for (uint64_t i = 0; i < kParams; ++i) g[i] = Gradient(p, r, i);
      if (blkps_push(h.m, 0, g.data(), kParams) != 0) return blkps_last_error(h.m);
    }
    uint64_t first = 1 + rng() % (kParams / 2), count = 1 + rng() % (kParams / 2);
    std::vector<float> ones(count, 1.0f);
    if (blkps_push(h.m, first, ones.data(), count) != 0) return blkps_last_error(h.m);
    return "";
  });
  ASSERT_EQ(failed, 0);

  std::vector<double> expected(kParams, 0.0);
  for (int p = 0; p < kLearners; ++p) {
    for (int r = 0; r < kRounds; ++r) {
      for (uint64_t i = 0; i < kParams; ++i) expected[i] -= Gradient(p, r, i);
    }
    std::mt19937 rng(100 + p);  // the same sub-range the learner drew
    uint64_t first = 1 + rng() % (kParams / 2), count = 1 + rng() % (kParams / 2);
    for (uint64_t i = first; i < first + count; ++i) expected[i] -= 1.0;
  }
  ModelHandle h(target.url());
  ASSERT_NE(h.m, nullptr) << h.error;
  std::vector<float> w(kParams);
  ASSERT_EQ(blkps_pull(h.m, 0, w.data(), kParams), 0) << blkps_last_error(h.m);
  for (uint64_t i = 0; i < kParams; ++i) ASSERT_EQ(w[i], static_cast<float>(expected[i])) << "parameter " << i;
}

TEST(Target, ReaderNeverSeesTornModelBlock) {
  constexpr uint64_t kBlocks = 8, kParams = kBlocks * kBlockParams;
  constexpr int kWrites = 150;
  TargetProcess target("params=" + std::to_string(kParams) + ";block=256K;lr=1");
  ASSERT_TRUE(target.ok()) << target.start_output();

  // The writer process adds 1 to every parameter of the model per push.
  pid_t writer = fork();
  if (writer == 0) {
    ModelHandle h(target.url());
    std::vector<float> g(kParams, -1.0f);
    bool ok = h.m != nullptr;
    for (int k = 0; ok && k < kWrites; ++k) ok = blkps_push(h.m, 0, g.data(), kParams) == 0;
    _exit(ok ? 0 : 1);
  }

  ModelHandle h(target.url(), 1 << 20);  // requests cover whole model blocks
  ASSERT_NE(h.m, nullptr) << h.error;
  std::vector<float> w(kParams);
  int reads = 0, mixed_versions = 0;
  for (;;) {
    int status = 0;
    bool writer_done = waitpid(writer, &status, WNOHANG) == writer;
    ASSERT_EQ(blkps_pull(h.m, 0, w.data(), kParams), 0) << blkps_last_error(h.m);
    ++reads;
    for (uint64_t b = 0; b < kBlocks; ++b) {
      const float* blk = w.data() + b * kBlockParams;
      for (uint64_t i = 1; i < kBlockParams; ++i) {
        ASSERT_EQ(blk[i], blk[0]) << "read " << reads << ": model block " << b << " torn at parameter " << i;
      }
      if (blk[0] != w[0]) ++mixed_versions;
    }
    if (writer_done) {
      ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "writer failed";
      break;
    }
  }
  EXPECT_EQ(w[0], static_cast<float>(kWrites));
  std::cout << reads << " reads during the writes; " << mixed_versions
            << " blocks seen at a different version than block 0\n";
}

TEST(Target, LunsNamingOneModelAreWindowsOntoIt) {
  // staleness_aware=0: every push applied as written, so the three pushes
  // sum (with it, each of 3 learners' async pushes is a third of a round:
  // doc/async.md "Gradient mode: staleness-aware steps in the server").
  TargetProcess target("params=1000;lr=1;staleness_aware=0", "--luns 3");
  ASSERT_TRUE(target.ok()) << target.start_output();
  std::vector<float> g(1000), w(1000);
  for (int lun = 1; lun <= 3; ++lun) {
    ModelHandle h(target.url(lun));
    ASSERT_NE(h.m, nullptr) << h.error;
    std::fill(g.begin(), g.end(), static_cast<float>(lun));
    ASSERT_EQ(blkps_push(h.m, 0, g.data(), 1000), 0) << blkps_last_error(h.m);
  }
  for (int lun = 1; lun <= 3; ++lun) {
    ModelHandle h(target.url(lun));
    ASSERT_EQ(blkps_pull(h.m, 0, w.data(), 1000), 0) << blkps_last_error(h.m);
    EXPECT_EQ(w[0], -6.0f) << "LUN " << lun;
  }
  // A LUN joining the model must not change its options.
  std::string out;
  EXPECT_NE(target.Admin("--lld iscsi --op new --mode logicalunit --tid 1 --lun 9 --bstype blkps "
                         "--backing-store model --bsopts 'params=2000;lr=1'",
                         &out),
            0);
  EXPECT_NE(target.Log().find("model 'model' is already served with --bsopts 'params=1000;lr=1;staleness_aware=0'"),
            std::string::npos)
      << target.Log();
}

TEST(Target, OutOfRangeIoGetsIllegalRequestAndTargetKeepsServing) {
  TargetProcess target("params=1000;lr=1");  // 4096-byte device: LBAs 0..7
  ASSERT_TRUE(target.ok()) << target.start_output();
  RawLun lun(target.url(), "iqn.2026-11.io.blkps:test-raw");
  ASSERT_TRUE(lun.connected()) << lun.error();
  const std::vector<uint8_t> ones = FloatBytes(std::vector<float>(256, 1.0f));  // two 512-byte blocks
  const char kLbaOutOfRange[] = "sense 0x5 0x2100";                             // ILLEGAL REQUEST, LBA OUT OF RANGE
  EXPECT_EQ(lun.Read(7, 2), kLbaOutOfRange);
  EXPECT_EQ(lun.Write(7, ones), kLbaOutOfRange);
  EXPECT_EQ(lun.Read(UINT64_MAX - 1, 2), kLbaOutOfRange);
  EXPECT_EQ(lun.Write(6, ones), "GOOD");
  std::vector<uint8_t> data;
  EXPECT_EQ(lun.Read(6, 2, &data), "GOOD");
  ASSERT_EQ(data.size(), 1024u);
  float first;
  std::memcpy(&first, data.data(), sizeof first);
  EXPECT_EQ(first, -1.0f);
  EXPECT_TRUE(target.TgtdAlive());
}

// Found by tests/fuzz/live_cdb_fuzz: tgt's MODE SENSE handler writes byte 2
// (6) or 3 (10) of the data without checking the allocation length, so 0
// crashed tgtd. bs_blkps.c guards it.
TEST(Target, ModeSenseShorterThanItsHeaderIsAnsweredAndTgtdLives) {
  TargetProcess target("params=1000");
  ASSERT_TRUE(target.ok()) << target.start_output();
  RawLun lun(target.url(), "iqn.2026-11.io.blkps:test-raw");
  ASSERT_TRUE(lun.connected()) << lun.error();
  const char kInvalidFieldInCdb[] = "sense 0x5 0x2400";  // ILLEGAL REQUEST
  for (bool ten : {false, true}) {
    EXPECT_EQ(lun.ModeSense(ten, 0), "GOOD") << "MODE SENSE(" << (ten ? 10 : 6) << ")";
    for (uint8_t alloc = 1; alloc <= (ten ? 3 : 2); ++alloc) {
      EXPECT_EQ(lun.ModeSense(ten, alloc), kInvalidFieldInCdb) << "allocation length " << int(alloc);
    }
    EXPECT_EQ(lun.ModeSense(ten, 255), "GOOD");
  }
  EXPECT_EQ(lun.Read(0, 1), "GOOD");
  EXPECT_TRUE(target.TgtdAlive());
}

TEST(Target, NonFiniteGradientIsRejectedAndNothingApplied) {
  TargetProcess target("params=1000;lr=1");
  ASSERT_TRUE(target.ok()) << target.start_output();
  RawLun lun(target.url(), "iqn.2026-11.io.blkps:test-raw");
  ASSERT_TRUE(lun.connected()) << lun.error();
  std::vector<float> g(1024, 1.0f);
  g[900] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(lun.Write(0, FloatBytes(g)), "sense 0x5 0x2600");  // ILLEGAL REQUEST, INVALID FIELD IN PARAMETER LIST
  EXPECT_NE(target.Log().find("gradient for parameter 900 is NaN"), std::string::npos) << target.Log();
  std::vector<uint8_t> w;
  EXPECT_EQ(lun.Read(0, 8, &w), "GOOD");
  ASSERT_EQ(w.size(), 4096u);
  for (uint8_t x : w) ASSERT_EQ(x, 0);

  // Through the library the same write fails with a clear message.
  ModelHandle h(target.url());
  ASSERT_NE(h.m, nullptr) << h.error;
  EXPECT_NE(blkps_push(h.m, 0, g.data(), 1000), 0);
  EXPECT_NE(std::string(blkps_last_error(h.m)).find("ILLEGAL"), std::string::npos) << blkps_last_error(h.m);
}

TEST(Target, BadBsoptsFailLunCreationWithOneLineNamingTheKey) {
  TargetProcess target("params=1000;lr=1");
  ASSERT_TRUE(target.ok()) << target.start_output();
  struct Case {
    std::string bsopts, key;
  };
  const Case cases[] = {
      {"params=0", "params:"},
      {"lr=0.1", "params: required"},
      {"params=10;lr=fast", "lr:"},
      {"params=10;rule=adamx", "rule: unknown update rule 'adamx'"},
      {"params=10;block=3", "block:"},
      {"params=10;init=file:/nonexistent/w.bin", "init: cannot open"},
      {"params=10;speed=9", "speed: unknown option"},
  };
  int lun = 10;
  for (const Case& c : cases) {
    std::string out;
    int rc = target.Admin("--lld iscsi --op new --mode logicalunit --tid 1 --lun " + std::to_string(lun++) +
                              " --bstype blkps --backing-store m2 --bsopts " + ShellQuote(c.bsopts),
                          &out);
    EXPECT_NE(rc, 0) << c.bsopts;
    EXPECT_NE(target.Log().find("blkps: "), std::string::npos);
    EXPECT_NE(target.Log().find(c.key), std::string::npos) << c.bsopts << "\n" << target.Log();
  }
  // tgtd still serves the good LUN.
  ExpectServesZeroModel(target.url(), 2.0f);
}

TEST(Target, StartScriptRefusesBadBsoptsAndLeavesNoDaemon) {
  TargetProcess target("params=10;lr=-3");
  EXPECT_FALSE(target.ok());
  EXPECT_NE(target.start_output().find("lr: expected a finite number > 0, got '-3'"), std::string::npos)
      << target.start_output();
  EXPECT_FALSE(target.TgtdAlive());
}

// tgtd dlopens every file in its plugin folder and calls register_bs_module().
// The test puts the built plugin there for its own tgtd and takes it away.
TEST(Target, PluginInstalledInTgtFolderServesTheModel) {
  const std::string dir = "/usr/lib/tgt/backing-store", installed = dir + "/bs_blkps.so";
  if (access(installed.c_str(), F_OK) == 0) GTEST_SKIP() << installed << " exists: not replacing it";
  ASSERT_EQ(RunCommand("mkdir -p " + dir + " && cp " + blkps_test::ShellQuote(BLKPS_PLUGIN) + " " + installed, nullptr),
            0);
  struct Uninstall {
    std::string path;
    ~Uninstall() { unlink(path.c_str()); }
  } uninstall{installed};

  TargetProcess target("params=1000;lr=1", "--plugin installed");
  ASSERT_TRUE(target.ok()) << target.start_output();
  ExpectServesZeroModel(target.url(), 3.0f);
}

TEST(Target, IserTransportFailsClearlyWithoutRdmaDevice) {
  std::string out;
  RunCommand("ls -A /sys/class/infiniband 2>/dev/null || true", &out);
  if (!out.empty()) GTEST_SKIP() << "this host has an RDMA device: " << out;
  TargetProcess target("params=10", "--transport iser");
  EXPECT_FALSE(target.ok());
  EXPECT_NE(target.start_output().find("RDMA"), std::string::npos) << target.start_output();

  blkps_model* m = nullptr;
  char err[512] = "";
  EXPECT_NE(blkps_open("iser://127.0.0.1:3260/iqn.2026-11.io.blkps:none/1", nullptr, &m, err, sizeof err), 0);
  EXPECT_NE(std::string(err).find("RDMA"), std::string::npos) << err;
}

// VmRSS of process `pid` in bytes, or 0 if unknown.
uint64_t ResidentBytes(const std::string& pid) {
  std::ifstream in("/proc/" + pid + "/status");
  std::string key;
  while (in >> key) {
    if (key == "VmRSS:") {
      uint64_t kib = 0;
      in >> kib;
      return kib << 10;
    }
    in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return 0;
}

// doc/server.md, "Memory": the server holds the weights, the rule's state and (bsp)
// one accumulator, plus per-learner bookkeeping and tgt's command buffers —
// never a model-sized buffer per learner. 4 learners each push a whole
// gradient of a 256 MiB model and pull the weights; tgtd's resident size must
// grow by the formula's model-sized arrays, and by less than one more model.
TEST(Target, ServerMemoryForA256MiBModelAndFourLearnersFollowsTheFormula) {
  constexpr uint64_t kParams = 64ull << 20;  // 256 MiB of float32
  constexpr uint64_t kModel = kParams * 4;
  constexpr int kLearners = 4;
  TargetProcess target("params=" + std::to_string(kParams) + ";rule=momentum;mode=bsp", "--luns 4");
  ASSERT_TRUE(target.ok()) << target.start_output();
  const uint64_t before = ResidentBytes(target.pid());
  ASSERT_GT(before, 0u);

  int failed = RunInProcesses(kLearners, [&](int k) -> std::string {
    ModelHandle h(target.url(k + 1));
    if (!h.m) return h.error;
    std::vector<float> buffer(kParams, 1.0f);
    if (blkps_push(h.m, 0, buffer.data(), kParams) != 0) return blkps_last_error(h.m);
    if (blkps_pull(h.m, 0, buffer.data(), kParams) != 0) return blkps_last_error(h.m);
    // momentum's first step from v = 0: v = g, w = -lr·g with lr 0.01.
    if (buffer[0] != -0.01f || buffer[kParams - 1] != -0.01f) return "the round was not applied once";
    return "";
  });
  ASSERT_EQ(failed, 0);

  const uint64_t after = ResidentBytes(target.pid());
  const uint64_t arrays = 3 * kModel;  // weights, momentum's v, the bsp sum
  // tgt's command buffers, kept by malloc for reuse: 2 × queue depth 16 ×
  // 1 MiB requests per learner (its writes, and its held reads meanwhile
  // others still write), and one 1 MiB command per learner on the control
  // LUN (libblkps reads its receipt there when it opens).
  const uint64_t command_buffers = 2 * kLearners * 16 * (1 << 20) + kLearners * (1 << 20);
  // malloc's arenas keep a varying share of freed buffers: 913 and 919 MiB
  // were seen in full-suite runs, 7 MiB over a 16 MiB slack.
  const uint64_t slack = 32 << 20;
  const uint64_t grew = after - before;
  EXPECT_GE(grew, arrays - arrays / 50) << "the model's arrays are not all resident: the test measures nothing";
  EXPECT_LE(grew, arrays + command_buffers + slack)
      << "tgtd grew by " << (grew >> 20) << " MiB for a " << (kModel >> 20) << " MiB model";
  EXPECT_LT(grew, arrays + kModel) << "a model-sized buffer per learner?";
}

}  // namespace
}  // namespace blkps_test
