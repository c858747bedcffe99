#!/usr/bin/python3
"""One learner of a blkps model exchange for bench/peers.sh: every exchange
pushes a gradient for the whole model and pulls the whole model, through a
blkps target (iscsi:// URL, one LUN per learner), the parameter-server
counterpart of one all_reduce of the same vector.

  blkps_exchange.py --target URL --params P --iterations I --warmup W
                    --start-at T --result FILE [--dtype D] [--drop-ratio R]
                    [--overlap | --pipelined]

It opens the device, waits until wall-clock second T (so that the learners
start together; with --ready R --go G instead it makes file R once open
and starts at the second written in file G, which the caller writes once
every learner is ready), runs W + I exchanges back to back and writes FILE (JSON):
the times of the I timed exchanges, of their pushes and pulls, the wall
clock (time.time()) at which each began, its CPU seconds (user + system)
over them, and how late it was ready for T. --dtype is the LUN's --bsopts dtype (a
16-bit wire), as the learner must say it. --drop-ratio R > 0 and
--overlap exchange through blkps.Engine (which pulls the first weights when
it opens): with --drop-ratio R a step pushes the largest 1 - R of the
gradient's runs (the rest kept as the residual), then pulls the whole model;
with --overlap (double buffering) the push of a gradient and the pull of the
next weights run at once on their own connections, so the weights are one
push behind, as when the engine trains. With --pipelined an exchange is one
blkps.Model.exchange (doc/libblkps.md "Exchange"): each request's pull
follows its push on the same connection while later pushes are in flight,
so push and pull are not timed apart (the result's push and pull lists stay
empty). With --torch an exchange is one step of blkps.torch's
DistributedOptimizer (gradient mode) on a model of P parameters in
TORCH_TENSORS tensors whose backward costs next to nothing: its own buckets,
pushed by its communication thread as backward fills them, and the weights
pulled; with --pipelined too, its one-step pipeline (pipeline=True), else
pipeline=False. Its phases are not timed apart either.
"""
import argparse
import contextlib
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
    ap.add_argument("--ready", help="a file to make once the device is open (with --go)")
    ap.add_argument("--go", help="wait until this file exists, then start at the wall-clock second it holds")
    ap.add_argument("--result", required=True)
    ap.add_argument("--dtype", help="the LUN's dtype: float32 (default), bfloat16 or float16")
    ap.add_argument("--drop-ratio", type=float, default=0.0, help="gradient runs dropped per push, in [0, 1)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--overlap", action="store_true", help="push and pull at once (blkps.Engine, double buffering)")
    mode.add_argument("--pipelined", action="store_true", help="one Model.exchange: each request's pull follows "
                      "its push (with --torch: blkps.torch's pipeline)")
    ap.add_argument("--torch", action="store_true", help="a step of blkps.torch's DistributedOptimizer")
    args = ap.parse_args()
    if args.pipelined and args.drop_ratio > 0:
        sys.exit("blkps_exchange: --pipelined exchanges the whole gradient; it does not drop (--drop-ratio)")
    if args.torch and (args.overlap or args.drop_ratio > 0 or args.dtype not in (None, "float32")):
        sys.exit("blkps_exchange: --torch takes a float32 model and neither --overlap nor --drop-ratio")
    try:
        if args.torch:
            exchange = TorchExchange(args)
        elif args.drop_ratio > 0 or args.overlap:
            exchange = EngineExchange(args)
        else:
            exchange = PipelinedExchange(args) if args.pipelined else ModelExchange(args)
    except OSError as e:
        sys.exit(f"blkps_exchange: {e.strerror or e}")
    times, pushes, pulls, starts, cpu = [], [], [], [], 0.0
    with exchange.handle:
        if args.go:
            args.start_at = wait_for_go(args.ready, args.go)
        late = max(0.0, time.time() - args.start_at)  # > 0: opening outlasted the wait for start_at
        time.sleep(max(0.0, args.start_at - time.time()))
        for it in range(-args.warmup, args.iterations):
            if it == 0:
                cpu = cpu_seconds()
            t0 = time.perf_counter()
            start = time.time()
            push_s, pull_s = exchange.step()
            if it >= 0:
                times.append(time.perf_counter() - t0)
                if push_s is not None:
                    pushes.append(push_s)
                    pulls.append(pull_s)
                    starts.append(start)
        cpu = cpu_seconds() - cpu
        pushed = exchange.params_pushed()
    with open(args.result, "w") as f:
        json.dump({"peer": "blkps", "target": args.target, "params": args.params, "dtype": args.dtype or "float32",
                   "drop_ratio": args.drop_ratio, "params_pushed": pushed, "late_s": late, "times": times,
                   "push_times": pushes, "pull_times": pulls, "starts": starts, "cpu": cpu}, f)


