#!/usr/bin/python3
"""The time of one torch.distributed all_reduce (sum, gloo backend) of a
float32 model vector: a peer of blkps for bench/peers.sh (TCP on loopback)
and bench/cluster/ (between namespaces).

  gloo_allreduce.py --rank R --world N --init tcp://ADDRESS:PORT
                    --params P --iterations I --warmup W [--ddp [--compress fp16]]
                    --result FILE

Each of the N processes (started by the caller) reduces P floats in place,
back to back, W + I times, and writes FILE (JSON): the times of the I timed
calls and its CPU seconds (user + system) over them.

--ddp: the exchange as PyTorch DistributedDataParallel makes it: the model
is one parameter vector of P values in DDP, and an exchange is one backward
pass of loss = sum(w), whose gradient DDP all-reduces (one bucket: the
vector is larger than DDP's bucket cap) before backward() returns.
--compress fp16 registers DDP's fp16_compress_hook (the gradient crosses
the wire as float16).
"""
import argparse
import json
import os
import resource
import time

import torch
import torch.distributed as dist


def cpu_seconds():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


class FlatModel(torch.nn.Module):
    def __init__(self, params):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(params))

    def forward(self):
        return self.w.sum()


def exchange_function(args):
    """A function that makes one exchange, by the chosen path."""
    if not args.ddp:
        model = torch.full((args.params,), 1e-6, dtype=torch.float32)
        return lambda: dist.all_reduce(model, op=dist.ReduceOp.SUM)
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel
    model = DistributedDataParallel(FlatModel(args.params))
    if args.compress == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)

    def step():
        model.zero_grad(set_to_none=False)
        model().backward()
    return step


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--init", required=True, help="torch.distributed init_method, e.g. tcp://127.0.0.1:29500")
    ap.add_argument("--params", type=int, required=True)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--ddp", action="store_true", help="exchange as DistributedDataParallel's backward does")
    ap.add_argument("--compress", choices=("none", "fp16"), default="none", help="with --ddp: DDP's comm hook")
    ap.add_argument("--result", required=True)
    args = ap.parse_args()
    if args.compress != "none" and not args.ddp:
        ap.error("--compress needs --ddp")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=args.init, rank=args.rank, world_size=args.world)
    exchange = exchange_function(args)
    times, cpu = [], 0.0
    for it in range(-args.warmup, args.iterations):
        if it == 0:
            cpu = cpu_seconds()
        start = time.perf_counter()
        exchange()
        if it >= 0:
            times.append(time.perf_counter() - start)
    cpu = cpu_seconds() - cpu
    with open(args.result, "w") as f:
        json.dump({"peer": "ddp" if args.ddp else "gloo", "rank": args.rank, "procs": args.world,
                   "params": args.params, "compress": args.compress, "times": times, "cpu": cpu}, f)
    del exchange
    dist.destroy_process_group()
    # torch 1.13's interpreter teardown can hang in gloo's threads after a
    # DDP comm hook ran (seen here with fp16_compress_hook); the result is
    # written, so leave at once.
    os._exit(0)


if __name__ == "__main__":
    main()
