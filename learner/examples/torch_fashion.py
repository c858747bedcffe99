#!/usr/bin/python3
"""A PyTorch learner: a small CNN trained on Fashion-MNIST through blkps with
blkps.torch, Horovod's two-line change (see doc/pytorch.md "PyTorch").

  torch_fashion.py --params                       the device's parameter count
  torch_fashion.py [--target T] [--control C] [options]   one learner
  torch_fashion.py --local [options]              the same training, no server (baseline)
  torch_fashion.py --ddp [options]                the peer: DistributedDataParallel (gloo)

The target and control LUN come from --target/--control or BLKPS_TARGET/
BLKPS_CONTROL ({rank}/{slot} filled in per learner); rank and size from the
launcher (torchrun, mpirun, Slurm, or RANK/WORLD_SIZE as
torch_fashion_job.py sets them). Learner r trains on every size-th image of
the training set starting at r (of the first --train-subset); each epoch it
prints one progress line; rank 0 prints the held-out accuracy at the end
(and every --eval-every steps), then a line "result: {json}".

--optimizer gradient (server rule, e.g. adam or sgd, updates the model) or
delta (local torch.optim.SGD with --lr, momentum --momentum; server rule sum).
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from blkps import datasets  # noqa: E402


def make_model(seed=0):
    """The CNN (11,274 parameters): 2 conv layers, 2 poolings, a linear layer."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 5, padding=2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 5, padding=2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(16 * 7 * 7, 10))


def load(split, limit):
    """(images float32 (N, 1, 28, 28) scaled to [0, 1], labels int64)."""
    images, labels = datasets.fashion_mnist(split)
    if limit:
        images, labels = images[:limit], labels[:limit]
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    return x, torch.from_numpy(labels.astype(np.int64))


