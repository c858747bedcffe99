// The libiscsi session under IscsiDevice (iscsi_device.h): logging in, one
// command at a time on a context with nothing else in flight (the control
// LUN's fence and receipts, capacity, limits), and libiscsi's event loop.
// Every function here blocks its caller and is for one thread per context.
// Shared by the three files of the iSCSI device, one job each:
//   iscsi_session.cc    this file's functions, and OpenIscsiDevice (device.h):
//                       a URL to a logged-in, probed IscsiDevice;
//   iscsi_device.cc     the data path: batches of commands in flight;
//   iscsi_reconnect.cc  a dropped session made good, exactly once.
#ifndef BLKPS_LEARNER_ISCSI_SESSION_H_
#define BLKPS_LEARNER_ISCSI_SESSION_H_

#include <iscsi/iscsi.h>
#include <iscsi/scsi-lowlevel.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "device.h"
#include "status.h"

namespace blkps::iscsi {

// The most one iser:// command carries: tgt's iSER driver takes at most
// buf_sz_kb (512 KiB by default) per command, and libiscsi 1.19's iSER
// initiator stages every command's data in one registered buffer of 256 KiB
// (DATA_BUFFER_SIZE in its lib/iser.c; a larger write overruns it). Also the
// default request size on iSER.
constexpr uint64_t kIserMaxRequestBytes = 256 << 10;
// The most iser:// commands in flight: libiscsi 1.19 has 256 send
// descriptors (NUM_MRS) and takes one per command without checking, and does
// not hold commands back for the target's CmdSN window (tgt's is 128).
constexpr uint32_t kIserMaxInFlight = 128;
// The first burst of an iscsi:// session: libiscsi 1.19 offers
// FirstBurstLength=262144 (lib/init.c; no call changes it) and the session
// takes the lesser of both ends' (blkps targets offer the same: scripts/
// blkps_cli/session.py). A write up to this size is sent whole, unsolicited.
constexpr uint64_t kTcpFirstBurstBytes = 256 << 10;
// libiscsi sends commands from the poll loop; wake it at least this often so
// that its timeouts and reconnect attempts run.
constexpr int kPollTimeoutMs = 1000;
// iscsi_which_events() == 0 means "reconnect pending, wait >= 100 ms".
constexpr int kReconnectWaitMs = 100;
// A command the target does not answer fails after this, as with the Linux
// SCSI layer: a hung server must not hang the learner. blkps servers bound
// their held commands well below it.
constexpr int kCommandTimeoutSeconds = 30;
// On a LUN with replicas, a command unanswered this long, or a reconnect's
// login and probe of one replica taking longer, counts the replica as gone
// (frozen, or its host cut off): the learner tries the next replica, so
// that it follows a failover within seconds. Replicas serve async jobs,
// whose commands the server never holds, and a reconnect to a replica
// that was only slow costs a login and a receipt read (exactly once still).
constexpr int kReplicaSilenceSeconds = 3;

// When a blocking step gives up. A reconnect bounds every step by what is
// left of BLKPS_RECONNECT_SECONDS; an open bounds its login, and every
// step bounds each command, by kCommandTimeoutSeconds (libiscsi enforces
// its command timeout on TCP only, never on iSER).
using Deadline = std::chrono::steady_clock::time_point;
constexpr Deadline kNoDeadline = Deadline::max();

// libiscsi's last error on one line: its messages may hold newlines.
std::string LastError(iscsi_context* iscsi);

// iscsi_service() without SIGPIPE: libiscsi writes to the socket with
// writev, and a connection the peer reset must end in an error the device
// handles, not kill the learner. SIGPIPE is blocked in this thread while
// libiscsi runs, and one it raised is taken back.
int ServiceWithoutSigpipe(iscsi_context* iscsi, int revents);

// "iqn.2026-11.io.blkps:learner-<host>-<pid>", the host name folded to the
// characters an IQN allows: the initiator name when the user gives none.
std::string DefaultInitiatorName();

// One replica of the LUN: a target at a portal (doc/replicas.md, "Learners
// follow a failover"). Every replica serves the same LUN number, and its
// control LUN at the number the first replica's has (targets made alike).
struct Replica {
  std::string name;  // its URL without credentials, for messages
  std::string portal, target;
};

// What it takes to log in again.
struct SessionSpec {
  std::string name;  // the first replica's URL without credentials, for messages
  std::string initiator;
  std::vector<Replica> replicas;  // the primary first; at least one
  ChapCredentials chap;
  int lun = 0;
  bool iser = false;
  double reconnect_seconds = 0;  // how long a lost session is retried
  // Several replicas: a replica is used only once it serves (ProbeServing).
  bool replicated() const { return replicas.size() > 1; }
};

// A new session token (never 0): a session logs in with it in its
// initiator alias (BLKPS_SESSION_ALIAS_PREFIX), and the fence after a
// reconnect names the ended session's (iscsi_device.h "Exactly-once writes").
uint64_t NewSessionToken();

// A logged-in context for replica `replica` of `spec`, its alias naming
// `session` (NewSessionToken), or nullptr with libiscsi's reason in *error. Connecting and logging in give up at
// `deadline` (a target that accepts the connection and never answers the
// login must not hold a reconnect past it). A login that was never
// answered, whether `deadline` or libiscsi's own command timeout ended it,
// leaves exactly kLoginUnanswered in *error.
extern const char kLoginUnanswered[];
iscsi_context* LogIn(const SessionSpec& spec, size_t replica, uint64_t session, std::string* error,
                     Deadline deadline = kNoDeadline);

// Whether the replica behind a logged-in context serves learners: a READ of
// the LUN's first block. EAGAIN when it answers standby (IsStandbySense: a
// backup not promoted), EIO when the read fails otherwise. Only for
// replicated LUNs: the read counts as the learner's.
Status ProbeServing(iscsi_context* iscsi, int lun, uint32_t block_size, Deadline deadline);

// Starts a command with `start(callback, private_data)` (an iscsi_*_task
// call) and services `iscsi` until it ends; returns its task, or nullptr if
// it could not start or the connection failed. Instead of libiscsi's *_sync
// calls: those return on a failed connection leaving the command queued
// with a pointer into their stack frame, which destroying the context later
// writes to (seen as heap corruption after a target restart). Here that
// pointer is to a CommandEnd left allocated for the context's destruction.
using StartCommand = std::function<scsi_task*(iscsi_command_cb, void*)>;
// Gives up (nullptr) at `deadline`; the caller then destroys the context.
scsi_task* RunToEnd(iscsi_context* iscsi, const StartCommand& start, Deadline deadline = kNoDeadline);

// One synchronous command on `lun` of a context with nothing else in
// flight: READ(16) into `data` or WRITE(16) from it, in pieces of at most
// kIserMaxRequestBytes (what iSER carries as well as TCP).
Status SyncTransfer(iscsi_context* iscsi, int lun, Direction direction, uint64_t offset, void* data, uint64_t len,
                    uint32_t block_size, Deadline deadline = kNoDeadline);

}  // namespace blkps::iscsi

#endif  // BLKPS_LEARNER_ISCSI_SESSION_H_
