"""The processes the command starts beside tgtd (exporters, watchdogs), as
seen from another command: whether one runs, and ending one by its id."""

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
    except ProcessLookupError:
        return
    deadline = time.monotonic() + wait_s
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
