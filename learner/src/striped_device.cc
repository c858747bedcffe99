#include "striped_device.h"

#include <limits.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>
#include <utility>

#include "blkps/feature_id.h"
#include "device_worker.h"
#include "shard_layout.h"

namespace blkps {
namespace {

using ull = unsigned long long;

// Most iovecs in one shard request: preadv/pwritev's limit (libaio).
constexpr int kMaxIovecs = IOV_MAX;

}  // namespace

std::unique_ptr<StripedDevice> StripedDevice::Create(uint64_t stripe_unit, std::vector<std::unique_ptr<Device>> shards,
                                                     std::vector<std::string> names, Status* status) {
  const uint32_t block = shards[0]->logical_block_size();
  uint64_t total = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    if (shards[s]->logical_block_size() != block) {
      *status = Status::Error(EINVAL,
                              "%s has %u-byte logical blocks but %s has %u-byte ones; all shards "
                              "of a layout must have the same logical block size",
                              names[s].c_str(), shards[s]->logical_block_size(), names[0].c_str(), block);
      return nullptr;
    }
    if (shards[s]->table_hashed()) {
      *status = Status::Error(EINVAL,
                              "%s serves a hashed table (table=hash:...), whose rows go to shards by their id's "
                              "hash, not by stripes: its layout needs a 'kind = hashed' line and no stripe_unit",
                              names[s].c_str());
      return nullptr;
    }
    total += shards[s]->size_bytes();
  }
  if (stripe_unit % block != 0) {
    *status = Status::Error(EINVAL,
                            "stripe_unit %llu is not a multiple of the shards' "
                            "logical block size %u",
                            static_cast<ull>(stripe_unit), block);
    return nullptr;
  }
  const StripeMap map(stripe_unit, static_cast<uint32_t>(shards.size()), total);
  for (size_t s = 0; s < shards.size(); ++s) {
    const uint64_t expected = map.ShardBytes(static_cast<uint32_t>(s));
    if (shards[s]->size_bytes() != expected) {
      *status = Status::Error(EINVAL,
                              "%s holds %llu bytes, but striping a model of %llu bytes (the "
                              "shards' sum) in units of %llu bytes over %zu shards puts %llu "
                              "bytes on it; start each shard's server with params = its part's "
                              "bytes / 4 (blkps shards start does)",
                              names[s].c_str(), static_cast<ull>(shards[s]->size_bytes()), static_cast<ull>(total),
                              static_cast<ull>(stripe_unit), shards.size(), static_cast<ull>(expected));
      return nullptr;
    }
  }
  return Make(map, block, std::move(shards), std::move(names), false, status);
}

std::unique_ptr<StripedDevice> StripedDevice::CreateHashed(std::vector<std::unique_ptr<Device>> shards,
                                                           std::vector<std::string> names, Status* status) {
  for (size_t s = 0; s < shards.size(); ++s) {
    if (!shards[s]->table_hashed() || !shards[s]->has_row_windows()) {
      *status = Status::Error(EINVAL,
                              "%s does not serve a hashed table (table=hash:CAPACITY:WIDTH) with row windows, "
                              "but the layout says kind = hashed; start every shard with the same table=hash: "
                              "(blkps shards start does)",
                              names[s].c_str());
      return nullptr;
    }
    if (shards[s]->table_width() != shards[0]->table_width()) {
      *status = Status::Error(EINVAL, "%s has rows of %llu values but %s of %llu; all shards serve one table width",
                              names[s].c_str(), static_cast<ull>(shards[s]->table_width()), names[0].c_str(),
                              static_cast<ull>(shards[0]->table_width()));
      return nullptr;
    }
  }
  const uint64_t bytes = shards[0]->size_bytes();
  const uint32_t block = shards[0]->logical_block_size();  // before shards moves
  return Make(StripeMap(bytes, 1, bytes), block, std::move(shards), std::move(names), true, status);
}

std::unique_ptr<StripedDevice> StripedDevice::Make(const StripeMap& map, uint32_t block_size,
                                                   std::vector<std::unique_ptr<Device>> shards,
                                                   std::vector<std::string> names, bool hashed, Status* status) {
  try {
    return std::unique_ptr<StripedDevice>(
        new StripedDevice(map, block_size, std::move(shards), std::move(names), hashed));
  } catch (const std::system_error& e) {
    *status = Status::Error(EAGAIN, "cannot start a thread per shard: %s", e.what());
  } catch (const std::bad_alloc&) {
    *status = Status::Error(ENOMEM, "out of memory opening a striped model");
  }
  return nullptr;
}

