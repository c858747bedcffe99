#!/usr/bin/python3
"""Held-out accuracy of a digits MLP over time, from outside the job: a
watcher for the training benchmark that polls the model's control LUN (the
weights at byte 1 MiB, the status JSON at byte 0) and never counts as a
learner, so it holds nothing back in bsp or ssp.

  eval_digits.py --control URL --stop-file PATH --out FILE [--interval 0.1]
                 [--hidden 128]

Every --interval seconds it reads the weights and the status and appends one
JSON line to FILE: {"t": wall-clock seconds, "updates": ..., "global_step":
..., "iterations": [per learner], "accuracy": held-out test accuracy}. It
stops after the first poll that finds PATH present (the learners are done).
The MLP and the data split are learner/examples/digits_mlp.py's.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

examples = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "learner", "examples")
sys.path.insert(0, os.path.join(examples, "..", "python"))
sys.path.insert(0, examples)
from blkps.control import Control  # noqa: E402

from digits_mlp import Mlp, load_data  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--control", required=True, help="the model's control LUN URL")
    ap.add_argument("--stop-file", required=True, help="stop once this file exists")
    ap.add_argument("--out", required=True, help="JSON lines, one per poll")
    ap.add_argument("--interval", type=float, default=0.1, help="seconds between polls (default 0.1)")
    ap.add_argument("--hidden", type=int, default=128, help="the MLP's hidden units (default 128)")
    args = ap.parse_args()
    mlp = Mlp(args.hidden)
    _, x_test, _, y_test = load_data()
    try:
        control = Control(args.control)
    except OSError as e:
        sys.exit(f"eval_digits: {e.strerror or e}")
    with control, open(args.out, "w") as out:
        while True:
            done = os.path.exists(args.stop_file)
            t = time.time()
            status = control.status()
            weights = control.read_weights(0, mlp.num_params)
            acc = mlp.accuracy(weights, x_test, y_test) if np.all(np.isfinite(weights)) else 0.0
            out.write(json.dumps({
                "t": t, "updates": status["updates"], "global_step": status["global_step"],
                "iterations": [lr["iteration"] for lr in status["learners"]],
                "accuracy": acc}) + "\n")
            out.flush()
            if done:
                return
            time.sleep(max(0.0, args.interval - (time.time() - t)))


if __name__ == "__main__":
    main()
