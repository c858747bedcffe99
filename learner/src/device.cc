#include "device.h"

#include <cerrno>

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
                            target.c_str());
    return nullptr;
  }
  return OpenFileDevice(target, status);
}

}  // namespace blkps
