#!/usr/bin/python3
"""A learner that trains a small MLP on the digits data set through a blkps
model device: every iteration it pulls the weights, computes a minibatch
gradient with numpy and pushes it; the server applies w -= lr * g.

  train_digits.py --params                     print the model's parameter count
  train_digits.py --target URL --learner K --learners N [--epochs E]
                  [--control URL --lr-decay F]   learning-rate schedule
  train_digits.py --target URL --evaluate      held-out test accuracy

The data split and the MLP are in digits_mlp.py (shared with
plain_digits.py and torch_digits.py): Debian's python3-sklearn copy of the
UCI digits, split 75/25 with a fixed seed; learner K of N trains on every
N-th training example starting at K. TARGET is anything libblkps
opens: iscsi://host:port/iqn/lun, iser://..., or a file or block device.

With --control (the model's control LUN) and --lr-decay F, this learner
drives a learning-rate schedule: after each epoch it sets the server's lr to
F times what it was, with a plain write of "lr=<x>" to the control LUN.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import blkps  # noqa: E402
from blkps.control import Control  # noqa: E402
from digits_mlp import (EpochMeter, Mlp, add_learner_arguments, learner_data, learner_rng,  # noqa: E402
                        load_data, report_accuracy, run_learner, wait_at_start_gate, warn_if_device_larger)

def train(args, mlp):
    x, y, steps_per_epoch = learner_data(args.learner, args.learners, args.batch)
    rng = learner_rng(args.learner)
    control = Control(args.control) if args.control else None
    lr = control.status()["rule_params"]["lr"] if control else None
    with blkps.Model(args.target) as model:
        warn_if_device_larger("train_digits", model.size_bytes, mlp.num_params)
        weights = np.empty(mlp.num_params, dtype=np.float32)
        meter = EpochMeter(args.learner)
        wait_at_start_gate(args)
        for epoch in range(args.epochs):
            order = rng.permutation(len(x))
            for b in range(steps_per_epoch):
                idx = order[b * args.batch:(b + 1) * args.batch]
                meter.timed_pull(lambda: model.pull_into(0, weights), weights.nbytes)
                loss, grad, p = mlp.loss_and_gradient(weights, x[idx], y[idx])
                meter.timed_push(lambda: model.push(0, grad), grad.nbytes)
                meter.add_batch(loss, int((p.argmax(axis=1) == y[idx]).sum()), len(idx))
            meter.end_epoch()
            if control and args.lr_decay != 1.0:
                lr *= args.lr_decay
                control.set(lr=lr)
                print(f"{meter.tag}: server lr set to {lr:.4g}", flush=True)
        if control:
            control.close()
        if args.sync:
            model.sync()
            print(f"{meter.tag}: checkpointed the model (fsync)", flush=True)


def evaluate(args, mlp):
    _, x_test, _, y_test = load_data()
    with blkps.Model(args.target) as model:
        weights = model.pull(0, mlp.num_params)
    if not np.all(np.isfinite(weights)):
        sys.exit("train_digits: the model holds NaN or infinite weights")
    acc = mlp.accuracy(weights, x_test, y_test)
    report_accuracy("train_digits", acc, len(y_test), args.min_accuracy)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", help="model device: iscsi:// URL, iser:// URL, file or block device")
    ap.add_argument("--control", help="the model's control LUN, for --lr-decay")
    ap.add_argument("--lr-decay", type=float, default=1.0,
                    help="with --control: multiply the server's lr by this after each epoch (default 1: off)")
    add_learner_arguments(ap)
    args = ap.parse_args()
    mlp = Mlp(args.hidden)
    if args.lr_decay != 1.0 and not args.control:
        ap.error("--lr-decay needs --control (the model's control LUN)")
    if not 0 < args.lr_decay <= 1.0:
        ap.error("--lr-decay must be in (0, 1]")
    run_learner("train_digits", ap, args, mlp.num_params, lambda a: train(a, mlp), lambda a: evaluate(a, mlp))


if __name__ == "__main__":
    main()
