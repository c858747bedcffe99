#!/usr/bin/python3
"""bench/overlap.py, the GPU step's proxy (doc/gpu.md "A proxy for the GPU
step: bench/overlap.py"), run on one tiny case so that its machinery is known to work; no
figure is asserted (the machine's load sets them).

  overlap_test.py <repo> <build dir> <case>

Cases:
  calibrate  --calibrate on ResNet-50, float32 wire, 1 learner, 2 shards,
             one bisection, two trees as --code (this one and a copy of its
             learner/python): the calibration run and its share recorded,
             one run per tree, each with its ratio against the H100's
             committed one; each tree's blkps.torch was the one imported;
             no shard folder left.
  bsp        --mode bsp, 1 and 2 learners: a run each on shards served in
             bsp, recorded as bsp with no H100 figure (the committed run
             is async); no shard folder left.
  hold       the proxy's share holding the interpreter: another thread
             runs no Python meanwhile until it has waited the switch
             interval, and the hold uses no CPU.
  shared     the device two learners share: two processes taking 2,000
             turns each on one SharedQueue end every turn at an instant
             of its own and the queue at the sum of the turns (none lost
             to a race); a Device of 2 sharers queues half a layer's
             seconds, one of its own the whole.
  refusals   a --code that is not a blkps tree, an interpreter share out
             of [0, 1), --pipeline with a blkps.torch that has no such
             option, and --pipeline or --calibrate with --mode bsp are
             each refused in one line naming the option.
"""
import importlib.util
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import testbed
from testbed import check

top, build, _ = testbed.setup("overlap_test")
BENCH = os.path.join(top, "bench", "overlap.py")
H100 = os.path.join(top, "bench", "results", "h100-80gb-hbm3", "gpu.json")


