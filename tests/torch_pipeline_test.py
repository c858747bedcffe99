#!/usr/bin/python3
"""blkps.torch's transfers through a slow or failing transport
(blkps.torch.pipeline's seam: DistributedOptimizer(transport=...),
tests/torch_transports.py), on a plain file as the model device (a file
keeps what was pushed: after an exchange its range holds that gradient).

Cases:
  slow    a pipelined step() waits for the previous step's exchanges, which
          the transport holds back, and counts the wait (pipeline_wait);
          the training is the same as through a quick transport
  failing a push that fails is raised by step() once, in one line, and is
          never sent again: its range keeps the previous step's gradient
  reopened an optimizer closed leaves the parameters alone: a second one on
          the same model pushes its own gradients
  zero_grad zero_grad() zeroes what was written into the gradients after
          step() (it skips its pass only when nothing was)
Usage: torch_pipeline_test.py <repo> <build dir> <case>"""

import contextlib
import os
import tempfile

import numpy as np

import testbed
from testbed import check

top, build, _ = testbed.setup("torch_pipeline_test")
import torch  # noqa: E402

import blkps.torch as bps  # noqa: E402
import torch_transports  # noqa: E402

torch.set_num_threads(1)
BATCH = 16
SMALL_BUCKET = 4096  # bytes: the MLP's 6,154 parameters make 7 buckets


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                               torch.nn.ReLU(), torch.nn.Linear(64, 10))


def batch(step):
    rng = np.random.default_rng(step)
    x = torch.from_numpy(rng.normal(size=(BATCH, 20)).astype(np.float32))
    return x, torch.from_numpy(rng.integers(0, 10, BATCH))


