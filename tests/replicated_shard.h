// A shard and its backup as two real tgtds on loopback (doc/replicas.md),
// for the replica tests: the backup started first (the primary connects to
// it when its model is created), each a TargetProcess.
#ifndef BLKPS_TESTS_REPLICATED_SHARD_H_
#define BLKPS_TESTS_REPLICATED_SHARD_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <blkps/control_lun.h>

#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "raw_lun.h"

#include "target_process.h"

namespace blkps_test {

// A loopback port nobody listens on now (the backup's replication port).
inline int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// Both with `bsopts` and two learner LUNs.
struct ReplicatedShard {
  explicit ReplicatedShard(const std::string& bsopts)
      : address("127.0.0.1:" + std::to_string(FreePort())),
        backup(bsopts + ";backup=" + address, "--luns 2"),
        primary(bsopts + ";replicate_to=" + address, "--luns 2") {}
  const std::string address;
  TargetProcess backup;
  TargetProcess primary;
};

// A control command (doc/server.md "Status and control") through the
// control LUN of `target`; GOOD or the sense.
inline std::string Command(const TargetProcess& target, const std::string& command) {
  RawLun control(target.control_url(), "iqn.2026-11.io.blkps.test:operator");
  std::vector<uint8_t> block(kRawLbaBytes, 0);
  std::memcpy(block.data(), command.data(), command.size());
  return control.Write(BLKPS_CONTROL_COMMANDS_OFFSET / kRawLbaBytes, block);
}

// A lease that lasts the test: the keeper's renewal (control
// lease_until=) as it would send it.
inline std::string LeaseForAMinute() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return "lease_until=" + std::to_string(now.tv_sec * 1000 + now.tv_nsec / 1000000 + 60000);
}

// The status JSON of `target` (its control LUN's first 4 KiB).
inline std::string StatusJson(const TargetProcess& target) {
  RawLun control(target.control_url(), "iqn.2026-11.io.blkps.test:operator");
  std::vector<uint8_t> status;
  control.Read(0, 8, &status);
  return std::string(status.begin(), status.end()).c_str();
}

}  // namespace blkps_test

#endif  // BLKPS_TESTS_REPLICATED_SHARD_H_
