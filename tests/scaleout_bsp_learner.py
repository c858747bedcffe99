"""A bsp learner of ScaleOut.kill-restart-bsp (tests/scaleout_test.sh) and of
bench/kill_restart_bsp_probe.sh: pushes VALUE (1 for learner 1, 3 for
learner 2) to every parameter each round, then pulls.

Learner 1 syncs every 4 rounds, each time once learner 2 has pushed the
next round's gradient to shard 0 (the model's first half) and not yet to
shard 1: a checkpoint taken at an instant, not at a round boundary, would
hold learner 2 one round apart on the two shards. The learners meet through
empty files in MARKS (half-<r>: learner 2's first half of round r is
pushed; synced-<r>: learner 1 synced after round r), until they have
reconnected: after a restart each learner's pushes that the restart lost
are lost on each shard apart, so a round's pull may need the other's next
push, and the meeting would deadlock. They write their last
finished round to MARKS/progress-<learner>. At the end each waits for
MARKS/finish (so that it is still there to be stopped), syncs (so that
pushed_bytes_lost is complete) and prints pushed_bytes_lost.

usage: scaleout_bsp_learner.py URL PARAMS LEARNER ROUNDS MARKS
"""

import os
import sys
import time

import numpy as np

import blkps


def mark(marks, name):
    with open(os.path.join(marks, name), "w"):
        pass


def wait_for(marks, name, limit_s=300):
    """Polls for the other learner's (or the test's) mark; exits after
    limit_s without it."""
    deadline = time.monotonic() + limit_s
    while not os.path.exists(os.path.join(marks, name)):
        if time.monotonic() > deadline:
            sys.exit(f"learner: no {name} in {marks} after {limit_s} s")
        time.sleep(0.01)


def main():
    url, n, learner, rounds, marks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    half = n // 2  # one 1 MiB stripe unit on each tgtd
    g = np.full(n, 1.0 if learner == 1 else 3.0, dtype=np.float32)
    with blkps.Model(url) as m:
        for r in range(1, rounds + 1):
            if learner == 2 and r > 1 and (r - 1) % 4 == 0:
                m.push(0, g[:half])
                mark(marks, f"half-{r}")
                if m.reconnects == 0:
                    wait_for(marks, f"synced-{r - 1}")
                m.push(half, g[half:])
            else:
                m.push(0, g)
            m.pull(0, n)
            if learner == 1 and r % 4 == 0:
                if r < rounds and m.reconnects == 0:
                    wait_for(marks, f"half-{r + 1}")
                m.sync()  # a generation
                mark(marks, f"synced-{r}")
            with open(os.path.join(marks, f"progress-{learner}"), "w") as f:
                f.write(f"{r}\n")
        wait_for(marks, "finish")
        m.sync()
        print(m.pushed_bytes_lost)


if __name__ == "__main__":
    main()
