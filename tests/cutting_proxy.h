// CuttingProxy: a TCP forwarder on loopback that stands between learners and
// a tgtd and cuts the connections it carries, as a failing network would.
//
// Learners connect to port() instead of the target's port; every accepted
// connection gets its own connection to the target, and two threads copy the
// bytes each way. A cut shuts both sockets of every pair down and closes them
// with a reset, so the learner's read fails mid-command and the target sees
// the connection end while commands may still be in flight or half sent.
// After a cut the proxy goes on accepting: a reconnecting learner gets
// through. Ended pairs are closed when the proxy is destroyed.
//
// Cuts happen at byte positions of the learner-to-target stream (summed over
// all connections), given up front with CutAt(): a seeded list of positions
// places cuts at random points of a run without any timing in the test.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace blkps_test {

class CuttingProxy {
 public:
  // Listens on a free loopback port and forwards to 127.0.0.1:target_port.
  // ok() is false (and error() says why) if the listening socket failed.
  explicit CuttingProxy(int target_port) : target_port_(target_port) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (listen_fd_ < 0 || bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        listen(listen_fd_, 16) != 0 || getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      error_ = std::string("proxy: cannot listen on loopback: ") + strerror(errno);
      return;
    }
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { AcceptLoop(); });
  }

  ~CuttingProxy() {
    stopping_ = true;
    shutdown(listen_fd_, SHUT_RDWR);
    if (acceptor_.joinable()) acceptor_.join();
    close(listen_fd_);
    CutAll();
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& pair : pairs_) pair->Join();
  }

  CuttingProxy(const CuttingProxy&) = delete;
  CuttingProxy& operator=(const CuttingProxy&) = delete;

  bool ok() const { return port_ > 0; }
  const std::string& error() const { return error_; }
  int port() const { return port_; }

  // Cuts every open connection when the learner-to-target byte count reaches
  // each of `positions` (any order).
  void CutAt(std::vector<uint64_t> positions) {
    std::sort(positions.begin(), positions.end(), std::greater<uint64_t>());
    std::lock_guard<std::mutex> lock(mu_);
    cut_at_ = std::move(positions);  // the next cut at the back
  }

  // Cuts every open connection now.
  void CutAll() {
    std::lock_guard<std::mutex> lock(mu_);
    CutAllLocked();
  }

  int cuts() const { return cuts_.load(); }
  uint64_t bytes_to_target() const { return bytes_to_target_.load(); }

 private:
  struct Pair {
    int learner_fd, target_fd;
    std::thread up, down;
    void Cut() const {
      // A reset, not an orderly close: SO_LINGER 0, then shut down both ways
      // so that the copying threads wake; they close the sockets.
      const linger reset{1, 0};
      setsockopt(learner_fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
      setsockopt(target_fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
      shutdown(learner_fd, SHUT_RDWR);
      shutdown(target_fd, SHUT_RDWR);
    }
    void Join() {
      if (up.joinable()) up.join();
      if (down.joinable()) down.join();
      close(learner_fd);
      close(target_fd);
    }
  };

  void CutAllLocked() {
    for (auto& pair : pairs_) pair->Cut();
    ++cuts_;
  }

  void AcceptLoop() {
    while (!stopping_) {
      const int learner_fd = accept(listen_fd_, nullptr, nullptr);
      if (learner_fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;
      }
      const int target_fd = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      addr.sin_port = htons(static_cast<uint16_t>(target_port_));
      if (target_fd < 0 || connect(target_fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
        close(learner_fd);
        if (target_fd >= 0) close(target_fd);
        continue;  // the target is down: the learner sees a refused login
      }
      auto pair = std::make_unique<Pair>();
      pair->learner_fd = learner_fd;
      pair->target_fd = target_fd;
      Pair* p = pair.get();
      std::lock_guard<std::mutex> lock(mu_);
      p->up = std::thread([this, p] { Copy(p->learner_fd, p->target_fd, true); });
      p->down = std::thread([this, p] { Copy(p->target_fd, p->learner_fd, false); });
      pairs_.push_back(std::move(pair));
    }
  }

  // Copies from `from` to `to` until either ends; then ends both.
  void Copy(int from, int to, bool to_target) {
    std::vector<char> buf(64 << 10);
    for (;;) {
      const ssize_t n = read(from, buf.data(), buf.size());
      if (n <= 0) break;
      if (to_target) {
        std::lock_guard<std::mutex> lock(mu_);
        const uint64_t total = bytes_to_target_ += static_cast<uint64_t>(n);
        if (!cut_at_.empty() && total >= cut_at_.back()) {
          while (!cut_at_.empty() && total >= cut_at_.back()) cut_at_.pop_back();
          CutAllLocked();  // these bytes are dropped with the connection
          break;
        }
      }
      ssize_t done = 0;
      while (done < n) {
        const ssize_t w = send(to, buf.data() + done, static_cast<size_t>(n - done), MSG_NOSIGNAL);
        if (w <= 0) break;
        done += w;
      }
      if (done < n) break;
    }
    shutdown(from, SHUT_RDWR);
    shutdown(to, SHUT_RDWR);
  }

  const int target_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::string error_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> cuts_{0};
  std::atomic<uint64_t> bytes_to_target_{0};
  std::mutex mu_;
  std::vector<std::unique_ptr<Pair>> pairs_;  // guarded by mu_
  std::vector<uint64_t> cut_at_;              // guarded by mu_; descending
  std::thread acceptor_;
};

}  // namespace blkps_test
