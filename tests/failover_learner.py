#!/usr/bin/python3
"""A learner of the failover tests (lease_test.py in threads,
replica_cluster_test.py as a process on a host of the netns cluster): it
pushes through libblkps over a layout whose shard has a backup, so that it
follows a failover by itself (doc/replicas.md "Learners follow a failover").

Kinds (rule sum, so that the weights count the pushes):
  push  ones to parameters 0..127, one push after the other;
  bsp   ones to parameters 0..1023, then a pull of them, every round; each
        pull must hold one value, the first round's times the rounds this
        learner pushed (a round lost or applied twice fails);
  ssp   the same, without that check (each push is applied as it comes).

train() is the loop; run as a process,

  failover_learner.py TOP BUILD LAYOUT KIND
  failover_learner.py TOP BUILD URL read     (prints the first 1024 weights, JSON)

prints `ack BEGAN` (BEGAN: the round's start on CLOCK_MONOTONIC, which
every network namespace shares) for each acknowledged round until its
stdin ends (a signal could cut a push short), then exits 0; a first line
on stdin, R, makes it go on until it has R acknowledged rounds (bsp
learners that stop at different rounds hold each other until dead_after).
A failure prints `error: WHY` and exits 1.
"""
import json
import sys
import threading
import time

import numpy as np

KINDS = ("push", "bsp", "ssp")


def train(model, kind, stopped, acknowledged):
    """Rounds of `kind` on blkps.Model `model` until stopped() is true;
    acknowledged(began) after each. Returns None, or why the learner
    failed (an OSError's text, or a bsp pull that is not exact)."""
    size = 128 if kind == "push" else 1024
    ones = np.ones(size, dtype=np.float32)
    rounds, per_round = 0, None
    try:
        while not stopped():
            began = time.monotonic()
            model.push(0, ones)
            if kind != "push":
                weights = model.pull(0, size)
                rounds += 1
                per_round = float(weights[0]) if per_round is None else per_round
                if kind == "bsp" and not np.all(weights == np.float32(per_round * rounds)):
                    return f"round {rounds} pulled {sorted(set(weights.tolist()))[:4]}, expected {per_round * rounds}"
            acknowledged(began)
    except OSError as e:
        return str(e)
    return None


def main():
    layout, kind = sys.argv[3:5]
    import testbed
    testbed.setup("failover_learner")  # sys.argv[1:3]: this checkout and build
    import blkps
    if kind == "read":  # LAYOUT is a learner URL: print its first 1024 weights
        with blkps.Model(layout) as model:
            print(json.dumps(model.pull(0, 1024).tolist()))
        return 0
    stop, last, acks = threading.Event(), [None], [0]

    def watch():
        line = sys.stdin.readline()
        if line.strip():
            last[0] = int(line)
        sys.stdin.read()
        stop.set()

    def acknowledged(began):
        acks[0] += 1
        print(f"ack {began:.6f}", flush=True)

    threading.Thread(target=watch, daemon=True).start()
    try:
        with blkps.Model("layout:" + layout) as model:
            why = train(model, kind, lambda: stop.is_set() and (last[0] is None or acks[0] >= last[0]),
                        acknowledged)
    except OSError as e:  # the open
        why = str(e)
    if why:
        print(f"error: {why}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
