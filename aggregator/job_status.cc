// What the control LUN shows of a Job: the status JSON (its keys are listed
// in blkps/control_lun.h, which a test checks) and the counters record's
// numbers.
#include "job.h"

#include <sstream>

#include "json_text.h"
#include "number_text.h"

namespace blkps::server {
namespace {}  // namespace

Job::Counters Job::GetCounters() const {
  MutexLock lock(&mu_);
  Counters c;
  c.params = model_->num_params();
  c.blocks = model_->num_blocks();
  c.global_step = clocks_.global_step();
  c.updates = clocks_.updates();
  c.rejected_writes = rejected_writes_.load();
  c.failed = FailedLocked();
  c.stop = stop_;
  c.table_width = model_->table().width;
  c.table_hashed = hashed_ != nullptr;
  c.pushing_learners = PushingLearnersLocked(Clock::now());
  return c;
}

std::string Job::StatusJson() const {
  std::ostringstream j;
  const Clock::time_point now = Clock::now();
  MutexLock lock(&mu_);
  const Model& m = *model_;
  size_t live = 0;
  for (size_t k = 0; k < slots_.size(); ++k) live += clocks_.live(k) ? 1 : 0;
  j << "{\n";
  j << "  \"model\": " << JsonString(name_) << ",\n";
  j << "  \"params\": " << m.num_params() << ",\n";
  j << "  \"device_bytes\": " << m.size_bytes() << ",\n";
  j << "  \"block_bytes\": " << m.block_bytes() << ",\n";
  j << "  \"blocks\": " << m.num_blocks() << ",\n";
  j << "  \"table\": " << TableStatusJson() << ",\n";
  j << "  \"mode\": " << JsonString(FormatConsistency(opts_.consistency)) << ",\n";
  j << "  \"parts\": " << JsonString(FormatGradientParts(opts_.parts)) << ",\n";
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
  j << "  \"held_now\": " << holds_.held() << ",\n";
  j << "  \"uptime_s\": " << Fixed(Seconds(now - started_), 3) << ",\n";
  j << "  \"dead_after_s\": " << FloatText(opts_.dead_after_s) << ",\n";
  j << "  \"hold_limit_s\": " << FloatText(opts_.hold_limit_s) << ",\n";
  j << "  \"max_dead\": " << opts_.max_dead << ",\n";
  j << "  \"staleness_aware\": " << (opts_.staleness_aware ? "true" : "false") << ",\n";
  j << "  \"stale_bound\": " << opts_.stale_bound << ",\n";
  j << "  \"live_learners\": " << live << ",\n";
  j << "  \"pushing_learners\": " << PushingLearnersLocked(now) << ",\n";
  j << "  \"failed\": " << (FailedLocked() ? "true" : "false") << ",\n";
  j << "  \"failure\": " << JsonString(failure_) << ",\n";
  j << "  \"control_error\": " << JsonString(control_error_) << ",\n";
  j << "  \"control_refused\": " << control_refused_ << ",\n";
  j << "  \"stop\": " << (stop_ ? "true" : "false") << ",\n";
  j << "  \"replica\": \""
    << (standby()                               ? "backup"
        : opts_.backup || opts_.replica_channel ? "primary"
                                                : "none")
    << "\",\n";
  j << "  \"replica_records\": " << replica_records_.load() << ",\n";
  j << "  \"backup\": " << JsonString(backup_.Describe()) << ",\n";
  j << "  \"lease\": " << JsonString(lease_.Describe()) << ",\n";
  j << "  \"checkpoint\": {\"path\": " << JsonString(opts_.checkpoint) << ", \"job\": " << JsonString(job_id_)
    << ", \"shard\": " << opts_.shard << ", \"shards\": " << opts_.shards << ", \"generation\": " << written_generation_
    << ", \"written\": " << checkpoints_ << ", \"last_seconds\": " << Fixed(checkpoint_seconds_, 3)
    << ", \"last_stall_seconds\": " << Fixed(checkpoint_stall_seconds_, 6)
    << ", \"every_s\": " << FloatText(opts_.checkpoint_every_s) << ", \"error\": " << JsonString(checkpoint_error_)
    << ", \"waiting_round\": " << (checkpoints_waiting_ ? std::to_string(waiting_round_) : "null") << "},\n";
  j << "  \"learners\": [";
  for (size_t k = 0; k < slots_.size(); ++k) {
    const Slot& s = slots_[k];
    const double mean = s.lead_count ? static_cast<double>(s.lead_sum) / s.lead_count : 0.0;
    j << (k ? ",\n" : "\n") << "    {\"lun\": " << s.lun << ", \"dtype\": " << JsonString(s.dtype) << ", \"state\": \""
      << (!s.attached       ? "detached"
          : clocks_.live(k) ? "live"
                            : "dead")
      << "\", \"iteration\": " << clocks_.iteration(k) << ", \"idle_s\": " << Fixed(Seconds(now - s.last_io), 3)
      << ", \"held\": " << holds_.held(k) << ", \"reads\": " << s.reads << ", \"writes\": " << s.writes
      << ", \"bytes_read\": " << s.bytes_read << ", \"bytes_written\": " << s.bytes_written
      << ", \"holds\": " << s.holds << ", \"hold_timeouts\": " << s.hold_timeouts << ", \"deaths\": " << s.deaths
      << ", \"staleness_last\": " << s.lead_last << ", \"staleness_max\": " << s.lead_max
      << ", \"staleness_mean\": " << Fixed(mean, 3) << ", \"push_staleness_max\": " << s.push_staleness_max
      << ", \"push_staleness_mean\": "
      << Fixed(s.pushes_measured ? static_cast<double>(s.push_staleness_sum) / s.pushes_measured : 0.0, 3)
      << ", \"stale_pushes\": " << s.stale_pushes << ", \"pipeline_depth\": " << s.pipeline_depth << "}";
  }
  j << (slots_.empty() ? "],\n" : "\n  ],\n");
  // Ranks are dead by the same bound as learners: no heartbeat for
  // dead_after (blkps.torch's waiting ranks apply their own bound).
  j << "  \"ranks\": [";
  const char* rank_sep = "\n";
  for (const auto& [rank, beat] : ranks_) {
    const double idle = Seconds(now - beat.last);
    j << rank_sep << "    {\"rank\": " << rank << ", \"run\": " << JsonString(beat.run) << ", \"state\": \""
      << (idle > opts_.dead_after_s ? "dead" : "live") << "\", \"idle_s\": " << Fixed(idle, 3) << "}";
    rank_sep = ",\n";
  }
  j << (ranks_.empty() ? "]\n" : "\n  ]\n") << "}\n";
  return j.str();
}

}  // namespace blkps::server
