// Device: the block device that holds the model, as libblkps sees it.
//
// A Device moves whole logical blocks between the model device and memory. It
// knows nothing about parameters or partial blocks: TransferPlan cuts a byte
// range into block-aligned IoRequests, and a Device runs a batch of them with
// up to `queue_depth` in flight.
//
// Implementations:
//   file_device.cc   a regular file or a block device (/dev/sdX of a kernel
//                    iSCSI/iSER session), libaio with O_DIRECT; buffered
//                    I/O (same path) where the file system refuses O_DIRECT,
//                    announced once on stderr.
//   iscsi_device.h   iscsi:// and iser:// through libiscsi, one session
//                    (iscsi_session.cc, iscsi_device.cc, iscsi_reconnect.cc).
//   striped_device.cc  layout:PATH, one model striped over shard Devices.
//
// Thread-safety: a Device is used by one thread at a time (libiscsi allows one
// thread per context). Distinct Devices are independent.

#ifndef BLKPS_LEARNER_DEVICE_H_
#define BLKPS_LEARNER_DEVICE_H_

#include <sys/uio.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "status.h"

namespace blkps {

enum class Direction { kRead, kWrite };

const char* DirectionName(Direction direction);  // "read" or "write"

// One device command: `length` bytes at device byte `offset`, gathered from
// (write) or scattered into (read) `iov`.
struct IoRequest {
  uint64_t offset;  // a multiple of the logical block size
  uint64_t length;  // the sum of the iov lengths; a multiple of the block size
  // The memory stays owned by the caller and must stay valid until the batch
  // returns. A device may change entries while the request runs but restores
  // them (libiscsi does this), so the iovecs live in writable memory.
  iovec* iov;
  int iovcnt;
  // Bytes at the request's start and end that hold none of the caller's
  // data: a write's zeros that pad a partial first or last block
  // (TransferPlan). pushed_bytes_lost() counts writes without them.
  uint64_t padding_head = 0, padding_tail = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  virtual uint64_t size_bytes() const = 0;  // a multiple of the block size
  virtual uint32_t logical_block_size() const = 0;
  // Request size when the user asks for none, and the largest request the
  // device accepts; both multiples of the block size.
  virtual uint64_t default_request_bytes() const = 0;
  virtual uint64_t max_request_bytes() const = 0;
  // Request size of an Exchange when the user asks for none: its writes
  // and reads share each connection, so a write's transfer must not wait
  // for the target behind the reads' data (doc/data-path.md "Phases at
  // link rate"). A multiple of the block size.
  virtual uint64_t default_exchange_request_bytes() const { return default_request_bytes(); }

  // Runs every request, keeping up to `queue_depth` (>= 1) in flight.
  // REQUIRES: each request lies within [0, size_bytes()) and is no longer than
  // max_request_bytes().
  // After the first failure no further request is started; those in flight
  // are waited for, and the first failure is returned. Which of the other
  // requests reached the device is then unspecified.
  virtual Status Transfer(Direction direction, const std::vector<IoRequest>& requests, uint32_t queue_depth) = 0;

  // Transfer(kRead, ...) that hands request k to consume(k), on this thread,
  // once it has completed GOOD, while later requests may still be in flight:
  // the caller converts each piece while it is in cache and the transfer
  // goes on (the 16-bit wire's widening). Each request is handed at most
  // once; after a failure some are not handed. This default hands them all
  // after Transfer().
  using ConsumeFn = std::function<void(size_t index)>;
  virtual Status ReadConsuming(const std::vector<IoRequest>& requests, uint32_t queue_depth, const ConsumeFn& consume);

  // An exchange: writes[k] then reads[k] for every k, pipelined. Read k is
  // started only after write k has completed GOOD, while later writes may
  // still be in flight, so one connection carries writes and reads at once
  // (doc/data-path.md "Phases at link rate"). Each block is still written
  // before it is read: a read returns the weights after this device's own
  // write of that range. At most `queue_depth` requests (writes and reads
  // together) are in flight on a device that mixes them; this default runs
  // Transfer(kWrite, writes) and then the reads, for devices that cannot.
  // `consume`, if not null, is handed read k as in ReadConsuming.
  // REQUIRES: writes.size() == reads.size(); writes[k] and reads[k] cover the
  // same device range (TransferPlans of one range in both directions do);
  // each as for Transfer. reads[k]'s memory may be writes[k]'s (an exchange
  // in place): read k starts only once write k is done with it.
  // Failure as Transfer: the first failure is returned and no request is
  // started after it; the read of a failed or unstarted write is never
  // started.
  virtual Status Exchange(const std::vector<IoRequest>& writes, const std::vector<IoRequest>& reads,
                          uint32_t queue_depth, const ConsumeFn* consume);

  // Makes every completed write durable (fsync / SYNCHRONIZE CACHE); on the
  // blkps server this checkpoints the model.
  virtual Status Sync() = 0;

  // Bytes of writes this device had seen acknowledged that the server no
  // longer counts: it restarted from a checkpoint taken before them, so
  // those gradients are not in the model (iscsi:// with receipts;
  // doc/libblkps.md "Faults").
  virtual uint64_t pushed_bytes_lost() const { return 0; }
  // Lost sessions this device re-established (iscsi://), and the seconds it
  // spent in reconnecting, a failed attempt to the deadline included. Read
  // them between calls, on the thread that makes them.
  virtual uint64_t reconnects() const { return 0; }
  virtual double reconnect_seconds() const { return 0; }

