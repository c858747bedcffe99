"""A learner of ScaleOut.kill-restart-bsp and ScaleOut.kill-restart-ssp
(tests/scaleout_test.sh) and of bench/kill_restart_bsp_probe.sh: pushes
VALUE (1 for learner 1, 3 for learner 2) to every parameter each round,
then pulls.

bsp: learner 1 syncs every 4 rounds, each time once learner 2 has pushed the
next round's gradient to shard 0 (the model's first half) and not yet to
shard 1: a checkpoint taken at an instant, not at a round boundary, would
hold learner 2 one round apart on the two shards. The learners meet through
empty files in MARKS (half-<r>: learner 2's first half of round r is
pushed; synced-<r>: learner 1 synced after round r), until the test has
restarted the shards (MARKS/restarted, written before the learners go on).
Both pause after round PAUSE's pull (before learner 1's sync of it), write
it to MARKS/paused-<learner> and wait for MARKS/restarted: with no I/O of
theirs in flight, the restart loses the same pushes of each learner on
every shard. (Stopped anywhere else, one learner could be left one push
apart on the two shards, ahead of the other on one and behind it on the
other; then each one's pull waits for the other's next push, and a round
completed without a learner once the server declares them dead breaks
the test's count of the gradients.) They write their last finished round
to MARKS/progress-<learner>.

ssp (MODE ssp:<s>): both learners sync every 4 rounds (the consistent
point of doc/server.md "One round on every shard"). Learner 1 pushes such
a round only once every shard holds learner 2's fsync of it, waiting for
learner 1 (status checkpoint.waiting_round); its own fsync then finds the
part written. They pause as in bsp, at rounds the test gives each.
After the restart they sync only at the end: a learner's own round count
is no longer its iteration on the shards, and an fsync asks for that.

At the end each waits for MARKS/finish (so that it is still there to be
stopped), syncs (so that pushed_bytes_lost is complete) and prints
pushed_bytes_lost and how many halves (one shard's part of a push) it
pushed.

usage: scaleout_round_learner.py URL PARAMS LEARNER ROUNDS MARKS MODE PAUSE
"""

import os
import sys
import time

import numpy as np

import blkps
import blkps.control


def mark(marks, name):
    with open(os.path.join(marks, name), "w"):
        pass


def restarted(marks):
    return os.path.exists(os.path.join(marks, "restarted"))


def wait_for(marks, name, limit_s=300, meeting=True):
    """Polls for the other learner's (or the test's) mark; exits after
    limit_s without it. A meeting ends without its mark once the shards
    have restarted."""
    deadline = time.monotonic() + limit_s
    while not os.path.exists(os.path.join(marks, name)) and not (meeting and restarted(marks)):
        if time.monotonic() > deadline:
            sys.exit(f"learner: no {name} in {marks} after {limit_s} s")
        time.sleep(0.01)


def main():
    url, n, learner, rounds, marks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    mode, pause = sys.argv[6], int(sys.argv[7])
    g = np.full(n, 1.0 if learner == 1 else 3.0, dtype=np.float32)
    with blkps.Model(url) as m:
        if mode == "bsp":
            bsp_rounds(m, g, learner, rounds, marks, pause)
        else:
            ssp_rounds(url, m, g, learner, rounds, marks, pause)
        made = 2 * rounds + top_up(url, m, g, learner, rounds)
        wait_for(marks, "finish", meeting=False)
        m.sync()
        print(m.pushed_bytes_lost, made)


def progress(marks, learner, r, name="progress"):
    with open(os.path.join(marks, f"{name}-{learner}"), "w") as f:
        f.write(f"{r}\n")


def ssp_rounds(url, m, g, learner, rounds, marks, pause):
    n = len(g)
    with blkps.control.ShardedControl(url) as control:
        for r in range(1, rounds + 1):
            meeting = r % 4 == 0 and not restarted(marks)
            if meeting and learner == 1:
                until_waiting(control, r, marks)
            m.push(0, g)
            m.pull(0, n)
            if r == pause:
                pause_for_restart(marks, learner, r)
            if meeting and not restarted(marks):
                m.sync()  # a generation, at iteration r for both
            progress(marks, learner, r)


def pause_for_restart(marks, learner, r):
    progress(marks, learner, r, "paused")
    wait_for(marks, "restarted", meeting=False)


def until_waiting(control, r, marks, limit_s=60):
    """Polls until every shard holds learner 2's fsync for iteration r
    (status checkpoint.waiting_round), or the shards have restarted."""
    deadline = time.monotonic() + limit_s
    while not restarted(marks):
        if all(s["checkpoint"]["waiting_round"] == r for s in control.status()["shards"]):
            return
        if time.monotonic() > deadline:
            sys.exit(f"learner: no shard-wide fsync of iteration {r} after {limit_s} s")
        time.sleep(0.01)


def bsp_rounds(m, g, learner, rounds, marks, pause):
    n = len(g)
    half = n // 2  # one 1 MiB stripe unit on each tgtd
    for r in range(1, rounds + 1):
        if learner == 2 and r > 1 and (r - 1) % 4 == 0:
            m.push(0, g[:half])
            mark(marks, f"half-{r}")
            wait_for(marks, f"synced-{r - 1}")
            m.push(half, g[half:])
        else:
            m.push(0, g)
        m.pull(0, n)
        if r == pause:
            pause_for_restart(marks, learner, r)
        if learner == 1 and r % 4 == 0:
            if r < rounds:
                wait_for(marks, f"half-{r + 1}")
            m.sync()  # a generation
            mark(marks, f"synced-{r}")
        progress(marks, learner, r)


def top_up(url, m, g, learner, rounds):
    """Pushes (and pulls) each shard's half until this learner has ROUNDS
    gradients in on every shard, as the shards' status counts them; returns
    how many halves it pushed. After a restart a learner whose half-push
    the rollback lost is one push behind on that shard; without this the
    other, ahead, would wait for that push after the last round until the
    server declared it dead, and complete a round without it."""
    half = len(g) // 2
    pushed = 0
    with blkps.control.ShardedControl(url) as control:
        while True:
            shards = control.status()["shards"]
            behind = []
            for k, status in enumerate(shards):
                mine = sorted(status["learners"], key=lambda entry: entry["lun"])[learner - 1]
                if mine["iteration"] < rounds:
                    behind.append(k)
            if not behind:
                return pushed
            for k in behind:
                m.push(k * half, g[k * half:(k + 1) * half])
                pushed += 1
            for k in behind:
                m.pull(k * half, half)


if __name__ == "__main__":
    main()
