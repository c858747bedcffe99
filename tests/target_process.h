// TargetProcess: a private blkps target for one test — its own tgtd with the
// freshly built plugin preloaded, its own control socket and a free loopback
// port — started and stopped through `blkps target` (scripts/blkps), the same
// command people use by hand; what it wrote in target.env is asked of
// `blkps target show --get`, the file's one reader.
//
// The destructor stops the target; if the test process dies without running
// it, the command's --owner-pid watchdog stops tgtd instead.
#pragma once

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "temp_dir.h"

namespace blkps_test {

// Runs a shell command; returns its exit status and its stdout+stderr.
inline int RunCommand(const std::string& cmd, std::string* output) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int status = pclose(p);
  if (output) *output = out;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

inline std::string ShellQuote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// The `blkps` command of this checkout, quoted for the shell (the checkout
// may be in a folder whose name has a space).
inline std::string Blkps() { return ShellQuote(BLKPS_COMMAND); }

inline bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

class TargetProcess {
 public:
  // Starts a target whose LUN 1 is a blkps model with `bsopts`.
  // `extra` is passed to `blkps target start` as is (e.g. "--null-lun"). One
  // tgtd (--tgtd 1) on every host: tests reach it by PID, PORT and tgtadm.
  explicit TargetProcess(const std::string& bsopts, const std::string& extra = "") : bsopts_(bsopts), extra_(extra) {
    Start(extra_);
  }

  // Stops the target; then folder_ goes, with its state.
  ~TargetProcess() { RunCommand(Blkps() + " target stop --dir " + ShellQuote(dir_), nullptr); }

  TargetProcess(const TargetProcess&) = delete;
  TargetProcess& operator=(const TargetProcess&) = delete;

  bool ok() const { return start_status_ == 0; }
  const std::string& start_output() const { return start_output_; }
  std::string url() const { return Env("URL"); }
  // The URL of model LUN `lun` (with --luns N in `extra`: 1..N).
  std::string url(int lun) const {
    std::string u = url();
    return u.substr(0, u.rfind('/') + 1) + std::to_string(lun);
  }
  std::string null_url() const { return Env("NULL_URL"); }
  // The model's status and control LUN (LUN N+1 with --luns N).
  std::string control_url() const { return Env("CONTROL_URL"); }
  // --operator: the operator's control LUN, and its credentials file (a
  // BLKPS_CHAP_FILE); empty without --operator.
  std::string operator_url() const { return Env("OPERATOR_URL"); }
  std::string operator_chap_file() const { return Env("OPERATOR_CHAP_FILE"); }
  int port() const { return std::atoi(Env("PORT").c_str()); }
  // The state folder given to --dir (control socket, tgtd.log, target.env).
  const std::string& dir() const { return dir_; }

