// StripedDevice: one model striped over several shard Devices, seen as one
// Device (the target `layout:PATH`).
//
// The layout file (shard_layout.h) names the stripe unit and the shards;
// StripeMap says where each model byte lives. Each shard is its own Device
// (its own connection, usually its own tgtd) and holds only its part of the
// model, so each shard's server knows nothing of the others. Transfer cuts
// every request into per-shard requests and runs the shards in parallel:
// shard requests are handed to one worker thread per shard, each running
// the shard Device's own Transfer with up to `queue_depth` requests in
// flight on that shard.
//
// A hashed layout (shard_layout.h `kind = hashed`) spreads a hashed table
// (table=hash:CAPACITY:WIDTH) instead: id's row lives on shard
// blkps_feature_id_shard(id, shards) under the id itself, and there are no
// model bytes to stripe. The same machinery moves its rows: TransferRows
// cuts a batch by that rule and runs the shards at once; Transfer and
// Exchange refuse (a hashed table takes rows only).
//
// Thread-safety: as every Device, used by one thread at a time. Internally
// each shard Device is used by one thread at a time too (the caller's
// thread or its worker, never both at once: Transfer and Sync return only
// when every shard is done).

#ifndef BLKPS_LEARNER_STRIPED_DEVICE_H_
#define BLKPS_LEARNER_STRIPED_DEVICE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "device.h"
#include "device_worker.h"
#include "stripe_map.h"

namespace blkps {

class StripedDevice : public Device {
 public:
  // Stripes `shards` (shard 0 first) in units of `stripe_unit` bytes;
  // `names` (one per shard, e.g. "model.layout:3 (iscsi://...)") prefix
  // shard errors. Checks that all shards have one logical block size, that
  // the stripe unit is a multiple of it, and that each shard's size is the
  // part of the model that the striping puts on it. On failure returns
  // nullptr and the reason in *status.
  // REQUIRES: shards is not empty; names.size() == shards.size().
  // Refuses a shard that serves a hashed table (its layout needs
  // `kind = hashed`).
  static std::unique_ptr<StripedDevice> Create(uint64_t stripe_unit, std::vector<std::unique_ptr<Device>> shards,
                                               std::vector<std::string> names, Status* status);
  // A hashed layout's shards: checks that every shard serves a hashed table
  // with row windows and that all have one width. Failure as Create.
  // REQUIRES: as Create.
  static std::unique_ptr<StripedDevice> CreateHashed(std::vector<std::unique_ptr<Device>> shards,
                                                     std::vector<std::string> names, Status* status);

  ~StripedDevice() override;

  // A hashed layout's: shard 0's one-row stand-in (doc/embeddings.md
  // "Hashed ids").
  uint64_t size_bytes() const override { return map_.size_bytes(); }
  uint32_t logical_block_size() const override { return block_size_; }
  // The smallest over the shards: every per-shard request of a request this
  // size fits the shard.
  uint64_t default_request_bytes() const override;
  uint64_t default_exchange_request_bytes() const override;
  uint64_t max_request_bytes() const override;

  // Splits the requests by shard (a request's pieces on one shard that are
  // contiguous there become one shard request of several iovecs) and runs
  // each shard's part on it, all shards at once. On failure returns the
  // failure of the lowest-numbered failing shard, prefixed by its name; the
  // other shards finish their part first. A hashed layout refuses it
  // (EOPNOTSUPP), as Exchange.
  Status Transfer(Direction direction, const std::vector<IoRequest>& requests, uint32_t queue_depth) override;

  // Splits writes and reads alike and runs each shard's pairs as that
  // shard's Exchange, all shards at once: on each shard's connection its
  // reads follow its writes. `consume` is handed every read once all
  // shards are done. Failure as Transfer.
  Status Exchange(const std::vector<IoRequest>& writes, const std::vector<IoRequest>& reads, uint32_t queue_depth,
                  const ConsumeFn* consume) override;

  // Syncs every shard at once (on blkps servers: each checkpoints its part).
  Status Sync() override;
  uint64_t pushed_bytes_lost() const override { return SumOver(shards_, &Device::pushed_bytes_lost); }
  // Every shard serves rows of one width (table=ITS_ROWS:WIDTH): shard 0's.
  uint64_t table_width() const override { return shards_[0]->table_width(); }
  bool table_hashed() const override { return hashed_; }
  // Row windows when every shard has them. TransferRows cuts the batch by
  // shard (a row lives whole on one shard: the stripe unit holds whole rows,
  // doc/embeddings.md "Tables over shards"), as each shard's own row ids,
  // or, hashed, by blkps_feature_id_shard as the ids themselves, and runs
  // the shards at once; each shard's windows keep its receipts. Failure as
  // Transfer: a push that fails on one shard is applied whole on every
  // shard that succeeded (which the message names) and not at all on the
  // failing one.
  bool has_row_windows() const override;
  Status TransferRows(Direction direction, const uint64_t* ids, uint64_t n, uint64_t width, float* rows,
                      uint32_t queue_depth) override;
  // Summed over the shards.
  uint64_t reconnects() const override { return SumOver(shards_, &Device::reconnects); }
  double reconnect_seconds() const override { return SumOver(shards_, &Device::reconnect_seconds); }

 private:
  StripedDevice(const StripeMap& map, uint32_t block_size, std::vector<std::unique_ptr<Device>> shards,
                std::vector<std::string> names, bool hashed);
  // Constructs; on failure returns nullptr and the reason in *status.
  static std::unique_ptr<StripedDevice> Make(const StripeMap& map, uint32_t block_size,
                                             std::vector<std::unique_ptr<Device>> shards,
                                             std::vector<std::string> names, bool hashed, Status* status);
  // The refusal of plain I/O on a hashed layout.
  Status RefusePlainIo(const char* operation) const;

  // The caller's requests cut per shard: requests[s] for shard s, whose
  // iovecs point into iovecs[s].
  struct ShardBatch {
    std::vector<std::vector<IoRequest>> requests;
    std::vector<std::vector<iovec>> iovecs;
  };
  // Cuts `requests` by shard: a request's pieces on one shard that are
  // contiguous there become one shard request of several iovecs. Throws
  // std::bad_alloc.
  void SplitByShard(const std::vector<IoRequest>& requests, ShardBatch* batch) const;

  // Runs job(s) for every shard s with busy[s], all at once; returns the
  // first failure in shard order.
  Status RunOnShards(const std::vector<bool>& busy, const std::function<Status(uint32_t)>& job);
  // The first failure of per-shard results, prefixed by its shard's name.
  Status FirstFailure(const std::vector<Status>& results) const;

  const StripeMap map_;  // a hashed layout's: shard 0's bytes, as one unit
  const uint32_t block_size_;
  const bool hashed_;  // a kind = hashed layout
  std::vector<std::unique_ptr<Device>> shards_;
  std::vector<std::string> names_;
  std::vector<std::unique_ptr<DeviceWorker>> workers_;  // one per shard (none for one shard)
};

}  // namespace blkps

#endif  // BLKPS_LEARNER_STRIPED_DEVICE_H_
