#!/usr/bin/python3
"""Checks for tests/mount_test.sh, run against a file on a blkps mount whose
model uses rule sgd with lr=1 (a gradient g moves the weights by exactly -g).

  mount_test.py misaligned FILE SHIFT [--direct]
      one pwrite of several MiB of integer-valued float32 gradient from a
      buffer that starts SHIFT bytes into a page (so the kernel cuts the write
      at page boundaries of the buffer, inside floats), at a file offset and
      length that are not whole 512-byte blocks; after close the weights must
      have moved by exactly -gradient, everywhere else not at all.
  mount_test.py threads FILE
      4 threads write adjacent, unaligned ranges at once through one
      descriptor (their edge blocks are shared); same exact check.
  mount_test.py nan FILE
      a gradient holding a NaN fails with EIO and changes nothing; the next
      write through the same descriptor is applied.
  mount_test.py same FILE URL
      the mount and libblkps read the same weights.
"""
import errno
import mmap
import os
import sys
import threading

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "learner", "python"))


def read_all(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        data = bytearray()
        while len(data) < size:
            chunk = os.pread(fd, size - len(data), len(data))
            if not chunk:
                break
            data += chunk
        return np.frombuffer(bytes(data), dtype=np.float32)
    finally:
        os.close(fd)


def gradient(n, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(-1000, 1000, size=n).astype(np.float32)


def check_moved(before, after, first, g):
    """after == before, except [first, first + len(g)) moved by exactly -g."""
    expected = before.copy()
    expected[first:first + len(g)] -= g
    bad = np.nonzero(after != expected)[0]
    if len(bad):
        i = bad[0]
        sys.exit(f"{len(bad)} parameters wrong; first: parameter {i} is {after[i]}, "
                 f"expected {expected[i]} (before {before[i]})")


def misaligned(path, shift, direct):
    before = read_all(path)
    first = 7                                  # starts inside a block
    n = min(1_500_001, len(before) - 2 * first)  # several MiB, tail block partial
    g = gradient(n, shift)
    memory = mmap.mmap(-1, 4 * n + 2 * mmap.PAGESIZE)  # page aligned
    memory[shift:shift + 4 * n] = g.tobytes()
    view = memoryview(memory)[shift:shift + 4 * n]
    fd = os.open(path, os.O_WRONLY | (os.O_DIRECT if direct else 0))
    try:
        written = os.pwrite(fd, view, 4 * first)
    finally:
        os.close(fd)                           # flush: the partial tail block goes out
    if written != 4 * n:
        sys.exit(f"pwrite wrote {written} of {4 * n} bytes")
    check_moved(before, read_all(path), first, g)
    print(f"misaligned shift={shift} direct={direct}: {n} parameters applied exactly once")


def threads(path):
    before = read_all(path)
    first, each, count = 3, 250_001, 4         # ranges meet inside blocks
    g = gradient(each * count, 99)
    fd = os.open(path, os.O_WRONLY)
    errors = []

    def push(k):
        part = g[k * each:(k + 1) * each].tobytes()
        try:
            if os.pwrite(fd, part, 4 * (first + k * each)) != len(part):
                errors.append(f"thread {k}: short write")
        except OSError as e:
            errors.append(f"thread {k}: {e}")

    workers = [threading.Thread(target=push, args=(k,)) for k in range(count)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    os.close(fd)
    if errors:
        sys.exit("; ".join(errors))
    check_moved(before, read_all(path), first, g)
    print(f"threads: {count} adjacent unaligned writes applied exactly once")


def nan(path):
    """A gradient with a NaN is refused whole (EIO), and the file still works."""
    before = read_all(path)
    g = np.ones(1024, dtype=np.float32)
    g[100] = np.nan
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, g.tobytes(), 0)
        sys.exit("a NaN gradient was accepted")
    except OSError as e:
        if e.errno != errno.EIO:
            sys.exit(f"a NaN gradient failed with {e}, expected EIO")
    g[100] = 1
    if os.pwrite(fd, g.tobytes(), 0) != g.nbytes:
        sys.exit("short write after the refused one")
    os.close(fd)
    check_moved(before, read_all(path), 0, g)
    print("nan: refused with EIO, changed nothing; the next write applied")


def same(path, url):
    import blkps
    through_mount = read_all(path)
    with blkps.Model(url) as model:
        direct = model.pull(0, len(through_mount))
    if not np.array_equal(through_mount, direct):
        sys.exit("the mount and libblkps read different weights")
    if not np.any(through_mount != 0):
        sys.exit("the weights are all zero: expected a random init")
    print(f"same: {len(direct)} weights identical through the mount and libblkps")


def main():
    what, path = sys.argv[1], sys.argv[2]
    if what == "misaligned":
        misaligned(path, int(sys.argv[3]), "--direct" in sys.argv[4:])
    elif what == "threads":
        threads(path)
    elif what == "nan":
        nan(path)
    elif what == "same":
        same(path, sys.argv[3])
    else:
        sys.exit(f"unknown check {what}")


if __name__ == "__main__":
    main()
