#include "job.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>

#include "checkpoint_file.h"

namespace blkps {
namespace {

constexpr auto kTick = std::chrono::milliseconds(50);

double Seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string Fixed(double x, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  return buf;
}

// Exact: a float printed with 9 significant digits reads back bit for bit.
std::string FloatText(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

// For people: 0.005, not 0.00499999989.
std::string FloatShort(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.7g", x);
  return buf;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// The checkpoint's metadata: what a loaded file must match.
std::map<std::string, std::string> Identity(const JobOptions& opts) {
  return {{"format", "blkps-model"},
          {"params", std::to_string(opts.model.num_params)},
          {"block", std::to_string(opts.model.block_bytes)},
          {"rule", opts.model.rule.name},
          {"nesterov", opts.model.rule.nesterov ? "1" : "0"},
          {"mode", FormatConsistency(opts.consistency)}};
}

}  // namespace

Status Job::Create(const std::string& name, const JobOptions& opts, Logger log, std::shared_ptr<Job>* out) {
  JobOptions o = opts;
  o.model.accumulator = o.consistency.mode == ConsistencyMode::kBsp;
  std::unique_ptr<Model> model;
  Status s = Model::Create(o.model, &model);
  if (!s.ok()) return s;
  std::shared_ptr<Job> job(new Job(name, o, std::move(log), std::move(model)));
  if (!o.checkpoint.empty()) {
    s = job->LoadCheckpoint();
    if (!s.ok()) return s;
  }
  job->ticker_ = std::thread([j = job.get()] { j->TickerLoop(); });
  *out = std::move(job);
  return Status::OK();
}

Job::Job(const std::string& name, const JobOptions& opts, Logger log, std::unique_ptr<Model> model)
    : name_(name),
      opts_(opts),
      log_(log ? std::move(log) : [](const std::string&) {}),
      model_(std::move(model)),
      clocks_(opts.consistency, [&] {
        std::vector<uint64_t> params(model_->num_blocks());
        for (uint64_t b = 0; b < params.size(); ++b) params[b] = model_->BlockParams(b);
        return params;
      }()),
      last_checkpoint_(Clock::now()) {}

Job::~Job() {
  {
    std::lock_guard<std::mutex> lock(ticker_mu_);
    stopping_ = true;
  }
  ticker_cv_.notify_all();
  if (ticker_.joinable()) ticker_.join();
}

size_t Job::AddLearner(uint64_t lun, std::function<void()> wake) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t slot = slots_.size();
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].lun == lun && !slots_[i].attached) slot = i;  // from a checkpoint, or re-added
  }
  if (slot == slots_.size()) {
    clocks_.AddLearner();
    slots_.emplace_back();
  }
  Slot& s = slots_[slot];
  s.lun = lun;
  s.attached = true;
  s.wake = std::move(wake);
  s.last_io = Clock::now();
  return slot;
}

void Job::RemoveLearner(size_t slot) {
  std::lock_guard<std::mutex> lock(mu_);
  held_.erase(std::remove_if(held_.begin(), held_.end(), [&](const HeldCommand& h) { return h.slot == slot; }),
              held_.end());
  Slot& s = slots_[slot];
  s.attached = false;
  s.held = 0;
  s.released.clear();
  s.wake = nullptr;
  clocks_.MarkDead(slot);
  ReleaseLocked();  // the others may no longer wait for it
  rounds_may_be_complete_ = true;  // the ticker finishes them
}

Job::Admission Job::Admit(size_t slot, bool write, uint64_t offset, uint64_t len, void* cmd) {
  const uint64_t first_param = offset / sizeof(float);
  const uint64_t end_param = std::min(model_->num_params(), (offset + len + sizeof(float) - 1) / sizeof(float));
  std::lock_guard<std::mutex> lock(mu_);
  Slot& s = slots_[slot];
  s.last_io = Clock::now();
  (write ? s.writes : s.reads) += 1;
  (write ? s.bytes_written : s.bytes_read) += len;
  if (FailedLocked()) return Admission::kRun;  // Read/Write fail it
  if (!clocks_.live(slot)) {
    clocks_.Rejoin(slot);
    log_("learner at lun " + std::to_string(s.lun) + " is back; it rejoins at iteration " +
         std::to_string(clocks_.iteration(slot)));
  }
  if (first_param >= end_param || offset + len < offset) return Admission::kRun;  // padding, or Read/Write refuse it
  const uint64_t first = model_->BlockOf(first_param), last = model_->BlockOf(end_param - 1);
  const bool may_pass = write ? clocks_.WriteMayPass(slot, first, last) : clocks_.ReadMayPass(slot, first, last);
  if (may_pass) {
    if (!write) RecordLeadLocked(slot, first, last);
    return Admission::kRun;
  }
  held_.push_back(HeldCommand{cmd, slot, write, first, last, Clock::now()});
  ++s.held;
  ++s.holds;
  return Admission::kHold;
}

