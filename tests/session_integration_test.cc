// Several iSCSI sessions per LUN (doc/libblkps.md "Several sessions per
// LUN"), a real tgtd with the built plugin: a model opened with K sessions
// moves exactly what one session moves (every push applied once), its
// requests go over all K (each session's initiator name has its own
// receipt, whose writes add up to the requests sent), and a path refuses
// sessions.
#include <blkps/model.hpp>

#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string>
#include <vector>

#include "target_process.h"
#include "temp_dir.h"

namespace blkps_test {
namespace {

constexpr uint64_t kParams = 65536;  // 256 KiB: 64 requests of 4 KiB

TEST(SeveralSessions, MoveWhatOneSessionMovesOverEverySession) {
  TargetProcess target("params=" + std::to_string(kParams) + ";rule=sum");
  ASSERT_TRUE(target.ok()) << target.start_output();
  const std::string base = "iqn.2026-11.io.blkps:sessions-test-" + std::to_string(getpid());
  blkps::OpenOptions o;
  o.sessions = 3;
  o.request_bytes = 4096;
  o.initiator_name = base;
  std::string error;
  auto model = blkps::Model::Open(target.url(1), o, &error);
  ASSERT_NE(model, nullptr) << error;
  std::vector<float> ones(kParams, 1.0f), w(kParams, -7.5f);
  ASSERT_EQ(model->Push(0, ones.data(), kParams), 0) << model->last_error();
  ASSERT_EQ(model->Exchange(0, ones.data(), w.data(), kParams), 0) << model->last_error();
  for (uint64_t i = 0; i < kParams; ++i) ASSERT_EQ(w[i], 2.0f) << "parameter " << i;
  blkps::Model::Ticket ticket = 0;
  ASSERT_EQ(model->SubmitPush(0, ones.data(), kParams, &ticket), 0) << model->last_error();
  std::vector<blkps::Model::Completion> done;
  ASSERT_EQ(model->Complete(&done, 1, -1), 1);
  EXPECT_EQ(done[0].result, 0) << done[0].error;
  ASSERT_EQ(model->Pull(0, w.data(), kParams), 0) << model->last_error();
  for (uint64_t i = 0; i < kParams; ++i) ASSERT_EQ(w[i], 3.0f) << "parameter " << i;
  // Each session's receipt, read under its initiator name: every session
  // wrote, and the writes add up to three pushes of 64 requests.
  uint64_t writes = 0;
  for (const std::string& name : {base, base + "-s2", base + "-s3"}) {
    blkps::OpenOptions as;
    as.initiator_name = name;
    auto control = blkps::Model::Open(target.control_url(), as, &error);
    ASSERT_NE(control, nullptr) << error;
    blkps_control_receipt header{};
    ASSERT_EQ(control->ReadControlReceipt(1, model->size_bytes(), &header, nullptr), 0) << control->last_error();
    EXPECT_GT(header.writes_applied, 0u) << name << " wrote nothing";
    writes += header.writes_applied;
  }
  EXPECT_EQ(writes, 3u * 64u);
}

TEST(SeveralSessions, APathRefusesThem) {
  TempDir dir;
  const std::string path = dir.path + "/model";
  FILE* f = fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(ftruncate(fileno(f), 1 << 20), 0);
  fclose(f);
  blkps::OpenOptions o;
  o.sessions = 2;
  std::string error;
  int code = 0;
  EXPECT_EQ(blkps::Model::Open(path, o, &error, &code), nullptr);
  EXPECT_EQ(code, -EINVAL);
  EXPECT_NE(error.find("sessions"), std::string::npos) << error;
}

}  // namespace
}  // namespace blkps_test
