// Checkpoint sets: a job's checkpoint as one identity across its shards, in
// generations, committed by a manifest (doc/server.md "Checkpoints").
//
// Every checkpoint file (checkpoint_file.h) carries the job's identity in its
// metadata:
//   job=<id>         fixed at the job's first start (`blkps target start`
//                    gives every shard the same; a lone server makes one)
//   generation=<G>   the job's checkpoint number: 1, 2, ... (every request
//                    for a checkpoint uses up one, written or failed; a
//                    scaled-out bsp or ssp job numbers them by their
//                    round, job.h "One round on every shard")
//   shard=<K>        which part of the model the file holds, 0-based
//   shards=<N>       of how many
//   step=<S>         the shard's global step at the checkpoint's instant
//   round=<R>        a scaled-out bsp or ssp job's only: the round
//                    boundary the part was taken at
//                    (job.h "One round on every shard"): rounds 1..R
//                    applied, nothing of a later one (ssp: every live
//                    learner's iterations)
//
// A set of one (a job served by one server, no shard= option) is the file
// PATH itself, replaced atomically at each checkpoint: it is committed when
// it is renamed into place.
//
// A set of N > 1 (a scaled-out job, bsopts shard=K/N on every shard): shard
// K writes generation G to PATH.shard-K.gen-G. A generation is committed
// when every shard's part of it is durable: the shard that makes the last
// part durable sees the others' parts in the folder (co-located shards share
// it), and writes the manifest PATH.manifest naming G. Only then does its
// fsync return. The manifest is itself a checkpoint file (checkpoint_file.h:
// written durably and atomically, checksummed) with no sections and this
// metadata:
//
//   format=blkps-checkpoint-set
//   job=<id>  generation=<G>  shards=<N>
//   part.<K>=<step> <file name>     one per shard K = 0 .. N-1: its step at
//                                   the instant, its file without folder
//   round.<K>=<R>                   the part's round, where its file has one
//
// A generation whose parts have rounds is committed only if they all have
// the same one: parts at different rounds are not one state of the job, so
// the last shard refuses to commit them (its fsync fails) and the previous
// committed generation stays.
//
// After a commit, the parts of all but the newest `keep` committed
// generations are removed, and so is any part of an older generation that
// never committed; parts of newer generations (being written) stay.
// Commits take an exclusive lock on PATH.lock, so two shards committing at
// once leave the manifest at the newer generation.
//
// A restart loads the committed generation: ReadCheckpointSet checks that
// the manifest's parts exist and say what it says (job, generation, shard
// count, step); anything else is refused in one line that names the files
// and what differs. Files the manifest does not name (a part of a failed
// generation, a stray PATH.shard-K.tmp) do not count.
//
// Thread safety: the functions may run concurrently; CommitGeneration
// serialises commits of one PATH across processes by its lock.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint_file.h"
#include "status.h"

namespace blkps::server {

// A part with no round (async, ssp, a set of one, files written before
// rounds).
constexpr uint64_t kNoCheckpointRound = ~uint64_t{0};

struct CheckpointIdentity {
  std::string job;
  uint64_t generation = 0;
  uint32_t shard = 0;
  uint32_t shards = 1;
  uint64_t step = 0;
  uint64_t round = kNoCheckpointRound;
};

// The file shard `shard` of a set of `shards` writes generation `generation`
// to: PATH itself for a set of one, else PATH.shard-K.gen-G.
std::string CheckpointPartPath(const std::string& path, uint32_t shard, uint32_t shards, uint64_t generation);
// PATH.manifest.
std::string CheckpointManifestPath(const std::string& path);

// Puts `id` into a checkpoint's metadata (the keys above).
void PutCheckpointIdentity(const CheckpointIdentity& id, std::map<std::string, std::string>* meta);
// The identity in a header's metadata; a file written before identities
// has none: job empty, generation 0, shard 0 of 1.
CheckpointIdentity GetCheckpointIdentity(const CheckpointHeader& header);

// A new job id: 16 lowercase hex digits from the system's random source.
std::string NewCheckpointJobId();

// The highest generation among the PATH.shard-K.gen-G files in PATH's
// folder, of any job; 0 if none. A new job over old files (fresh=1) and a
// restart after a failed generation number on from it, so that no part's
// name is used twice.
uint64_t NewestCheckpointGeneration(const std::string& path);

struct CheckpointSet {
  std::string job;
  uint64_t generation = 0;
  uint32_t shards = 1;
  struct Part {
    std::string file;  // full path
    uint64_t step = 0;
    uint64_t round = kNoCheckpointRound;
  };
  std::vector<Part> parts;  // by shard
};

// The committed checkpoint set of `path` (a set of one, or the manifest's
// generation), each part's header checked against it. Returns:
//   NotFound         nothing was ever committed and no part is there: a new
//                    job;
//   InvalidArgument  one line naming the files and what differs: parts
//                    without a manifest (incomplete), a missing part, a
//                    part of another job (foreign), another generation,
//                    step or round (mixed), parts at different rounds,
//                    another shard count; or both PATH and PATH.manifest;
//   the codes of ReadCheckpointHeader for a part it cannot read.
Status ReadCheckpointSet(const std::string& path, CheckpointSet* out);

// Shard `written.shard`'s part of generation `written.generation` is
// durable: if every shard's part of it now is (each part's header says this
// job and generation), commits it as above unless a newer one is committed,
// then prunes to the newest `keep` committed generations. *committed says
// whether this call wrote the manifest. IOError if the manifest cannot be
// written, or if the parts are at different rounds (the previous one
// stays); pruning failures are not errors.
// REQUIRES: written.shards > 1, keep >= 1.
Status CommitCheckpointGeneration(const std::string& path, const CheckpointIdentity& written, uint32_t keep,
                                  bool* committed);

}  // namespace blkps::server
