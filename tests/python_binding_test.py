#!/usr/bin/python3
"""The Python binding (learner/python/blkps/) against a real tgtd: Model's
push/pull/read/write round trip, Engine's double-buffered loop giving exact
weights, and its errors (OSError with libblkps's message; ValueError after
close); blkps.control's status, counters, commands and weights window.

Usage: python_binding_test.py <repo> <build dir>
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

top, build = sys.argv[1], sys.argv[2]
os.environ["BLKPS_LIB"] = os.path.join(build, "learner", "libblkps.so")
sys.path.insert(0, os.path.join(top, "learner", "python"))
import blkps  # noqa: E402
import blkps.control  # noqa: E402

PARAMS = 300_000  # not a whole number of 512-byte blocks: the tail is padded
ITERATIONS = 12


def check(condition, message):
    if not condition:
        sys.exit(f"python_binding_test: {message}")


def start_target(state):
    subprocess.run(
        [os.path.join(top, "scripts", "blkps-target"), "start", "--dir", state,
         "--plugin", os.path.join(build, "target-plugin", "bs_blkps.so"),
         "--owner-pid", str(os.getpid()),
         "--bsopts", f"params={PARAMS};rule=sgd;lr=1;mode=async"],
        check=True, stdout=subprocess.DEVNULL)
    env = {}
    with open(os.path.join(state, "target.env")) as f:
        for line in f:
            key, _, value = line.strip().partition("=")
            env[key] = value
    return env


def test_model(url):
    with blkps.Model(url) as model:
        check(model.size_bytes >= 4 * PARAMS, f"size {model.size_bytes} < {4 * PARAMS}")
        grad = np.arange(PARAMS, dtype=np.float32) % 7
        model.push(0, grad)
        weights = model.pull(0, PARAMS)
        check(np.array_equal(weights, -grad), "one sgd push with lr=1 did not give -gradient")
        try:
            model.pull(PARAMS + 1024, 10)
            check(False, "a pull past the end did not raise")
        except OSError as e:
            check(e.errno != 0 and "blkps" in e.strerror, f"unclear error: {e}")
        model.push(0, -grad)  # back to zeros for the engine test
    try:
        model.pull(0, 1)
        check(False, "a closed Model did not raise")
    except ValueError as e:
        check("closed Model" in str(e), f"unclear error: {e}")


def test_engine(url, control):
    # Iteration t pushes the gradient t + 1 everywhere: after all of them
    # (and finish()), every weight is -(1 + 2 + ... + ITERATIONS) exactly.
    with blkps.Engine(url, param_count=PARAMS, control_target=control) as engine:
        check(engine.count == PARAMS, f"engine serves {engine.count} params")
        for t in range(ITERATIONS):
            check(np.all(np.isfinite(engine.weights)), "weights hold NaN")
            engine.gradient[:] = t + 1
            if t + 1 == ITERATIONS:
                engine.finish()
            else:
                engine.step()
                m = engine.metrics
                check(m["stall_s"] >= 0 and m["compute_s"] >= 0, f"bad metrics {m}")
        check(engine.gradients_pushed == ITERATIONS,
              f"{engine.gradients_pushed} gradients pushed, expected {ITERATIONS}")
        check(engine.pushed_bytes_lost == 0, f"{engine.pushed_bytes_lost} bytes lost without a restart")
        try:
            engine.step()
            check(False, "step() after finish() did not raise")
        except OSError as e:
            check("Finish" in e.strerror, f"unclear error: {e}")
    with blkps.Model(url) as model:
        weights = model.pull(0, PARAMS)
    want = -ITERATIONS * (ITERATIONS + 1) / 2
    check(np.all(weights == want), f"weights {weights[:4]}..., expected {want} everywhere")
    try:
        blkps.Engine(url, smoothing=0)
        check(False, "smoothing=0 did not raise")
    except OSError as e:
        check("smoothing" in e.strerror, f"unclear error: {e}")


def test_control(url, control_url):
    layout = blkps.control.layout()
    check(layout.format_version >= 1 and layout.weights_offset > layout.counters_offset,
          f"odd layout {vars(layout)}")
    with blkps.control.Control(control_url) as control:
        status = control.status()
        check(sorted(status) == sorted(layout.status_keys),
              f"status keys {sorted(status)} are not the layout's {sorted(layout.status_keys)}")
        control.set(lr=0.5)
        check(control.status()["rule_params"]["lr"] == 0.5, "lr=0.5 did not take effect")
        before = control.counters()
        with blkps.Model(url) as model:
            model.push(0, np.full(PARAMS, 2.0, dtype=np.float32))
        after = control.counters()
        check(after["updates"] == before["updates"] + after["blocks"],
              f"one push to every block moved counters {before} to {after}")
        check(after["updates"] == control.status()["updates"], "counters and status disagree")
        weights = control.read_weights(1000, 5)
        check(np.all(weights == -1.0), f"weights window read {weights}, expected -1 (lr 0.5 x 2)")
        try:
            control.command("bogus=1")
            check(False, "a bad command did not raise")
        except OSError as e:
            check(e.errno != 0, f"unclear error: {e}")
        control.set(lr=1)
    with blkps.Model(url) as model:
        model.push(0, np.full(PARAMS, -1.0, dtype=np.float32))  # back to zeros


def main():
    state = tempfile.mkdtemp(prefix="blkps-pytest-")
    try:
        env = start_target(state)
        test_model(env["URL"])
        test_control(env["URL"], env["CONTROL_URL"])
        test_engine(env["URL"], env["CONTROL_URL"])
    finally:
        subprocess.run([os.path.join(top, "scripts", "blkps-target"), "stop", "--dir", state])
        subprocess.run(["rm", "-rf", state])
    print("python binding: Model, Engine and control OK")


if __name__ == "__main__":
    main()
