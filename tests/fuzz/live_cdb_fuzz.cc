// live_cdb_fuzz: random SCSI commands against a real tgtd serving blkps.
//
// Starts its own target (tests/target_process.h: a private tgtd with the
// built plugin preloaded, 2 learner LUNs and the control LUN) and sends
// --commands raw CDBs over one libiscsi session: every opcode in turn
// (0x00..0xff, then again) alternating with opcodes tgt serves for blkps
// LUNs, random bytes with LBA and transfer length fields biased to the edges
// of the device, data-out of 0..64 KiB, on learner LUNs, the control LUN and
// LUN 0. A command may fail in any way (sense data, a dropped connection that
// libiscsi reconnects); what must hold:
//   - tgtd never dies;
//   - tgtd never hangs: after any transport error a new session gets an
//     answer to TEST UNIT READY, and no command goes unanswered for
//     kStuckS (a watchdog thread; libiscsi's own loop would retry forever
//     against a dead target);
//   - tgtd does not grow: its RSS at the end is within --rss-growth-kib of
//     its RSS after the first tenth of the commands (warm-up).
// Prints one line of counts; exits 1 with the reason (and tgtd's log tail)
// when a check fails, with the command it was sending (LUN, CDB, data
// length) to replay. Needs root, as tgtd does.
//
// Usage: live_cdb_fuzz [--commands N] [--seed S] [--rss-growth-kib K]
//                      [--plugin PATH]   (another bs_blkps.so, e.g. build/asan's)
#include <iscsi/iscsi.h>
#include <iscsi/scsi-lowlevel.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "raw_lun.h"
#include "target_process.h"

namespace {

constexpr uint64_t kParams = 262144;  // a 1 MiB model
constexpr uint64_t kModelBlocks = kParams * 4 / 512;
constexpr uint32_t kMaxData = 64 << 10;
constexpr int kStuckS = 60;  // no progress this long: tgtd hangs

// Opcodes the plugin's opcode map sends to tgt's handlers or to the plugin
// (target-plugin/bs_blkps.c), and a few neighbours tgt refuses.
constexpr uint8_t kServed[] = {
    0x00 /* TEST UNIT READY */,
    0x03 /* REQUEST SENSE */,
    0x08 /* READ(6) */,
    0x0a /* WRITE(6) */,
    0x12 /* INQUIRY */,
    0x15 /* MODE SELECT(6) */,
    0x16 /* RESERVE */,
    0x17 /* RELEASE */,
    0x1a /* MODE SENSE(6) */,
    0x1b /* START STOP UNIT */,
    0x1d /* SEND DIAGNOSTIC */,
    0x1e /* PREVENT ALLOW MEDIUM REMOVAL */,
    0x25 /* READ CAPACITY(10) */,
    0x28 /* READ(10) */,
    0x2a /* WRITE(10) */,
    0x2f /* VERIFY(10) */,
    0x35 /* SYNCHRONIZE CACHE(10) */,
    0x41 /* WRITE SAME(10) */,
    0x42 /* UNMAP */,
    0x55 /* MODE SELECT(10) */,
    0x5a /* MODE SENSE(10) */,
    0x5e /* PERSISTENT RESERVE IN */,
    0x5f /* PERSISTENT RESERVE OUT */,
    0x88 /* READ(16) */,
    0x89 /* COMPARE AND WRITE */,
    0x8a /* WRITE(16) */,
    0x91 /* SYNCHRONIZE CACHE(16) */,
    0x93 /* WRITE SAME(16) */,
    0x9e /* SERVICE ACTION IN(16) */,
    0xa0 /* REPORT LUNS */,
    0xa3 /* MAINTENANCE IN */,
    0xa8 /* READ(12) */,
    0xaa /* WRITE(12) */,
};

bool IsDataOut(uint8_t op) {
  switch (op) {
    case 0x0a:
    case 0x15:
    case 0x1d:
    case 0x2a:
    case 0x2e:
    case 0x41:
    case 0x42:
    case 0x55:
    case 0x5f:
    case 0x89:
    case 0x8a:
    case 0x8e:
    case 0x93:
    case 0xaa:
    case 0xae: return true;
  }
  return false;
}

// The CDB length of an opcode's group (SPC-4 4.2.5.1); vendor groups random.
int CdbLength(uint8_t op, std::mt19937_64& rng) {
  switch (op >> 5) {
    case 0: return 6;
    case 1:
    case 2: return 10;
    case 4: return 16;
    case 5: return 12;
    default: {
      static constexpr int kLengths[] = {6, 10, 12, 16};
      return kLengths[rng() % 4];
    }
  }
}

// An LBA at an interesting place: start, inside, last block, just past the
// end, or anywhere in 64 bits.
uint64_t PickLba(std::mt19937_64& rng) {
  switch (rng() % 6) {
    case 0: return 0;
    case 1:
    case 2: return rng() % kModelBlocks;
    case 3: return kModelBlocks - 1 - rng() % 4;
    case 4: return kModelBlocks + rng() % 4;
    default: return rng();
  }
}

uint32_t PickBlocks(std::mt19937_64& rng) {
  switch (rng() % 5) {
    case 0: return 0;
    case 1: return 1;
    case 2:
    case 3: return 1 + rng() % (kMaxData / 512);
    default: return static_cast<uint32_t>(rng());
  }
}

void PutBig(uint8_t* at, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i, v >>= 8) at[i] = static_cast<uint8_t>(v);
}