std::vector<Job::Released> Job::TakeReleased(size_t slot) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Released> out;
  out.swap(slots_[slot].released);
  return out;
}

void Job::RecordLeadLocked(size_t slot, uint64_t first_block, uint64_t last_block) {
  uint64_t lead = 0;
  for (uint64_t b = first_block; b <= last_block; ++b) lead = std::max(lead, clocks_.Lead(slot, b));
  Slot& s = slots_[slot];
  s.lead_max = std::max(s.lead_max, lead);
  s.lead_sum += lead;
  ++s.lead_count;
}

void Job::ReleaseOneLocked(HeldCommand& held, Status status) {
  Slot& s = slots_[held.slot];
  if (status.ok() && !held.write) RecordLeadLocked(held.slot, held.first_block, held.last_block);
  s.released.push_back(Released{held.cmd, std::move(status)});
  --s.held;
  if (s.wake) s.wake();
}

void Job::ReleaseLocked() {
  auto it = std::remove_if(held_.begin(), held_.end(), [&](HeldCommand& held) {
    if (FailedLocked()) {
      ReleaseOneLocked(held, Status::Unavailable(failure_));
      return true;
    }
    const bool may_pass = held.write ? clocks_.WriteMayPass(held.slot, held.first_block, held.last_block)
                                     : clocks_.ReadMayPass(held.slot, held.first_block, held.last_block);
    if (may_pass) ReleaseOneLocked(held, Status::OK());
    return may_pass;
  });
  held_.erase(it, held_.end());
}

Status Job::Read(size_t, uint64_t offset, void* dst, size_t len) {
  if (failed_.load()) {
    std::lock_guard<std::mutex> lock(mu_);
    return Status::Unavailable(failure_);
  }
  return model_->Read(offset, dst, len);
}

