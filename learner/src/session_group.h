// SessionGroup: one LUN reached through several iSCSI sessions at once,
// seen as one Device (OpenOptions::sessions; doc/libblkps.md "Several
// sessions per LUN"). Where one connection (one libiscsi thread, one TCP
// stream) caps a learner's rate, each call's requests are dealt over the
// sessions in turn and every session runs its share on its own thread.
//
// Exactly-once and the server's accounting: session k > 0 logs in as
// "<initiator>-s<k+1>". The server knows a learner by its LUN (its slot,
// clocks and liveness), so the sessions are one learner; it keeps receipts
// and fences per LUN and initiator name, so each session's reconnects
// resend exactly once on their own (iscsi_device.h). Each session takes
// one of the 8 receipts a LUN keeps (doc/libblkps.md "Faults").
//
// Thread-safety: as every Device. Each session is used by one thread at a
// time (the caller's or its worker; calls return when all are done).

#ifndef BLKPS_LEARNER_SESSION_GROUP_H_
#define BLKPS_LEARNER_SESSION_GROUP_H_

#include <memory>
#include <string>
#include <vector>

#include "device.h"
#include "device_worker.h"

namespace blkps {

class SessionGroup : public Device {
 public:
  // REQUIRES: sessions.size() >= 2, all of one LUN (same size and blocks).
  // Throws std::system_error when no thread can be started.
  explicit SessionGroup(std::vector<std::unique_ptr<Device>> sessions);

  uint64_t size_bytes() const override { return sessions_[0]->size_bytes(); }
  uint32_t logical_block_size() const override { return sessions_[0]->logical_block_size(); }
  uint64_t default_request_bytes() const override { return sessions_[0]->default_request_bytes(); }
  uint64_t default_exchange_request_bytes() const override { return sessions_[0]->default_exchange_request_bytes(); }
  uint64_t max_request_bytes() const override { return sessions_[0]->max_request_bytes(); }
  uint64_t table_width() const override { return sessions_[0]->table_width(); }
  bool table_hashed() const override { return sessions_[0]->table_hashed(); }

  // Each session runs its contiguous share of the requests (Deal) with up
  // to `queue_depth` in flight on it. The first failure in session order
  // is returned once every session is done.
  Status Transfer(Direction direction, const std::vector<IoRequest>& requests, uint32_t queue_depth) override;
  // Pairs stay together: writes[k] and reads[k] go to one session, whose
  // Exchange keeps each read behind its write. `consume` is handed every
  // read once all sessions are done.
  Status Exchange(const std::vector<IoRequest>& writes, const std::vector<IoRequest>& reads, uint32_t queue_depth,
                  const ConsumeFn* consume) override;
  // Syncs every session (a SYNCHRONIZE CACHE after each one's writes).
  Status Sync() override;
  // Summed over the sessions.
  uint64_t pushed_bytes_lost() const override { return SumOver(sessions_, &Device::pushed_bytes_lost); }
  uint64_t reconnects() const override { return SumOver(sessions_, &Device::reconnects); }
  double reconnect_seconds() const override { return SumOver(sessions_, &Device::reconnect_seconds); }

 private:
  // `requests` cut into one contiguous share per session, in order, of
  // equal counts give or take one.
  std::vector<std::vector<IoRequest>> Deal(const std::vector<IoRequest>& requests) const;
  // job(s) on every session with busy[s], all at once; the first failure.
  Status RunOnSessions(const std::vector<bool>& busy, const std::function<Status(uint32_t)>& job);

  std::vector<std::unique_ptr<Device>> sessions_;
  std::vector<std::unique_ptr<DeviceWorker>> workers_;  // one per session; [0] unused (the caller's thread)
};

// Opens `sessions` sessions of iscsi:// or iser:// `url` (initiator names
// as above; `initiator_name` empty: libblkps's default) as one SessionGroup.
std::unique_ptr<Device> OpenSessionGroup(const std::string& url, const std::string& initiator_name, uint32_t sessions,
                                         Status* status);

}  // namespace blkps

#endif  // BLKPS_LEARNER_SESSION_GROUP_H_
