#include "scsi_sense.h"

#include <cstdio>

namespace blkps {
namespace {

const char* KeyName(int key) {
  static const char* const kNames[16] = {"NO SENSE",       "RECOVERED ERROR", "NOT READY",      "MEDIUM ERROR",
                                         "HARDWARE ERROR", "ILLEGAL REQUEST", "UNIT ATTENTION", "DATA PROTECT",
                                         "BLANK CHECK",    "VENDOR SPECIFIC", "COPY ABORTED",   "ABORTED COMMAND",
                                         "RESERVED (0xC)", "VOLUME OVERFLOW", "MISCOMPARE",     "COMPLETED"};
  return key >= 0 && key < 16 ? kNames[key] : "UNKNOWN SENSE KEY";
}

struct Meaning {
  int key;  // -1: any key
  int asc_ascq;
  const char* name;
  const char* meaning;
};

// The blkps server's senses first (bs_blkps.c, complete_io), then tgt's.
constexpr Meaning kMeanings[] = {
    {5, 0x2100, "LBA OUT OF RANGE", "the request passes the end of the LUN (the model's device or the control LUN)"},
    {5, 0x2600, "INVALID FIELD IN PARAMETER LIST",
     "the server refused the data: a gradient with NaN or Inf, a bad control command (the status's control_error says "
     "which), or bytes of a 16-bit LUN that split a value"},
    {2, 0x3a00, "MEDIUM NOT PRESENT", "no model is open on this LUN (the target is starting or stopping)"},
    {11, 0x2e00, "INSUFFICIENT TIME FOR OPERATION",
     "the server held the command past its hold limit (bsp/ssp waiting on a slower learner) or fenced it after a "
     "reconnect; the status says who is behind"},
    {2, 0x0403, "MANUAL INTERVENTION REQUIRED",
     "the job failed (too many dead learners, or another failure the status's \"failure\" names); an operator "
     "resumes it with resume=1"},
    {7, 0x2700, "WRITE PROTECTED",
     "this region or LUN is read-only to this session: the control LUN's status, counters and receipts, or the "
     "weights and operator commands on the learners' control LUN"},
    {kStandbySenseKey, kStandbyAscAscq, "LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN STANDBY STATE",
     "this server is a shard's backup on standby: it serves learners once promoted (blkps target promote); a layout "
     "that lists the shard's replicas has libblkps follow to the one that serves"},
    {3, 0x0c00, "WRITE ERROR", "the server could not write its checkpoint (its log and status say why)"},
    {5, 0x5503, "INSUFFICIENT RESOURCES",
     "a hashed table is full: the push needed rows it cannot make and nothing was applied; give its server an "
     "eviction rule (--bsopts evict=lru-push or evict=idle:N) or a larger table=hash:CAPACITY or memory="},
    {5, 0x2000, "INVALID COMMAND OPERATION CODE",
     "the LUN does not take this SCSI command (a hashed table's learner LUN takes no READ or WRITE: use pull_rows "
     "and push_rows)"},
    {5, 0x2400, "INVALID FIELD IN CDB", "the target refused a field of the command itself"},
    {5, 0x2500, "LOGICAL UNIT NOT SUPPORTED", "no such LUN on this target"},
    {6, 0x2900, "POWER ON OR RESET", "the target or LUN was reset; the command was not run, send it again"},
    {6, 0x3f0e, "REPORTED LUNS DATA HAS CHANGED", "the target's LUNs changed; the command was not run"},
    {4, 0x4400, "INTERNAL TARGET FAILURE", "the target failed internally (its log says why)"},
    {3, 0x1100, "UNRECOVERED READ ERROR", "the target could not read the data"},
    {2, 0x0400, "LOGICAL UNIT NOT READY", "the LUN is not ready"},
    {11, 0x0000, "NO ADDITIONAL SENSE", "the target aborted the command"},
};

}  // namespace

std::string ScsiSenseMessage(int key, int asc_ascq) {
  char numbers[32];
  std::snprintf(numbers, sizeof numbers, "asc/ascq 0x%04x", asc_ascq & 0xffff);
  for (const Meaning& m : kMeanings) {
    if (m.key == key && m.asc_ascq == asc_ascq) {
      return std::string(KeyName(key)) + " / " + m.name + " (" + numbers + "): " + m.meaning;
    }
  }
  return std::string(KeyName(key)) + " (" + numbers +
         "): not a sense the blkps server sends; see SPC-4's ASC/ASCQ table";
}

}  // namespace blkps
