#!/usr/bin/python3
"""One learner of bench/cluster's table case (doc/embeddings.md "Tables over
shards"), or its check: rows of a table striped over shards, pulled and
pushed through libblkps's pull_rows / push_rows on a layout: target.

  blkps_rows.py --target layout:PATH --rows N --width W --learner L
                --batches B --batch S --start-at T --result FILE
  blkps_rows.py --target layout:PATH --rows N --width W --learners K
                --batches B --batch S --lr LR --check
  ... --hashed: a hashed table (table=hash:CAPACITY:WIDTH): rank r of
      [0, N) is the 64-bit id r x 0x9E3779B97F4A7C15 mod 2^64 (a fixed
      feature hash; odd, so ranks keep distinct ids)

A learner waits until wall-clock second T, then for each of its B batches
(S Zipf(1.05) ids, learner L's own seed) pulls the batch's rows and pushes a
gradient for them, and writes FILE (JSON): seconds pulling and pushing,
ids and distinct rows moved. The gradients are small integers, so the sums
of all learners' pushes are exact in float32 whatever their order: --check
(after every learner is done, on a table with init=zeros and rule sgd)
pulls every row any learner touched, and 1,000 rows none did, and exits 1
unless each is -LR times the sum of the gradients pushed to it (zero for
the untouched), printing how many rows it compared.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "learner", "python"))
import blkps  # noqa: E402


FEATURE_HASH = np.uint64(0x9E3779B97F4A7C15)


def ids_of(ranks, hashed):
    """The table ids of `ranks`: themselves, or (--hashed) their hashes."""
    ranks = np.asarray(ranks, dtype=np.uint64)
    return ranks * FEATURE_HASH if hashed else ranks


def batches(learner, rows, width, count, size, hashed=False):
    """Learner `learner`'s batches: (ids, gradients) pairs, the same every
    time for the same arguments."""
    rng = np.random.default_rng(1000 + learner)
    for _ in range(count):
        ids = ids_of((rng.zipf(1.05, size) - 1) % rows, hashed)
        yield ids, rng.integers(-3, 4, (size, width)).astype(np.float32)


def learn(a):
    work = list(batches(a.learner, a.rows, a.width, a.batches, a.batch, a.hashed))
    pull_s = push_s = 0.0
    with blkps.Model(a.target) as table:
        late = max(0.0, time.time() - a.start_at)
        time.sleep(max(0.0, a.start_at - time.time()))
        for ids, grads in work:
            t0 = time.perf_counter()
            table.pull_rows(ids, a.width)
            t1 = time.perf_counter()
            table.push_rows(ids, grads)
            pull_s += t1 - t0
            push_s += time.perf_counter() - t1
    with open(a.result, "w") as f:
        json.dump({"learner": a.learner, "pull_s": pull_s, "push_s": push_s, "late_s": late,
                   "ids": sum(len(ids) for ids, _ in work),
                   "distinct": sum(len(np.unique(ids)) for ids, _ in work)}, f)


def check(a):
    want = {}
    for learner in range(a.learners):
        for ids, grads in batches(learner, a.rows, a.width, a.batches, a.batch, a.hashed):
            for i, g in zip(ids.tolist(), grads):
                want[i] = want.get(i, 0) - a.lr * g
    touched = np.array(sorted(want), dtype=np.uint64)
    untouched = np.setdiff1d(ids_of(np.linspace(0, a.rows - 1, 1000).astype(np.uint64), a.hashed), touched)
    with blkps.Model(a.target) as table:
        got = table.pull_rows(touched, a.width)
        zeros = table.pull_rows(untouched, a.width)
    expect = np.stack([want[i] for i in touched.tolist()]).astype(np.float32)
    bad = np.flatnonzero(np.any(got != expect, axis=1))
    if bad.size or np.any(zeros != 0):
        sys.exit(f"blkps_rows: {bad.size} of {touched.size} touched rows differ from -lr x their summed "
                 f"gradients (first: row {touched[bad[0]] if bad.size else '-'}); untouched rows nonzero: "
                 f"{int(np.any(zeros != 0, axis=1).sum())}")
    print(json.dumps({"rows_checked": int(touched.size), "untouched_checked": int(untouched.size)}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--rows", type=int, required=True)
    ap.add_argument("--width", type=int, required=True)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--learner", type=int, default=0)
    ap.add_argument("--learners", type=int, default=1, help="--check: how many learners pushed")
    ap.add_argument("--lr", type=float, default=1.0, help="--check: the table's sgd lr")
    ap.add_argument("--start-at", type=float, default=0.0)
    ap.add_argument("--result")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--hashed", action="store_true", help="ids are 64-bit hashes of the ranks (a hashed table)")
    a = ap.parse_args()
    try:
        check(a) if a.check else learn(a)
    except OSError as e:
        sys.exit(f"blkps_rows: {e.strerror or e}")


if __name__ == "__main__":
    main()