def bench(out, *options, tmp=None):
    """Runs the proxy on ResNet-50's calibration case; its exit status and stderr."""
    env = dict(os.environ, TMPDIR=tmp) if tmp else None
    proc = subprocess.run([sys.executable, BENCH, "--out", out, "--build", build, "--models", "resnet50",
                           "--wires", "float32", "--learners", "1", "--shards", "2", "--steps", "1",
                           "--warmup", "1", *options], env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    return proc.returncode, proc.stderr


def tree(into, python=None):
    """A --code tree at `into`: a copy of this one's learner/python (or
    `python`: {file under learner/python: text}), with this tree's scripts
    and build."""
    if python is None:
        shutil.copytree(os.path.join(top, "learner", "python"), os.path.join(into, "learner", "python"),
                        ignore=shutil.ignore_patterns("__pycache__"))
    for name, text in (python or {}).items():
        os.makedirs(os.path.dirname(os.path.join(into, "learner", "python", name)), exist_ok=True)
        with open(os.path.join(into, "learner", "python", name), "w") as f:
            f.write(text)
    os.symlink(os.path.join(top, "scripts"), os.path.join(into, "scripts"))
    os.makedirs(os.path.join(into, "build"))
    os.symlink(build, os.path.join(into, "build", "cmake"))
    return into


def case_calibrate():
    tmp = tempfile.mkdtemp(prefix="blkps-overlap-test-")
    out, shards = os.path.join(tmp, "out"), os.path.join(tmp, "shards")
    os.mkdir(shards)
    try:
        other = tree(os.path.join(tmp, "other"))
        rc, err = bench(out, "--calibrate", "--bisections", "1", "--code", f"{top},{other}", tmp=shards)
        check(rc == 0, f"bench/overlap.py --calibrate exited with {rc}: {err[-2000:]}")
        left = os.listdir(shards)
        check(not left, f"the proxy left {left} in its TMPDIR")
        with open(os.path.join(out, "overlap.json")) as f:
            result = json.load(f)
        with open(H100) as f:
            h100 = next(r["ratio"] for r in json.load(f)
                        if (r["model"], r["wire_dtype"], r["learners"]) == ("resnet50", "float32", 1))
        cal = result["calibration"]
        check(cal["h100_ratio"] == h100 and len(cal["runs"]) == 1 and cal["share"] == cal["runs"][0]["share"],
              f"calibration {cal}")
        check(result["interpreter_share"] == cal["share"], f"share {result['interpreter_share']}, calibrated {cal}")
        check(result["clock"]["resnet50"]["by_hand_ms"] > 0, f"clock {result['clock']}")
        labels = [r["code"] for r in result["runs"]]
        check(len(labels) == 2 and labels[0] != labels[1] and "not a git tree" in labels[1],
              f"one run per --code, labelled: {labels}")
        for r in result["runs"]:
            check(r["params"] == 25557032 and r["h100_ratio"] == h100, f"run {r}")
            check(abs(r["ratio"] - r["alone_ms"] / r["step_ms"]) < 2e-3 and r["error"] == round(r["ratio"] - h100, 3),
                  f"ratio and error of {r}")
            check(r["rank0_transfers"] > 0, f"rank 0 sent nothing: {r}")
        with open(os.path.join(out, "overlap.md")) as f:
            rows = [line for line in f if line.startswith("| resnet50 ")]
        check(len(rows) == 2, f"overlap.md has {len(rows)} rows for 2 runs")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def case_bsp():
    tmp = tempfile.mkdtemp(prefix="blkps-overlap-test-")
    out, shards = os.path.join(tmp, "out"), os.path.join(tmp, "shards")
    os.mkdir(shards)
    try:
        rc, err = bench(out, "--mode", "bsp", "--interpreter-share", "0.1", "--learners", "1,2", tmp=shards)
        check(rc == 0, f"bench/overlap.py --mode bsp exited with {rc}: {err[-2000:]}")
        left = os.listdir(shards)
        check(not left, f"the proxy left {left} in its TMPDIR")
        with open(os.path.join(out, "overlap.json")) as f:
            result = json.load(f)
        runs = result["runs"]
        check(result["mode"] == "bsp" and [r["learners"] for r in runs] == [1, 2], f"runs {runs}")
        for r in runs:
            # mode: the server's, as rank 0's optimizer read it
            check(r["mode"] == "bsp" and r["h100_ratio"] is None and "error" not in r, f"run {r}")
            check(r["step_ms"] > 0 and r["rank0_transfers"] > 0, f"rank 0 sent nothing: {r}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_bench():
    """bench/overlap.py as a module."""
    spec = importlib.util.spec_from_file_location("overlap", BENCH)
    overlap = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(overlap)
    return overlap


TURNS = 2000


def case_shared():
    overlap = load_bench()

    def take_turns(path, out):
        queue = overlap.SharedQueue(path)
        out.send([queue.take(0.0, 1.0) for _ in range(TURNS)])

    with tempfile.NamedTemporaryFile(prefix="blkps-overlap-test-") as f:
        f.write(bytes(8))
        f.flush()
        fork = multiprocessing.get_context("fork")
        pipes = [fork.Pipe(duplex=False) for _ in range(2)]
        procs = [fork.Process(target=take_turns, args=(f.name, send)) for _, send in pipes]
        for p in procs:
            p.start()
        ends = [receive.recv() for receive, _ in pipes]
        for p in procs:
            p.join()
        every = sorted(e for mine in ends for e in mine)
        check(every == [float(k) for k in range(1, 2 * TURNS + 1)],
              f"{2 * TURNS} turns of 1 s ended at {len(set(every))} instants, the last at {every[-1]}: "
              "turns were lost to a race")
        check(overlap.SharedQueue(f.name).take(0.0, 0.0) == 2 * TURNS, "the queue's end is not the sum of the turns")

    class Recording(overlap.Queue):
        def take(self, earliest, seconds):
            self.seconds = seconds
            return super().take(earliest, seconds)

    for sharers in (1, 2):
        queue = Recording()
        overlap.Device(0.0, 0.005, queue, sharers).compute(0.02, first=True)
        check(queue.seconds == 0.02 / sharers, f"{sharers} sharers: a layer of 0.02 s queued {queue.seconds} s")


def case_hold():
    overlap = load_bench()
    counted, stop = [0], threading.Event()

    def spin():
        while not stop.is_set():
            counted[0] += 1

    spinner = threading.Thread(target=spin)
    try:
        for interval, share in ((0.5, False), (0.02, True)):
            sys.setswitchinterval(interval)
            if not spinner.is_alive():
                spinner.start()
            time.sleep(0.05)
            before, cpu = counted[0], time.thread_time()
            overlap.hold(0.2, interval)  # the spinner asks for the lock from now on
            used, ran = time.thread_time() - cpu, counted[0] - before
            check(used < 0.05, f"a hold of 0.2 s used {used:.3f} s of CPU")
            check((ran > 0) == share, f"switch interval {interval} s: the other thread counted {ran} during a "
                                      f"hold of 0.2 s ({'some' if share else 'none'} expected)")
    finally:
        stop.set()
        spinner.join()


def case_refusals():
    tmp = tempfile.mkdtemp(prefix="blkps-overlap-test-")
    try:
        # The signature of a blkps.torch from before pipeline= (as f4377fc's).
        old = tree(os.path.join(tmp, "old"), {
            "blkps/__init__.py": "",
            "blkps/torch.py": "def DistributedOptimizer(optimizer, named_parameters=None, compression=None):\n"
                              "    raise AssertionError('not to be called')\n"})
        for options, says in ((["--code", tmp], "--code"), (["--interpreter-share", "1"], "--interpreter-share"),
                              (["--code", old, "--pipeline"], "--pipeline"),
                              (["--mode", "bsp", "--pipeline"], "--pipeline"),
                              (["--mode", "bsp", "--calibrate"], "--calibrate")):
            rc, err = bench(os.path.join(tmp, "out"), *options)
            lines = err.strip().splitlines()
            check(rc != 0 and lines and says in lines[-1], f"{options}: exit {rc}, stderr {err[-1500:]!r}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


CASES = {"calibrate": case_calibrate, "bsp": case_bsp, "hold": case_hold, "shared": case_shared,
         "refusals": case_refusals}

if __name__ == "__main__":
    testbed.run(CASES, None)