Status Job::Write(size_t slot, uint64_t offset, const void* src, size_t len) {
  if (failed_.load()) {
    std::lock_guard<std::mutex> lock(mu_);
    return Status::Unavailable(failure_);
  }
  Model::ParamRange range;
  Status s = model_->CheckGradient(offset, src, len, &range);
  if (!s.ok()) {
    rejected_writes_.fetch_add(1);
    return s;
  }
  const float* g = static_cast<const float*>(src) - range.first;  // g[i]: parameter i's gradient
  const bool bsp = opts_.consistency.mode == ConsistencyMode::kBsp;
  model_->ForEachBlockLocked(range, [&](uint64_t b, uint64_t first, uint64_t n) {
    if (bsp) {
      model_->AccumulateLocked(first, g + first, n);
    } else {
      model_->ApplyLocked(first, g + first, n);
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (!clocks_.AddGradient(slot, b, n)) return;
    if (bsp) {
      FinishRoundIfCompleteLocked(b, lock);
    } else if (!held_.empty()) {
      ReleaseLocked();  // ssp: the slowest may have moved
    }
  });
  return Status::OK();
}

void Job::FinishRoundIfCompleteLocked(uint64_t b, std::unique_lock<std::mutex>& lock) {
  if (!clocks_.RoundComplete(b)) return;
  const uint32_t given = clocks_.FinishRound(b);
  ReleaseLocked();
  lock.unlock();
  // Readers released above wait for this block's lock, which the caller
  // holds, so they see the round's update.
  model_->ApplyAverageLocked(b, given);
}

std::string Job::WhoIsBehindLocked(const HeldCommand& held) const {
  std::string behind;
  const uint64_t b = held.first_block;
  const uint64_t mine = clocks_.clock(held.slot, b);
  for (size_t k = 0; k < slots_.size(); ++k) {
    if (k == held.slot || !clocks_.live(k) || clocks_.clock(k, b) >= mine) continue;
    behind += (behind.empty() ? "" : ", ") + std::string("lun ") + std::to_string(slots_[k].lun) + " at " +
              std::to_string(clocks_.clock(k, b));
  }
  return behind.empty() ? "the rest of this round" : behind;
}

void Job::Tick() {
  const Clock::time_point now = Clock::now();
  std::vector<uint64_t> bsp_blocks;  // rounds a death may have completed
  bool checkpoint_due = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto hold_limit = std::chrono::duration<double>(opts_.hold_limit_s);
    held_.erase(std::remove_if(held_.begin(), held_.end(),
                               [&](HeldCommand& held) {
                                 if (now - held.since < hold_limit) return false;
                                 Slot& s = slots_[held.slot];
                                 ++s.hold_timeouts;
                                 const std::string why =
                                     std::string(held.write ? "gradient write" : "read") + " of block " +
                                     std::to_string(held.first_block) + " by lun " + std::to_string(s.lun) +
                                     " (iteration " + std::to_string(clocks_.clock(held.slot, held.first_block)) +
                                     ", mode " + FormatConsistency(opts_.consistency) + ") waited " +
                                     Fixed(opts_.hold_limit_s, 1) + " s (hold_limit) for learners behind it: " +
                                     WhoIsBehindLocked(held);
                                 log_(why);
                                 ReleaseOneLocked(held, Status::DeadlineExceeded(why));
                                 return true;
                               }),
                held_.end());

    size_t dead = 0;
    bool died = false;
    for (size_t k = 0; k < slots_.size(); ++k) {
      Slot& s = slots_[k];
      if (clocks_.live(k) && s.held == 0 && Seconds(now - s.last_io) > opts_.dead_after_s) {
        clocks_.MarkDead(k);
        ++s.deaths;
        died = true;
        log_("learner at lun " + std::to_string(s.lun) + " is dead: no I/O for " + Fixed(Seconds(now - s.last_io), 1) +
             " s (dead_after=" + Fixed(opts_.dead_after_s, 1) + "); the others go on without it");
      }
      dead += clocks_.live(k) ? 0 : 1;
    }
    // Only a new death fails the job: after resume=1 it goes on with the
    // live learners until another one dies.
    if (died && opts_.max_dead > 0 && dead >= opts_.max_dead && !FailedLocked()) {
      failure_ = "job failed: " + std::to_string(dead) + " of " + std::to_string(slots_.size()) +
                 " learners are dead (max_dead=" + std::to_string(opts_.max_dead) +
                 "); learner I/O fails until a control write of resume=1";
      failed_.store(true);
      log_(failure_);
    }
    checkpoint_due = opts_.checkpoint_every_s > 0 && Seconds(now - last_checkpoint_) >= opts_.checkpoint_every_s;
    if (died) ReleaseLocked();
    if (died || rounds_may_be_complete_) {
      rounds_may_be_complete_ = false;
      if (opts_.consistency.mode == ConsistencyMode::kBsp) {
        for (uint64_t b = 0; b < clocks_.num_blocks(); ++b) {
          if (clocks_.RoundComplete(b)) bsp_blocks.push_back(b);
        }
      }
    }
  }
  for (uint64_t b : bsp_blocks) {
    std::unique_lock<std::shared_mutex> block_lock = model_->LockBlock(b);
    std::unique_lock<std::mutex> lock(mu_);
    FinishRoundIfCompleteLocked(b, lock);
  }

  if (checkpoint_due) {
    Status s = Checkpoint();
    if (!s.ok()) log_("periodic checkpoint failed: " + s.message());
  }
}

void Job::TickerLoop() {
  // tgtd wakes its main thread with signals; they must not land here.
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  std::unique_lock<std::mutex> lock(ticker_mu_);
  while (!ticker_cv_.wait_for(lock, kTick, [&] { return stopping_; })) {
    lock.unlock();
    Tick();
    lock.lock();
  }
}