  // The values per row of the table the server serves (its table=ROWS:WIDTH,
  // read from the control LUN's counters when the device was opened): the
  // only width pull_rows and push_rows accept. 0 when the device is a dense
  // model or does not say (a file or block device, a target without a blkps
  // control LUN): then any width is taken.
  virtual uint64_t table_width() const { return 0; }
  // Whether that table is hashed (its server's table=hash:CAPACITY:WIDTH,
  // from the same counters): its row ids are any 64-bit value, not bounded
  // by size_bytes(), and it is reached through the row windows only.
  virtual bool table_hashed() const { return false; }

  // Row windows (blkps/control_lun.h "Row windows"): a table's rows in
  // batches, one command each way per window, instead of a command per row.
  // Whether this device has them (a blkps server's table, over iscsi:// or
  // a layout: of such shards); if not, rows go by their bytes (RowBatch).
  virtual bool has_row_windows() const { return false; }
  // Pulls rows ids[0..n) into rows[k * width ..] (direction kRead), or pushes
  // rows[k * width ..] as the gradient of ids[k] (kWrite; rows is not
  // changed), over up to `queue_depth` windows at once. A push is applied
  // exactly once across reconnects (the windows' receipts per batch).
  // REQUIRES: has_row_windows(); ids distinct and below the table's rows;
  // width the table's; a push's values finite.
  virtual Status TransferRows(Direction direction, const uint64_t* ids, uint64_t n, uint64_t width, float* rows,
                              uint32_t queue_depth);

 protected:
  Device() = default;
};

// Opens `target`: iscsi://host[:port]/<target-iqn>/<lun>, iser://... of the
// same shape, or a path to a regular file or block device.
// layout:PATH opens the shards named in layout file PATH as one StripedDevice.
// `initiator_name`
// is the iSCSI initiator IQN; empty selects
// "iqn.2026-11.io.blkps:learner-<host>-<pid>". Ignored for paths.
// On failure returns nullptr and stores the reason in *status.
std::unique_ptr<Device> OpenDevice(const std::string& target, const std::string& initiator_name, Status* status);
// With `sessions` > 1, an iscsi:// or iser:// target (each shard of a
// layout:) is reached through that many sessions at once (session_group.h);
// a path refuses it (-EINVAL).
std::unique_ptr<Device> OpenDevice(const std::string& target, const std::string& initiator_name, uint32_t sessions,
                                   Status* status);

std::unique_ptr<Device> OpenFileDevice(const std::string& path, Status* status);
// OpenFileDevice with `open_file` in place of open(2) (same arguments, -1 and
// errno on failure), so that tests can refuse O_DIRECT as some file systems
// do.
using OpenFileFn = int (*)(const char* path, int flags);
std::unique_ptr<Device> OpenFileDeviceWith(const std::string& path, OpenFileFn open_file, Status* status);
// An iscsi:// or iser:// URL logs in with CHAP when it carries credentials,
// libiscsi's syntax iscsi://USER%SECRET@host/... (plus, for mutual CHAP,
// ?target_user=NAME&target_password=SECRET), or else when the environment
// names a credentials file in BLKPS_CHAP_FILE (doc/server.md, "Authentication and
// access"). Errors never show a secret (MaskTarget).
std::unique_ptr<Device> OpenIscsiDevice(const std::string& url, const std::string& initiator_name, Status* status);
// The replicas of one LUN (a layout's shard line and its replica lines;
// doc/replicas.md "Learners follow a failover"), the primary first: the
// device logs in to the first that serves learners (a backup on standby is
// skipped), and when its session breaks or answers standby it follows to
// the next that serves, within the reconnect deadline. Every URL names the
// same LUN over the same transport; credentials are the first URL's (or
// BLKPS_CHAP_FILE's), for all. If none serves: one line naming each
// replica and what it answered.
std::unique_ptr<Device> OpenIscsiDevice(const std::vector<std::string>& replicas, const std::string& initiator_name,
                                        Status* status);

// `target` as messages show it: an URL's credentials (between "://" and '@',
// and its query) replaced by "***".
std::string MaskTarget(const std::string& target);

// CHAP credentials for iSCSI logins; empty strings where not used.
struct ChapCredentials {
  std::string user, secret;                // the initiator's (one-way CHAP)
  std::string target_user, target_secret;  // the target's (mutual CHAP)
};
// Reads the credentials file `path` (format in doc/server.md, "Authentication and
// access": user=, secret=, target_user=, target_secret= lines; '#' comments).
// Refuses a file readable by group or others, an unknown or repeated key, a
// name or secret that breaks the rules, and a missing user= or secret=. The
// same grammar, rules and messages as scripts/blkps_cli/chap.py
// (tests/chap_file_test.py checks both on the same files). Messages never
// quote a secret.
Status ReadChapFile(const std::string& path, ChapCredentials* out);

// `layout:` targets: see striped_device.h and shard_layout.h.
std::unique_ptr<Device> OpenStripedDevice(const std::string& layout_path, const std::string& initiator_name,
                                          uint32_t sessions, Status* status);

}  // namespace blkps

#endif  // BLKPS_LEARNER_DEVICE_H_