def accuracy(model, x, y, batch=1000):
    with torch.no_grad():
        right = sum(int((model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum())
                    for i in range(0, len(x), batch))
    return right / len(x)


def add_arguments(ap):
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32, help="per learner")
    ap.add_argument("--train-subset", type=int, default=0, help="first N training images (0: all 60,000)")
    ap.add_argument("--test-subset", type=int, default=0, help="first N test images (0: all 10,000)")
    ap.add_argument("--optimizer", choices=["gradient", "delta"], default="gradient")
    ap.add_argument("--lr", type=float, default=0.05, help="delta mode and --local: local SGD's lr")
    ap.add_argument("--momentum", type=float, default=0.9, help="delta mode and --local: SGD momentum")
    ap.add_argument("--look-ahead", type=float, default=None,
                    help="async and ssp: DistributedOptimizer's look_ahead (default: blkps.torch's)")
    ap.add_argument("--bucket-bytes", type=int, default=0, help="gradient mode's bucket (0: default)")
    ap.add_argument("--pipeline", choices=["default", "on", "off"], default="default",
                    help="gradient mode: one-step pipelined steps (default: blkps.torch's, on for CUDA in "
                         "async and ssp)")
    ap.add_argument("--eval-every", type=int, default=0, help="rank 0: held-out accuracy every N steps")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--straggler", type=int, default=-1,
                    help="this rank is a straggler: it waits after each step (see --slowdown)")
    ap.add_argument("--slowdown", type=float, default=2.0,
                    help="the straggler's step takes this many times its compute (2: half speed)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", action="store_true", help="print the device's parameter count")
    ap.add_argument("--local", action="store_true", help="train without blkps (one process)")
    ap.add_argument("--ddp", action="store_true",
                    help="the peer: torch DistributedDataParallel (gloo; RANK, WORLD_SIZE, MASTER_ADDR, "
                         "MASTER_PORT from the launcher) with local SGD, no blkps")
    ap.add_argument("--target", help="model target (default $BLKPS_TARGET)")
    ap.add_argument("--control", help="control LUN (default $BLKPS_CONTROL)")
    ap.add_argument("--min-accuracy", type=float, default=0.0, help="exit 1 below this held-out accuracy")
    add_arguments(ap)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = make_model(args.seed)
    if args.params:
        print(sum(p.numel() for p in model.parameters()))
        return
    if args.local:
        rank, size = 0, 1
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    elif args.ddp:
        torch.distributed.init_process_group("gloo")
        rank, size = torch.distributed.get_rank(), torch.distributed.get_world_size()
        evaluated = model
        model = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    else:
        import blkps.torch as bps
        try:
            bps.init(target=args.target, control=args.control)
            rank, size = bps.rank(), bps.size()
            local = (torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
                     if args.optimizer == "delta" else None)
            options = {"bucket_bytes": args.bucket_bytes} if args.bucket_bytes else {}
            if args.look_ahead is not None:
                options["look_ahead"] = args.look_ahead
            if args.pipeline != "default":
                options["pipeline"] = args.pipeline == "on"
            optimizer = bps.DistributedOptimizer(local, named_parameters=model.named_parameters(), **options)
        except (OSError, ValueError, TimeoutError) as e:
            sys.exit(f"torch_fashion: {e}")
    if not args.ddp:
        evaluated = model
    tag = f"learner {rank}"
    x, y = load("train", args.train_subset)
    steps_per_epoch = len(x) // size // args.batch  # the same for every learner (bsp needs it)
    x, y = x[rank::size], y[rank::size]
    x_test, y_test = load("test", args.test_subset) if rank == 0 else (None, None)
    if not args.local and not args.ddp and bps.control() is not None:
        # After loading: broadcast_parameters is a collective round, so no
        # learner starts training while rank 0 still loads the test set
        # (in async the others took 80% of their steps before rank 0's first).
        try:
            bps.broadcast_parameters(model.state_dict(), root_rank=0)
        except (OSError, ValueError, TimeoutError) as e:
            sys.exit(f"torch_fashion: {e}")
    rng = np.random.default_rng(args.seed * 1000 + rank)
    # curve: (train s, step, held-out accuracy, mean training loss since the last point)
    started, step, curve, eval_s = time.monotonic(), 0, [], 0.0
    window_loss = window_n = 0
    for epoch in range(args.epochs):
        order = torch.from_numpy(rng.permutation(len(x)))
        loss_sum = right = seen = 0
        epoch_start = time.monotonic()
        for b in range(steps_per_epoch):
            step_start = time.monotonic()
            idx = order[b * args.batch:(b + 1) * args.batch]
            optimizer.zero_grad()
            logits = model(x[idx])
            loss = F.cross_entropy(logits, y[idx])
            loss.backward()
            try:
                optimizer.step()
            except OSError as e:
                sys.exit(f"torch_fashion: {tag}: {e}")
            step += 1
            if rank == args.straggler:
                time.sleep((args.slowdown - 1) * (time.monotonic() - step_start))
            loss_sum += loss.item() * len(idx)
            window_loss, window_n = window_loss + loss.item(), window_n + 1
            right += int((logits.argmax(1) == y[idx]).sum())
            seen += len(idx)
            if rank == 0 and args.eval_every and step % args.eval_every == 0:
                eval_start = time.monotonic()
                acc = accuracy(evaluated, x_test, y_test)
                curve.append((round(eval_start - started - eval_s, 3), step, acc, round(window_loss / window_n, 4)))
                window_loss = window_n = 0
                eval_s += time.monotonic() - eval_start  # not training time
                print(f"{tag}: step {step} t={curve[-1][0]:.1f}s held-out accuracy {acc:.4f}", flush=True)
        took = time.monotonic() - epoch_start
        print(f"{tag}: epoch {epoch + 1}/{args.epochs} step {step} loss {loss_sum / seen:.4f} "
              f"train accuracy {right / seen:.4f} {seen / took:.0f} samples/s", flush=True)
    train_s = time.monotonic() - started - eval_s
    if not args.local and not args.ddp and size > 1:
        # At equal epochs: rank 0 evaluates the server's weights once every
        # learner has finished (in async it may finish first; with the
        # look-ahead its parameters are not the server's weights).
        try:
            bps.barrier()
            if rank == 0:
                optimizer.pull_server_weights()
        except (OSError, ValueError, TimeoutError) as e:
            sys.exit(f"torch_fashion: {tag}: {e}")
    if rank != 0:
        return
    acc = accuracy(evaluated, x_test, y_test)
    print(f"{tag}: held-out accuracy {acc:.4f} ({len(y_test)} test images)", flush=True)
    print("result: " + json.dumps({"accuracy": acc, "train_s": round(train_s, 3), "steps": step,
                                   "samples_per_s": round(step * args.batch * size / train_s, 1),
                                   "curve": curve}), flush=True)
    if acc < args.min_accuracy:
        sys.exit(f"torch_fashion: held-out accuracy {acc:.4f} is below {args.min_accuracy}")


if __name__ == "__main__":
    main()
