#!/usr/bin/python3
"""A PyTorch learner: a small network trained on the digits data set through
the model as a file (the blkps FUSE mount, a kernel initiator's disk, or a
regular file) with plain file I/O only, no blkps library.

  torch_digits.py --params                       print the model's parameter count
  torch_digits.py --target PATH --learner K --learners N [--epochs E] [--sync]
  torch_digits.py --target PATH --evaluate       held-out test accuracy

The network's parameters live in one flat float32 buffer in the device's
layout (parameter i at byte 4*i): W1 (64 x hidden), b1, W2 (hidden x 10), b2,
the layout of digits_mlp.py, so this learner and train_digits.py can share a
model. Each parameter is a torch.from_numpy view into that buffer: a pull
(os.preadv straight into it) updates the network with no copy. Likewise each
parameter's .grad is a view into a second flat buffer, into which autograd
accumulates in place; that buffer is the gradient pushed with os.pwrite. The
server applies its update rule (e.g. sgd: w -= lr * g).

The data split, minibatches and learner shares are digits_mlp.py's; file
access (O_DIRECT and aligned buffers on a block device) is plain_digits.py's
ModelFile.
"""
import argparse
import sys

import numpy as np
import torch
import torch.nn.functional as F

from digits_mlp import (EpochMeter, Mlp, add_learner_arguments, learner_data, learner_rng,
                        load_data, report_accuracy, run_learner, wait_at_start_gate)
from plain_digits import ModelFile


class FlatNetwork(torch.nn.Module):
    """64 -> hidden (ReLU) -> 10 whose parameters and gradients are views
    into two flat float32 arrays (the weights and the gradient buffers)."""

    def __init__(self, hidden, weights, gradient):
        super().__init__()
        shapes = Mlp(hidden).shapes
        names = ["w1", "b1", "w2", "b2"]
        flat_weights, flat_gradient = torch.from_numpy(weights), torch.from_numpy(gradient)
        at = 0
        for name, shape in zip(names, shapes):
            n = int(np.prod(shape))
            parameter = torch.nn.Parameter(flat_weights[at:at + n].view(shape))  # shares memory
            parameter.grad = flat_gradient[at:at + n].view(shape)  # backward adds into it
            self.register_parameter(name, parameter)
            at += n

    def forward(self, x):
        return F.relu(x @ self.w1 + self.b1) @ self.w2 + self.b2


def train(args, num_params):
    x, y, steps_per_epoch = learner_data(args.learner, args.learners, args.batch)
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    rng = learner_rng(args.learner)
    with ModelFile(args.target, num_params) as model:
        weights_memory, weights = model.buffer()
        gradient_memory, gradient = model.buffer()  # padding stays zero
        net = FlatNetwork(args.hidden, weights[:num_params], gradient[:num_params])
        meter = EpochMeter(args.learner)
        wait_at_start_gate(args)
        for epoch in range(args.epochs):
            order = torch.from_numpy(rng.permutation(len(x)))
            for b in range(steps_per_epoch):
                idx = order[b * args.batch:(b + 1) * args.batch]
                meter.timed_pull(lambda: model.pull(weights_memory), model.span)
                gradient[:] = 0.0
                logits = net(x[idx])
                loss = F.cross_entropy(logits, y[idx])
                loss.backward()
                meter.timed_push(lambda: model.push(gradient_memory), model.span)
                meter.add_batch(loss.item(), int((logits.argmax(dim=1) == y[idx]).sum()), len(idx))
            meter.end_epoch()
        if args.sync:
            model.sync()
            print(f"{meter.tag}: checkpointed the model (fsync)", flush=True)


def evaluate(args, num_params):
    _, x_test, _, y_test = load_data()
    with ModelFile(args.target, num_params) as model:
        weights_memory, weights = model.buffer()
        _, gradient = model.buffer()
        model.pull(weights_memory)
    if not np.all(np.isfinite(weights[:num_params])):
        sys.exit("torch_digits: the model holds NaN or infinite weights")
    net = FlatNetwork(args.hidden, weights[:num_params], gradient[:num_params])
    with torch.no_grad():
        predicted = net(torch.from_numpy(x_test)).argmax(dim=1).numpy()
    acc = float((predicted == y_test).mean())
    report_accuracy("torch_digits", acc, len(y_test), args.min_accuracy)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", help="the model: a file on the blkps mount, a block device, or a file")
    add_learner_arguments(ap)
    args = ap.parse_args()
    num_params = Mlp(args.hidden).num_params
    run_learner("torch_digits", ap, args, num_params, lambda a: train(a, num_params),
                lambda a: evaluate(a, num_params))


if __name__ == "__main__":
    main()
