// What a SCSI sense a learner gets from a blkps target means, in one line.
#ifndef BLKPS_LEARNER_SCSI_SENSE_H_
#define BLKPS_LEARNER_SCSI_SENSE_H_

#include <string>

namespace blkps {

// "<KEY> / <ASC name> (asc/ascq 0xHHHH): <what it means on blkps>", e.g.
// "MEDIUM ERROR / WRITE ERROR (asc/ascq 0x0c00): the server could not write
// its checkpoint (its log and status say why)". `key` is the sense key
// (0..15), `asc_ascq` ASC << 8 | ASCQ. Every pair the blkps server sends
// (target-plugin/bs_blkps.c, complete_io) and those tgt itself sends a
// learner have a meaning; any other pair is named by its numbers.
std::string ScsiSenseMessage(int key, int asc_ascq);

// NOT READY, LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN STANDBY STATE: what
// a shard's backup answers a learner's I/O until it is promoted
// (doc/replicas.md). Nothing was applied; another replica may serve.
constexpr int kStandbySenseKey = 2;
constexpr int kStandbyAscAscq = 0x040b;
inline bool IsStandbySense(int key, int asc_ascq) { return key == kStandbySenseKey && asc_ascq == kStandbyAscAscq; }

}  // namespace blkps

#endif  // BLKPS_LEARNER_SCSI_SENSE_H_
