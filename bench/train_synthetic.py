#!/usr/bin/python3
"""A communication-bound learner for the training benchmark: softmax
regression on synthetic sparse data, with a model of tens of millions of
parameters and a gradient that costs almost nothing to compute, so that the
time per iteration is the whole-model exchange with the parameter server.

  train_synthetic.py --print-params [--params N]    parameters actually served
  train_synthetic.py --target URL --learner K --learners L --iterations I
                     [--params N] [--start-at T]
                     [--engine [--drop-ratio R] [--control URL]] [--dtype D]
                     [--straggle] [--result FILE]
  train_synthetic.py --allreduce tcp://ADDRESS:PORT --lr LR --learner K
                     --learners L --iterations I [...]

Every iteration pulls all weights, computes the gradient of one minibatch
and pushes a gradient for every parameter (as bsp and ssp require). The
model is W (features x classes), row-major: parameter f*classes + c. A
sample of class c has --active features set to 1, mostly from c's own
feature set, so the loss falls as training goes on; the gradient touches only
those rows, which are cleared again after the push.

--start-at T (seconds since the epoch): wait until then after opening the
device, so that the learners of one run start together. --result FILE: write
one JSON object with the learner's figures (iterations, samples, seconds,
bytes pushed and pulled, per-iteration losses). --engine uses
blkps.Engine (the double-buffered engine) where the binding has one;
--drop-ratio R makes it push only the largest gradient runs and keep the
rest as a residual (doc/libblkps.md "Gradient dropping"; async or ssp, where it
needs --control, the model's CONTROL_URL, to drop per model block).

--allreduce INIT trains the same model without a server, as a data-parallel
peer would (the exchange DDP makes every step): the L learners sum their
gradients with torch.distributed all_reduce (gloo; INIT is its init_method,
--learner the rank) and each applies w -= LR * sum to its own copy of the
model, which is what the server's rule sgd with lr=LR applies in mode bsp.
--straggle: after each iteration the learner sleeps as long as the
iteration took, so it runs at half its speed (a straggler).
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "learner", "python"))
import blkps  # noqa: E402

CLASSES = 1000


def geometry(params):
    """(features, classes) with features * classes <= params and the model a
    whole number of 512-byte blocks (so every push covers whole blocks)."""
    features = params // CLASSES // 16 * 16
    if features < 16:
        sys.exit(f"train_synthetic: --params {params} is too small (at least {16 * CLASSES})")
    return features, CLASSES


class SyntheticTask:
    """Samples and the softmax-regression gradient; seeded per learner."""

    def __init__(self, features, classes, active, seed):
        self.features, self.classes, self.active = features, classes, active
        own = min(features, 4 * active)
        self.class_features = np.random.default_rng(7).integers(0, features, size=(classes, own))
        self.rng = np.random.default_rng(seed)

    def batch(self, size):
        """(feature indices [size, active], labels [size])."""
        y = self.rng.integers(0, self.classes, size=size)
        pick = self.rng.integers(0, self.class_features.shape[1], size=(size, self.active))
        idx = self.class_features[y[:, None], pick]
        noise = self.rng.random((size, self.active)) < 0.2
        idx[noise] = self.rng.integers(0, self.features, size=int(noise.sum()))
        return idx, y

    def gradient(self, w, grad, idx, y):
        """Adds the minibatch gradient into grad (zero on entry outside the
        returned rows) and returns (loss, rows touched)."""
        size = len(y)
        w2 = w.reshape(self.features, self.classes)
        logits = w2[idx].sum(axis=1)
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        loss = float(-np.log(p[np.arange(size), y] + 1e-12).mean())
        p[np.arange(size), y] -= 1.0
        p /= size
        rows, where = np.unique(idx.ravel(), return_inverse=True)
        counts = np.zeros((len(rows), size), dtype=np.float32)
        np.add.at(counts, (where, np.repeat(np.arange(size), self.active)), 1.0)
        grad.reshape(self.features, self.classes)[rows] = counts @ p
        return loss, rows


def train(args):
    features, classes = geometry(args.params)
    n = features * classes
    task = SyntheticTask(features, classes, args.active, 1000 + args.learner)
    if args.allreduce:
        exchange = AllReduceExchange(args.allreduce, args.learner, args.learners, args.lr, n)
    elif args.engine:
        exchange = EngineExchange(args.target, n, args.dtype, args.drop_ratio, args.control)
    else:
        exchange = ModelExchange(args.target, n, args.dtype)
    if args.start_at:
        time.sleep(max(0.0, args.start_at - time.time()))
    losses, times = [], []
    start = time.time()
    for it in range(args.iterations):
        began = time.perf_counter()
        weights, grad = exchange.begin()
        idx, y = task.batch(args.batch)
        loss, rows = task.gradient(weights, grad, idx, y)
        exchange.end(rows)
        losses.append(loss)
        if args.straggle:
            time.sleep(time.perf_counter() - began)
        times.append(time.time() - start)
        if args.progress and (it + 1) % args.progress == 0:
            print(f"learner {args.learner}: iteration {it + 1} loss {loss:.4f} "
                  f"{(it + 1) / (time.time() - start):.2f} it/s", flush=True)
    exchange.close()
    seconds = time.time() - start
    result = {
        "learner": args.learner, "learners": args.learners, "params": n,
        "iterations": args.iterations, "samples": args.iterations * args.batch,
        "start": start, "seconds": seconds,
        "bytes_pushed": exchange.bytes_pushed(args.iterations, n),
        "bytes_pulled": args.iterations * 4 * n, "drop_ratio": args.drop_ratio,
        "comm_seconds": exchange.comm_seconds,
        "losses": losses, "times": times,
    }
    if args.result:
        with open(args.result, "w") as f:
            json.dump(result, f)
    print(f"learner {args.learner}: {args.iterations} iterations in {seconds:.2f} s, "
          f"loss {np.mean(losses[:3]):.3f} -> {np.mean(losses[-3:]):.3f}", flush=True)


class ModelExchange:
    """Pull, compute, push in turn with blkps.Model (one thread)."""

    def __init__(self, target, n, dtype):
        self.model = blkps.Model(target, dtype=dtype)
        if self.model.param_capacity < n:
            sys.exit(f"train_synthetic: {target} holds {self.model.param_capacity} parameters, "
                     f"the model needs {n} (start the server with params={n})")
        self.weights = np.empty(n, dtype=np.float32)
        self.grad = np.zeros(n, dtype=np.float32)
        self.comm_seconds = 0.0

    def begin(self):
        """Pulls; returns (weights, a zero gradient buffer)."""
        t = time.perf_counter()
        self.model.pull_into(0, self.weights)
        self.comm_seconds += time.perf_counter() - t
        return self.weights, self.grad

    @staticmethod
    def bytes_pushed(iterations, n):
        return iterations * 4 * n

    def end(self, rows):
        """Pushes the gradient, then clears the rows it set."""
        t = time.perf_counter()
        self.model.push(0, self.grad)
        self.comm_seconds += time.perf_counter() - t
        self.grad.reshape(-1, CLASSES)[rows] = 0.0

    def close(self):
        self.model.close()


class AllReduceExchange:
    """The peer-to-peer counterpart of ModelExchange: the gradient summed
    over the learners (gloo all_reduce), applied to a local model."""

    def __init__(self, init, rank, world, lr, n):
        import torch
        import torch.distributed as dist
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
        self.dist, self.lr = dist, lr
        self.weights = np.zeros(n, dtype=np.float32)
        self.grad = np.zeros(n, dtype=np.float32)
        self.grad_tensor = torch.from_numpy(self.grad)  # shares grad's memory
        self.comm_seconds = 0.0

    def begin(self):
        return self.weights, self.grad

    @staticmethod
    def bytes_pushed(iterations, n):
        """What this learner gave to all_reduce: its whole gradient, every iteration."""
        return iterations * 4 * n

    def end(self, rows):
        t = time.perf_counter()
        self.dist.all_reduce(self.grad_tensor)
        self.comm_seconds += time.perf_counter() - t
        self.weights -= self.lr * self.grad
        self.grad[:] = 0.0  # the sum touches every learner's rows

    def close(self):
        self.dist.destroy_process_group()


class EngineExchange:
    """blkps.Engine: the next pull and this push overlap the next compute.
    Adaptive pulling is off, so every step moves the whole model both ways,
    as ModelExchange does (with drop_ratio: the whole model is pulled, the
    largest runs of the gradient pushed)."""

    def __init__(self, target, n, dtype=None, drop_ratio=0.0, control=None):
        engine_class = getattr(blkps, "Engine", None)
        if engine_class is None:
            sys.exit("train_synthetic: --engine: this blkps binding has no Engine")
        self.engine = engine_class(target, param_count=n, adaptive_pull=False,
                                   drop_ratio=drop_ratio, control_target=control, dtype=dtype)
        # Dropping adds the residual into the pushed buffer: every row may be
        # non-zero afterwards, so the whole buffer is cleared.
        self.clear_all = drop_ratio > 0
        self.pushed = 0
        self.rows = {}  # gradient buffer address -> rows it holds from its last use
        self.grad = None
        self.comm_seconds = 0.0

    def begin(self):
        self.grad = self.engine.gradient
        address = self.grad.ctypes.data
        if address in self.rows and not self.clear_all:
            self.grad.reshape(-1, CLASSES)[self.rows[address]] = 0.0
        else:
            self.grad[:] = 0.0
        return self.engine.weights, self.grad

    def end(self, rows):
        self.rows[self.grad.ctypes.data] = rows
        t = time.perf_counter()
        self.engine.step()  # waits only for what did not overlap the compute
        self.comm_seconds += time.perf_counter() - t

    def bytes_pushed(self, iterations, n):
        del iterations, n  # counted by the engine
        return 4 * self.pushed

    def close(self):
        t = time.perf_counter()
        self.engine.finish()
        self.comm_seconds += time.perf_counter() - t
        self.pushed = self.engine.params_pushed
        self.engine.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", help="model device URL (iscsi://...) or path")
    ap.add_argument("--print-params", action="store_true", help="print the parameter count served and exit")
    ap.add_argument("--params", type=int, default=25_000_000, help="model size, rounded down (default 25M)")
    ap.add_argument("--learner", type=int, default=0)
    ap.add_argument("--learners", type=int, default=1)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--batch", type=int, default=64, help="samples per iteration (default 64)")
    ap.add_argument("--active", type=int, default=32, help="features set per sample (default 32)")
    ap.add_argument("--start-at", type=float, help="wall-clock second to start at")
    ap.add_argument("--engine", action="store_true", help="use blkps.Engine")
    ap.add_argument("--drop-ratio", type=float, default=0.0,
                    help="with --engine: gradient runs dropped per push, in [0, 1) (default 0)")
    ap.add_argument("--control", help="with --engine: the model's CONTROL_URL (staleness; "
                    "with --drop-ratio in ssp, the per-block groups)")
    ap.add_argument("--dtype", help="the LUN's --bsopts dtype: float32 (default), bfloat16 or float16 "
                    "(doc/server.md \"16-bit wire\")")
    ap.add_argument("--allreduce", metavar="INIT", help="no server: sum gradients with gloo all_reduce "
                    "(init_method INIT, e.g. tcp://10.0.0.1:29500) and apply them locally")
    ap.add_argument("--lr", type=float, default=50.0, help="with --allreduce: the SGD step (default 50)")
    ap.add_argument("--straggle", action="store_true", help="run at half speed (sleep as long as each "
                    "iteration took)")
    ap.add_argument("--result", help="write the learner's figures here (JSON)")
    ap.add_argument("--progress", type=int, default=0, help="print a line every this many iterations")
    args = ap.parse_args()
    if args.print_params:
        features, classes = geometry(args.params)
        print(features * classes)
        return
    if not args.target and not args.allreduce:
        ap.error("--target or --allreduce is required")
    if not 0 <= args.learner < args.learners:
        ap.error(f"--learner must be in [0, {args.learners})")
    if (args.drop_ratio or args.control) and not args.engine:
        ap.error("--drop-ratio and --control need --engine")
    if args.iterations < 1 or args.batch < 1 or args.active < 1:
        ap.error("--iterations, --batch and --active must be positive")
    try:
        train(args)
    except OSError as e:
        sys.exit(f"train_synthetic: {e.strerror or e}")


if __name__ == "__main__":
    main()