// Random bytes, with the LBA and transfer length fields of the read/write
// layouts of the opcode's group set to picked values three times in four.
std::vector<uint8_t> RandomCdb(uint8_t op, std::mt19937_64& rng) {
  std::vector<uint8_t> cdb(CdbLength(op, rng));
  for (auto& b : cdb) b = static_cast<uint8_t>(rng());
  cdb[0] = op;
  if (rng() % 4 == 0) return cdb;
  if (rng() % 2) cdb[1] &= 0x1f;  // no protection/flags bits, half the time
  const uint64_t lba = PickLba(rng);
  const uint32_t blocks = PickBlocks(rng);
  switch (cdb.size()) {
    case 6:
      PutBig(&cdb[1], lba & 0x1fffff, 3);
      cdb[4] = static_cast<uint8_t>(blocks);
      break;
    case 10:
      PutBig(&cdb[2], lba, 4);
      PutBig(&cdb[7], blocks, 2);
      break;
    case 12:
      PutBig(&cdb[2], lba, 4);
      PutBig(&cdb[6], blocks, 4);
      break;
    case 16:
      PutBig(&cdb[2], lba, 8);
      PutBig(&cdb[10], blocks, 4);
      break;
  }
  cdb.back() = 0;  // CONTROL: no NACA, no linking
  return cdb;
}

// Data for a data-out command: usually whole blocks (sometimes a control
// command's text), sometimes any length.
std::vector<uint8_t> RandomData(std::mt19937_64& rng) {
  const uint32_t len = rng() % 4 ? 512 * (rng() % (kMaxData / 512 + 1)) : rng() % (kMaxData + 1);
  std::vector<uint8_t> data(len);
  if (rng() % 4 == 0) {
    static constexpr const char* kCommands[] = {"lr=0.5\n", "resume=1\n", "beta1=2\n", "lr=nan\n", "x"};
    const std::string text = kCommands[rng() % 5];
    for (size_t i = 0; i < len; ++i) data[i] = i < text.size() ? text[i] : 0;
    return data;
  }
  // Small finite floats: a gradient the model accepts, unless a byte flips.
  std::uniform_real_distribution<float> g(-1, 1);
  for (size_t i = 0; i + 4 <= len; i += 4) {
    const float f = g(rng);
    std::memcpy(&data[i], &f, 4);
  }
  if (len && rng() % 8 == 0) data[rng() % len] = static_cast<uint8_t>(rng());
  return data;
}