  // Kills tgtd with SIGKILL, as a crash would (no clean shutdown), and waits
  // until it is gone and the --owner-pid watchdog has noticed and cleaned up
  // after it (it removes tgtd.pid and target.env), so that Restart() cannot
  // race that watchdog. Returns false, with the reason in *why, if that does
  // not happen within timeout_s.
  bool KillTgtd(std::string* why, double timeout_s = 30) {
    const pid_t p = static_cast<pid_t>(std::atol(Env("PID").c_str()));
    if (p <= 0 || kill(p, SIGKILL) != 0) {
      if (why) *why = "no tgtd to kill (pid " + std::to_string(p) + ")";
      return false;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    // tgtd is not our child: it is gone once its parent (init) has reaped it.
    auto gone = [&] { return kill(p, 0) != 0 && errno == ESRCH; };
    auto cleaned = [&] {
      return access((dir_ + "/tgtd.pid").c_str(), F_OK) != 0 && access((dir_ + "/target.env").c_str(), F_OK) != 0;
    };
    while (!(gone() && cleaned())) {
      if (std::chrono::steady_clock::now() > deadline) {
        if (why) {
          *why = !gone() ? "tgtd " + std::to_string(p) + " still exists (not reaped?) after SIGKILL"
                         : "the --owner-pid watchdog did not clean up " + dir_ + " after tgtd died";
        }
        return false;
      }
      usleep(20000);
    }
    return true;
  }

  // Stops tgtd with SIGSTOP, as a hung server would be (alive, its sockets
  // open, answering nothing), and waits until every one of its threads is
  // stopped: kill() only wakes one thread, and until the stop reaches the
  // others they may still answer a command. Returns false, with the reason
  // in *why, if that does not happen within timeout_s. ContinueTgtd() undoes it.
  bool StopTgtd(std::string* why, double timeout_s = 30) {
    const pid_t p = static_cast<pid_t>(std::atol(Env("PID").c_str()));
    if (p <= 0 || kill(p, SIGSTOP) != 0) {
      if (why) *why = "no tgtd to stop (pid " + std::to_string(p) + ")";
      return false;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (!EveryThreadStopped(p)) {
      if (std::chrono::steady_clock::now() > deadline) {
        if (why) *why = "tgtd " + std::to_string(p) + " still runs after SIGSTOP";
        return false;
      }
      usleep(5000);
    }
    return true;
  }
  void ContinueTgtd() {
    const pid_t p = static_cast<pid_t>(std::atol(Env("PID").c_str()));
    if (p > 0) kill(p, SIGCONT);
  }

  // Starts the target again in the same --dir, with the same --bsopts and
  // options, on the same port (so that learners' sessions can reconnect), e.g.
  // after KillTgtd(). Returns ok(); start_output() has the command's output.
  bool Restart() {
    const int old_port = port();
    env_.clear();
    Start(extra_ + (old_port > 0 ? " --port " + std::to_string(old_port) : std::string()));
    return ok();
  }

  // Everything tgtd has logged so far.
  std::string Log() const {
    std::ifstream in(dir_ + "/tgtd.log");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  // Runs tgtadm against this target's private control socket.
  int Admin(const std::string& args, std::string* output) const {
    return RunCommand("TGT_IPC_SOCKET=" + ShellQuote(dir_ + "/tgtd.sock") + " tgtadm " + args, output);
  }

  // tgtd's process id.
  std::string pid() const { return Env("PID"); }

  bool TgtdAlive() const {
    std::string pid = Env("PID");
    return !pid.empty() && kill(std::stoi(pid), 0) == 0;
  }

 private:
  // Whether every thread of process p is in state T (stopped), from
  // /proc/p/task/*/stat, whose third field is the state.
  static bool EveryThreadStopped(pid_t p) {
    const std::string tasks = "/proc/" + std::to_string(p) + "/task";
    DIR* dir = opendir(tasks.c_str());
    if (!dir) return false;
    bool stopped = true;
    int seen = 0;
    while (dirent* e = readdir(dir)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream stat(tasks + "/" + e->d_name + "/stat");
      std::string line;
      std::getline(stat, line);
      const size_t paren = line.rfind(')');                                  // the name may hold spaces
      if (paren == std::string::npos || paren + 2 >= line.size()) continue;  // the thread just ended
      ++seen;
      if (line[paren + 2] != 'T') stopped = false;
    }
    closedir(dir);
    return stopped && seen > 0;
  }
  void Start(const std::string& extra) {
    start_status_ = RunCommand(Blkps() + " target start --dir " + ShellQuote(dir_) + " --plugin " +
                                   ShellQuote(BLKPS_PLUGIN) + " --owner-pid " + std::to_string(getpid()) +
                                   " --tgtd 1 --bsopts " + ShellQuote(bsopts_) + " " + extra,
                               &start_output_);
    if (start_status_ == 0) LoadEnv();
  }
  // The target.env values the tests use, one line each in the order asked.
  void LoadEnv() {
    static const char* const kKeys[] = {"URL",  "NULL_URL", "CONTROL_URL", "OPERATOR_URL", "OPERATOR_CHAP_FILE",
                                        "PORT", "PID"};
    std::string cmd = Blkps() + " target show --dir " + ShellQuote(dir_);
    for (const char* key : kKeys) cmd += std::string(" --get ") + key;
    std::string out;
    if (RunCommand(cmd, &out) != 0) return;
    std::istringstream lines(out);
    std::string line;
    for (const char* key : kKeys) {
      if (!std::getline(lines, line)) break;
      env_[key] = line;
    }
  }
  std::string Env(const std::string& key) const {
    auto it = env_.find(key);
    return it == env_.end() ? "" : it->second;
  }

  const std::string bsopts_, extra_;
  TempDir folder_;
  const std::string dir_ = folder_.path;
  int start_status_ = -1;
  std::string start_output_;
  std::map<std::string, std::string> env_;
};

}  // namespace blkps_test
