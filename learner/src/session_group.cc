#include "session_group.h"

#include <cerrno>
#include <new>
#include <system_error>

#include "iscsi_session.h"

namespace blkps {

SessionGroup::SessionGroup(std::vector<std::unique_ptr<Device>> sessions) : sessions_(std::move(sessions)) {
  workers_.push_back(nullptr);
  for (size_t s = 1; s < sessions_.size(); ++s) workers_.push_back(std::make_unique<DeviceWorker>());
}

std::vector<std::vector<IoRequest>> SessionGroup::Deal(const std::vector<IoRequest>& requests) const {
  const size_t n = requests.size(), count = sessions_.size();
  std::vector<std::vector<IoRequest>> share(count);
  for (size_t s = 0; s < count; ++s) {
    share[s].assign(requests.begin() + static_cast<std::ptrdiff_t>(s * n / count),
                    requests.begin() + static_cast<std::ptrdiff_t>((s + 1) * n / count));
  }
  return share;
}

Status SessionGroup::RunOnSessions(const std::vector<bool>& busy, const std::function<Status(uint32_t)>& job) {
  for (const Status& result : RunEach(workers_, busy, job)) {
    if (!result.ok()) return result;
  }
  return Status();
}

Status SessionGroup::Transfer(Direction direction, const std::vector<IoRequest>& requests, uint32_t queue_depth) {
  try {
    const std::vector<std::vector<IoRequest>> share = Deal(requests);
    std::vector<bool> busy(share.size());
    for (size_t s = 0; s < share.size(); ++s) busy[s] = !share[s].empty();
    return RunOnSessions(busy, [&](uint32_t s) { return sessions_[s]->Transfer(direction, share[s], queue_depth); });
  } catch (const std::bad_alloc&) {
    return Status::Error(ENOMEM, "out of memory dealing a %s over %zu sessions", DirectionName(direction),
                         sessions_.size());
  }
}

Status SessionGroup::Exchange(const std::vector<IoRequest>& writes, const std::vector<IoRequest>& reads,
                              uint32_t queue_depth, const ConsumeFn* consume) {
  try {
    const std::vector<std::vector<IoRequest>> write_share = Deal(writes), read_share = Deal(reads);
    std::vector<bool> busy(write_share.size());
    for (size_t s = 0; s < write_share.size(); ++s) busy[s] = !write_share[s].empty();
    Status status = RunOnSessions(
        busy, [&](uint32_t s) { return sessions_[s]->Exchange(write_share[s], read_share[s], queue_depth, nullptr); });
    if (status.ok() && consume != nullptr) {
      for (size_t k = 0; k < reads.size(); ++k) (*consume)(k);
    }
    return status;
  } catch (const std::bad_alloc&) {
    return Status::Error(ENOMEM, "out of memory dealing an exchange over %zu sessions", sessions_.size());
  }
}

Status SessionGroup::Sync() {
  return RunOnSessions(std::vector<bool>(sessions_.size(), true), [this](uint32_t s) { return sessions_[s]->Sync(); });
}

std::unique_ptr<Device> OpenSessionGroup(const std::string& url, const std::string& initiator_name, uint32_t sessions,
                                         Status* status) {
  try {
    const std::string base = initiator_name.empty() ? iscsi::DefaultInitiatorName() : initiator_name;
    std::vector<std::unique_ptr<Device>> opened;
    for (uint32_t s = 0; s < sessions; ++s) {
      const std::string name = s == 0 ? base : base + "-s" + std::to_string(s + 1);
      std::unique_ptr<Device> session = OpenIscsiDevice(url, name, status);
      if (session == nullptr) return nullptr;
      opened.push_back(std::move(session));
    }
    return std::make_unique<SessionGroup>(std::move(opened));
  } catch (const std::system_error& e) {
    *status = Status::Error(EAGAIN, "cannot start a thread per iSCSI session: %s", e.what());
  } catch (const std::bad_alloc&) {
    *status = Status::Error(ENOMEM, "out of memory opening %u sessions", sessions);
  }
  return nullptr;
}

}  // namespace blkps