long RssKib(const std::string& pid) {
  std::ifstream in("/proc/" + pid + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  return -1;
}

// The command being sent, for the report of a failure.
struct Progress {
  std::atomic<uint64_t> sent{0};
  std::mutex mu;
  std::string command;  // guarded by mu
};

std::string Describe(uint64_t i, int lun, const std::vector<uint8_t>& cdb, int dir, size_t len) {
  std::string s = "command " + std::to_string(i) + ": lun " + std::to_string(lun) + " cdb";
  char hex[4];
  for (uint8_t b : cdb) {
    std::snprintf(hex, sizeof(hex), " %02x", b);
    s += hex;
  }
  return s +
         (dir == SCSI_XFER_WRITE  ? " data-out "
          : dir == SCSI_XFER_READ ? " data-in "
                                  : " no data ") +
         std::to_string(len) + " bytes";
}

int Fail(const blkps_test::TargetProcess& target, const std::string& why) {
  std::fprintf(stderr, "live_cdb_fuzz: FAILED: %s\n", why.c_str());
  const std::string log = target.Log();
  std::fprintf(stderr, "--- %s/tgtd.log (tail) ---\n%s\n", target.dir().c_str(),
               log.substr(log.size() > 4000 ? log.size() - 4000 : 0).c_str());
  return 1;
}

// Watches tgtd and the sender from its own thread; on a dead or stuck tgtd
// reports the command being sent and exits the process (the target's
// --owner-pid watchdog then stops tgtd; its folder is kept for the log).
void Watch(const blkps_test::TargetProcess& target, Progress& progress, const std::atomic<bool>& done) {
  uint64_t last = progress.sent.load();
  auto moved = std::chrono::steady_clock::now();
  while (!done.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const uint64_t now = progress.sent.load();
    if (now != last) {
      last = now;
      moved = std::chrono::steady_clock::now();
    }
    const bool dead = !target.TgtdAlive();
    if (dead || std::chrono::steady_clock::now() - moved > std::chrono::seconds(kStuckS)) {
      std::lock_guard<std::mutex> lock(progress.mu);
      std::fflush(stdout);
      _exit(Fail(target, std::string(dead ? "tgtd died" : "tgtd stopped answering") + " during " + progress.command));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t commands = 100000, seed = 1;
  long rss_growth_kib = 16 << 10;
  std::string plugin_option;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    if (key == "--commands") commands = std::strtoull(argv[i + 1], nullptr, 10);
    else if (key == "--seed") seed = std::strtoull(argv[i + 1], nullptr, 10);
    else if (key == "--rss-growth-kib") rss_growth_kib = std::atol(argv[i + 1]);
    else if (key == "--plugin") plugin_option = " --plugin " + blkps_test::ShellQuote(argv[i + 1]);
    else {
      std::fprintf(stderr, "live_cdb_fuzz: unknown option '%s' (use --commands, --seed, --rss-growth-kib, --plugin)\n",
                   argv[i]);
      return 2;
    }
  }
  blkps_test::TargetProcess target("params=" + std::to_string(kParams) + ";block=64K;rule=sgd;lr=0.001",
                                   "--luns 2" + plugin_option);
  if (!target.ok()) {
    std::fprintf(stderr, "live_cdb_fuzz: target did not start:\n%s\n", target.start_output().c_str());
    return 1;
  }
  const int luns[] = {1, 2, 3 /* control */, 1, 3, 0 /* tgt's controller LUN */};
  const std::string initiator = "iqn.2026-11.io.blkps:cdb-fuzz";
  blkps_test::RawLun session(target.url(1), initiator);
  if (!session.connected()) return Fail(target, "cannot log in: " + session.error());

  Progress progress;
  std::atomic<bool> done{false};
  std::thread watchdog(Watch, std::cref(target), std::ref(progress), std::cref(done));
  auto stop_watching = [&](int rc) {
    done.store(true);
    watchdog.join();
    return rc;
  };
  std::mt19937_64 rng(seed);
  uint64_t good = 0, check = 0, other = 0, dropped = 0;
  long rss_warm = -1, rss_peak = 0;
  for (uint64_t i = 0; i < commands; ++i) {
    const uint8_t op = i % 2 ? kServed[rng() % sizeof(kServed)] : static_cast<uint8_t>(i / 2);
    std::vector<uint8_t> cdb = RandomCdb(op, rng);
    const int lun = luns[rng() % 6];
    std::vector<uint8_t> data;
    int dir = SCSI_XFER_WRITE;
    uint32_t expected;
    if (IsDataOut(op) || rng() % 16 == 0) {
      data = RandomData(rng);
      expected = static_cast<uint32_t>(data.size());
    } else {
      expected = rng() % 4 ? rng() % (kMaxData + 1) : 0;
      dir = expected ? SCSI_XFER_READ : SCSI_XFER_NONE;
    }
    {
      std::lock_guard<std::mutex> lock(progress.mu);
      progress.command = Describe(i, lun, cdb, dir, expected);
    }
    const int status = session.Command(lun, cdb, dir, expected, dir == SCSI_XFER_WRITE ? &data : nullptr);
    progress.sent.fetch_add(1);
    if (status == SCSI_STATUS_GOOD) ++good;
    else if (status == SCSI_STATUS_CHECK_CONDITION) ++check;
    else if (status >= 0) ++other;
    else {
      ++dropped;
      if (!target.TgtdAlive()) return stop_watching(Fail(target, "tgtd died after command " + std::to_string(i)));
      blkps_test::RawLun probe(target.url(1), initiator + "-probe");
      std::vector<uint8_t> tur(6, 0);
      if (!probe.connected() || probe.Command(1, tur, SCSI_XFER_NONE, 0, nullptr) < 0) {
        return stop_watching(Fail(
            target, "tgtd does not answer a new session after command " + std::to_string(i) + ": " + probe.error()));
      }
    }
    if (i % 1000 == 999) {
      const long rss = RssKib(target.pid());
      if (rss < 0)
        return stop_watching(Fail(target, "tgtd is gone (no /proc entry) after command " + std::to_string(i)));
      if (i + 1 >= commands / 10 && rss_warm < 0) rss_warm = rss;
      if (rss > rss_peak) rss_peak = rss;
      if ((i + 1) % std::max<uint64_t>(commands / 10 / 1000 * 1000, 1000) == 0) {
        std::printf("live_cdb_fuzz: %llu commands, tgtd RSS %ld KiB\n", static_cast<unsigned long long>(i + 1), rss);
        std::fflush(stdout);
      }
    }
  }
  stop_watching(0);
  if (!target.TgtdAlive()) return Fail(target, "tgtd died");
  const long rss_end = RssKib(target.pid());
  std::printf("live_cdb_fuzz: %llu commands (seed %llu): %llu good, %llu check condition, %llu other status, "
              "%llu without an answer (connection dropped or refused; reconnected); tgtd alive, "
              "RSS %ld KiB after warm-up, %ld KiB peak, %ld KiB at the end\n",
              static_cast<unsigned long long>(commands), static_cast<unsigned long long>(seed),
              static_cast<unsigned long long>(good), static_cast<unsigned long long>(check),
              static_cast<unsigned long long>(other), static_cast<unsigned long long>(dropped), rss_warm, rss_peak,
              rss_end);
  if (rss_warm >= 0 && rss_end - rss_warm > rss_growth_kib) {
    return Fail(target, "tgtd grew by " + std::to_string(rss_end - rss_warm) + " KiB (bound " +
                            std::to_string(rss_growth_kib) + " KiB)");
  }
  return 0;
}
