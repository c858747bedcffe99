#!/usr/bin/python3
"""Learners push integer gradients and pull the model through libblkps, and
the weights must be exact; prints push and pull MB/s.

  push_pull.py --params N --rounds R [--mode M] [--initiator IQN] TARGET...

With --initiator, this process opens TARGET as IQN and learner k as IQN-k
(each session its own name, as tgt's iSER ACL and the receipts want).

One learner process per TARGET (a learner LUN of one model with rule=sum:
an iscsi:// or iser:// URL, or the LUN's block device): learner k pushes
the gradient k + 1 to every parameter R times, then pulls the whole model R
times. Every weight must end at its initial value plus R * (1 + ... + L)
for L learners, or R * (1 + ... + L) / L in bsp (the rule is applied to the
round's average): exact in float32 for the small R and L used here.
Exit status 1 with one line when a weight differs. The MB/s figures are the
model's bytes moved by all learners over the phase's wall time.
"""
import argparse
import multiprocessing
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.environ["BLKPS_PY"])
import blkps  # noqa: E402


def require_exact(who, weights, want):
    """Exits with one line naming the first of `weights` that differs from
    `want`, if any."""
    wrong = np.flatnonzero(weights != want)
    if wrong.size:
        i = wrong[0]
        sys.exit(f"{who}: {wrong.size} weights differ: parameter {i} is {weights[i]}, expected {want[i]}")


def learner(url, initiator, k, params, rounds, start, pushed, pulled):
    """Learner k: R pushes, then (once every learner has pushed) R pulls."""
    with blkps.Model(url, initiator_name=initiator) as m:
        grad = np.full(params, k + 1, dtype=np.float32)
        start.wait()
        for _ in range(rounds):
            m.push(0, grad)
        pushed.wait()
        out = np.empty(params, dtype=np.float32)
        for _ in range(rounds):
            m.pull_into(0, out)
        pulled.wait()


def pull_whole(url, initiator, params, weights):
    """Pulls the whole model into the shared array `weights`."""
    with blkps.Model(url, initiator_name=initiator) as m:
        m.pull_into(0, np.frombuffer(weights.get_obj(), dtype=np.float32, count=params))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--params", type=int, required=True)
    p.add_argument("--rounds", type=int, required=True)
    p.add_argument("--mode", default="async", help="the model's mode= (async, bsp or ssp:S)")
    p.add_argument("--initiator", help="initiator name of this process; learner k's is IQN-k (default: libblkps's)")
    p.add_argument("urls", nargs="+")
    a = p.parse_args()
    n = len(a.urls)
    # On iser:// every process that opens the model starts as a new process
    # (spawn), not a fork of this one, and this one opens none itself: a
    # fork of a process that has opened an iser:// model inherits librdmacm's
    # process-wide RDMA state, and libiscsi's iSER then corrupts the child's
    # heap ("double free or corruption", seen on soft-RoCE); and this
    # process's second iser:// open once hung in CI (soft-RoCE; cause not
    # found). Elsewhere fork, which starts faster.
    ctx = multiprocessing.get_context("spawn" if any(u.startswith("iser://") for u in a.urls) else "fork")

    def pulled_whole():
        weights = ctx.Array("f", a.params)
        proc = ctx.Process(target=pull_whole, args=(a.urls[0], a.initiator, a.params, weights))
        proc.start()
        proc.join()
        if proc.exitcode != 0:
            sys.exit(f"push_pull: the pull of the whole model failed (exit {proc.exitcode})")
        return np.frombuffer(weights.get_obj(), dtype=np.float32, count=a.params).copy()

    initial = pulled_whole()
    # Three barriers shared with the learners: pushes start, pushes done,
    # pulls done; this process is the (n+1)th party of each.
    start, pushed, pulled = (ctx.Barrier(n + 1, timeout=120) for _ in range(3))
    procs = [ctx.Process(target=learner, args=(url, a.initiator and f"{a.initiator}-{k + 1}", k, a.params,
                                                           a.rounds, start, pushed, pulled))
             for k, url in enumerate(a.urls)]
    for proc in procs:
        proc.start()
    start.wait()
    t0 = time.monotonic()
    pushed.wait()
    t1 = time.monotonic()
    pulled.wait()
    t2 = time.monotonic()
    for proc in procs:
        proc.join()
        if proc.exitcode != 0:
            sys.exit(f"push_pull: a learner failed (exit {proc.exitcode})")
    moved = n * a.rounds * a.params * 4 / 1e6
    print(f"push {moved / (t1 - t0):.1f} MB/s, pull {moved / (t2 - t1):.1f} MB/s "
          f"({n} learners, {a.rounds} x {a.params * 4 >> 10} KiB each)")
    final = pulled_whole()
    gain = a.rounds * n * (n + 1) / 2 / (n if a.mode == "bsp" else 1)
    require_exact("push_pull", final, initial + np.float32(gain))
    print(f"weights exact: initial + {gain}")


if __name__ == "__main__":
    main()
