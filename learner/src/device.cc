#include "device.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>

namespace blkps {

const char* DirectionName(Direction direction) { return direction == Direction::kRead ? "read" : "write"; }

std::unique_ptr<Device> OpenDevice(const std::string& target, const std::string& initiator_name, Status* status) {
  if (target.rfind("iscsi://", 0) == 0 || target.rfind("iser://", 0) == 0) {
    return OpenIscsiDevice(target, initiator_name, status);
  }
  if (target.rfind("layout:", 0) == 0) {
    return OpenStripedDevice(target.substr(7), initiator_name, status);
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

Status ReadChapFile(const std::string& path, ChapCredentials* out) {
  *out = ChapCredentials{};
  std::ifstream in(path);
  struct stat st {};
  if (!in || stat(path.c_str(), &st) != 0) {
    return Status::Error(ENOENT, "CHAP file %s: cannot read it: %s", path.c_str(), std::strerror(errno));
  }
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    return Status::Error(EPERM, "CHAP file %s is readable by group or others (mode %04o); chmod 600 %s", path.c_str(),
                         static_cast<unsigned>(st.st_mode & 07777), path.c_str());
  }
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
    if (value.find_first_of(" \t") != std::string::npos) {
      return Status::Error(EINVAL, "CHAP file %s:%d: a value holds a space (a comment starts with '#')", path.c_str(),
                           number);
    }
    std::string* field = key == "user"            ? &out->user
                         : key == "secret"        ? &out->secret
                         : key == "target_user"   ? &out->target_user
                         : key == "target_secret" ? &out->target_secret
                                                  : nullptr;
    if (field == nullptr || eq == std::string::npos) {
      return Status::Error(
          EINVAL, "CHAP file %s:%d: expected user=, secret=, target_user= or target_secret=", path.c_str(), number);
    }
    *field = value;
  }
  if (out->user.empty() != out->secret.empty() || out->target_user.empty() != out->target_secret.empty() ||
      (!out->target_user.empty() && out->user.empty())) {
    return Status::Error(EINVAL,
                         "CHAP file %s: needs user= with secret=, and for mutual CHAP target_user= with "
                         "target_secret= as well",
                         path.c_str());
  }
  return Status();
}

}  // namespace blkps