StripedDevice::StripedDevice(const StripeMap& map, uint32_t block_size, std::vector<std::unique_ptr<Device>> shards,
                             std::vector<std::string> names, bool hashed)
    : map_(map), block_size_(block_size), hashed_(hashed), shards_(std::move(shards)), names_(std::move(names)) {
  // One shard needs no worker: the caller's thread runs it.
  if (shards_.size() > 1) {
    for (size_t s = 0; s < shards_.size(); ++s) {
      workers_.push_back(std::make_unique<DeviceWorker>());
    }
  }
}

StripedDevice::~StripedDevice() = default;

uint64_t StripedDevice::default_request_bytes() const {
  uint64_t bytes = shards_[0]->default_request_bytes();
  for (const auto& shard : shards_) {
    bytes = std::min(bytes, shard->default_request_bytes());
  }
  return bytes;
}

uint64_t StripedDevice::default_exchange_request_bytes() const {
  uint64_t bytes = shards_[0]->default_exchange_request_bytes();
  for (const auto& shard : shards_) {
    bytes = std::min(bytes, shard->default_exchange_request_bytes());
  }
  return bytes;
}

uint64_t StripedDevice::max_request_bytes() const {
  uint64_t bytes = shards_[0]->max_request_bytes();
  for (const auto& shard : shards_) {
    bytes = std::min(bytes, shard->max_request_bytes());
  }
  return bytes;
}

Status StripedDevice::RunOnShards(const std::vector<bool>& busy, const std::function<Status(uint32_t)>& job) {
  return FirstFailure(RunEach(workers_, busy, job));
}

Status StripedDevice::FirstFailure(const std::vector<Status>& results) const {
  for (size_t s = 0; s < results.size(); ++s) {
    if (!results[s].ok()) {
      return Status::Error(results[s].code(), "%s: %s", names_[s].c_str(), results[s].reason());
    }
  }
  return Status();
}

void StripedDevice::SplitByShard(const std::vector<IoRequest>& requests, ShardBatch* batch) const {
  const uint32_t count = static_cast<uint32_t>(shards_.size());
  // A shard request under construction: its iovecs are the last `iovcnt`
  // entries of its shard's iovec list until it is closed.
  struct ShardRequest {
    uint64_t offset;
    uint64_t length;
    size_t first_iov;
    size_t request;                       // index of the caller's request it came from
    uint64_t padding_head, padding_tail;  // IoRequest's
  };
  std::vector<std::vector<ShardRequest>> parts(count);
  std::vector<std::vector<iovec>>& iovecs = batch->iovecs;
  iovecs.assign(count, {});
  std::vector<StripePiece> pieces;
  const uint64_t max_bytes = max_request_bytes();
  for (size_t r = 0; r < requests.size(); ++r) {
    const IoRequest& request = requests[r];
    pieces.clear();
    map_.Map(request.offset, request.length, &pieces);
    int iov_index = 0;
    uint64_t iov_used = 0;  // bytes of request.iov[iov_index] consumed
    uint64_t at = 0;        // where the piece starts in the request
    for (const StripePiece& piece : pieces) {
      std::vector<ShardRequest>& shard_parts = parts[piece.shard];
      std::vector<iovec>& shard_iovecs = iovecs[piece.shard];
      bool extend = false;
      if (!shard_parts.empty()) {
        const ShardRequest& last = shard_parts.back();
        extend = last.request == r && last.offset + last.length == piece.shard_offset &&
                 last.length + piece.length <= max_bytes &&
                 shard_iovecs.size() - last.first_iov + static_cast<size_t>(request.iovcnt) <=
                     static_cast<size_t>(kMaxIovecs);
      }
      if (!extend) {
        shard_parts.push_back({piece.shard_offset, 0, shard_iovecs.size(), r, 0, 0});
      }
      // Take piece.length bytes of the caller's iovecs, in order.
      uint64_t left = piece.length;
      while (left > 0) {
        const iovec& source = request.iov[iov_index];
        const uint64_t take = std::min<uint64_t>(left, source.iov_len - iov_used);
        if (take > 0) {
          shard_iovecs.push_back({static_cast<uint8_t*>(source.iov_base) + iov_used, take});
        }
        iov_used += take;
        left -= take;
        if (iov_used == source.iov_len) {
          ++iov_index;
          iov_used = 0;
        }
      }
      shard_parts.back().length += piece.length;
      // The request's padding: [0, head) and [length - tail, length). It
      // is less than a block, so it starts (head) or ends (tail) a part.
      const uint64_t tail_from = request.length - request.padding_tail;
      shard_parts.back().padding_head +=
          request.padding_head > at ? std::min(piece.length, request.padding_head - at) : 0;
      shard_parts.back().padding_tail +=
          at + piece.length > tail_from ? at + piece.length - std::max(at, tail_from) : 0;
      at += piece.length;
    }
  }
  // The iovec lists are complete: point the shard requests into them.
  batch->requests.assign(count, {});
  for (uint32_t s = 0; s < count; ++s) {
    for (size_t i = 0; i < parts[s].size(); ++i) {
      const ShardRequest& part = parts[s][i];
      const size_t end = i + 1 < parts[s].size() ? parts[s][i + 1].first_iov : iovecs[s].size();
      batch->requests[s].push_back({part.offset, part.length, iovecs[s].data() + part.first_iov,
                                    static_cast<int>(end - part.first_iov), part.padding_head, part.padding_tail});
    }
  }
}

