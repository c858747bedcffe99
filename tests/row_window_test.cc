// Integration tests of the control LUN's row windows (wire/include/blkps/
// control_lun.h "Row windows"; doc/embeddings.md "A batch in one command"):
// a real tgtd with the built plugin, requests written as raw SCSI commands,
// as any language would with pwrite/pread, so that each test sees the exact
// sense a refusal gives. The per-row path (a row's bytes on the learner LUN)
// is the reference.
#include <blkps/control_lun.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "raw_lun.h"
#include "target_process.h"

namespace blkps_test {
namespace {

constexpr uint64_t kRows = 4096, kWidth = 128;  // 512-byte rows: one a sector
constexpr uint64_t kRowBytes = kWidth * 4;
const char kGood[] = "GOOD";
const char kLbaOutOfRange[] = "sense 0x5 0x2100";  // ILLEGAL REQUEST, LBA OUT OF RANGE
const char kBadData[] = "sense 0x5 0x2600";        // ILLEGAL REQUEST, INVALID FIELD IN PARAMETER LIST

std::string Initiator(const std::string& who) {
  static std::atomic<int> counter{0};
  return "iqn.2026-11.io.blkps:window-test-" + who + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
}

int LunOf(const std::string& url) { return std::atoi(url.substr(url.rfind('/') + 1).c_str()); }

// A target serving a table with learner LUN 1, and the raw sessions a test
// drives it with: the learner LUN (the per-row path) and the control LUN (its
// windows), both of one initiator, as one learner's would be.
class Windows {
 public:
  explicit Windows(const std::string& bsopts, const std::string& who = "learner")
      : target_(std::make_unique<TargetProcess>(bsopts)), initiator_(Initiator(who)) {
    Connect();
  }
  TargetProcess& target() { return *target_; }
  RawLun& control() { return *control_; }
  RawLun& learner() { return *learner_; }
  // Drops both sessions and logs in again under the same initiator name:
  // what a learner does after a lost connection.
  void Connect() {
    control_.reset();
    learner_.reset();
    if (!target_->ok()) return;
    control_ = std::make_unique<RawLun>(target_->control_url(), initiator_);
    learner_ = std::make_unique<RawLun>(target_->url(1), initiator_ + "-rows");
  }

  // The LBA of window `w` of learner LUN 1.
  uint64_t WindowLba(uint64_t w) const {
    return blkps_control_window_offset(kRows * kRowBytes, LunOf(target_->control_url()), 1, w) / kRawLbaBytes;
  }

  std::string Pull(uint64_t w, const std::vector<uint64_t>& ids, uint64_t width = kWidth) {
    return control_->Write(WindowLba(w), Request(BLKPS_ROW_WINDOW_PULL, 1, 0, ids, width, {}));
  }
  std::string Push(uint64_t w, uint64_t sequence, uint64_t tag, const std::vector<uint64_t>& ids,
                   const std::vector<float>& rows, uint64_t width = kWidth) {
    return control_->Write(WindowLba(w), Request(BLKPS_ROW_WINDOW_PUSH, sequence, tag, ids, width, rows));
  }
  // The window's state and the rows of its last pull (`count` of them).
  blkps_row_window_state State(uint64_t w, std::vector<float>* rows = nullptr, uint64_t count = 0) {
    std::vector<uint8_t> bytes;
    const uint64_t blocks = (BLKPS_ROW_WINDOW_HEADER_BYTES + count * kRowBytes) / kRawLbaBytes;
    EXPECT_EQ(control_->Read(WindowLba(w), static_cast<uint32_t>(blocks), &bytes), kGood);
    bytes.resize(blocks * kRawLbaBytes);  // zeros where the read failed
    blkps_row_window_state state{};
    EXPECT_EQ(blkps_row_window_state_decode(bytes.data(), bytes.size(), 1, w, &state), 0);
    if (rows != nullptr) {
      rows->resize(count * kWidth);
      std::memcpy(rows->data(), bytes.data() + BLKPS_ROW_WINDOW_HEADER_BYTES, count * kRowBytes);
    }
    return state;
  }
  // Row r through the per-row path.
  std::vector<float> Row(uint64_t r) {
    std::vector<uint8_t> bytes;
    EXPECT_EQ(learner_->Read(r, 1, &bytes), kGood);
    bytes.resize(kRowBytes);
    std::vector<float> row(kWidth);
    std::memcpy(row.data(), bytes.data(), kRowBytes);
    return row;
  }