Status Job::Checkpoint() {
  if (opts_.checkpoint.empty()) return Status::OK();
  std::lock_guard<std::mutex> one_at_a_time(checkpoint_mu_);
  const Clock::time_point start = Clock::now();
  Status s;
  uint64_t step = 0;
  {
    // Writes wait from here until the file is durable: the file is one
    // instant of the model, its state and its clocks.
    auto block_locks = model_->LockAllBlocksShared();
    std::map<std::string, std::string> meta = Identity(opts_);
    std::vector<uint64_t> clocks, luns;
    {
      std::lock_guard<std::mutex> lock(mu_);
      clocks = clocks_.Save();
      for (const Slot& slot : slots_) luns.push_back(slot.lun);
      step = clocks_.global_step();
    }
    meta["step"] = std::to_string(step);
    for (const auto& [key, value] : model_->rule().params()) meta["rule." + key] = FloatText(value);
    std::vector<CheckpointSection> sections;
    for (const Model::Array& a : model_->Arrays()) sections.push_back({a.name, a.data, a.bytes});
    sections.push_back({"clocks", clocks.data(), clocks.size() * sizeof(uint64_t)});
    sections.push_back({"luns", luns.data(), luns.size() * sizeof(uint64_t)});
    s = WriteCheckpointFile(opts_.checkpoint, meta, sections);
  }
  const double took = Seconds(Clock::now() - start);
  std::lock_guard<std::mutex> lock(mu_);
  last_checkpoint_ = Clock::now();
  if (!s.ok()) {
    checkpoint_error_ = s.message();
    return s;
  }
  checkpoint_error_.clear();
  ++checkpoints_;
  checkpoint_seconds_ = took;
  log_("checkpoint of step " + std::to_string(step) + " written to " + opts_.checkpoint + " in " + Fixed(took, 3) +
       " s");
  return Status::OK();
}

Status Job::LoadCheckpoint() {
  const std::string& path = opts_.checkpoint;
  CheckpointHeader header;
  Status s = ReadCheckpointHeader(path, &header);
  if (s.code() == Status::Code::kNotFound) return Status::OK();  // a new job
  if (!s.ok()) return Status::InvalidArgument("checkpoint: " + s.message());
  for (const auto& [key, want] : Identity(opts_)) {
    auto it = header.meta.find(key);
    const std::string got = it == header.meta.end() ? "(none)" : it->second;
    if (got != want) {
      return Status::InvalidArgument("checkpoint: " + path + " was written with " + key + "=" + got +
                                     " but this LUN has " + key + "=" + want +
                                     "; give matching --bsopts, or move the file away to start afresh");
    }
  }
  std::vector<CheckpointDest> dests;
  for (const Model::Array& a : model_->Arrays()) dests.push_back({a.name, a.data, a.bytes});
  std::vector<uint64_t> clocks, luns;
  for (const auto& [section, bytes] : header.sections) {
    if (section == "clocks") clocks.resize(bytes / sizeof(uint64_t));
    if (section == "luns") luns.resize(bytes / sizeof(uint64_t));
  }
  dests.push_back({"clocks", clocks.data(), clocks.size() * sizeof(uint64_t)});
  dests.push_back({"luns", luns.data(), luns.size() * sizeof(uint64_t)});
  s = ReadCheckpointSections(path, dests);
  if (!s.ok()) return Status::InvalidArgument("checkpoint: " + s.message());
  s = clocks_.Restore(clocks);
  if (s.ok() && clocks_.num_learners() != luns.size()) {
    s = Status::InvalidArgument("its clocks are for " + std::to_string(clocks_.num_learners()) + " learners but it names " +
                                std::to_string(luns.size()) + " LUNs");
  }
  if (!s.ok()) return Status::InvalidArgument("checkpoint: " + path + ": " + s.message());
  const Clock::time_point now = Clock::now();
  for (uint64_t lun : luns) {
    slots_.emplace_back();
    slots_.back().lun = lun;
    slots_.back().last_io = now;
  }
  for (const auto& [key, value] : header.meta) {
    if (key.rfind("rule.", 0) != 0) continue;
    s = model_->rule().SetParam(key.substr(5), std::strtof(value.c_str(), nullptr));
    if (!s.ok()) return Status::InvalidArgument("checkpoint: " + path + ": " + s.message());
  }
  log_("loaded checkpoint " + path + " (step " + header.meta["step"] + ")");
  return Status::OK();
}

Status Job::Control(const std::string& commands) {
  std::istringstream in(commands.substr(0, commands.find('\0')));
  std::string line;
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
    if (key == "tag") {
      Status s = SetTag(value);
      if (!s.ok()) return s;
      continue;
    }
    char* end = nullptr;
    const float v = std::strtof(value.c_str(), &end);
    if (eq == std::string::npos || value.empty() || *end != '\0') {
      return Status::InvalidArgument("control: expected key=<number>, resume=1 or tag=<text>, got '" + line + "'");
    }
    Status s = model_->rule().SetParam(key, v);
    if (!s.ok()) return Status::InvalidArgument("control: " + s.message());
    log_("control: " + key + " set to " + FloatShort(v));
  }
  return Status::OK();
}