Status StripedDevice::RefusePlainIo(const char* operation) const {
  return Status::Error(EOPNOTSUPP,
                       "%s: the layout is a hashed table's (kind = hashed), which takes no plain reads or writes: "
                       "reach its rows with pull_rows and push_rows",
                       operation);
}

Status StripedDevice::Transfer(Direction direction, const std::vector<IoRequest>& requests, uint32_t queue_depth) {
  const uint32_t count = static_cast<uint32_t>(shards_.size());
  if (hashed_) return RefusePlainIo(DirectionName(direction));
  try {
    ShardBatch batch;
    SplitByShard(requests, &batch);
    std::vector<bool> busy(count, false);
    for (uint32_t s = 0; s < count; ++s) busy[s] = !batch.requests[s].empty();
    return RunOnShards(busy,
                       [&](uint32_t s) { return shards_[s]->Transfer(direction, batch.requests[s], queue_depth); });
  } catch (const std::bad_alloc&) {
    return Status::Error(ENOMEM, "out of memory splitting a %s over %u shards", DirectionName(direction), count);
  }
}

bool StripedDevice::has_row_windows() const {
  for (const auto& shard : shards_) {
    if (!shard->has_row_windows()) return false;
  }
  return true;
}

Status StripedDevice::TransferRows(Direction direction, const uint64_t* ids, uint64_t n, uint64_t width, float* rows,
                                   uint32_t queue_depth) {
  const uint32_t count = static_cast<uint32_t>(shards_.size());
  const uint64_t row_bytes = width * sizeof(float);
  try {
    std::vector<std::vector<uint64_t>> local(count), position(count);
    std::vector<StripePiece> pieces;
    for (uint64_t k = 0; k < n; ++k) {
      if (hashed_) {
        const uint32_t shard = blkps_feature_id_shard(ids[k], count);
        local[shard].push_back(ids[k]);
        position[shard].push_back(k);
        continue;
      }
      pieces.clear();
      map_.Map(ids[k] * row_bytes, row_bytes, &pieces);
      local[pieces[0].shard].push_back(pieces[0].shard_offset / row_bytes);
      position[pieces[0].shard].push_back(k);
    }
    std::vector<std::vector<float>> values(count);
    std::vector<bool> busy(count, false);
    for (uint32_t s = 0; s < count; ++s) {
      busy[s] = !local[s].empty();
      values[s].resize(local[s].size() * width);
      if (direction != Direction::kWrite) continue;
      for (size_t j = 0; j < position[s].size(); ++j) {
        std::memcpy(values[s].data() + j * width, rows + position[s][j] * width, row_bytes);
      }
    }
    std::vector<Status> results = RunEach(workers_, busy, [&](uint32_t s) {
      return shards_[s]->TransferRows(direction, local[s].data(), local[s].size(), width, values[s].data(),
                                      queue_depth);
    });
    Status status = FirstFailure(results);
    if (!status.ok() && direction == Direction::kWrite) {
      // The shards that took their part keep it: say which, so that no one
      // pushes the batch again whole and applies it twice there.
      std::string applied;
      for (uint32_t s = 0; s < count; ++s) {
        if (busy[s] && results[s].ok()) applied += (applied.empty() ? "" : ", ") + std::to_string(s);
      }
      if (!applied.empty()) {
        status =
            Status::Error(status.code(), "%s; shard(s) %s applied their part of this push (do not push it again whole)",
                          status.reason(), applied.c_str());
      }
    }
    if (!status.ok() || direction == Direction::kWrite) return status;
    for (uint32_t s = 0; s < count; ++s) {
      for (size_t j = 0; j < position[s].size(); ++j) {
        std::memcpy(rows + position[s][j] * width, values[s].data() + j * width, row_bytes);
      }
    }
    return status;
  } catch (const std::bad_alloc&) {
    return Status::Error(ENOMEM, "out of memory splitting %llu rows over %u shards", static_cast<unsigned long long>(n),
                         count);
  }
}

