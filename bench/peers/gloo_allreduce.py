#!/usr/bin/python3
"""The time of one torch.distributed all_reduce (sum, gloo backend, TCP on
loopback) of a float32 model vector: a peer of blkps for bench/peers.sh.

  gloo_allreduce.py --rank R --world N --init tcp://127.0.0.1:PORT
                    --params P --iterations I --warmup W --result FILE

Each of the N processes (started by the caller) reduces P floats in place,
back to back, W + I times, and writes FILE (JSON): the times of the I timed
calls and its CPU seconds (user + system) over them.
"""
import argparse
import json
import resource
import time

import torch
import torch.distributed as dist


def cpu_seconds():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--init", required=True, help="torch.distributed init_method, e.g. tcp://127.0.0.1:29500")
    ap.add_argument("--params", type=int, required=True)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--result", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=args.init, rank=args.rank, world_size=args.world)
    model = torch.full((args.params,), 1e-6, dtype=torch.float32)
    times, cpu = [], 0.0
    for it in range(-args.warmup, args.iterations):
        if it == 0:
            cpu = cpu_seconds()
        start = time.perf_counter()
        dist.all_reduce(model, op=dist.ReduceOp.SUM)
        if it >= 0:
            times.append(time.perf_counter() - start)
    cpu = cpu_seconds() - cpu
    dist.destroy_process_group()
    with open(args.result, "w") as f:
        json.dump({"peer": "gloo", "rank": args.rank, "procs": args.world, "params": args.params,
                   "times": times, "cpu": cpu}, f)


if __name__ == "__main__":
    main()
