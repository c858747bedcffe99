#!/usr/bin/python3
"""A learner with no blkps library at all: the digits MLP of train_digits.py
trained through a model device with plain file I/O: os.preadv pulls the
weights, os.pwrite pushes the gradient, os.fsync checkpoints.

  plain_digits.py --params                       print the model's parameter count
  plain_digits.py --target PATH --learner K --learners N [--epochs E] [--sync]
  plain_digits.py --target PATH --evaluate       held-out test accuracy

PATH is the model as a file: a learner slot's disk from a kernel initiator
(/dev/disk/by-path/...-lun-K, scripts/blkps login), a file on the blkps FUSE
mount, or a regular file. Parameter i is at byte 4*i.

A block device is opened with O_DIRECT: through the page cache a gradient
write of part of a page would go out merged with the weights read earlier,
and the server would apply those weights as gradient. O_DIRECT needs aligned
memory, offsets and lengths: both buffers are anonymous mmaps (page aligned)
of the model rounded up to the device's logical block size, and the pull uses
os.preadv into the buffer (os.pread would return new, unaligned bytes). The
padding past the last parameter reads as zeros and is pushed as zero
gradient. A file on the FUSE mount (direct_io) or a regular file needs no
O_DIRECT and is opened plainly.

Same data, model, minibatches and numerics as train_digits.py: through the
same server it reaches the same accuracy.
"""
import argparse
import fcntl
import mmap
import os
import stat
import struct
import sys

import numpy as np

from digits_mlp import (EpochMeter, Mlp, add_learner_arguments, learner_data, learner_rng,
                        load_data, report_accuracy, run_learner, wait_at_start_gate, warn_if_device_larger)

BLKSSZGET = 0x1268  # ioctl: a block device's logical block size


class ModelFile:
    """The model's file or block device, opened for plain positional I/O with
    the alignment O_DIRECT needs. One user at a time."""

    def __init__(self, path, num_params):
        self.path = path
        self.block_device = stat.S_ISBLK(os.stat(path).st_mode)
        self.fd = os.open(path, os.O_RDWR | (os.O_DIRECT if self.block_device else 0))
        block = 512
        if self.block_device:
            block = struct.unpack("i", fcntl.ioctl(self.fd, BLKSSZGET, b"\0" * 4))[0]
        # The whole model, rounded up to whole blocks (the device's padding).
        self.span = (4 * num_params + block - 1) // block * block
        size = os.lseek(self.fd, 0, os.SEEK_END)
        if size < self.span:
            os.close(self.fd)
            raise ValueError(f"{path} holds {size} bytes but a model of {num_params} "
                             f"parameters needs {self.span}: is this the right model?")
        warn_if_device_larger(os.path.basename(sys.argv[0]), size, num_params)

    def buffer(self):
        """Page-aligned zeroed memory for the whole model, as float32s."""
        memory = mmap.mmap(-1, self.span)
        return memory, np.frombuffer(memory, dtype=np.float32)

    def pull(self, memory):
        """Reads the current weights into `memory` (the whole model)."""
        done = 0
        while done < self.span:
            n = os.preadv(self.fd, [memoryview(memory)[done:]], done)
            if n == 0:
                raise OSError(f"{self.path}: unexpected end of file at byte {done}")
            done += n

    def push(self, memory):
        """Writes the gradient in `memory` (the whole model)."""
        done = 0
        while done < self.span:
            done += os.pwrite(self.fd, memoryview(memory)[done:], done)

    def sync(self):
        os.fsync(self.fd)  # SYNCHRONIZE CACHE: the server writes a checkpoint

    def close(self):
        os.close(self.fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def train(args, mlp):
    x, y, steps_per_epoch = learner_data(args.learner, args.learners, args.batch)
    rng = learner_rng(args.learner)
    n = mlp.num_params
    with ModelFile(args.target, n) as model:
        weights_memory, weights = model.buffer()
        gradient_memory, gradient = model.buffer()  # padding stays zero
        meter = EpochMeter(args.learner)
        wait_at_start_gate(args)
        for epoch in range(args.epochs):
            order = rng.permutation(len(x))
            for b in range(steps_per_epoch):
                idx = order[b * args.batch:(b + 1) * args.batch]
                meter.timed_pull(lambda: model.pull(weights_memory), model.span)
                loss, grad, p = mlp.loss_and_gradient(weights[:n], x[idx], y[idx])
                gradient[:n] = grad
                meter.timed_push(lambda: model.push(gradient_memory), model.span)
                meter.add_batch(loss, int((p.argmax(axis=1) == y[idx]).sum()), len(idx))
            meter.end_epoch()
        if args.sync:
            model.sync()
            print(f"{meter.tag}: checkpointed the model (fsync)", flush=True)


def evaluate(args, mlp):
    _, x_test, _, y_test = load_data()
    with ModelFile(args.target, mlp.num_params) as model:
        memory, weights = model.buffer()
        model.pull(memory)
    weights = weights[:mlp.num_params]
    if not np.all(np.isfinite(weights)):
        sys.exit("plain_digits: the model holds NaN or infinite weights")
    acc = mlp.accuracy(weights, x_test, y_test)
    report_accuracy("plain_digits", acc, len(y_test), args.min_accuracy)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", help="the model: a block device, a file on the blkps mount, or a file")
    add_learner_arguments(ap)
    args = ap.parse_args()
    mlp = Mlp(args.hidden)
    run_learner("plain_digits", ap, args, mlp.num_params, lambda a: train(a, mlp), lambda a: evaluate(a, mlp))


if __name__ == "__main__":
    main()
