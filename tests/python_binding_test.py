#!/usr/bin/python3
"""The Python binding (learner/python/blkps/) against a real tgtd: Model's
push/pull/exchange/read/write round trip, Engine's double-buffered loop giving exact
weights, and its errors (OSError with libblkps's message; ValueError after
close); blkps.control's status, counters, commands and weights window;
Model and Engine on bfloat16 and float16 LUNs (exact small-integer sums).

Usage: python_binding_test.py <repo> <build dir>
"""
import errno

import numpy as np

import testbed
from testbed import check

top, build, _ = testbed.setup("python_binding_test")
import blkps  # noqa: E402
import blkps.control  # noqa: E402

PARAMS = 300_000  # not a whole number of 512-byte blocks: the tail is padded
ITERATIONS = 12


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
        # exchange = push then pull, per request (doc/libblkps.md "Exchange"),
        # into a new array or in place; an out that overlaps grad otherwise
        # is refused before anything is sent.
        check(np.array_equal(model.exchange(0, grad), -2 * grad), "exchange did not return push-then-pull")
        inplace = grad.copy()
        check(model.exchange(0, inplace, out=inplace) is inplace and np.array_equal(inplace, -3 * grad),
              "exchange in place did not return push-then-pull in grad's array")
        both = np.zeros(20, dtype=np.float32)
        try:
            model.exchange(0, both[:10], out=both[5:15])
            check(False, "an out overlapping grad did not raise")
        except ValueError as e:
            check("overlaps" in str(e), f"unclear error: {e}")
        # exchange16 takes a 16-bit LUN's own values: refused on this float32
        # one, and refused before anything is sent when grad is not uint16.
        for wrong, error in ((np.zeros(4, np.uint16), OSError), (np.zeros(4, np.float32), ValueError)):
            try:
                model.exchange16(0, wrong)
                check(False, f"exchange16 of {wrong.dtype} to a float32 LUN did not raise")
            except error as e:
                check("float32" in str(e) or "uint16" in str(e), f"unclear error: {e}")
        model.push(0, -3 * grad)  # back to zeros for the engine test
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
    return weights


def test_engine_dropping(url, start):
    # 99% dropped, runs of 16384 parameters, no double buffering (so the
    # residual may be read between steps): after every step the weights'
    # change (sgd, lr=1: minus what was pushed) plus the residual is exactly
    # the sum of the gradients given; after finish() the residual is empty.
    given = np.zeros(PARAMS)
    with blkps.Engine(url, param_count=PARAMS, double_buffering=False,
                      drop_ratio=0.99, drop_run_params=16384) as engine:
        for t in range(ITERATIONS):
            engine.gradient[:] = np.arange(PARAMS) % 5 + t
            given += engine.gradient
            if t + 1 == ITERATIONS:
                engine.finish()
                break
            engine.step()
            with blkps.Model(url) as model:
                pushed = start - model.pull(0, PARAMS)
            check(np.array_equal(pushed + engine.residual, given),
                  f"step {t}: pushed + residual is not the sum of the gradients")
            check(np.count_nonzero(engine.residual) > PARAMS // 2, f"step {t}: nothing was dropped")
        check(not np.any(engine.residual), "finish() left a residual")
        # Each step pushed one run of 16384 of 19; finish() pushed all.
        check(engine.params_pushed == (ITERATIONS - 1) * 16384 + PARAMS,
              f"{engine.params_pushed} parameters pushed")
    with blkps.Model(url) as model:
        check(np.array_equal(start - model.pull(0, PARAMS), given), "a dropped gradient was lost")
    with blkps.Engine(url, param_count=PARAMS) as engine:
        check(engine.residual is None, "a residual without dropping")
    try:
        blkps.Engine(url, drop_ratio=1)
        check(False, "drop_ratio=1 did not raise")
    except OSError as e:
        check("drop_ratio" in e.strerror, f"unclear error: {e}")


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
    # The receipt of one push, read under the pusher's initiator name; its
    # counters (one per 512 bytes of a device that is no whole number of
    # blocks) do not end on a block boundary.
    name = "iqn.2026-11.io.blkps:receipt-reader"
    with blkps.Model(url, initiator_name=name) as model:
        model.push(0, np.zeros(PARAMS, dtype=np.float32))
        model.sync()
    with blkps.control.Control(control_url, initiator_name=name) as control:
        header, counts = control.receipt(1, PARAMS * 4)
    check(len(counts) == -(-PARAMS * 4 // 512), f"{len(counts)} receipt counters for {PARAMS * 4} bytes")
    check(header["lun"] == 1 and header["writes_in_progress"] == 0 and header["writes_applied"] >= 1
          and counts.sum() == header["writes_applied"] and counts[0] == 1, f"receipt {header}, {counts.sum()} counted")


def test_sixteen_bit(url, dtype):
    """A LUN with --bsopts dtype=bfloat16|float16 (rule=sum): Model and Engine
    take float32 arrays; small integer sums come back exact."""
    with blkps.Model(url, dtype=dtype) as model:
        check(model.param_capacity == model.size_bytes // 2 >= PARAMS,
              f"{dtype}: capacity {model.param_capacity} for {model.size_bytes} bytes")
        grad = (np.arange(PARAMS, dtype=np.float32) % 9) - 4
        model.push(0, grad)
        model.push(0, grad)
        weights = model.pull(0, PARAMS)
        check(np.array_equal(weights, 2 * grad), f"{dtype}: two pushes of small integers did not add exactly")
        try:
            model.push(0, np.full(PARAMS, np.nan, dtype=np.float32))
            check(False, f"{dtype}: a NaN gradient did not raise")
        except OSError as e:
            check(e.errno == errno.EINVAL and "is NaN" in e.strerror, f"unclear error: {e}")
        model.push(0, -2 * grad)  # back to zeros
    with blkps.Engine(url, param_count=PARAMS, dtype=dtype) as engine:
        for t in range(ITERATIONS):
            engine.gradient[:] = t + 1
            engine.finish() if t + 1 == ITERATIONS else engine.step()
    with blkps.Model(url, dtype=dtype) as model:
        weights = model.pull(0, PARAMS)
    want = ITERATIONS * (ITERATIONS + 1) / 2
    check(np.all(weights == want), f"{dtype}: engine weights {weights[:4]}..., expected {want} everywhere")


def main():
    with testbed.Server(f"params={PARAMS};rule=sgd;lr=1;mode=async") as server:
        test_model(server.url)
        test_control(server.url, server.control)
        weights = test_engine(server.url, server.control)
        test_engine_dropping(server.url, weights)
    for dtype in ("bfloat16", "float16"):
        with testbed.Server(f"params={PARAMS};rule=sum;dtype={dtype}") as server:
            test_sixteen_bit(server.url, dtype)
    print("python binding: Model, Engine, control and the 16-bit wire OK")


if __name__ == "__main__":
    main()
