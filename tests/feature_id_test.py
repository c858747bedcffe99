#!/usr/bin/python3
"""blkps.feature_ids.shards gives the shards of wire/include/blkps/feature_id.h:
its vectors (the ones the C++ test checks), and the ids of a hashed table
spread evenly; ids that are not unsigned 64-bit integers, or a count below
one shard, are refused in one line. No server.

Usage: feature_id_test.py TOP BUILD"""
import sys

import numpy as np

import testbed

top, build, _ = testbed.setup("feature_id_test")
import blkps.feature_ids  # noqa: E402


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


# The contract's vectors (feature_id.h): shard(2, 4) = 3, shard(12345, 3) = 2,
# shard(2^64 - 1, 4) = 2; shard(0, n) = 0 (hash(0) = 0).
got = blkps.feature_ids.shards(np.array([2, 2**64 - 1, 0], dtype=np.uint64), 4).tolist()
if got != [3, 2, 0]:
    fail(f"shards of 2, 2^64-1, 0 over 4: expected [3, 2, 0], got {got}")
if blkps.feature_ids.shards([12345], 3).tolist() != [2]:
    fail(f"shard of 12345 over 3: expected 2, got {blkps.feature_ids.shards([12345], 3).tolist()}")

counts = np.bincount(blkps.feature_ids.shards(np.arange(30_000, dtype=np.uint64), 3), minlength=3)
if counts.min() < 9_500 or counts.max() > 10_500:
    fail(f"30,000 ids over 3 shards should split about evenly, got {counts.tolist()}")

for bad, why in (([-1], "below 0"), ([0.5], "unsigned 64-bit")):
    try:
        blkps.feature_ids.shards(bad, 2)
        fail(f"ids {bad} were taken")
    except ValueError as e:
        if why not in str(e) or "\n" in str(e):
            fail(f"ids {bad}: expected one line saying '{why}', got {e}")
try:
    blkps.feature_ids.shards([1], 0)
    fail("a count of 0 shards was taken")
except ValueError as e:
    if "at least 1" not in str(e):
        fail(f"0 shards: expected 'at least 1', got {e}")
print("feature ids: the contract's shards, an even split, bad ids refused")
