// Control commands for a running Job (written to the control LUN): a rule
// parameter (lr, momentum, beta1, beta2, eps), resume=1, or fence=<lun>
// (job.h, "Receipts"), or stop=1|0.
#include "job.h"

#include <cstdlib>
#include <sstream>

#include "number_text.h"

namespace blkps::server {

namespace {

// The commands a learner sends itself (Job::ControlRights::kLearner).
bool IsLearnerCommand(const std::string& key) { return key == "fence" || key == "tag"; }

}  // namespace

Status Job::Control(const std::string& commands, const std::string& initiator, ControlRights rights) {
  // A refused command stays in the status JSON (control_error) until the next
  // control write succeeds: the writer sees only a SCSI error.
  auto refuse = [this](const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    control_error_ = why;
    return Status::InvalidArgument(why);
  };
  const std::string text = commands.substr(0, commands.find('\0'));
  std::string line;
  if (rights == ControlRights::kLearner) {
    std::istringstream in(text);
    while (std::getline(in, line)) {
      const std::string key = line.substr(0, line.find('='));
      if (line.empty() || line == "\r" || IsLearnerCommand(key)) continue;
      const std::string why = "control: " + key + ": initiator '" + initiator +
                              "' is not an operator of this model (only fence= and tag= are open to learners)";
      refuse(why);
      return Status::PermissionDenied(why);
    }
  }
  std::istringstream in(text);
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const size_t eq = line.find('=');
    const std::string key = line.substr(0, eq), value = eq == std::string::npos ? "" : line.substr(eq + 1);
    if (key == "resume") {
      std::lock_guard<std::mutex> lock(mu_);
      if (FailedLocked()) log_("job resumed by a control write; the failure was: " + failure_);
      failure_.clear();
      failed_.store(false);
      continue;
    }
    if (key == "stop") {
      if (value != "1" && value != "0") return refuse("control: expected stop=1 or stop=0, got '" + line + "'");
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = value == "1";
      log_(stop_ ? "control: stop asked: learners stop training" : "control: stop withdrawn");
      continue;
    }
    if (key == "tag") {
      Status s = SetTag(value);
      if (!s.ok()) return refuse(s.message());
      continue;
    }
    if (key == "fence") {
      char* lun_end = nullptr;
      const unsigned long long lun = std::strtoull(value.c_str(), &lun_end, 10);
      if (value.empty() || *lun_end != '\0') {
        return refuse("control: expected fence=<learner LUN>, got '" + line + "'");
      }
      std::lock_guard<std::mutex> lock(mu_);
      FenceLocked(lun, initiator);
      continue;
    }
    char* end = nullptr;
    const float v = std::strtof(value.c_str(), &end);
    if (eq == std::string::npos || value.empty() || *end != '\0') {
      return refuse("control: expected key=<number>, resume=1, fence=<lun> or tag=<text>, got '" + line + "'");
    }
    Status s = model_->rule().SetParam(key, v);
    if (!s.ok()) return refuse("control: " + s.message());
    log_("control: " + key + " set to " + FloatShort(v));
  }
  std::lock_guard<std::mutex> lock(mu_);
  control_error_.clear();
  return Status::OK();
}

Status Job::SetTag(const std::string& tag) {
  static constexpr size_t kMaxTag = 256;
  const bool plain = tag.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:,=+/-") ==
                     std::string::npos;
  if (tag.size() > kMaxTag || !plain) {
    return Status::InvalidArgument("control: tag: expected at most 256 of [A-Za-z0-9._:,=+/-], got '" + tag + "'");
  }
  std::lock_guard<std::mutex> lock(mu_);
  tag_ = tag;
  return Status::OK();
}

}  // namespace blkps::server