  static std::vector<uint8_t> Request(uint32_t op, uint64_t sequence, uint64_t tag, const std::vector<uint64_t>& ids,
                                      uint64_t width, const std::vector<float>& rows) {
    std::vector<uint8_t> bytes(blkps_row_window_request_bytes(op, ids.size(), width), 0);
    blkps_row_window_request header{};
    header.op = op;
    header.sequence = sequence;
    header.tag = tag;
    header.count = ids.size();
    header.width = width;
    blkps_row_window_request_encode(header, bytes.data());
    std::memcpy(bytes.data() + BLKPS_ROW_WINDOW_HEADER_BYTES, ids.data(), ids.size() * 8);
    std::memcpy(bytes.data() + blkps_row_window_rows_offset(ids.size()), rows.data(), rows.size() * 4);
    return bytes;
  }

 private:
  std::unique_ptr<TargetProcess> target_;
  const std::string initiator_;
  std::unique_ptr<RawLun> control_, learner_;
};

const std::string kAdagrad =
    "table=" + std::to_string(kRows) + ":" + std::to_string(kWidth) + ";rule=adagrad;lr=0.5;init=normal:0.1;seed=3";

// Small integers: a gradient whose value tells its row and push apart.
std::vector<float> Gradients(const std::vector<uint64_t>& ids, int push) {
  std::vector<float> g(ids.size() * kWidth);
  for (size_t k = 0; k < ids.size(); ++k) {
    for (uint64_t i = 0; i < kWidth; ++i) g[k * kWidth + i] = static_cast<float>((ids[k] + i + push) % 7) - 3.0f;
  }
  return g;
}

// A pull writes ids in any order, repeats allowed, and reads back each id's
// row in that order: the bytes the per-row path reads at the row's offset.
TEST(RowWindows, PullReadsEachIdsRowInIdOrderAsThePerRowPathDoes) {
  Windows w(kAdagrad);
  ASSERT_TRUE(w.target().ok()) << w.target().start_output();
  ASSERT_TRUE(w.control().connected()) << w.control().error();
  const std::vector<uint64_t> ids = {4095, 7, 3, 7, 0, 1000};
  ASSERT_EQ(w.Pull(2, ids), kGood);
  std::vector<float> rows;
  const blkps_row_window_state state = w.State(2, &rows, ids.size());
  EXPECT_EQ(state.pull_count, ids.size());
  EXPECT_EQ(state.pull_width, kWidth);
  for (size_t k = 0; k < ids.size(); ++k) {
    const std::vector<float> want = w.Row(ids[k]);
    EXPECT_EQ(0, std::memcmp(rows.data() + k * kWidth, want.data(), kRowBytes)) << "id " << ids[k];
  }
}

// READs of a window may come in pieces: 512-byte pieces that cut 384-byte
// rows read the bytes one READ does, and those are the per-row path's.
TEST(RowWindows, AReadInPiecesThatCutRowsReadsTheBytesOfOneRead) {
  constexpr uint64_t kRows384 = 1024, kRow384Bytes = 384;
  Windows w("table=1024:96;rule=sgd;init=normal:0.1;seed=3");
  ASSERT_TRUE(w.target().ok()) << w.target().start_output();
  ASSERT_TRUE(w.control().connected()) << w.control().error();
  const uint64_t lba =
      blkps_control_window_offset(kRows384 * kRow384Bytes, LunOf(w.target().control_url()), 1, 0) / kRawLbaBytes;
  const std::vector<uint64_t> ids = {1023, 5, 5, 700, 0};
  ASSERT_EQ(w.control().Write(lba, Windows::Request(BLKPS_ROW_WINDOW_PULL, 1, 0, ids, 96, {})), kGood);
  const uint32_t blocks = (BLKPS_ROW_WINDOW_HEADER_BYTES + ids.size() * kRow384Bytes + kRawLbaBytes - 1) / kRawLbaBytes;
  std::vector<uint8_t> whole, pieces, piece;
  ASSERT_EQ(w.control().Read(lba, blocks, &whole), kGood);
  for (uint32_t b = 0; b < blocks; ++b) {
    ASSERT_EQ(w.control().Read(lba + b, 1, &piece), kGood);
    pieces.insert(pieces.end(), piece.begin(), piece.end());
  }
  EXPECT_EQ(pieces, whole);
  for (size_t k = 0; k < ids.size(); ++k) {
    std::vector<uint8_t> sectors;  // the row's bytes on the learner LUN
    const uint64_t at = ids[k] * kRow384Bytes;
    const uint32_t span = (at % kRawLbaBytes + kRow384Bytes + kRawLbaBytes - 1) / kRawLbaBytes;
    ASSERT_EQ(w.learner().Read(at / kRawLbaBytes, span, &sectors), kGood);
    EXPECT_EQ(0, std::memcmp(whole.data() + BLKPS_ROW_WINDOW_HEADER_BYTES + k * kRow384Bytes,
                             sectors.data() + at % kRawLbaBytes, kRow384Bytes))
        << "id " << ids[k];
  }
}

// The same gradients pushed as one batch through a window and row by row on
// the learner LUN give the same rows, bit for bit, rule state included (two
// pushes of adagrad). Both halves of the table start at zeros.
TEST(RowWindows, PushAppliesTheTablesRuleAsThePerRowPathDoes) {
  Windows w("table=" + std::to_string(kRows) + ":" + std::to_string(kWidth) + ";rule=adagrad;lr=0.5;init=zeros");
  ASSERT_TRUE(w.target().ok()) << w.target().start_output();
  const std::vector<uint64_t> batch = {5, 9, 2, 40};  // through the window; the rows 1000 + id row by row
  for (int push = 1; push <= 2; ++push) {
    const std::vector<float> g = Gradients(batch, push);
    ASSERT_EQ(w.Push(0, push, 77, batch, g), kGood);
    for (size_t k = 0; k < batch.size(); ++k) {
      std::vector<float> row(g.begin() + k * kWidth, g.begin() + (k + 1) * kWidth);
      ASSERT_EQ(w.learner().Write(1000 + batch[k], FloatBytes(row)), kGood);
    }
  }
  for (uint64_t id : batch) {
    const std::vector<float> windowed = w.Row(id), per_row = w.Row(1000 + id);
    EXPECT_NE(windowed, std::vector<float>(kWidth, 0.0f)) << "id " << id << " was never updated";
    EXPECT_EQ(0, std::memcmp(windowed.data(), per_row.data(), kRowBytes)) << "id " << id;
  }
  const blkps_row_window_state state = w.State(0);
  EXPECT_EQ(state.push_sequence, 2u);
  EXPECT_EQ(state.pushes_applied, 2u);
  EXPECT_EQ(state.rows_applied, 2 * batch.size());
}

// Each refusal below fails the whole batch with one sense and applies none
// of it: the rows given before the bad one are unchanged, and so is the
// window's receipt.
void ExpectRefusedWhole(Windows& w, const std::string& sense, const std::vector<uint64_t>& ids,
                        const std::vector<float>& rows, uint64_t width) {
  ASSERT_TRUE(w.target().ok()) << w.target().start_output();
  const std::vector<float> before = w.Row(ids[0]);
  EXPECT_EQ(w.Push(1, 1, 5, ids, rows, width), sense);
  EXPECT_EQ(w.Row(ids[0]), before);
  const blkps_row_window_state state = w.State(1);
  EXPECT_EQ(state.push_sequence, 0u);
  EXPECT_EQ(state.rows_applied, 0u);
}

TEST(RowWindows, AnIdPastTheTablesEndRefusesTheWholeBatch) {
  Windows w(kAdagrad);
  const std::vector<uint64_t> ids = {10, 11, kRows};
  ExpectRefusedWhole(w, kLbaOutOfRange, ids, Gradients(ids, 1), kWidth);
  EXPECT_EQ(w.Pull(1, ids), kLbaOutOfRange);
}

TEST(RowWindows, RowsOfAnotherWidthRefuseTheWholeBatch) {
  Windows w(kAdagrad);
  const std::vector<uint64_t> ids = {10, 11};
  ExpectRefusedWhole(w, kBadData, ids, std::vector<float>(ids.size() * 64, 1.0f), 64);
  EXPECT_EQ(w.Pull(1, ids, 64), kBadData);
}

TEST(RowWindows, ANaNGradientRefusesTheWholeBatch) {
  Windows w(kAdagrad);
  const std::vector<uint64_t> ids = {10, 11};
  std::vector<float> g = Gradients(ids, 1);
  g[kWidth + 3] = std::numeric_limits<float>::quiet_NaN();
  ExpectRefusedWhole(w, kBadData, ids, g, kWidth);
}

TEST(RowWindows, AnInfiniteGradientRefusesTheWholeBatch) {
  Windows w(kAdagrad);
  const std::vector<uint64_t> ids = {10, 11};
  std::vector<float> g = Gradients(ids, 1);
  g.back() = -std::numeric_limits<float>::infinity();
  ExpectRefusedWhole(w, kBadData, ids, g, kWidth);
}

// A dense model has windows in its control LUN's layout but takes no batch
// (INVALID FIELD IN PARAMETER LIST, nothing applied), and every window, of a
// learner LUN or not, reads (zeros past its state), so that the whole
// control LUN reads as it did.
TEST(RowWindows, ADenseModelRefusesBatchesAndItsWindowsRead) {
  Windows w("params=" + std::to_string(kRows * kWidth) + ";rule=sgd;lr=1");
  ASSERT_TRUE(w.target().ok()) << w.target().start_output();
  const std::vector<uint64_t> ids = {1};
  EXPECT_EQ(w.Push(0, 1, 1, ids, std::vector<float>(kWidth, 1.0f)), kBadData);
  EXPECT_EQ(w.Row(1), std::vector<float>(kWidth, 0.0f));
  EXPECT_EQ(w.Pull(0, ids), kBadData);
  std::vector<uint8_t> bytes;
  const uint64_t lun0 = blkps_control_window_offset(kRows * kRowBytes, LunOf(w.target().control_url()), 0, 0);
  EXPECT_EQ(w.control().Read(lun0 / kRawLbaBytes, 16, &bytes), kGood) << "LUN 0 is no learner LUN";
  EXPECT_EQ(w.control().Read(w.WindowLba(15), 16, &bytes), kGood);
  EXPECT_EQ(bytes[BLKPS_ROW_WINDOW_HEADER_BYTES], 0);
}

// A push resent after a lost connection (a new session of the same
// initiator, the same sequence and tag) is acknowledged and applied once; a
// sequence that neither follows nor repeats the last is refused.
TEST(RowWindows, APushResentAfterAReconnectIsAppliedOnce) {
  Windows w("table=" + std::to_string(kRows) + ":" + std::to_string(kWidth) + ";rule=sgd;lr=1;init=zeros");
  ASSERT_TRUE(w.target().ok()) << w.target().start_output();
  const std::vector<uint64_t> ids = {1, 2};
  const std::vector<float> g(ids.size() * kWidth, 1.0f);
  ASSERT_EQ(w.Push(3, 1, 0xabc, ids, g), kGood);
  w.Connect();
  EXPECT_EQ(w.Push(3, 1, 0xabc, ids, g), kGood);
  EXPECT_EQ(w.Row(1), std::vector<float>(kWidth, -1.0f));
  EXPECT_EQ(w.State(3).pushes_applied, 1u);
  EXPECT_EQ(w.Push(3, 1, 0xdef, ids, g), kBadData) << "sequence 1 again with another tag";
  EXPECT_EQ(w.Row(1), std::vector<float>(kWidth, -1.0f));
  EXPECT_EQ(w.Push(3, 2, 0xdef, ids, g), kGood);
  EXPECT_EQ(w.Row(1), std::vector<float>(kWidth, -2.0f));
}

// After a kill -9 and a restart from the checkpoint, a window's receipt is
// the checkpoint's: a learner that saw 3 rows acknowledged finds
// rows_applied 2 (the last push was lost: pushed_bytes_lost is its rows'
// bytes), and its resend of that push, same sequence and tag, applies.
TEST(RowWindows, AWindowsReceiptAfterARestartIsTheCheckpoints) {
  TempDir dir;
  Windows w("table=" + std::to_string(kRows) + ":" + std::to_string(kWidth) +
            ";rule=sgd;lr=1;init=zeros;checkpoint=" + dir.path + "/t.ckpt");
  ASSERT_TRUE(w.target().ok()) << w.target().start_output();
  const std::vector<float> one(kWidth, 1.0f), two(2 * kWidth, 1.0f);
  ASSERT_EQ(w.Push(0, 1, 11, {1, 2}, two), kGood);
  std::vector<uint8_t> cdb(10, 0);
  cdb[0] = 0x35;  // SYNCHRONIZE CACHE(10): a checkpoint
  ASSERT_EQ(w.learner().Command(1, cdb, SCSI_XFER_NONE, 0, nullptr), SCSI_STATUS_GOOD);
  ASSERT_EQ(w.Push(0, 2, 22, {3}, one), kGood);
  std::string why;
  ASSERT_TRUE(w.target().KillTgtd(&why)) << why;
  ASSERT_TRUE(w.target().Restart()) << w.target().start_output();
  w.Connect();
  blkps_row_window_state state = w.State(0);
  EXPECT_EQ(state.push_sequence, 1u);
  EXPECT_EQ(state.push_tag, 11u);
  EXPECT_EQ(state.rows_applied, 2u);
  EXPECT_EQ(w.Row(3), std::vector<float>(kWidth, 0.0f));
  ASSERT_EQ(w.Push(0, 2, 22, {3}, one), kGood);
  EXPECT_EQ(w.Row(3), std::vector<float>(kWidth, -1.0f));
  EXPECT_EQ(w.State(0).rows_applied, 3u);
}

}  // namespace
}  // namespace blkps_test
