#include "shard_layout.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "device.h"

namespace blkps {
namespace {

constexpr uint64_t kSectorBytes = 512;

std::string Trim(const std::string& s) {
  const char* space = " \t\r";
  const size_t begin = s.find_first_not_of(space);
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(space) - begin + 1);
}

// A decimal number of bytes, > 0 and a multiple of 512.
bool ParseStripeUnit(const std::string& value, uint64_t* unit) {
  if (value.empty() || value.size() > 19 || value.find_first_not_of("0123456789") != std::string::npos) {
    return false;
  }
  *unit = std::stoull(value);
  return *unit > 0 && *unit % kSectorBytes == 0;
}

bool IsUrl(const std::string& target) { return target.find("://") != std::string::npos; }

// An iscsi:// or iser:// URL's scheme ("iscsi://") and LUN (the text after
// its last '/'); false for anything else.
bool SchemeAndLun(const std::string& target, std::string* scheme, std::string* lun) {
  const size_t colon = target.find("://");
  const size_t slash = target.rfind('/');
  if (colon == std::string::npos || slash == std::string::npos || slash < colon + 3) return false;
  *scheme = target.substr(0, colon + 3);
  *lun = target.substr(slash + 1);
  return (*scheme == "iscsi://" || *scheme == "iser://") && !lun->empty() &&
         lun->find_first_not_of("0123456789") == std::string::npos;
}

// Checks a replica line's URL against its shard (the last shard line).
Status CheckReplica(const std::string& value, const ShardLayout::Shard* shard, const std::string& name, int line) {
  if (shard == nullptr) {
    return Status::Error(EINVAL, "%s:%d: replica before any shard line; put it under the shard it is a replica of",
                         name.c_str(), line);
  }
  std::string scheme, lun, shard_scheme, shard_lun;
  if (!SchemeAndLun(shard->target, &shard_scheme, &shard_lun)) {
    return Status::Error(EINVAL,
                         "%s:%d: replica of shard line %d, which is no iscsi:// or iser:// URL; only a LUN "
                         "served over iSCSI has replicas",
                         name.c_str(), line, shard->line);
  }
  if (!SchemeAndLun(value, &scheme, &lun) || scheme != shard_scheme || lun != shard_lun) {
    return Status::Error(EINVAL, "%s:%d: replica: expected an %s URL of LUN %s, as its shard on line %d, got '%s'",
                         name.c_str(), line, shard_scheme.c_str(), shard_lun.c_str(), shard->line,
                         MaskTarget(value).c_str());
  }
  const bool twice = value == shard->target ||
                     std::find(shard->replicas.begin(), shard->replicas.end(), value) != shard->replicas.end();
  if (twice) {
    return Status::Error(EINVAL, "%s:%d: replica %s is named twice for the shard on line %d; name each replica once",
                         name.c_str(), line, MaskTarget(value).c_str(), shard->line);
  }
  return Status();
}

}  // namespace

