#include "device.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "session_group.h"

namespace blkps {

const char* DirectionName(Direction direction) { return direction == Direction::kRead ? "read" : "write"; }

Status Device::ReadConsuming(const std::vector<IoRequest>& requests, uint32_t queue_depth, const ConsumeFn& consume) {
  Status status = Transfer(Direction::kRead, requests, queue_depth);
  if (status.ok()) {
    for (size_t k = 0; k < requests.size(); ++k) consume(k);
  }
  return status;
}

Status Device::Exchange(const std::vector<IoRequest>& writes, const std::vector<IoRequest>& reads, uint32_t queue_depth,
                        const ConsumeFn* consume) {
  Status status = Transfer(Direction::kWrite, writes, queue_depth);
  if (!status.ok()) return status;
  return consume != nullptr ? ReadConsuming(reads, queue_depth, *consume)
                            : Transfer(Direction::kRead, reads, queue_depth);
}

Status Device::TransferRows(Direction, const uint64_t*, uint64_t, uint64_t, float*, uint32_t) {
  return Status::Error(ENOTSUP, "this device has no row windows (a blkps table's control LUN): rows go by their bytes");
}

std::unique_ptr<Device> OpenDevice(const std::string& target, const std::string& initiator_name, Status* status) {
  return OpenDevice(target, initiator_name, 1, status);
}

std::unique_ptr<Device> OpenDevice(const std::string& target, const std::string& initiator_name, uint32_t sessions,
                                   Status* status) {
  if (target.rfind("iscsi://", 0) == 0 || target.rfind("iser://", 0) == 0) {
    return sessions > 1 ? OpenSessionGroup(target, initiator_name, sessions, status)
                        : OpenIscsiDevice(target, initiator_name, status);
  }
  if (target.rfind("layout:", 0) == 0) {
    return OpenStripedDevice(target.substr(7), initiator_name, sessions, status);
  }
  if (sessions > 1) {
    *status = Status::Error(EINVAL,
                            "%s: several sessions (sessions=%u) need an iscsi://, iser:// or layout: target; a "
                            "path has no session: open it with sessions 0 or 1",
                            MaskTarget(target).c_str(), sessions);
    return nullptr;
  }
  if (target.find("://") != std::string::npos) {
    *status = Status::Error(EINVAL,
                            "unsupported target '%s'; expected a file or block device path, "
                            "iscsi://host[:port]/<target-iqn>/<lun>, iser://... or layout:PATH",
                            MaskTarget(target).c_str());
    return nullptr;
  }
  return OpenFileDevice(target, status);
}

std::string MaskTarget(const std::string& target) {
  const size_t scheme = target.find("://");
  if (scheme == std::string::npos) return target;
  std::string masked = target;
  const size_t host = scheme + 3, at = masked.find('@', host), slash = masked.find('/', host);
  if (at != std::string::npos && (slash == std::string::npos || at < slash)) masked.replace(host, at - host, "***");
  const size_t query = masked.find('?');
  if (query != std::string::npos) masked.replace(query + 1, std::string::npos, "***");
  return masked;
}

namespace {

constexpr size_t kSecretMin = 12, kSecretMax = 16;

bool IsChapName(const std::string& v) {
  if (v.empty() || v.size() > 64) return false;
  for (const char c : v) {
    const bool alnum = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    if (!alnum && c != '.' && c != '_' && c != ':' && c != '-') return false;
  }
  return true;
}

bool IsChapSecret(const std::string& v) {
  if (v.size() < kSecretMin || v.size() > kSecretMax) return false;
  for (const char c : v) {
    if (c < 0x21 || c > 0x7e || std::strchr(",%@/\\\"'", c) != nullptr) return false;
  }
  return true;
}

}  // namespace

// The grammar, rules and messages of scripts/blkps_cli/chap.py, exactly:
// tests/chap_files/ holds the samples both are checked against.
Status ReadChapFile(const std::string& path, ChapCredentials* out) {
  *out = ChapCredentials{};
  std::ifstream in(path, std::ios::binary);
  struct stat st {};
  if (!in || stat(path.c_str(), &st) != 0) {
    return Status::Error(ENOENT, "CHAP file %s: cannot read it: %s", path.c_str(), std::strerror(errno));
  }
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    return Status::Error(EPERM, "CHAP file %s is readable by group or others (mode %04o); chmod 600 %s", path.c_str(),
                         static_cast<unsigned>(st.st_mode & 07777), path.c_str());
  }
  bool seen[4] = {};
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    // A '#' starts a comment at the start of a line or after a space or tab
    // (a secret may hold '#', never a space).
    const size_t blank = line.find_first_of(" \t");
    const size_t comment = line[0] == '#' ? 0 : line.find('#', blank == std::string::npos ? line.size() : blank);
    const std::string rest = comment == std::string::npos ? line : line.substr(0, comment);
    const size_t end = rest.find_last_not_of(" \t");
    if (end == std::string::npos) continue;
    line = rest.substr(0, end + 1);
    const size_t eq = line.find('=');
    const std::string key = line.substr(0, eq), value = eq == std::string::npos ? "" : line.substr(eq + 1);
    static const char* const kKeys[] = {"user", "secret", "target_user", "target_secret"};
    std::string* const fields[] = {&out->user, &out->secret, &out->target_user, &out->target_secret};
    const auto k = std::find(std::begin(kKeys), std::end(kKeys), key) - std::begin(kKeys);
    if (eq == std::string::npos || k == 4) {
      return Status::Error(
          EINVAL, "CHAP file %s:%d: expected user=, secret=, target_user= or target_secret=", path.c_str(), number);
    }
    if (value.find_first_of(" \t") != std::string::npos) {
      return Status::Error(EINVAL, "CHAP file %s:%d: a value holds a space (a comment starts with '#')", path.c_str(),
                           number);
    }
    if (seen[k]) return Status::Error(EINVAL, "CHAP file %s:%d: %s= is given twice", path.c_str(), number, kKeys[k]);
    if (k % 2 == 0 && !IsChapName(value)) {
      return Status::Error(EINVAL, "CHAP file %s:%d: %s= must be 1 to 64 of A-Z a-z 0-9 . _ : -", path.c_str(), number,
                           kKeys[k]);
    }
    if (k % 2 == 1 && !IsChapSecret(value)) {
      return Status::Error(EINVAL,
                           "CHAP file %s:%d: %s= must be %zu to %zu printable ASCII characters without space , %% @ / "
                           "\\ \" ' (it has %zu)",
                           path.c_str(), number, kKeys[k], kSecretMin, kSecretMax, value.size());
    }
    seen[k] = true;
    *fields[k] = value;
  }
  if (!seen[0] || !seen[1] || seen[2] != seen[3]) {
    return Status::Error(EINVAL,
                         "CHAP file %s: needs user= with secret=, and for mutual CHAP target_user= with "
                         "target_secret= as well",
                         path.c_str());
  }
  if (seen[2] && (out->target_user == out->user || out->target_secret == out->secret)) {
    return Status::Error(EINVAL,
                         "CHAP file %s: the target's account must differ from the initiator's in target_user= and "
                         "target_secret=",
                         path.c_str());
  }
  return Status();
}

}  // namespace blkps