def file_device(params):
    """A zeroed file the size of a float32 device holding `params` parameters."""
    fd, path = tempfile.mkstemp(prefix="blkps-torch-pipeline-test-")
    os.write(fd, b"\0" * ((params * 4 + 511) // 512 * 512))
    os.close(fd)
    return path


@contextlib.contextmanager
def mlp_on_a_file(transport, pipeline=None):
    """The MLP and its DistributedOptimizer on a zeroed file device through
    `transport`: yields (model, optimizer, on_device), on_device() the
    file's values once bps.shutdown() has closed the optimizer."""
    model = mlp()
    n = bps.param_count(model)
    path = file_device(n)
    try:
        bps.init(target=path, env={})
        try:
            opt = bps.DistributedOptimizer(None, named_parameters=model.named_parameters(), bucket_bytes=SMALL_BUCKET,
                                           pipeline=pipeline, transport=transport)
            yield model, opt, lambda: np.fromfile(path, dtype=np.float32, count=n)
        finally:
            bps.shutdown()
    finally:
        os.unlink(path)


def train(transport, steps):
    """Trains the MLP, pipelined, through `transport`; returns the outputs
    of each forward, the file's values after close(), and the optimizer's
    seconds after the last step() (close() drains: its waits are not
    step()'s)."""
    with mlp_on_a_file(transport, pipeline=True) as (model, opt, on_device):
        outputs = []
        for t in range(steps):
            opt.zero_grad()
            x, y = batch(t)
            out = model(x)
            outputs.append(out.detach().clone())
            torch.nn.functional.cross_entropy(out, y).backward()
            opt.step()
        seconds = dict(opt.seconds)
        bps.shutdown()
        return outputs, on_device(), seconds


def case_slow():
    quick_out, quick_file, _ = train(torch_transports.Transport(), 4)
    slow = torch_transports.Transport({"push": 0.05})
    slow_out, slow_file, seconds = train(slow, 4)
    check(slow.submitted["push"] > 0, "the slow transport carried no push")
    check(seconds["pipeline_wait"] > 0, f"step() never waited for exchanges held back 0.05 s each: seconds {seconds}")
    for t, (a, b) in enumerate(zip(quick_out, slow_out)):
        check(torch.equal(a, b), f"step {t}: the forward's outputs differ through the slow transport")
    check(np.array_equal(quick_file, slow_file), "the device holds other values through the slow transport")
    print(f"slow: step() waited {seconds['pipeline_wait']:.3f} s in 4 steps (pipeline_wait), same training")


def case_failing():
    transport = torch_transports.Transport()
    gradients, raised = [], []
    # No control LUN: bsp's order, each step's pulls after its pushes, and
    # step() returns with every transfer of the step done.
    with mlp_on_a_file(transport) as (model, opt, on_device):
        for t in range(2):
            if t == 1:
                transport.fail_next_push()  # the first push of step 1's backward
            opt.zero_grad()
            x, y = batch(t)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            gradients.append(opt.gradient.detach().clone().numpy())
            try:
                opt.step()
            except OSError as e:
                raised.append((t, str(e)))
        bps.shutdown()  # waits for what is in flight; raises nothing more
        values = on_device()
    check(len(raised) == 1 and raised[0][0] == 1 and "\n" not in raised[0][1],
          f"raised {raised!r}, expected one one-line OSError from step 1")
    check(len(transport.failed) == 1, f"failed pushes {transport.failed}, expected one")
    first, count = transport.failed[0]
    g0, g1 = gradients
    failed = slice(first, first + count)
    check(np.array_equal(values[failed], g0[failed]) and not np.array_equal(g0[failed], g1[failed]),
          f"the failed push's range [{first}, {first + count}) does not hold step 0's gradient: it was sent again")
    check(np.all((values == g0) | (values == g1)), "the device holds values of no step's gradient")
    print(f"failing: step 1 raised {raised[0][1]!r} once; [{first}, {first + count}) kept step 0's gradient")


def steps(model, opt, ts):
    """Trains the MLP through `opt` on the batches of steps `ts`; returns
    the last step's gradient as step() got it."""
    for t in ts:
        opt.zero_grad()
        x, y = batch(t)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        gradient = opt.gradient.detach().clone().numpy()
        opt.step()
    return gradient


def case_reopened():
    transport = torch_transports.Transport()
    with mlp_on_a_file(transport) as (model, first, on_device):
        steps(model, first, range(2))
        first.close()  # a second optimizer on the same parameters
        second = bps.DistributedOptimizer(None, named_parameters=model.named_parameters(),
                                          bucket_bytes=SMALL_BUCKET, transport=transport)
        gradient = steps(model, second, range(2, 5))
        bps.shutdown()
        values = on_device()
    check(np.count_nonzero(gradient) > 0, "the second optimizer's last gradient is all zeros: the closed one's "
          "hooks still ran on the parameters")
    check(np.array_equal(values, gradient), "the device does not hold the second optimizer's last gradient")
    print(f"reopened: a second optimizer pushed its own gradient ({np.count_nonzero(gradient)} nonzero values)")


def case_zero_grad():
    with mlp_on_a_file(torch_transports.Transport()) as (model, opt, _):
        steps(model, opt, range(2))
        check(opt.gradient.count_nonzero().item() == 0, "step() left a gradient in the flat buffer")
        first, last = list(model.parameters())[0], list(model.parameters())[-1]
        first.grad.add_(1.0)  # written in place after step(), through the parameters' own views
        last.grad[0] = 2.0
        opt.zero_grad()
        left = opt.gradient.count_nonzero().item()
        opt.zero_grad()  # nothing written since: still all zeros
        bps.shutdown()
    check(left == 0, f"zero_grad() left {left} values written after step() in the flat gradient")
    check(opt.gradient.count_nonzero().item() == 0, "a second zero_grad() left values in the flat gradient")
    print("zero_grad: gradients written in place after step() are zeroed")


CASES = {"slow": case_slow, "failing": case_failing, "reopened": case_reopened, "zero_grad": case_zero_grad}

if __name__ == "__main__":
    testbed.run(CASES, None)
