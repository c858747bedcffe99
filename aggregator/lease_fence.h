// The fence of a primary that holds a lease (doc/replicas.md "Failover by a
// lease"): the deadline past which it acknowledges no learner write and
// serves no learner read, because its lease in the coordination service
// (etcd) may have lapsed and a backup may be the primary by then (with newer
// weights, and learners must find it: a read they take as "serving" would
// send them back here).
//
// Who moves the deadline: the lease keeper (`blkps target lease`), after
// each renewal that etcd confirmed, through the control command
// lease_until=<ms> (job_control.cc): the renewal's SEND time plus the TTL
// minus a margin, on CLOCK_MONOTONIC. etcd's own expiry is at least the
// TTL after it received the renewal, so the fence closes before the lease
// can lapse there, whatever the keeper does next (stuck, stopped, killed).
//
// A job that never received lease_until= has no fence: it admits writes as
// before. Thread-safe: the deadline is one atomic; Admit runs on tgt's
// worker threads, Extend on a control write.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "status.h"

namespace blkps::server {

class LeaseFence {
 public:
  // Now on CLOCK_MONOTONIC, in milliseconds: the clock of lease_until=.
  static uint64_t NowMs();

  // Moves the deadline to `until_ms` (CLOCK_MONOTONIC ms) if that is later
  // than the one held: renewals may arrive out of order, and a deadline a
  // renewal confirmed stays valid. Returns true if this reopened a fence
  // that had refused a write: the caller logs the reopening.
  bool Extend(uint64_t until_ms);
  // OK if this job holds no lease or its deadline has not passed; otherwise
  // Standby saying so, which a learner takes as "use another server".
  // `lapsed_first` is set true on the first refusal after a deadline
  // passed (one log line per lapse), untouched otherwise.
  Status Admit(bool* lapsed_first);
  // Whether lease_until= was ever given: this job is leased.
  bool leased() const { return until_ms_.load() != 0; }
  // Whether this job is leased and its deadline has passed (Admit would
  // refuse), without counting as a refusal.
  bool lapsed() const { return leased() && NowMs() > until_ms_.load(); }
  // For status: "" without a lease, "held: S s left", or "lapsed S s ago:
  // ..." (one line).
  std::string Describe() const;

 private:
  std::atomic<uint64_t> until_ms_{0};  // 0: no lease
  std::atomic<bool> refused_{false};   // a write was refused since the last Extend
};

}  // namespace blkps::server
