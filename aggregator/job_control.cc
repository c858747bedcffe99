// Control commands for a running Job (written to the control LUN): a rule
// parameter (lr, momentum, beta1, beta2, eps), resume=1, fence=<lun>,
// stop=1|0, tag=<text>, rank=<rank>:<run>, pipeline=<lun>:<depth>,
// lease_until=<ms> (job.h, "Receipts", "Replicas", Control) or
// checkpoint=1, promote=1, backup_outdated=1 or replicate_to=<host:port>,
// alone.
// One grammar, one parser: a block is parsed and checked whole, then
// applied whole or not at all.
#include "job.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>

#include "number_text.h"

namespace blkps::server {

namespace {

// The commands a learner sends itself (Job::ControlRights::kLearner).
bool IsLearnerCommand(const std::string& key) {
  return key == "fence" || key == "tag" || key == "rank" || key == "pipeline";
}

// A key: lower-case letters, digits and '_'. Any key but the commands
// Control() takes names a rule parameter, which the rule checks.
bool IsKey(const std::string& key) {
  return !key.empty() && key.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") == std::string::npos;
}

// Printable ASCII other than space: what a key or a value may hold.
bool IsWordByte(char c) { return c > 0x20 && c < 0x7f; }

// `text` for a message: printable ASCII as is, other bytes (and '\\') as
// \xNN, at most 80 bytes shown.
std::string ShowBytes(const std::string& text) {
  static constexpr size_t kMaxShown = 80;
  std::string out;
  for (size_t i = 0; i < text.size() && i < kMaxShown; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return text.size() > kMaxShown ? out + "..." : out;
}

}  // namespace

Status Job::Control(const std::string& commands, const Initiator& initiator, ControlRights rights) {
  // A refused command stays in the status JSON (control_error) until the next
  // control write succeeds: the writer sees only a SCSI error. Every refusal
  // is counted (control_refused).
  auto refuse = [this](Status why) {
    MutexLock lock(&mu_);
    control_error_ = why.message();
    ++control_refused_;
    return why;
  };
  auto bad = [&](const std::string& why) { return refuse(Status::InvalidArgument("control: " + why)); };

  // Parse: the text, then NUL padding only.
  const size_t nul = std::min(commands.find('\0'), commands.size());
  if (commands.find_first_not_of('\0', nul) != std::string::npos) {
    return bad("bytes after the NUL padding at byte " + std::to_string(nul) +
               ": a block is key=value lines, then NULs to its end");
  }
  std::string text = commands.substr(0, nul);
  if (!text.empty() && text.back() == '\n') text.pop_back();
  struct Line {
    std::string key, value;
  };
  std::vector<Line> lines;
  std::set<std::string> seen;
  for (size_t start = 0; !text.empty() && start <= text.size();) {
    const size_t end = std::min(text.find('\n', start), text.size());
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    const size_t eq = line.find('=');
    const std::string key = line.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : line.substr(eq + 1);
    if (eq == std::string::npos || !IsKey(key)) {
      return bad("expected lr|momentum|beta1|beta2|eps=<number>, resume=1, stop=1|0, fence=<learner LUN>, tag=<text>, "
                 "rank=<rank>:<run>, pipeline=<learner LUN>:<depth>, lease_until=<ms>, checkpoint=1, promote=1, "
                 "backup_outdated=1 or replicate_to=<host:port>, one a line, got '" +
                 ShowBytes(line) + "'");
    }
    if (!std::all_of(value.begin(), value.end(), IsWordByte)) {
      return bad(key + ": the value holds a space or a byte outside printable ASCII: '" + ShowBytes(line) + "'");
    }
    if (!seen.insert(key).second) return bad(key + ": given twice in one write");
    lines.push_back({key, value});
  }

  // Check, nothing applied yet.
  if (rights == ControlRights::kLearner) {
    for (const Line& l : lines) {
      if (IsLearnerCommand(l.key)) continue;
      return refuse(Status::PermissionDenied(
          "control: " + l.key +
          ": the learners' control LUN takes only fence=, tag=, rank= and pipeline=; "
          "operators write through the model's operator target (blkps target start --operator)"));
    }
  }
  // checkpoint=1 comes alone: it is the one command that can fail once
  // applied, and a block is applied whole or not at all.
  if (std::any_of(lines.begin(), lines.end(), [](const Line& l) { return l.key == "checkpoint"; })) {
    if (lines.size() != 1 || lines[0].value != "1") {
      return bad("checkpoint: expected checkpoint=1, alone in its write");
    }
    Status s = Checkpoint();
    if (s.ok() && opts_.checkpoint.empty()) {
      s = Status::InvalidArgument("control: checkpoint: this model has no checkpoint= file");
    }
    MutexLock lock(&mu_);
    control_error_ = s.ok() ? "" : s.message();
    return s;
  }
  // promote=1 (a backup serves learners from now on; doc/replicas.md) comes
  // alone too: it fails on a server that is not a backup.
  if (std::any_of(lines.begin(), lines.end(), [](const Line& l) { return l.key == "promote"; })) {
    if (lines.size() != 1 || lines[0].value != "1") return bad("promote: expected promote=1, alone in its write");
    Status s = Promote();
    return s.ok() ? s : refuse(s);
  }
  // backup_outdated=1 (a lease keeper's verdict on a lost backup, after it
  // recorded it in etcd; backup_verdict.h) comes alone too: it fails on a
  // primary whose backup is not lost.
  if (std::any_of(lines.begin(), lines.end(), [](const Line& l) { return l.key == "backup_outdated"; })) {
    if (lines.size() != 1 || lines[0].value != "1") {
      return bad("backup_outdated: expected backup_outdated=1, alone in its write");
    }
    Status s = backup_.DeclareOutdated();
    if (!s.ok()) return refuse(s);
    log_("backup declared outdated by the lease keeper: this primary acknowledges writes alone from now on "
         "(degraded); the backup must not be promoted");
    return s;
  }
  // replicate_to=HOST:PORT (a new backup for a primary without one, a
  // promoted one: doc/replicas.md "A new backup") comes alone too.
  if (std::any_of(lines.begin(), lines.end(), [](const Line& l) { return l.key == "replicate_to"; })) {
    if (lines.size() != 1) return bad("replicate_to: expected replicate_to=<host:port>, alone in its write");
    Status s = ReplicateTo(lines[0].value);
    return s.ok() ? s : refuse(s);
  }
  // Whether `text` is the number of one of this model's learner LUNs (*lun).
  auto learner_lun = [this](const std::string& text, uint64_t* lun) {
    const bool digits = !text.empty() && text.size() <= 19 && text.find_first_not_of("0123456789") == std::string::npos;
    *lun = digits ? std::strtoull(text.c_str(), nullptr, 10) : 0;
    MutexLock lock(&mu_);
    return digits && std::any_of(slots_.begin(), slots_.end(), [&](const Slot& s) { return s.lun == *lun; });
  };
  std::map<std::string, float> params;
  bool resume = false;
  std::optional<bool> stop;
  uint64_t fence_lun = 0;
  bool fence = false;
  uint64_t ended_session = 0;                            // fence=<lun>:<session>
  std::optional<std::pair<uint64_t, std::string>> beat;  // rank=
  std::optional<std::pair<uint64_t, uint64_t>> depth;    // pipeline=: LUN, depth
  std::optional<uint64_t> lease_until;                   // CLOCK_MONOTONIC ms
  for (const Line& l : lines) {
    if (l.key == "resume") {
      if (l.value != "1") return bad("resume: expected resume=1, got '" + ShowBytes(l.value) + "'");
      resume = true;
    } else if (l.key == "stop") {
      if (l.value != "1" && l.value != "0")
        return bad("stop: expected stop=1 or stop=0, got '" + ShowBytes(l.value) + "'");
      stop = l.value == "1";
    } else if (l.key == "tag") {
      Status s = CheckTag(l.value);
      if (!s.ok()) return refuse(s);
    } else if (l.key == "rank") {
      const size_t colon = l.value.find(':');
      const std::string rank = l.value.substr(0, colon);
      const std::string run = colon == std::string::npos ? "" : l.value.substr(colon + 1);
      const bool digits =
          !rank.empty() && rank.size() <= 5 && rank.find_first_not_of("0123456789") == std::string::npos;
      const bool hex =
          !run.empty() && run.size() <= 32 && run.find_first_not_of("0123456789abcdef") == std::string::npos;
      const uint64_t r = digits ? std::strtoull(rank.c_str(), nullptr, 10) : kMaxRanks;
      if (r >= kMaxRanks || !hex) {
        return bad("rank: expected rank=<rank below " + std::to_string(kMaxRanks) +
                   ">:<run, 1 to 32 lower-case hex digits>, got '" + ShowBytes(l.value) + "'");
      }
      beat.emplace(r, run);
    } else if (l.key == "lease_until") {
      // The lease keeper's deadline (lease_fence.h), in milliseconds on
      // CLOCK_MONOTONIC; only a keeper on this host can know that clock.
      const bool digits =
          !l.value.empty() && l.value.size() <= 15 && l.value.find_first_not_of("0123456789") == std::string::npos;
      const uint64_t ms = digits ? std::strtoull(l.value.c_str(), nullptr, 10) : 0;
      if (ms == 0) {
        return bad("lease_until: expected lease_until=<milliseconds on this host's CLOCK_MONOTONIC, above 0>, got '" +
                   ShowBytes(l.value) + "'");
      }
      lease_until = ms;
    } else if (l.key == "pipeline") {
      const size_t colon = l.value.find(':');
      const std::string lun = l.value.substr(0, colon);
      const std::string d = colon == std::string::npos ? "" : l.value.substr(colon + 1);
      uint64_t n = 0;
      if (!learner_lun(lun, &n) || (d != "0" && d != "1")) {
        return bad("pipeline: expected pipeline=<the LUN of a learner of this model>:<its pipeline depth, 0 or 1>, "
                   "got '" +
                   ShowBytes(l.value) + "'");
      }
      depth.emplace(n, d == "1" ? 1 : 0);
    } else if (l.key == "fence") {
      const size_t colon = l.value.find(':');
      const std::string session = colon == std::string::npos ? "" : l.value.substr(colon + 1);
      const bool hex = session.size() == 16 && session.find_first_not_of("0123456789abcdef") == std::string::npos;
      if (!learner_lun(l.value.substr(0, colon), &fence_lun) || (colon != std::string::npos && !hex)) {
        return bad("fence: expected fence=<the LUN of a learner of this model>[:<the ended session, 16 lower-case "
                   "hex digits>], got '" +
                   ShowBytes(l.value) + "'");
      }
      fence = true;
      ended_session = hex ? std::strtoull(session.c_str(), nullptr, 16) : 0;
    } else {
      char* end = nullptr;
      const float v = std::strtof(l.value.c_str(), &end);
      if (l.value.empty() || *end != '\0') {
        return bad(l.key + ": expected a number, got '" + ShowBytes(l.value) + "'");
      }
      Status s = model_->rule().CheckParam(l.key, v);
      if (!s.ok()) return bad(s.message());
      params[l.key] = v;
    }
  }

  // Apply: nothing here can fail.
  if (lease_until && lease_.Extend(*lease_until)) {
    log_("lease renewed: this primary acknowledges learner writes again");
  }
  // A primary's rule parameters are its backup's before the write completes.
  Status replicated;
  if (!params.empty()) {
    MutexLock in_order(&rule_params_mu_);
    for (const auto& [key, v] : params) {
      SetRuleParam(key, v);
      log_("control: " + key + " set to " + FloatShort(v));
    }
    replicated = ReplicateRuleParams();
  }
  MutexLock lock(&mu_);
  for (const Line& l : lines) {
    if (l.key == "tag") tag_ = l.value;
  }
  if (fence) FenceLocked(fence_lun, initiator.name, ended_session);
  if (beat) ranks_[beat->first] = RankBeat{beat->second, Clock::now()};
  for (Slot& s : slots_) {
    if (depth && s.lun == depth->first) s.pipeline_depth = depth->second;
  }
  if (stop) {
    stop_ = *stop;
    log_(stop_ ? "control: stop asked: learners stop training" : "control: stop withdrawn");
  }
  if (resume) {
    if (FailedLocked()) log_("job resumed by a control write; the failure was: " + failure_);
    failure_.clear();
    failed_.store(false);
  }
  control_error_.clear();
  return replicated;
}

Status Job::CheckTag(const std::string& tag) {
  static constexpr size_t kMaxTag = 256;
  const bool plain = tag.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:,=+/-") ==
                     std::string::npos;
  if (tag.size() > kMaxTag || !plain) {
    return Status::InvalidArgument("control: tag: expected at most 256 of [A-Za-z0-9._:,=+/-], got '" + ShowBytes(tag) +
                                   "'");
  }
  return Status::OK();
}

}  // namespace blkps::server
