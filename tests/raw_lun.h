// RawLun: raw SCSI access to one LUN for integration tests — READ(16) and
// WRITE(16) sent by the test itself, bypassing libblkps's checks, so that a
// test sees the exact SCSI status and sense data.
#pragma once

#include <iscsi/iscsi.h>
#include <iscsi/scsi-lowlevel.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace blkps_test {

inline constexpr uint32_t kRawLbaBytes = 512;

// One iSCSI session on one LUN, sending READ(16) / WRITE(16) itself so that a
// test sees the exact SCSI status and sense data.
class RawLun {
 public:
  // `initiator` must differ between sessions open at once: two sessions of one
  // name would reinstate (log out) each other. `alias`, if given, is the
  // session's initiator alias (libblkps names its session token there).
  RawLun(const std::string& url, const std::string& initiator, const std::string& alias = "") {
    ctx_ = iscsi_create_context(initiator.c_str());
    if (!alias.empty()) iscsi_set_alias(ctx_, alias.c_str());
    url_ = iscsi_parse_full_url(ctx_, url.c_str());
    if (!url_) return;
    iscsi_set_targetname(ctx_, url_->target);
    iscsi_set_session_type(ctx_, ISCSI_SESSION_NORMAL);
    iscsi_set_header_digest(ctx_, ISCSI_HEADER_DIGEST_NONE);
    connected_ = iscsi_full_connect_sync(ctx_, url_->portal, url_->lun) == 0;
    // A command the server never answers fails the test instead of hanging
    // it (the longest the tests expect to wait is a 1 s hold limit).
    iscsi_set_timeout(ctx_, 15);
  }
  ~RawLun() {
    // A context whose reconnect failed for good (GiveUpWhenTargetIsGone)
    // is left as it is: libiscsi 1.19 crashed destroying one (in
    // iscsi_destroy_context of its old context), depending on the layout
    // of the test's memory. One leaked context per such session.
    if (gone_) return;
    if (connected_) iscsi_logout_sync(ctx_);
    if (url_) iscsi_destroy_url(url_);
    iscsi_destroy_context(ctx_);
  }
  RawLun(const RawLun&) = delete;
  RawLun& operator=(const RawLun&) = delete;

  bool connected() const { return connected_; }
  // A dropped connection is reconnected at most once: with the target gone
  // for good, the command in flight and every later one fail instead of
  // waiting for it.
  void GiveUpWhenTargetIsGone() {
    iscsi_set_reconnect_max_retries(ctx_, 0);
    give_up_ = true;
  }
  std::string error() const { return iscsi_get_error(ctx_); }

  // READ(16) of `blocks` logical blocks at `lba`; the data into *data if
  // given. Returns "GOOD", "sense <key> <asc><ascq>" or what else happened.
  std::string Read(uint64_t lba, uint32_t blocks, std::vector<uint8_t>* data = nullptr) {
    scsi_task* t = iscsi_read16_sync(ctx_, url_->lun, lba, blocks * kRawLbaBytes, kRawLbaBytes, 0, 0, 0, 0, 0);
    return Finish(t, data);
  }
  // WRITE(16) of `data` (a multiple of 512 bytes) at `lba`.
  std::string Write(uint64_t lba, std::vector<uint8_t> data) {
    scsi_task* t = iscsi_write16_sync(ctx_, url_->lun, lba, data.data(), data.size(), kRawLbaBytes, 0, 0, 0, 0, 0);
    return Finish(t, nullptr);
  }

  // Any CDB, to any LUN of the session's target: `dir` is SCSI_XFER_NONE,
  // _READ (up to `expected` bytes) or _WRITE (`data`, `expected` bytes of it).
  // Returns the SCSI status, or -1 if no answer came (the connection dropped
  // or the command timed out).
  int Command(int lun, std::vector<uint8_t> cdb, int dir, uint32_t expected, std::vector<uint8_t>* data) {
    scsi_task* task = scsi_create_task(static_cast<int>(cdb.size()), cdb.data(), dir, static_cast<int>(expected));
    if (!task) return -1;
    iscsi_data out{data ? data->size() : 0, data ? data->data() : nullptr};
    scsi_task* done = iscsi_scsi_command_sync(ctx_, lun, task, dir == SCSI_XFER_WRITE ? &out : nullptr);
    if (!done) {
      scsi_free_scsi_task(task);
      return -1;
    }
    const int status = done->status;
    scsi_free_scsi_task(done);
    return status >= SCSI_STATUS_CANCELLED ? -1 : status;
  }

  // INQUIRY of vital product data page `page` (0x80 the unit serial number,
  // 0x83 the device identification): the page's bytes into *data.
  std::string Inquiry(uint8_t page, std::vector<uint8_t>* data) {
    scsi_task* t = iscsi_inquiry_sync(ctx_, url_->lun, 1, page, 255);
    return Finish(t, data);
  }

  // MODE SENSE(6) or (10) of all pages with allocation length `alloc`.
  std::string ModeSense(bool ten, uint8_t alloc) {
    scsi_task* t = ten ? iscsi_modesense10_sync(ctx_, url_->lun, 0, 1, SCSI_MODESENSE_PC_CURRENT,
                                                SCSI_MODEPAGE_RETURN_ALL_PAGES, 0, alloc)
                       : iscsi_modesense6_sync(ctx_, url_->lun, 1, SCSI_MODESENSE_PC_CURRENT,
                                               SCSI_MODEPAGE_RETURN_ALL_PAGES, 0, alloc);
    return Finish(t, nullptr);
  }

 private:
  std::string Finish(scsi_task* t, std::vector<uint8_t>* data) {
    if (!t) {
      gone_ = give_up_;
      return "no task: " + error();
    }
    std::string r;
    if (t->status == SCSI_STATUS_GOOD) {
      r = "GOOD";
      if (data) data->assign(t->datain.data, t->datain.data + t->datain.size);
    } else if (t->status == SCSI_STATUS_CHECK_CONDITION) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "sense 0x%x 0x%04x", static_cast<unsigned>(t->sense.key),
                    static_cast<unsigned>(t->sense.ascq));
      r = buf;
    } else {
      r = "status " + std::to_string(t->status) + ": " + error();
    }
    scsi_free_scsi_task(t);
    return r;
  }

  iscsi_context* ctx_ = nullptr;
  iscsi_url* url_ = nullptr;
  bool connected_ = false;
  bool give_up_ = false;  // GiveUpWhenTargetIsGone()
  bool gone_ = false;     // and a command found the target gone
};

// The bytes of v, for RawLun::Write.
inline std::vector<uint8_t> FloatBytes(const std::vector<float>& v) {
  std::vector<uint8_t> bytes(v.size() * sizeof(float));
  std::memcpy(bytes.data(), v.data(), bytes.size());
  return bytes;
}

}  // namespace blkps_test
