"""The processes the command starts beside tgtd (exporters, watchdogs, lease
keepers), as seen from another command: whether one runs, and ending one by
its id."""

import os
import signal
import time


def running(pid):
    """Whether process `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def terminate(pid, wait_s):
    """Sends `pid` SIGTERM and waits up to wait_s seconds for it to end.
    REQUIRES: the caller has checked that `pid` is its own (/proc/PID/cmdline),
    not a reused id."""
    try:
        os.kill(pid, signal.SIGTERM)
        os.kill(pid, signal.SIGCONT)  # a stopped process ends too
    except ProcessLookupError:
        return
    deadline = time.monotonic() + wait_s
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def stop_recorded(pid_file, word, folder, wait_s=5):
    """Ends (terminate) the process whose pid `pid_file` holds if it is
    still ours: its command line holds `word` (its subcommand) and
    `folder`. Quiet when there is no such file or process."""
    try:
        with open(pid_file) as f:
            pid = int(f.read().strip())
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except (OSError, ValueError):
        return
    if word.encode() not in argv or folder.encode() not in argv:
        return  # the pid was reused: not ours
    terminate(pid, wait_s)