Status ParseShardLayout(const std::string& text, const std::string& name, ShardLayout* layout) {
  *layout = ShardLayout();
  std::istringstream lines(text);
  std::string raw;
  int line = 0;
  int unit_line = 0, dtype_line = 0, kind_line = 0;
  while (std::getline(lines, raw)) {
    ++line;
    const std::string content = Trim(raw.substr(0, raw.find('#')));
    if (content.empty()) continue;
    const size_t eq = content.find('=');
    if (eq == std::string::npos) {
      return Status::Error(EINVAL, "%s:%d: expected 'key = value', got '%s'", name.c_str(), line, content.c_str());
    }
    const std::string key = Trim(content.substr(0, eq));
    const std::string value = Trim(content.substr(eq + 1));
    if (key == "kind") {
      if (kind_line != 0) {
        return Status::Error(EINVAL, "%s:%d: kind given twice (first on line %d)", name.c_str(), line, kind_line);
      }
      if (value == "striped") {
        layout->kind = ShardLayout::Kind::kStriped;
      } else if (value == "hashed") {
        layout->kind = ShardLayout::Kind::kHashed;
      } else {
        return Status::Error(EINVAL, "%s:%d: kind: expected striped or hashed, got '%s'", name.c_str(), line,
                             value.c_str());
      }
      kind_line = line;
    } else if (key == "stripe_unit") {
      if (unit_line != 0) {
        return Status::Error(EINVAL,
                             "%s:%d: stripe_unit given twice (first on line "
                             "%d)",
                             name.c_str(), line, unit_line);
      }
      if (!ParseStripeUnit(value, &layout->stripe_unit)) {
        return Status::Error(EINVAL,
                             "%s:%d: stripe_unit: expected a number of bytes "
                             "> 0 and a multiple of 512, got '%s'",
                             name.c_str(), line, value.c_str());
      }
      unit_line = line;
    } else if (key == "dtype") {
      if (dtype_line != 0) {
        return Status::Error(EINVAL, "%s:%d: dtype given twice (first on line %d)", name.c_str(), line, dtype_line);
      }
      if (!wire::ParseDtype(value, &layout->dtype)) {
        return Status::Error(EINVAL, "%s:%d: dtype: expected one of %s, got '%s'", name.c_str(), line,
                             wire::kDtypeNames, value.c_str());
      }
      dtype_line = line;
    } else if (key == "shard") {
      if (value.empty()) {
        return Status::Error(EINVAL,
                             "%s:%d: shard: expected a target (iscsi:// or "
                             "iser:// URL, or a path), got nothing",
                             name.c_str(), line);
      }
      if (value.rfind("layout:", 0) == 0) {
        return Status::Error(EINVAL,
                             "%s:%d: shard '%s': a shard cannot be another "
                             "layout",
                             name.c_str(), line, value.c_str());
      }
      layout->shards.push_back({value, line});
    } else if (key == "control") {
      if (value.empty() || value.rfind("layout:", 0) == 0) {
        return Status::Error(EINVAL,
                             "%s:%d: control: expected a shard's control LUN (iscsi:// or iser:// URL, or a "
                             "path), got '%s'",
                             name.c_str(), line, value.c_str());
      }
      layout->controls.push_back({value, line});
    } else if (key == "replica") {
      ShardLayout::Shard* shard = layout->shards.empty() ? nullptr : &layout->shards.back();
      if (Status s = CheckReplica(value, shard, name, line); !s.ok()) return s;
      shard->replicas.push_back(value);
    } else {
      return Status::Error(EINVAL,
                           "%s:%d: unknown key '%s'; expected kind, stripe_unit, "
                           "dtype, shard, replica or control",
                           name.c_str(), line, key.c_str());
    }
  }
  if (layout->kind == ShardLayout::Kind::kHashed && (unit_line != 0 || dtype_line != 0)) {
    return Status::Error(EINVAL,
                         "%s:%d: a kind = hashed layout has no %s: a hashed table's rows go to shards by their "
                         "id's hash, as float32; remove the line",
                         name.c_str(), unit_line != 0 ? unit_line : dtype_line,
                         unit_line != 0 ? "stripe_unit" : "dtype");
  }
  if (unit_line == 0 && layout->kind == ShardLayout::Kind::kStriped) {
    return Status::Error(EINVAL,
                         "%s: no 'stripe_unit = <bytes>' line; a layout needs "
                         "one",
                         name.c_str());
  }
  if (layout->device_stripe_unit() % kSectorBytes != 0) {
    return Status::Error(EINVAL,
                         "%s:%d: stripe_unit %llu over %s shards is %llu "
                         "device bytes, not a multiple of 512; use a multiple "
                         "of 1024",
                         name.c_str(), unit_line, static_cast<unsigned long long>(layout->stripe_unit),
                         wire::DtypeName(layout->dtype), static_cast<unsigned long long>(layout->device_stripe_unit()));
  }
  if (layout->shards.empty()) {
    return Status::Error(EINVAL,
                         "%s: no 'shard = <target>' line; a layout needs at "
                         "least one shard",
                         name.c_str());
  }
  if (!layout->controls.empty() && layout->controls.size() != layout->shards.size()) {
    return Status::Error(EINVAL, "%s:%d: %zu control lines for %zu shards; give one per shard, in shard order, or none",
                         name.c_str(), layout->controls.back().line, layout->controls.size(), layout->shards.size());
  }
  return Status();
}

Status ReadShardLayout(const std::string& path, ShardLayout* layout) {
  std::ifstream file(path);
  if (!file) {
    const int code = errno != 0 ? errno : ENOENT;
    return Status::Error(code, "cannot open layout file %s: %s", path.c_str(), strerror(code));
  }
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) {
    return Status::Error(EIO, "cannot read layout file %s", path.c_str());
  }
  Status status = ParseShardLayout(text.str(), path, layout);
  if (!status.ok()) return status;
  const size_t slash = path.rfind('/');
  const std::string folder = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  for (auto* list : {&layout->shards, &layout->controls}) {
    for (ShardLayout::Shard& shard : *list) {
      if (!IsUrl(shard.target) && shard.target[0] != '/') {
        shard.target = folder + shard.target;
      }
    }
  }
  return Status();
}

}  // namespace blkps