Status StripedDevice::Exchange(const std::vector<IoRequest>& writes, const std::vector<IoRequest>& reads,
                               uint32_t queue_depth, const ConsumeFn* consume) {
  const uint32_t count = static_cast<uint32_t>(shards_.size());
  if (hashed_) return RefusePlainIo("exchange");
  try {
    ShardBatch write_batch, read_batch;
    SplitByShard(writes, &write_batch);
    SplitByShard(reads, &read_batch);
    // Shard write j and shard read j cover the same shard range when the
    // caller's pairs do and their iovecs split alike (always, short of
    // IOV_MAX iovecs per request); else pair nothing and run the default.
    std::vector<bool> busy(count, false);
    for (uint32_t s = 0; s < count; ++s) {
      const std::vector<IoRequest>& w = write_batch.requests[s];
      const std::vector<IoRequest>& r = read_batch.requests[s];
      if (w.size() != r.size()) return Device::Exchange(writes, reads, queue_depth, consume);
      for (size_t j = 0; j < w.size(); ++j) {
        if (w[j].offset != r[j].offset || w[j].length != r[j].length) {
          return Device::Exchange(writes, reads, queue_depth, consume);
        }
      }
      busy[s] = !w.empty();
    }
    // `consume` runs on this thread, so it is handed every read at the end
    // (as ReadConsuming's default does).
    Status status = RunOnShards(busy, [&](uint32_t s) {
      return shards_[s]->Exchange(write_batch.requests[s], read_batch.requests[s], queue_depth, nullptr);
    });
    if (status.ok() && consume != nullptr) {
      for (size_t k = 0; k < reads.size(); ++k) (*consume)(k);
    }
    return status;
  } catch (const std::bad_alloc&) {
    return Status::Error(ENOMEM, "out of memory splitting an exchange over %u shards", count);
  }
}

Status StripedDevice::Sync() {
  return RunOnShards(std::vector<bool>(shards_.size(), true), [this](uint32_t s) { return shards_[s]->Sync(); });
}

std::unique_ptr<Device> OpenStripedDevice(const std::string& layout_path, const std::string& initiator_name,
                                          uint32_t sessions, Status* status) {
  try {
    ShardLayout layout;
    *status = ReadShardLayout(layout_path, &layout);
    if (!status->ok()) return nullptr;
    std::vector<std::unique_ptr<Device>> shards;
    std::vector<std::string> names;
    for (size_t s = 0; s < layout.shards.size(); ++s) {
      const ShardLayout::Shard& shard = layout.shards[s];
      names.push_back(layout_path + ":" + std::to_string(shard.line) + ": shard " + std::to_string(s) + " (" +
                      shard.target + ")");
      Status opened;
      std::unique_ptr<Device> device;
      if (shard.replicas.empty()) {
        device = OpenDevice(shard.target, initiator_name, sessions, &opened);
      } else if (sessions > 1) {
        opened = Status::Error(EINVAL,
                               "several sessions (sessions=%u) to a shard with replicas are not done yet; "
                               "open it with one session",
                               sessions);
      } else {
        std::vector<std::string> replicas = {shard.target};
        replicas.insert(replicas.end(), shard.replicas.begin(), shard.replicas.end());
        device = OpenIscsiDevice(replicas, initiator_name, &opened);
      }
      if (device == nullptr) {
        *status = Status::Error(opened.code(), "%s: %s", names.back().c_str(), opened.reason());
        return nullptr;
      }
      shards.push_back(std::move(device));
    }
    if (layout.kind == ShardLayout::Kind::kHashed) {
      return StripedDevice::CreateHashed(std::move(shards), std::move(names), status);
    }
    return StripedDevice::Create(layout.device_stripe_unit(), std::move(shards), std::move(names), status);
  } catch (const std::bad_alloc&) {
    *status = Status::Error(ENOMEM, "out of memory opening layout %s", layout_path.c_str());
    return nullptr;
  }
}

}  // namespace blkps
