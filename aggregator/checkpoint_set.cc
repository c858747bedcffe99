#include "checkpoint_set.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <set>

#include "number_text.h"

namespace blkps::server {
namespace {

constexpr char kSetFormat[] = "blkps-checkpoint-set";

std::string FolderOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string BaseOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

uint64_t MetaNumber(const CheckpointHeader& h, const std::string& key, uint64_t otherwise) {
  auto it = h.meta.find(key);
  uint64_t v = 0;
  return it != h.meta.end() && ParseDecimal(it->second, &v) ? v : otherwise;
}

// A part's file in the folder: PATH.shard-K.gen-G, nothing after it.
struct PartName {
  std::string file;  // full path
  uint32_t shard;
  uint64_t generation;
};

// Every PATH.shard-K.gen-G in PATH's folder, and the names of other files
// starting PATH.shard- (stray temporaries, parts written before
// generations) in *others.
std::vector<PartName> ListParts(const std::string& path, std::vector<std::string>* others = nullptr) {
  std::vector<PartName> parts;
  const std::string folder = FolderOf(path), prefix = BaseOf(path) + ".shard-";
  DIR* dir = ::opendir(folder.c_str());
  if (dir == nullptr) return parts;
  while (const dirent* e = ::readdir(dir)) {
    const std::string name = e->d_name;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string rest = name.substr(prefix.size());
    const size_t gen = rest.find(".gen-");
    uint64_t shard = 0, generation = 0;
    if (gen != std::string::npos && ParseDecimal(rest.substr(0, gen), &shard) && shard < (1u << 20) &&
        ParseDecimal(rest.substr(gen + 5), &generation)) {
      parts.push_back({folder + "/" + name, static_cast<uint32_t>(shard), generation});
    } else if (others != nullptr) {
      others->push_back(folder + "/" + name);
    }
  }
  ::closedir(dir);
  std::sort(parts.begin(), parts.end(), [](const PartName& a, const PartName& b) {
    return a.generation != b.generation ? a.generation < b.generation : a.shard < b.shard;
  });
  return parts;
}

std::string Join(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < 4; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > 4) out += " and " + std::to_string(names.size() - 4) + " more";
  return out;
}

std::string RoundText(uint64_t round) { return round == kNoCheckpointRound ? "(none)" : std::to_string(round); }

// "" if the set's parts are at one round (or have none); else what differs,
// e.g. "shard 0 is at round 12, shard 1 at round 13".
std::string RoundsDiffer(const CheckpointSet& set) {
  for (size_t k = 1; k < set.parts.size(); ++k) {
    if (set.parts[k].round != set.parts[0].round) {
      return "shard 0 is at round " + RoundText(set.parts[0].round) + ", shard " + std::to_string(k) + " at round " +
             RoundText(set.parts[k].round);
    }
  }
  return "";
}

std::string Refusal(const std::string& path, const std::string& why) {
  return "checkpoint " + path + ": " + why +
         "; the job was not started from it (fresh=1, blkps target start --fresh, starts a new job over it)";
}

// Reads a part's header and checks it says what the set says.
Status CheckPart(const std::string& path, const CheckpointSet& set, uint32_t k) {
  const CheckpointSet::Part& part = set.parts[k];
  CheckpointHeader header;
  Status s = ReadCheckpointHeader(part.file, &header);
  if (s.code() == Status::Code::kNotFound) {
    return Status::InvalidArgument(Refusal(path, "incomplete: generation " + std::to_string(set.generation) +
                                                     " names " + part.file + ", which is missing"));
  }
  if (!s.ok()) return Status::InvalidArgument("checkpoint " + path + ": " + s.message());
  const CheckpointIdentity id = GetCheckpointIdentity(header);
  std::string differs;
  if (id.job != set.job) {
    differs = "foreign: it is of job " + (id.job.empty() ? "(none)" : id.job) + ", the set of job " + set.job;
  } else if (id.generation != set.generation || id.step != part.step || id.round != part.round) {
    differs = "mixed: it is generation " + std::to_string(id.generation) + " at step " + std::to_string(id.step) +
              " round " + RoundText(id.round) + ", the set's part " + std::to_string(k) + " is generation " +
              std::to_string(set.generation) + " at step " + std::to_string(part.step) + " round " +
              RoundText(part.round);
  } else if (id.shard != k || id.shards != set.shards) {
    differs = "it is shard " + std::to_string(id.shard) + " of " + std::to_string(id.shards) + ", the set names it " +
              "shard " + std::to_string(k) + " of " + std::to_string(set.shards);
  }
  if (differs.empty()) return Status::OK();
  return Status::InvalidArgument(
      Refusal(path, part.file + " does not belong to " + CheckpointManifestPath(path) + ": " + differs));
}

Status ReadManifest(const std::string& path, CheckpointSet* out) {
  const std::string manifest = CheckpointManifestPath(path);
  CheckpointHeader header;
  Status s = ReadCheckpointHeader(manifest, &header);
  if (s.ok()) s = ReadCheckpointSections(manifest, {});  // the checksum
  if (!s.ok()) return s;
  const auto meta = [&](const std::string& key) {
    auto it = header.meta.find(key);
    return it == header.meta.end() ? std::string() : it->second;
  };
  CheckpointSet set;
  set.job = meta("job");
  uint64_t shards = 0;
  if (meta("format") != kSetFormat || set.job.empty() || !ParseDecimal(meta("generation"), &set.generation) ||
      !ParseDecimal(meta("shards"), &shards) || shards < 2 || shards > (1u << 20)) {
    return Status::InvalidArgument("checkpoint " + path + ": " + manifest +
                                   " is not a checkpoint set's manifest (format, job, generation or shards missing)");
  }
  set.shards = static_cast<uint32_t>(shards);
  const std::string folder = FolderOf(path);
  for (uint32_t k = 0; k < set.shards; ++k) {
    const std::string part = meta("part." + std::to_string(k));
    const size_t space = part.find(' ');
    CheckpointSet::Part p;
    if (space == std::string::npos || !ParseDecimal(part.substr(0, space), &p.step) || space + 1 == part.size() ||
        part.find('/', space) != std::string::npos) {
      return Status::InvalidArgument("checkpoint " + path + ": " + manifest + ": part." + std::to_string(k) +
                                     " is missing or malformed");
    }
    p.file = folder + "/" + part.substr(space + 1);
    const std::string round = meta("round." + std::to_string(k));
    if (!round.empty() && !ParseDecimal(round, &p.round)) {
      return Status::InvalidArgument("checkpoint " + path + ": " + manifest + ": round." + std::to_string(k) +
                                     " is malformed");
    }
    set.parts.push_back(std::move(p));
  }
  *out = std::move(set);
  return Status::OK();
}

Status WriteManifest(const std::string& path, const CheckpointSet& set) {
  std::map<std::string, std::string> meta = {{"format", kSetFormat},
                                             {"job", set.job},
                                             {"generation", std::to_string(set.generation)},
                                             {"shards", std::to_string(set.shards)}};
  for (size_t k = 0; k < set.parts.size(); ++k) {
    meta["part." + std::to_string(k)] = std::to_string(set.parts[k].step) + " " + BaseOf(set.parts[k].file);
    if (set.parts[k].round != kNoCheckpointRound)
      meta["round." + std::to_string(k)] = std::to_string(set.parts[k].round);
  }
  return WriteCheckpointFile(CheckpointManifestPath(path), meta, {});
}

// Removes parts as the header says (CommitCheckpointGeneration).
void Prune(const std::string& path, const CheckpointSet& committed, uint32_t keep) {
  std::map<uint64_t, std::vector<PartName>> by_generation;
  for (const PartName& p : ListParts(path)) by_generation[p.generation].push_back(p);
  std::set<uint64_t> kept;
  uint32_t complete_kept = 0;
  for (auto it = by_generation.rbegin(); it != by_generation.rend(); ++it) {
    const uint64_t g = it->first;
    if (g > committed.generation) {
      kept.insert(g);  // being written
      continue;
    }
    if (complete_kept >= keep) continue;
    std::set<uint32_t> shards;  // of this job
    for (const PartName& p : it->second) {
      CheckpointHeader header;
      if (ReadCheckpointHeader(p.file, &header).ok() && GetCheckpointIdentity(header).job == committed.job) {
        shards.insert(p.shard);
      }
    }
    if (g == committed.generation || shards.size() == committed.shards) {
      kept.insert(g);
      ++complete_kept;
    }
  }
  for (const auto& [g, parts] : by_generation) {
    if (kept.count(g)) continue;
    for (const PartName& p : parts) ::unlink(p.file.c_str());
  }
}

// Holds an exclusive lock on PATH.lock while it lives.
class CommitLock {
 public:
  explicit CommitLock(const std::string& path)
      : fd_(::open((path + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
    if (fd_ >= 0) ::flock(fd_, LOCK_EX);
  }
  ~CommitLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  CommitLock(const CommitLock&) = delete;
  CommitLock& operator=(const CommitLock&) = delete;
  bool held() const { return fd_ >= 0; }

 private:
  int fd_;
};

}  // namespace

std::string CheckpointPartPath(const std::string& path, uint32_t shard, uint32_t shards, uint64_t generation) {
  if (shards <= 1) return path;
  return path + ".shard-" + std::to_string(shard) + ".gen-" + std::to_string(generation);
}

std::string CheckpointManifestPath(const std::string& path) { return path + ".manifest"; }

void PutCheckpointIdentity(const CheckpointIdentity& id, std::map<std::string, std::string>* meta) {
  (*meta)["job"] = id.job;
  (*meta)["generation"] = std::to_string(id.generation);
  (*meta)["shard"] = std::to_string(id.shard);
  (*meta)["shards"] = std::to_string(id.shards);
  (*meta)["step"] = std::to_string(id.step);
  if (id.round != kNoCheckpointRound) (*meta)["round"] = std::to_string(id.round);
}

CheckpointIdentity GetCheckpointIdentity(const CheckpointHeader& header) {
  CheckpointIdentity id;
  auto job = header.meta.find("job");
  if (job != header.meta.end()) id.job = job->second;
  id.generation = MetaNumber(header, "generation", 0);
  id.shard = static_cast<uint32_t>(MetaNumber(header, "shard", 0));
  id.shards = static_cast<uint32_t>(MetaNumber(header, "shards", 1));
  id.step = MetaNumber(header, "step", 0);
  id.round = MetaNumber(header, "round", kNoCheckpointRound);
  return id;
}

std::string NewCheckpointJobId() {
  std::random_device random;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%08x%08x", random(), random());
  return buf;
}

uint64_t NewestCheckpointGeneration(const std::string& path) {
  const std::vector<PartName> parts = ListParts(path);
  return parts.empty() ? 0 : parts.back().generation;
}

Status ReadCheckpointSet(const std::string& path, CheckpointSet* out) {
  const std::string manifest = CheckpointManifestPath(path);
  CheckpointHeader single;
  Status alone = ReadCheckpointHeader(path, &single);
  const bool has_manifest = ::access(manifest.c_str(), F_OK) == 0;
  if (alone.code() != Status::Code::kNotFound && has_manifest) {
    return Status::InvalidArgument(Refusal(path, "both " + path + " (a set of one) and " + manifest +
                                                     " (a scaled-out set) are there; move the one not wanted away"));
  }
  if (alone.code() != Status::Code::kNotFound) {
    if (!alone.ok()) return alone;
    const CheckpointIdentity id = GetCheckpointIdentity(single);
    CheckpointSet set;
    set.job = id.job;
    set.generation = id.generation;
    set.parts.push_back({path, id.step});
    *out = std::move(set);
    return Status::OK();
  }
  if (!has_manifest) {
    std::vector<std::string> names;
    for (const PartName& p : ListParts(path, &names)) names.push_back(p.file);
    names.erase(std::remove_if(names.begin(), names.end(),
                               [](const std::string& n) { return n.size() >= 4 && n.substr(n.size() - 4) == ".tmp"; }),
                names.end());
    if (names.empty()) return Status::NotFound(path + ": no checkpoint yet");
    std::sort(names.begin(), names.end());
    return Status::InvalidArgument(
        Refusal(path, "incomplete: no generation was committed (no " + manifest + "), yet there are " + Join(names)));
  }
  CheckpointSet set;
  Status s = ReadManifest(path, &set);
  if (!s.ok()) return s;
  for (uint32_t k = 0; k < set.shards; ++k) {
    s = CheckPart(path, set, k);
    if (!s.ok()) return s;
  }
  const std::string rounds = RoundsDiffer(set);
  if (!rounds.empty()) {
    return Status::InvalidArgument(Refusal(path, "mixed rounds: generation " + std::to_string(set.generation) +
                                                     " is not one state of the job: " + rounds));
  }
  *out = std::move(set);
  return Status::OK();
}

Status CommitCheckpointGeneration(const std::string& path, const CheckpointIdentity& written, uint32_t keep,
                                  bool* committed) {
  *committed = false;
  CommitLock lock(path);
  if (!lock.held()) return Status::IOError(path + ".lock: cannot open the checkpoint set's lock");
  CheckpointSet set;
  set.job = written.job;
  set.generation = written.generation;
  set.shards = written.shards;
  for (uint32_t k = 0; k < written.shards; ++k) {
    const std::string file = CheckpointPartPath(path, k, written.shards, written.generation);
    CheckpointHeader header;
    if (!ReadCheckpointHeader(file, &header).ok()) return Status::OK();  // not yet durable, or failed
    const CheckpointIdentity id = GetCheckpointIdentity(header);
    if (id.job != written.job || id.generation != written.generation || id.shards != written.shards) {
      return Status::OK();  // another job's leftover under that name: not this generation's part
    }
    set.parts.push_back({file, id.step, id.round});
  }
  const std::string rounds = RoundsDiffer(set);
  if (!rounds.empty()) {
    return Status::IOError("generation " + std::to_string(set.generation) + " was not committed: " + rounds +
                           " (a shard took its part at another round boundary); the previous generation stays");
  }
  CheckpointSet current;
  if (ReadManifest(path, &current).ok() && current.job == set.job && current.generation >= set.generation) {
    return Status::OK();  // a newer one is committed
  }
  Status s = WriteManifest(path, set);
  if (!s.ok()) return s;
  *committed = true;
  Prune(path, set, keep);
  return Status::OK();
}

}  // namespace blkps::server
