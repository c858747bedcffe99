// The network side of replicas (doc/replicas.md): a primary's TCP link to
// its backup (ReplicaLink, the job's ReplicaChannel) and a backup's
// replication port (ReplicaListener), speaking the frames of
// wire/include/blkps/replication.h. The records and what a job does with
// them are the aggregator's (aggregator/replication.h, job.h "Replicas").
#pragma once

#include <netinet/in.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "job.h"
#include "mutex.h"
#include "replication.h"
#include "status.h"

namespace blkps::server {

// "HOST:PORT" (HOST a numeric IPv4 address, PORT in [1, 65535]) into *out;
// InvalidArgument with what was expected. The one parser of the replica
// options' addresses (replicate_to=, backup=).
Status ParseReplicaAddress(const std::string& text, sockaddr_in* out);

// A primary's connection to its backup. Push() may be called from any
// number of threads: frames go out one at a time, each waits for its own
// acknowledgement (the backup applies and acknowledges in order). Once the
// link breaks (connection lost, a refusal, no acknowledgement within
// kAckTimeoutSeconds) every Push fails with the reason: a link is never
// repaired (doc/replicas.md "When a WRITE completes").
class ReplicaLink : public ReplicaChannel {
 public:
  // Under the initiators' ~30 s command timeout, with room for the rest of
  // the WRITE.
  static constexpr double kAckTimeoutSeconds = 10;

  // Connects to the backup at `address` (ParseReplicaAddress). Unavailable
  // with the reason if it cannot.
  static Status Connect(const std::string& address, std::shared_ptr<ReplicaLink>* out);
  ~ReplicaLink() override;
  ReplicaLink(const ReplicaLink&) = delete;
  ReplicaLink& operator=(const ReplicaLink&) = delete;

  // Hello waits kAckTimeoutSeconds for the answer.
  Status Hello(const std::string& body) override;
  Status Send(Record kind, const std::string& body) override;
  std::string peer() const override { return address_; }

 private:
  ReplicaLink(int fd, std::string address) : fd_(fd), address_(std::move(address)) {}
  // The reader thread: acknowledgements until the link breaks.
  void ReadAcks();
  // The link is broken for `why` (the first reason stays).
  void Break(const std::string& why);
  // Wakes the senders whose records are acknowledged (all of them once the
  // link is broken).
  void WakeLocked() REQUIRES(ack_mu_);

  const int fd_;
  const std::string address_;
  Mutex send_mu_;  // one frame at a time; sequences in the order sent
  uint64_t sent_ GUARDED_BY(send_mu_) = 0;
  Mutex ack_mu_;
  // The senders waiting, by their record's sequence, each on its own
  // condition (with ack_mu_): an acknowledgement wakes only those it
  // answers, not every writer of the LUN.
  std::map<uint64_t, std::condition_variable*> waiting_ GUARDED_BY(ack_mu_);
  uint64_t acked_ GUARDED_BY(ack_mu_) = 0;  // every record up to it is applied
  std::string broken_ GUARDED_BY(ack_mu_);  // non-empty: why the link is broken
  std::thread reader_;
};

// A primary's watch for the return of its backup at `address`
// (doc/replicas.md "A backup that returns"): every kRetrySeconds while the
// job's backup is outdated, connects to it and catches it up
// (Job::CatchUp), logging each new reason it could not. Holds the job
// weakly; destroying it stops the watch (and waits for a catch-up under
// way).
class BackupRejoiner {
 public:
  using Logger = std::function<void(const std::string&)>;
  static constexpr double kRetrySeconds = 1;
  BackupRejoiner(std::string address, std::weak_ptr<Job> job, Logger log);
  ~BackupRejoiner();
  BackupRejoiner(const BackupRejoiner&) = delete;
  BackupRejoiner& operator=(const BackupRejoiner&) = delete;

 private:
  void Watch();  // the thread
  const std::string address_;
  const std::weak_ptr<Job> job_;
  const Logger log_;
  Mutex mu_;
  std::condition_variable stop_cv_;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// A backup's replication port: follows one connection of its primary at a
// time, a new one ending the one before (the primary counted it lost).
// The first connection may follow from a write's record on; every later
// one only from a catch-up's SNAPSHOT_BEGIN (a write's record before it
// is refused): a catch-up refused or broken is tried again. Records are
// applied to the job in the order they arrive, each acknowledged once
// applied; a promoted job refuses them all. Holds the job weakly: the
// job's LUNs decide its life.
class ReplicaListener {
 public:
  using Logger = std::function<void(const std::string&)>;
  // Listens on `address` (ParseReplicaAddress) for `job`'s primary;
  // Unavailable with the reason if it cannot (a port in use).
  static Status Listen(const std::string& address, std::weak_ptr<Job> job, Logger log,
                       std::unique_ptr<ReplicaListener>* out);
  ~ReplicaListener();  // stops listening and following; joins its threads
  ReplicaListener(const ReplicaListener&) = delete;
  ReplicaListener& operator=(const ReplicaListener&) = delete;

 private:
  ReplicaListener(int fd, std::weak_ptr<Job> job, Logger log) : listen_fd_(fd), job_(std::move(job)), log_(log) {}
  void Accept();  // the acceptor thread
  // The follower thread: one connection's frames; `snapshot_first`: a
  // write's record is refused until a catch-up began.
  void Follow(int fd, bool snapshot_first);
  const int listen_fd_;
  const std::weak_ptr<Job> job_;
  const Logger log_;
  Mutex mu_;
  int follow_fd_ GUARDED_BY(mu_) = -1;     // the primary's connection, while followed
  bool followed_ GUARDED_BY(mu_) = false;  // a connection was followed
  bool stopping_ GUARDED_BY(mu_) = false;
  std::thread acceptor_;
  std::thread follower_;  // started and joined by the acceptor, joined last by the destructor
};

}  // namespace blkps::server
