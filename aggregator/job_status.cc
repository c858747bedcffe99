// What the control LUN shows of a Job: the status JSON (its keys are listed
// in blkps/control_lun.h, which a test checks) and the counters record's
// numbers.
#include "job.h"

#include <sstream>

#include "number_text.h"

namespace blkps::server {
namespace {

// The length of the well-formed UTF-8 sequence at s[i] (RFC 3629: no
// overlong forms, no surrogates, at most U+10FFFF), or 0 if there is none.
size_t Utf8SequenceAt(const std::string& s, size_t i) {
  const auto byte = [&](size_t k) { return k < s.size() ? static_cast<unsigned char>(s[k]) : 0u; };
  const unsigned c = byte(i);
  const auto tail = [&](size_t k) { return (byte(k) & 0xc0) == 0x80; };
  if (c >= 0xc2 && c <= 0xdf) return tail(i + 1) ? 2 : 0;
  if (c >= 0xe0 && c <= 0xef) {
    const unsigned lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
    return byte(i + 1) >= lo && byte(i + 1) <= hi && tail(i + 2) ? 3 : 0;
  }
  if (c >= 0xf0 && c <= 0xf4) {
    const unsigned lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
    return byte(i + 1) >= lo && byte(i + 1) <= hi && tail(i + 2) && tail(i + 3) ? 4 : 0;
  }
  return 0;
}

// `s` as a JSON string that is valid UTF-8 whatever `s` holds: quotes,
// backslashes and control bytes escaped, well-formed UTF-8 kept, and every
// other byte (a client's, in a refused command) as U+FFFD.
std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
      ++i;
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
      ++i;
    } else if (c < 0x80) {
      out += static_cast<char>(c);
      ++i;
    } else if (const size_t n = Utf8SequenceAt(s, i); n > 0) {
      out.append(s, i, n);
      i += n;
    } else {
      out += "\\ufffd";
      ++i;
    }
  }
  return out + "\"";
}

}  // namespace

Job::Counters Job::GetCounters() const {
  std::lock_guard<std::mutex> lock(mu_);
  Counters c;
  c.params = model_->num_params();
  c.blocks = model_->num_blocks();
  c.global_step = clocks_.global_step();
  c.updates = clocks_.updates();
  c.rejected_writes = rejected_writes_.load();
  c.failed = FailedLocked();
  c.stop = stop_;
  return c;
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
  if (m.table().is_table()) {
    j << "  \"table\": {\"rows\": " << m.table().rows << ", \"width\": " << m.table().width
      << ", \"row_bytes\": " << m.table().row_bytes() << ", \"rows_made\": " << m.RowsMade() << "},\n";
  } else {
    j << "  \"table\": null,\n";
  }
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
  j << "  \"staleness_aware\": " << (opts_.staleness_aware ? "true" : "false") << ",\n";
  j << "  \"stale_bound\": " << opts_.stale_bound << ",\n";
  j << "  \"live_learners\": " << live << ",\n";
  j << "  \"failed\": " << (FailedLocked() ? "true" : "false") << ",\n";
  j << "  \"failure\": " << JsonString(failure_) << ",\n";
  j << "  \"control_error\": " << JsonString(control_error_) << ",\n";
  j << "  \"stop\": " << (stop_ ? "true" : "false") << ",\n";
  j << "  \"checkpoint\": {\"path\": " << JsonString(opts_.checkpoint) << ", \"job\": " << JsonString(job_id_)
    << ", \"shard\": " << opts_.shard << ", \"shards\": " << opts_.shards
    << ", \"generation\": " << written_generation_ << ", \"written\": " << checkpoints_
    << ", \"last_seconds\": " << Fixed(checkpoint_seconds_, 3)
    << ", \"last_stall_seconds\": " << Fixed(checkpoint_stall_seconds_, 6)
    << ", \"every_s\": " << FloatText(opts_.checkpoint_every_s) << ", \"error\": " << JsonString(checkpoint_error_)
    << "},\n";
  j << "  \"learners\": [";
  for (size_t k = 0; k < slots_.size(); ++k) {
    const Slot& s = slots_[k];
    const double mean = s.lead_count ? static_cast<double>(s.lead_sum) / s.lead_count : 0.0;
    j << (k ? ",\n" : "\n") << "    {\"lun\": " << s.lun << ", \"dtype\": " << JsonString(s.dtype) << ", \"state\": \""
      << (!s.attached       ? "detached"
          : clocks_.live(k) ? "live"
                            : "dead")
      << "\", \"iteration\": " << clocks_.iteration(k) << ", \"idle_s\": " << Fixed(Seconds(now - s.last_io), 3)
      << ", \"held\": " << s.held << ", \"reads\": " << s.reads << ", \"writes\": " << s.writes
      << ", \"bytes_read\": " << s.bytes_read << ", \"bytes_written\": " << s.bytes_written
      << ", \"holds\": " << s.holds << ", \"hold_timeouts\": " << s.hold_timeouts << ", \"deaths\": " << s.deaths
      << ", \"staleness_max\": " << s.lead_max << ", \"staleness_mean\": " << Fixed(mean, 3)
      << ", \"push_staleness_max\": " << s.push_staleness_max << ", \"push_staleness_mean\": "
      << Fixed(s.pushes_measured ? static_cast<double>(s.push_staleness_sum) / s.pushes_measured : 0.0, 3)
      << ", \"stale_pushes\": " << s.stale_pushes << "}";
  }
  j << (slots_.empty() ? "]\n" : "\n  ]\n") << "}\n";
  return j.str();
}

}  // namespace blkps::server
