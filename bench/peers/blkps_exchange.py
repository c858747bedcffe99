#!/usr/bin/python3
"""One learner of a blkps model exchange for bench/peers.sh: every exchange
pushes a gradient for the whole model and pulls the whole model, through a
blkps target (iscsi:// URL, one LUN per learner), the parameter-server
counterpart of one all_reduce of the same vector.

  blkps_exchange.py --target URL --params P --iterations I --warmup W
                    --start-at T --result FILE

It opens the device, waits until wall-clock second T (so that the learners
start together), runs W + I exchanges back to back and writes FILE (JSON):
the times of the I timed exchanges, of their pushes and pulls, and its CPU
seconds (user + system) over them.
"""
import argparse
import json
import os
import resource
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "learner", "python"))
import blkps  # noqa: E402


def cpu_seconds():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--params", type=int, required=True)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--start-at", type=float, default=0.0)
    ap.add_argument("--result", required=True)
    args = ap.parse_args()
    grad = np.full(args.params, 1e-6, dtype=np.float32)
    weights = np.empty(args.params, dtype=np.float32)
    try:
        model = blkps.Model(args.target)
    except OSError as e:
        sys.exit(f"blkps_exchange: {e.strerror or e}")
    times, pushes, pulls, cpu = [], [], [], 0.0
    with model:
        time.sleep(max(0.0, args.start_at - time.time()))
        for it in range(-args.warmup, args.iterations):
            if it == 0:
                cpu = cpu_seconds()
            t0 = time.perf_counter()
            model.push(0, grad)
            t1 = time.perf_counter()
            model.pull_into(0, weights)
            t2 = time.perf_counter()
            if it >= 0:
                times.append(t2 - t0)
                pushes.append(t1 - t0)
                pulls.append(t2 - t1)
        cpu = cpu_seconds() - cpu
    with open(args.result, "w") as f:
        json.dump({"peer": "blkps", "target": args.target, "params": args.params, "times": times,
                   "push_times": pushes, "pull_times": pulls, "cpu": cpu}, f)


if __name__ == "__main__":
    main()
