#!/usr/bin/python3
"""`blkps demo` shows learners training together (issue 20): its learners
start at one gate, so that every learner's first epoch meets an untrained
model and their progress lines interleave. Runs the demo's own learner
runner (scripts/blkps_cli/demo.py run_learners) with the demo's learner on a
private target; the build and the rest of the demo are not repeated here.

Usage: demo_test.py <repo> <build dir> [python|cpp]
"""
import contextlib
import io
import os
import re
import subprocess
import sys

import testbed
from testbed import fail

top, build, args = testbed.setup("demo_test")
kind = args[0] if args else "python"
sys.path.insert(0, os.path.join(top, "scripts"))
from blkps_cli import demo  # noqa: E402

PYTHON = "/usr/bin/python3"
LEARNERS, EPOCHS = 2, 6
# bsp: once both have started, neither runs ahead, however loaded the
# machine (in async, the demo's default, one learner may get more CPU).
MODE = "bsp"
# The mean loss of the digits MLP over its first epoch from init=normal:0.1:
# about 2 (cross-entropy of 10 classes starts at ln 10 = 2.3). A learner that
# started after the other had trained meets a model at about 0.1-0.2.
UNTRAINED_LOSS = 1.0

params = subprocess.run([PYTHON, demo.TRAIN, "--params"], capture_output=True, text=True, check=True).stdout.strip()
with testbed.Server(f"params={params};rule=sgd;lr=0.2;init=normal:0.1;seed=1;mode={MODE}", LEARNERS) as server:
    learner = ([PYTHON, demo.TRAIN] if kind == "python"
               else [os.path.join(build, "learner", "examples", "blkps-train-digits")])
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            demo.run_learners([[*learner, "--target", server.urls[k], "--learner", str(k), "--learners",
                                str(LEARNERS), "--epochs", str(EPOCHS)] for k in range(LEARNERS)])
    finally:
        print(out.getvalue())

lines = out.getvalue().splitlines()
gate = [i for i, line in enumerate(lines) if "learners ready: starting them together" in line]
ready = {k: i for i, line in enumerate(lines) for k in range(LEARNERS) if line == f"learner {k}: ready"}
epochs = [(i, int(m[1]), float(m[2])) for i, line in enumerate(lines)
          if (m := re.match(r"learner (\d+): epoch +\d+ iteration +\d+ loss ([\d.]+)", line))]
if len(gate) != 1 or len(ready) != LEARNERS:
    fail("expected every learner's 'ready' line and one gate line")
if max(ready.values()) > gate[0] or min(i for i, _, _ in epochs) < gate[0]:
    fail("a learner trained before every learner was ready")
if len(epochs) != LEARNERS * EPOCHS:
    fail(f"{len(epochs)} progress lines, expected {LEARNERS * EPOCHS}")
order = [k for _, k, _ in epochs]
for k in range(LEARNERS):
    mine = [i for i, j in enumerate(order) if j == k]
    others = [i for i, j in enumerate(order) if j != k]
    if not (mine[0] < others[-1] and others[0] < mine[-1]):
        fail(f"learner {k}'s progress lines do not interleave with the others': {order}")
    first_loss = next(loss for _, j, loss in epochs if j == k)
    if first_loss < UNTRAINED_LOSS:
        fail(f"learner {k}'s first epoch has loss {first_loss}, below an untrained model's {UNTRAINED_LOSS}")
print(f"demo_test {kind}: ok")