def wait_for_go(ready, go):
    """Says it is ready (makes `ready`), waits for `go` and returns the start
    time written in it: the bench writes it once every learner is ready, so
    that all start together however long their logins took."""
    open(ready, "w").close()
    while True:
        try:
            with open(go) as f:
                return float(f.read())
        except (FileNotFoundError, ValueError):
            time.sleep(0.01)


class ModelExchange:
    """blkps.Model: push the whole gradient, then pull the whole model."""

    def __init__(self, args):
        self.handle = blkps.Model(args.target, dtype=args.dtype)
        self.grad = np.full(args.params, 1e-6, dtype=np.float32)
        self.weights = np.empty(args.params, dtype=np.float32)
        self.pushed = 0

    def step(self):
        """One exchange; returns (push seconds, pull seconds)."""
        t0 = time.perf_counter()
        self.handle.push(0, self.grad)
        t1 = time.perf_counter()
        self.handle.pull_into(0, self.weights)
        self.pushed += self.grad.size
        return t1 - t0, time.perf_counter() - t1

    def params_pushed(self):
        return self.pushed


class PipelinedExchange(ModelExchange):
    """blkps.Model.exchange: push and pull of each request pipelined on one
    connection; the phases are not timed apart."""

    def step(self):
        """One exchange; returns (None, None): no separate phases."""
        self.handle.exchange(0, self.grad, self.weights)
        self.pushed += self.grad.size
        return None, None


class EngineExchange:
    """blkps.Engine: step() pushes the gradient (with dropping: its kept runs)
    and pulls the whole model, one after the other or, with overlap, at once."""

    def __init__(self, args):
        self.handle = blkps.Engine(args.target, param_count=args.params, double_buffering=args.overlap,
                                   adaptive_pull=False, drop_ratio=args.drop_ratio, dtype=args.dtype)

    def step(self):
        self.handle.gradient[:] = 1e-6  # the engine's contract: every value, every step
        self.handle.step()
        metrics = self.handle.metrics
        return metrics["push_s"], metrics["pull_s"]

    def params_pushed(self):
        return self.handle.params_pushed


TORCH_TENSORS = 16


class TorchExchange:
    """blkps.torch: step() is zero_grad, a backward whose every gradient is
    1e-6, and the optimizer's step(); the communication thread pushes the
    buckets and pulls the weights. The handle closes the optimizer (its last
    transfers drained) and the session."""

    def __init__(self, args):
        import torch
        import blkps.torch as bps
        torch.set_num_threads(1)
        bps.init(target=args.target)
        sizes = [args.params // TORCH_TENSORS + (k < args.params % TORCH_TENSORS) for k in range(TORCH_TENSORS)]
        self.tensors = [torch.nn.Parameter(torch.zeros(n)) for n in sizes]
        self.opt = bps.DistributedOptimizer(None, named_parameters=[(f"t{k}", t) for k, t in enumerate(self.tensors)],
                                            pipeline=args.pipelined)
        self.steps = 0
        self.handle = contextlib.ExitStack()
        self.handle.callback(bps.shutdown)
        self.handle.callback(self.opt.close)

    def step(self):
        """One step; returns (None, None): no separate phases."""
        self.opt.zero_grad()
        (1e-6 * sum(t.sum() for t in self.tensors)).backward()
        self.opt.step()
        self.steps += 1
        return None, None

    def params_pushed(self):
        return self.steps * sum(t.numel() for t in self.tensors)


if __name__ == "__main__":
    main()