Status Job::SetTag(const std::string& tag) {
  static constexpr size_t kMaxTag = 256;
  const bool plain = tag.find_first_not_of(
                         "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:,=+/-") == std::string::npos;
  if (tag.size() > kMaxTag || !plain) {
    return Status::InvalidArgument("control: tag: expected at most 256 of [A-Za-z0-9._:,=+/-], got '" + tag + "'");
  }
  std::lock_guard<std::mutex> lock(mu_);
  tag_ = tag;
  return Status::OK();
}

std::string Job::StatusJson() const {
  std::ostringstream j;
  const Clock::time_point now = Clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  const Model& m = *model_;
  size_t live = 0;
  for (size_t k = 0; k < slots_.size(); ++k) live += clocks_.live(k) ? 1 : 0;
  j << "{\n";
  j << "  \"model\": " << JsonString(name_) << ",\n";
  j << "  \"params\": " << m.num_params() << ",\n";
  j << "  \"device_bytes\": " << m.size_bytes() << ",\n";
  j << "  \"block_bytes\": " << m.block_bytes() << ",\n";
  j << "  \"blocks\": " << m.num_blocks() << ",\n";
  j << "  \"mode\": " << JsonString(FormatConsistency(opts_.consistency)) << ",\n";
  j << "  \"rule\": " << JsonString(m.rule().name()) << ",\n";
  j << "  \"tag\": " << JsonString(tag_) << ",\n";
  j << "  \"rule_params\": {";
  const char* sep = "";
  for (const auto& [key, value] : m.rule().params()) {
    j << sep << JsonString(key) << ": " << FloatShort(value);
    sep = ", ";
  }
  j << "},\n";
  j << "  \"global_step\": " << clocks_.global_step() << ",\n";
  j << "  \"updates\": " << clocks_.updates() << ",\n";
  j << "  \"rejected_writes\": " << rejected_writes_.load() << ",\n";
  j << "  \"held_now\": " << held_.size() << ",\n";
  j << "  \"uptime_s\": " << Fixed(Seconds(now - started_), 3) << ",\n";
  j << "  \"dead_after_s\": " << FloatText(opts_.dead_after_s) << ",\n";
  j << "  \"hold_limit_s\": " << FloatText(opts_.hold_limit_s) << ",\n";
  j << "  \"max_dead\": " << opts_.max_dead << ",\n";
  j << "  \"live_learners\": " << live << ",\n";
  j << "  \"failed\": " << (FailedLocked() ? "true" : "false") << ",\n";
  j << "  \"failure\": " << JsonString(failure_) << ",\n";
  j << "  \"checkpoint\": {\"path\": " << JsonString(opts_.checkpoint) << ", \"written\": " << checkpoints_
    << ", \"last_seconds\": " << Fixed(checkpoint_seconds_, 3) << ", \"every_s\": "
    << FloatText(opts_.checkpoint_every_s) << ", \"error\": " << JsonString(checkpoint_error_) << "},\n";
  j << "  \"learners\": [";
  for (size_t k = 0; k < slots_.size(); ++k) {
    const Slot& s = slots_[k];
    const double mean = s.lead_count ? static_cast<double>(s.lead_sum) / s.lead_count : 0.0;
    j << (k ? ",\n" : "\n") << "    {\"lun\": " << s.lun << ", \"state\": \""
      << (!s.attached ? "detached" : clocks_.live(k) ? "live" : "dead") << "\", \"iteration\": "
      << clocks_.iteration(k) << ", \"idle_s\": " << Fixed(Seconds(now - s.last_io), 3) << ", \"held\": " << s.held
      << ", \"reads\": " << s.reads << ", \"writes\": " << s.writes << ", \"bytes_read\": " << s.bytes_read
      << ", \"bytes_written\": " << s.bytes_written << ", \"holds\": " << s.holds
      << ", \"hold_timeouts\": " << s.hold_timeouts << ", \"deaths\": " << s.deaths
      << ", \"staleness_max\": " << s.lead_max << ", \"staleness_mean\": " << Fixed(mean, 3) << "}";
  }
  j << (slots_.empty() ? "]\n" : "\n  ]\n") << "}\n";
  return j.str();
}

}  // namespace blkps
