#!/usr/bin/python3
"""Adds a gradient to a blkps-mount file of a rule=sum model and checks the
weights read back are exact; prints one line.

  mount_check.py FILE PARAMS LABEL

Waits (up to 120 s) for FILE to appear, reads the PARAMS weights, writes the
gradient i % 7 + 1 to parameter i with O_DIRECT, fsyncs, reads again: every
weight must have grown by exactly its gradient. Exit status 1 with one line
when not.
"""
import mmap
import os
import sys
import time

import numpy as np

from push_pull import require_exact


def transfer(fd, nbytes, write=None):
    """Reads nbytes from offset 0 of fd, or writes `write` there, through an
    aligned buffer (O_DIRECT)."""
    buf = mmap.mmap(-1, nbytes)
    if write is not None:
        buf[:] = write.tobytes()
        done = os.pwritev(fd, [buf], 0)
    else:
        done = os.preadv(fd, [buf], 0)
    if done != nbytes:
        sys.exit(f"mount_check: {'write' if write is not None else 'read'} of {nbytes} bytes moved {done}")
    return np.frombuffer(bytes(buf), dtype=np.float32)


def main():
    path, params, label = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    deadline = time.monotonic() + 120
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            sys.exit(f"mount_check: {path} did not appear")
        time.sleep(0.5)
    grad = (np.arange(params) % 7 + 1).astype(np.float32)
    fd = os.open(path, os.O_RDWR | os.O_DIRECT)
    try:
        before = transfer(fd, params * 4)
        transfer(fd, params * 4, grad)
        os.fsync(fd)
        after = transfer(fd, params * 4)
    finally:
        os.close(fd)
    require_exact("mount_check", after, before + grad)
    print(f"{label}: weights exact through the file")


if __name__ == "__main__":
    main()
