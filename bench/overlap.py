#!/usr/bin/python3
"""A GPU step's proxy: how much of a step's transfers blkps.torch hides
behind compute, measured without a GPU, calibrated on one case of the
committed H100 run and checked against its other cases (doc/gpu.md
"A proxy for the GPU step: bench/overlap.py").

The model has the parameters of bench/gpu_bench.py's ResNet-50 or
GPT-2-shaped transformer, layer by layer in forward order (the same
parameters, so the same buckets), on CPU tensors. Each layer computes for
its share of the H100's step alone (gpu.json's standalone_step_ms): the
forward a third, the backward two thirds, each layer's share by its
multiply-adds (convolutions and matrix products, attention's scores; norms
and lookups count as none; GPT-2's tied head is a layer that reads the
embedding's weight). Of each layer's time, the share --interpreter-share
holds the interpreter lock, as a GPU step's Python and kernel launches hold
it, without using a CPU (the GPU host's training thread has a core of its
own; here a busy loop would take one of 2 from the shards); the rest is
slept, with the lock released, as the GPU computes while its host thread
waits. The layers run as a GPU's queue does (Device): a host late by less
than a layer's asleep share is hidden, a later one delays the step; two
learners' layers take turns on one queue.

The proxy runs the H100's step in slow motion: its clock is this machine's
push and pull of the whole model by hand through the same shards, against
the H100 host's (ResNet-50 17 ms, GPT-2 78 ms: H100_BY_HAND_MS), so that
compute and transfers keep the H100's proportion; the learners' Python
switch interval is slowed alike.

  bench/overlap.py --out DIR [--calibrate | --interpreter-share S]
                   [--code DIR[,DIR...]] [--models resnet50,gpt2]
                   [--wires float32,bfloat16] [--learners 1,2] [--shards 8]
                   [--steps 6] [--warmup 2] [--pipeline] [--build DIR]
                   [--reference DIR] [--bisections 4] [--run-timeout 300]
                   [--mode async|bsp]

--code: the blkps trees whose blkps.torch the learners run, each in turn
case by case (interleaved, so that the machine's load falls on all alike);
default this tree. A tree named more than once is run that many times per
case (one shard set serves them all), and overlap.md adds the median
ratio and error of each case's runs, with their spread, beside every
run. Each tree runs whole, with its own build (libblkps.so, the server
plugin; DIR/build/cmake, this tree's --build) and its own CLI
starting its shards: an older tree's Python refuses a library of another
build. Build an older commit for it with
`git worktree add --detach DIR COMMIT` and, in DIR,
`scripts/build.sh bs_blkps blkps blkps-layout blkps-bsopts`.
--calibrate: first finds the interpreter share at which the first --code
keeps the H100's ratio on the calibration case (ResNet-50, float32 wire,
1 learner), by bisection, then runs every case with it. --pipeline passes
pipeline=True to blkps.torch's DistributedOptimizer (a tree whose
optimizer has no such option is refused before any run). --mode bsp
serves the shards in bsp (a step's pulls wait for its round; blkps.torch
pulls after step(), first layers first, and each forward waits for its
own buckets), on a fresh shard set per run with one learner slot per
learner (a bsp round waits for every slot); it takes
--interpreter-share (the calibration case is the H100's async run) and
refuses --pipeline, as blkps.torch does in bsp. Its cases have no H100
figure to be compared with: the committed run is async.

Per model, one set of co-located shards per tree and wire (`blkps shards
start`, --mode, rule sgd, 2 learner slots), as bench/gpu.sh: the push and
pull by hand (the clock), then per case blkps.torch in gradient mode
(overlap_pull, as for a CUDA model) of each tree, with the step alone (no
transfers) just before and just after the case's runs (their mean: a load
that drifts falls on both). Learners of one run share one device, each
with half the batch, as on the H100 (Device, SharedQueue). No run takes an
optimizer step on the learner (the server applies the gradient). Writes
DIR/overlap.json (calibration: each bisection's share and ratio; runs:
model, code, mode, wire_dtype, learners, step_ms, alone_ms,
alone_ms_before_after, ratio, h100_ratio, error = ratio - h100_ratio, rank
0's ms per step by the optimizer's seconds and its transfers; machine:
cores, load before and after) and DIR/overlap.md, both rewritten after
every run.
"""
import argparse
import ctypes
import fcntl
import inspect
import json
import mmap
import os
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.abspath(os.path.join(HERE, ".."))
GPT2_SEQ = 1024  # gpu_bench's sequence
GRAD = 1e-7      # every gradient value: finite, small
# The H100 host's push and pull of each model's float32 parameters by hand
# through 8 co-located shards, ms (doc/gpu.md "Measured on an H100"): the
# yardstick of the proxy's clock.
H100_BY_HAND_MS = {"resnet50": 9 + 8, "gpt2": 43 + 35}
REFERENCE = os.path.join(HERE, "results", "h100-80gb-hbm3")
CALIBRATION_CASE = ("resnet50", "float32", 1)  # model, wire, learners (async)
SWITCH_INTERVAL_S = 0.005  # Python's default, on the H100's clock
BY_HAND_WARMUP_S = 5.0  # by_hand(): pushes and pulls untimed first


# ---- the layers and their compute, from gpu_bench's real models ----

def profile(torch, name):
    """[(parameter shapes, multiply-adds per sample, index of the layer
    whose weight it reads or None)] in forward order: the modules that own
    parameters, as one forward of the real model at batch 1 runs them."""
    import gpu_bench
    model = gpu_bench.build_model(torch, name)
    layers, seen = [], set()

    def hook(module, inputs, output):
        own = list(module.parameters(recurse=False))
        if not own or id(module) in seen:
            return
        seen.add(id(module))
        shapes = [tuple(p.shape) for p in own]
        if isinstance(module, torch.nn.MultiheadAttention):
            out_proj = [tuple(p.shape) for p in module.out_proj.parameters()]
            width = module.embed_dim
            macs = 4 * width * width * GPT2_SEQ + 2 * GPT2_SEQ * GPT2_SEQ * width
            shapes += out_proj
        elif isinstance(module, torch.nn.Conv2d):
            macs = module.weight.numel() * output.shape[-1] * output.shape[-2]
        elif isinstance(module, torch.nn.Linear):
            tokens = output.numel() // module.out_features
            macs = module.weight.numel() * (GPT2_SEQ if name == "gpt2" else tokens)
        else:
            macs = 0  # norms, embeddings: no matrix products
        layers.append((shapes, macs, None))

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    with torch.no_grad():
        if name == "resnet50":
            model(torch.zeros(1, 3, 224, 224))
        else:
            model(torch.zeros(1, 8, dtype=torch.long))  # shapes only: the compute counts GPT2_SEQ tokens
    for h in handles:
        h.remove()
    if name == "gpt2":  # the tied head reads the token embedding's weight (the first layer)
        vocab, width = layers[0][0][0]
        layers.append(([], vocab * width * GPT2_SEQ, 0))
    return layers


# Its calls keep the interpreter lock: a wait that holds it and uses no CPU.
_HOLDING = ctypes.PyDLL(None)


def hold(seconds, interval):
    """Holds the interpreter lock for `seconds` without using a CPU, in
    waits of a tenth of `interval` (the switch interval) between which the
    interpreter hands the lock to a thread that has asked for it that long,
    as a thread running Python does. A GPU host's training thread runs on a
    core of its own (16 there); a busy loop here would take one of this
    machine's 2 from the shards and the other learners."""
    end = time.perf_counter() + seconds
    while True:
        left = end - time.perf_counter()
        if left <= 0:
            return
        _HOLDING.usleep(max(1, int(1e6 * min(left, interval / 10))))


class Queue:
    """The end of a device's queue (when the work launched so far is done)
    as one process sees it: its own."""

    def __init__(self):
        self.due = 0.0

    def take(self, earliest, seconds):
        """Queues `seconds` of work that may start at `earliest` (CLOCK_MONOTONIC)
        behind the work queued so far; returns when it ends."""
        self.due = max(self.due, earliest) + seconds
        return self.due


class SharedQueue:
    """The end of one device's queue shared by the learners of a run, each a
    process: one float64 in the file `path` (made by the parent, zeroed),
    read and moved under an exclusive flock, so that the learners' work
    runs on the device one piece after another, as two processes' kernels
    take turns on one GPU."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_RDWR)
        self.map = mmap.mmap(self.fd, 8)

    def take(self, earliest, seconds):
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            due = max(struct.unpack("d", self.map[:8])[0], earliest) + seconds
            self.map[:8] = struct.pack("d", due)
            return due
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)


class Device:
    """The GPU as the proxy's layers use it. A layer's compute takes its
    seconds: the share `held` (0 to 1) holding the interpreter lock as a
    GPU step's Python and kernel launches do, then the rest asleep with the
    lock released, as the host waits while the GPU computes. The device
    works through its queue (Queue, or a SharedQueue of `sharers`
    learners): a layer's work ends its seconds after the work queued before
    it ended, so a host late by less than the layer's asleep share (a
    sleep's late wake-up, a wait for the lock) is hidden, as behind a GPU's
    queue; a later host delays the device by the rest. A learner's first
    layer of a step starts no earlier than its launch. `sharers` learners
    on one device each run 1/sharers of the batch: a layer's device time
    is its seconds / sharers, its host time (held) is not divided (a
    launch costs the same at any batch), and one learner's device work
    waits behind the others' (the GPU takes them in turn: a learner waiting
    for the network leaves the device to the others). `interval`: the
    learners' switch interval, on the proxy's clock."""

    def __init__(self, held, interval, queue=None, sharers=1):
        self.held, self.interval = held, interval
        self.queue, self.sharers = queue or Queue(), sharers

    def compute(self, seconds, first=False):
        busy = seconds / self.sharers
        now = time.monotonic()
        due = self.queue.take(now if first else now - busy * (1 - self.held), busy)
        hold(seconds * self.held, self.interval)
        time.sleep(max(0.0, due - time.monotonic()))


def proxy_model(torch, layers, compute_s, device):
    """A model of `layers` (profile()) whose step computes for compute_s
    seconds on `device` (a Device). The
    gradients cost no memory traffic beyond autograd's accumulation: each
    is one value broadcast over its parameter's shape, and a weight that a
    later layer reads (a tied embedding) gets its gradient from that layer
    alone (its own layer's backward still runs first, so the weight's
    gradient is complete only at the end of backward, as when tied)."""
    total = sum(macs for _, macs, _ in layers)
    read_later = {reads for _, _, reads in layers if reads is not None}

    class LayerCompute(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, layer, *params):
            ctx.layer = layer
            device.compute(layer.seconds / 3, first=layer.first)
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            layer = ctx.layer
            device.compute(2 * layer.seconds / 3)
            return (grad, None, *layer.grads)

    def constant(shape):
        return torch.full((), GRAD).expand(shape)

    class Layer(torch.nn.Module):
        def __init__(self, shapes, seconds, reads, tied):
            super().__init__()
            for k, shape in enumerate(shapes):
                self.register_parameter(f"w{k}", torch.nn.Parameter(torch.zeros(shape)))
            self.seconds, self.reads = seconds, reads  # reads: a list holding another Layer, or empty
            self.first = not built  # the step's first layer
            self.grads = ([None if tied else constant(s) for s in shapes] +
                          [constant(p.shape) for r in reads for p in r.parameters()])

        def forward(self, x):
            return LayerCompute.apply(x, self, *self.parameters(),
                                      *(p for r in self.reads for p in r.parameters()))

    built = []
    for k, (shapes, macs, reads) in enumerate(layers):
        built.append(Layer(shapes, compute_s * macs / total, [] if reads is None else [built[reads]],
                           k in read_later))
    return torch.nn.Sequential(*built)


# ---- one process: a learner, the step alone, the transfers by hand ----

def import_code(code):
    """Imports blkps and blkps.torch from the tree `code` (its
    learner/python), ahead of this tree's; returns blkps.torch."""
    sys.path.insert(0, os.path.join(code, "learner", "python"))
    import blkps.torch as bps
    want = os.path.realpath(os.path.join(code, "learner", "python"))
    if not os.path.realpath(bps.__file__).startswith(want + os.sep):
        raise SystemExit(f"overlap: blkps.torch came from {bps.__file__}, not from {want}")
    return bps


def by_hand(cfg):
    """The whole model's float32 parameters pushed, then pulled, by hand
    through slot 1 of the shards with cfg["code"]'s binding; the median ms
    of cfg["reps"] (a mean took the odd slow one whole: GPT-2's clock moved
    by 15% between two quiet runs) after BY_HAND_WARMUP_S of them untimed
    (at least one): a set of shards just started moves the model slower
    for its first seconds (ResNet-50's first median of 7 took 1.4 times
    the next ones', once 2.2 times)."""
    import numpy as np
    sys.path.insert(0, os.path.join(cfg["code"], "learner", "python"))
    import blkps
    times = []
    with blkps.Model(os.environ["BLKPS_TARGET"].replace("{slot}", "1")) as model:
        grad = np.full(cfg["params"], GRAD, np.float32)
        into = np.empty_like(grad)
        warm = time.monotonic() + BY_HAND_WARMUP_S
        while len(times) < cfg["reps"]:
            start = time.perf_counter()
            model.push(0, grad)
            model.pull_into(0, into)
            if time.monotonic() >= warm:
                times.append(1000 * (time.perf_counter() - start))
    return {"by_hand_ms": statistics.median(times)}


def learner(cfg):
    """The proxy's training loop, alone or through blkps.torch (cfg["code"]):
    cfg["steps"] timed steps after cfg["warmup"]."""
    import torch
    torch.set_num_threads(1)
    sys.setswitchinterval(cfg["switch_interval"])
    shared = cfg.get("device_file")
    device = Device(cfg["held"], cfg["switch_interval"], shared and SharedQueue(shared), cfg.get("sharers", 1))
    model = proxy_model(torch, [tuple(x) for x in cfg["layers"]], cfg["compute_s"], device)
    opt, extra = None, {}
    if cfg["code"]:
        bps = import_code(cfg["code"])
        bps.init()
        options = {"pipeline": True} if cfg["pipeline"] else {}
        compression = bps.Compression.bf16 if cfg["wire"] == "bfloat16" else bps.Compression.none
        opt = bps.DistributedOptimizer(None, named_parameters=model.named_parameters(), compression=compression,
                                       overlap_pull=True, **options)
        bps.broadcast_parameters(model.state_dict(), root_rank=0)
    x = torch.zeros(1)
    for t in range(cfg["warmup"] + cfg["steps"]):
        if t == cfg["warmup"]:
            start = time.perf_counter()
        model.zero_grad(set_to_none=False) if opt is None else opt.zero_grad()
        model(x).sum().backward()
        if opt is not None:
            opt.step()
    if opt is not None:
        opt.wait_weights()
    wall = time.perf_counter() - start
    if opt is not None:  # where the time goes, ms per step (warm-up included, as the counters are)
        extra = {"ms_per_step": {k: round(1000 * v / (cfg["steps"] + cfg["warmup"]), 2)
                                 for k, v in opt.seconds.items()},
                 "transfers": getattr(opt, "transfers", getattr(opt, "exchanges", 0)),  # f4377fc: exchanges
                 "mode": opt.mode}  # the server's, as the optimizer read it
        opt.close()
    return {"step_ms": 1000 * wall / cfg["steps"], **extra}


def takes_pipeline(cfg):
    """Whether cfg["code"]'s DistributedOptimizer has a pipeline= option."""
    bps = import_code(cfg["code"])
    return {"pipeline": "pipeline" in inspect.signature(bps.DistributedOptimizer).parameters}


def child(cfg):
    sys.path.insert(0, HERE)  # gpu_bench; it puts this tree's learner/python first: --code goes ahead of it
    out = {"by_hand": by_hand, "takes_pipeline": takes_pipeline, "learner": learner}[cfg["system"]](cfg)
    print(json.dumps(out), flush=True)


# ---- the servers and the runs ----

class Tree:
    """A blkps tree whose learners the proxy measures (--code): its
    learner/python (blkps, blkps.torch), its build's libblkps.so and server
    plugin, and its CLI, which starts its shards. One build's parts go
    together: an older tree's Python checks that the library's structures
    are its own, and its control LUN's are the server's."""

    def __init__(self, path, build):
        self.path, self.build = path, build
        self.cli = [sys.executable, os.path.join(path, "scripts", "blkps_cli", "__main__.py")]
        self.lib = os.path.join(build, "learner", "libblkps.so")
        self.plugin = os.path.join(build, "target-plugin", "bs_blkps.so")

    def missing(self):
        """What the tree lacks to be measured, in words; None if nothing."""
        for part in (os.path.join(self.path, "learner", "python", "blkps"), self.cli[1], self.lib, self.plugin):
            if not os.path.exists(part):
                return (f"{part} is missing (give a blkps tree, built: "
                        "scripts/build.sh bs_blkps blkps blkps-layout blkps-bsopts)")
        return None

    def label(self):
        """The tree's commit, and whether its learner/python has changes."""
        head = subprocess.run(["git", "-C", self.path, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True)
        dirty = subprocess.run(["git", "-C", self.path, "status", "--porcelain", "--", "learner/python"],
                               capture_output=True, text=True)
        return (head.stdout.strip() or "not a git tree") + (" (changed)" if dirty.stdout.strip() else "")


class Shards:
    """One set of co-located shards of `tree` (its `blkps shards start`,
    args.mode, rule sgd, `luns` learner slots) in a private folder;
    stopped, and the folder removed, by stop()."""

    def __init__(self, args, tree, params, wire, luns=2):
        self.tree, self.folder = tree, tempfile.mkdtemp(prefix="blkps-overlap-")
        dtype = "" if wire == "float32" else f";dtype={wire}"
        try:
            subprocess.run([*tree.cli, "shards", "start", "--dir", self.folder, "--shards", str(args.shards),
                            "--stripe-unit", "1M", "--luns", str(luns), "--owner-pid", str(os.getpid()),
                            "--bsopts", f"params={params};rule=sgd;lr=0.001;mode={args.mode};dead_after=60{dtype}",
                            "--plugin", tree.plugin], check=True, stdout=subprocess.DEVNULL)
        except subprocess.CalledProcessError:
            shutil.rmtree(self.folder, ignore_errors=True)
            raise SystemExit(f"overlap: blkps shards start of {tree.path} failed for {params} parameters "
                             f"({wire}): its message is above")

    def envs(self, learners):
        """The learners' environments: the layout is their job's control."""
        envs = []
        for rank in range(learners):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(learners), BLKPS_LIB=self.tree.lib,
                       BLKPS_TARGET=f"layout:{self.folder}/slot-{{slot}}.layout")
            env.pop("BLKPS_CONTROL", None)
            envs.append(env)
        return envs

    def stop(self):
        subprocess.run([*self.tree.cli, "shards", "stop", "--dir", self.folder], stdout=subprocess.DEVNULL)
        shutil.rmtree(self.folder, ignore_errors=True)


def run(cfg, envs, timeout):
    """Runs one child process of cfg per environment; their results by rank."""
    sys.path.insert(0, HERE)
    import gpu_bench
    try:
        return gpu_bench.run_ranks([sys.executable, __file__, "--child", json.dumps(cfg)], envs, timeout)
    except RuntimeError as e:
        raise SystemExit(f"overlap: {cfg['system']}: {e}") from None


def reference(folder, mode):
    """The committed H100 run's records of `mode` (a record without one is
    async): {(model, wire, learners): record}."""
    with open(os.path.join(folder, "gpu.json")) as f:
        return {(r["model"], r["wire_dtype"], r["learners"]): r for r in json.load(f)
                if "failed" not in r and r.get("mode", "async") == mode}


def load():
    """The machine's load averages (1, 5, 15 minutes)."""
    with open("/proc/loadavg") as f:
        return [float(v) for v in f.read().split()[:3]]


class Bench:
    """One model's servers (a shard set per tree and wire) and clock, its
    compute the H100's step alone, `alone_ms`; runs the step alone and
    through blkps.torch on them. stop() stops them."""

    def __init__(self, args, name, alone_ms):
        import torch
        self.args, self.name = args, name
        self.layers = profile(torch, name)
        self.params = sum(torch.Size(s).numel() for shapes, _, _ in self.layers for s in shapes)
        self.shards = {}
        try:
            first = args.trees[0]
            # bsp: the clock's set alone, of one slot (a round waits for every
            # slot); through() starts a set per run, one slot per learner
            kept = [(first, args.wires[0])] if args.mode == "bsp" else [(t, w) for t in args.trees
                                                                         for w in args.wires]
            for tree, wire in kept:
                if (tree.path, wire) not in self.shards:  # a tree named twice: repeats on one set
                    self.shards[tree.path, wire] = Shards(args, tree, self.params, wire,
                                                          1 if args.mode == "bsp" else 2)
            self.by_hand_ms = run({"system": "by_hand", "code": first.path, "params": self.params, "reps": 7},
                                  self.shards[first.path, args.wires[0]].envs(1), args.run_timeout)[0]["by_hand_ms"]
        except BaseException:
            self.stop()
            raise
        self.clock = self.by_hand_ms / H100_BY_HAND_MS[name]  # proxy seconds per H100 second
        self.h100_alone_ms = alone_ms

    def cfg(self, held, tree=None, wire="float32"):
        a = self.args
        return {"system": "learner", "layers": self.layers, "compute_s": self.h100_alone_ms * self.clock / 1000,
                "held": held, "code": tree and tree.path, "wire": wire, "steps": a.steps, "warmup": a.warmup,
                "pipeline": a.pipeline, "switch_interval": SWITCH_INTERVAL_S * self.clock}

    def alone(self, held):
        return run(self.cfg(held), [None], self.args.run_timeout)[0]["step_ms"]

    def through(self, held, tree, wire, learners):
        """blkps.torch's step (the slowest rank's) and rank 0's result;
        `learners` share one device (Device)."""
        cfg = self.cfg(held, tree, wire)
        if self.args.mode == "bsp":  # a round waits for every learner slot: fresh ones, one per learner
            used = self.shards.pop((tree.path, wire), None)
            if used is not None:
                used.stop()
            self.shards[tree.path, wire] = Shards(self.args, tree, self.params, wire, learners)
        with tempfile.NamedTemporaryFile(prefix="blkps-overlap-device-") as queue:
            if learners > 1:
                queue.write(bytes(8))  # the shared queue's end: 0.0
                queue.flush()
                cfg.update(device_file=queue.name, sharers=learners)
            outs = run(cfg, self.shards[tree.path, wire].envs(learners), self.args.run_timeout)
        return max(o["step_ms"] for o in outs), outs[0]

    def stop(self):
        for s in self.shards.values():
            s.stop()


def calibrate(bench, tree, target, bisections, record):
    """The interpreter share at which `tree` keeps `target` of the step
    alone on the calibration case: `bisections` halvings of [0, 0.9] (the
    ratio falls as the share grows), each a run of the step alone and one
    through blkps.torch, each recorded; the share whose ratio came
    nearest."""
    model, wire, learners = CALIBRATION_CASE
    low, high = 0.0, 0.9
    best = None
    for _ in range(bisections):
        held = round((low + high) / 2, 4)
        alone = bench.alone(held)
        step, _ = bench.through(held, tree, wire, learners)
        ratio = alone / step
        record({"share": held, "alone_ms": round(alone, 1), "step_ms": round(step, 1), "ratio": round(ratio, 3)})
        if best is None or abs(ratio - target) < abs(best[1] - target):
            best = (held, ratio)
        low, high = (held, high) if ratio > target else (low, held)
    return best[0]


def measure(args, name, held, h100, alone_ms, result, save):
    """Every case of `name` with interpreter share `held` (with
    --calibrate, the calibration case's model first finds it), each --code
    in turn per case; appends each run's record to result["runs"]. Returns
    the share it used. `h100`: the H100's records of args.mode; `alone_ms`:
    its step alone, by model."""
    bench = Bench(args, name, alone_ms[name])
    try:
        result["clock"][name] = {"by_hand_ms": round(bench.by_hand_ms, 1), "h100_by_hand_ms": H100_BY_HAND_MS[name],
                                 "proxy_s_per_h100_s": round(bench.clock, 2)}
        if args.calibrate and result["calibration"] is None and name == CALIBRATION_CASE[0]:
            result["calibration"] = {"case": dict(zip(("model", "wire_dtype", "learners"), CALIBRATION_CASE)),
                                     "code": args.trees[0].label(),
                                     "h100_ratio": h100[CALIBRATION_CASE]["ratio"], "runs": []}
            save()

            def note(row):
                result["calibration"]["runs"].append(row)
                print(json.dumps(row), flush=True)
                save()

            held = calibrate(bench, args.trees[0], h100[CALIBRATION_CASE]["ratio"], args.bisections, note)
            result["calibration"]["share"] = held
            save()
        result["interpreter_share"] = held
        before = bench.alone(held)
        for wire, learners in [(w, n) for w in args.wires for n in args.learners]:
            rows = []
            for tree in args.trees:
                step, rank0 = bench.through(held, tree, wire, learners)
                ref = h100.get((name, wire, learners), {})
                rows.append({"model": name, "params": bench.params, "code": result["code"][tree.path],
                             "mode": rank0["mode"], "wire_dtype": wire, "learners": learners, "step_ms": round(step, 1),
                             "compute_ms": round(bench.h100_alone_ms * bench.clock, 1),
                             "h100_ratio": ref.get("ratio"), "rank0_ms_per_step": rank0["ms_per_step"],
                             "rank0_transfers": rank0["transfers"]})
            after = bench.alone(held)
            for row in rows:  # the step alone just before and just after the case's runs: their mean
                row["alone_ms_before_after"] = [round(before, 1), round(after, 1)]
                row["alone_ms"] = round((before + after) / 2, 1)
                row["ratio"] = round(row["alone_ms"] / row["step_ms"], 3)
                if row["h100_ratio"] is not None:
                    row["error"] = round(row["ratio"] - row["h100_ratio"], 3)
                result["runs"].append(row)
                print(json.dumps(row), flush=True)
            save()
            before = after
        save()
        return held
    finally:
        bench.stop()


def write(out, result):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "overlap.json.tmp"), "w") as f:
        json.dump(result, f, indent=1)
    os.replace(os.path.join(out, "overlap.json.tmp"), os.path.join(out, "overlap.json"))
    m = result["machine"]
    with open(os.path.join(out, "overlap.md"), "w") as f:
        f.write("# A GPU step's proxy against the H100 (bench/overlap.py)\n\n"
                f"{m['cores']} cores, load {m['load_before']} before and {m.get('load_after', '–')} after "
                "(1, 5, 15 minutes; the run's own shards and learners are in the load after, so the load before says "
                "whether anything else ran). "
                f"Mode {result.get('mode', 'async')}. Interpreter share {result.get('interpreter_share', '–')}"
                f"{' (--pipeline)' if result['pipeline'] else ''}; ratio = the proxy's step alone / its step "
                "through blkps.torch; the H100's from the committed run (gpu.json).\n\n")
        cal = result["calibration"]
        if cal:
            f.write(f"Calibration on {cal['case']['model']}, {cal['case']['wire_dtype']} wire, "
                    f"{cal['case']['learners']} learner, code {cal['code']} (H100 {cal['h100_ratio']}): "
                    + "; ".join(f"share {r['share']}: {r['ratio']}" for r in cal["runs"])
                    + f"; chosen {cal.get('share', '–')}.\n\n")
        for name, c in result["clock"].items():
            f.write(f"Clock, {name}: push and pull by hand {c['by_hand_ms']} ms here, {c['h100_by_hand_ms']} ms "
                    f"on the H100: {c['proxy_s_per_h100_s']} s here per H100 second.\n")
        f.write("\n| model | code | wire | learners | compute ms | alone ms | step ms | ratio | H100 ratio | "
                "error | rank 0 ms: copy out, exchange, step wait, weights wait, pipeline wait; transfers |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|\n")
        for r in result["runs"]:
            t = r["rank0_ms_per_step"]
            f.write(f"| {r['model']} | {r['code']} | {r['wire_dtype']} | {r['learners']} | {r['compute_ms']} | "
                    f"{r.get('alone_ms', '–')} | {r['step_ms']} | {r.get('ratio', '–')} | "
                    f"{'–' if r['h100_ratio'] is None else r['h100_ratio']} | "
                    f"{r.get('error', '–')} | {t.get('copy_out')}, {t.get('exchange')}, {t.get('step_wait')}, "
                    f"{t.get('weights_wait')}, {t.get('pipeline_wait', '–')}; {r['rank0_transfers']} |\n")
        cases = {}
        for r in result["runs"]:
            if "ratio" in r:
                cases.setdefault((r["model"], r["code"], r["wire_dtype"], r["learners"]), []).append(r)
        if any(len(runs) > 1 for runs in cases.values()):
            f.write("\nEach case's runs (a tree named more than once in --code): the median ratio and error, "
                    "and the spread of the ratio (lowest to highest).\n\n"
                    "| model | code | wire | learners | runs | median ratio | spread | H100 ratio | median error |\n"
                    "|---|---|---|---|---|---|---|---|---|\n")
            for (model, code, wire, learners), runs in cases.items():
                ratios = [r["ratio"] for r in runs]
                errors = [r["error"] for r in runs if "error" in r]
                f.write(f"| {model} | {code} | {wire} | {learners} | {len(runs)} | "
                        f"{round(statistics.median(ratios), 3)} | {min(ratios)}–{max(ratios)} | "
                        f"{'–' if runs[0]['h100_ratio'] is None else runs[0]['h100_ratio']} | "
                        f"{round(statistics.median(errors), 3) if errors else '–'} |\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--out", help="folder for overlap.json and overlap.md")
    ap.add_argument("--calibrate", action="store_true",
                    help="find the interpreter share on ResNet-50, float32, 1 learner first (the first --code)")
    ap.add_argument("--bisections", type=int, default=4, help="--calibrate's runs (default 4)")
    ap.add_argument("--interpreter-share", type=float, default=0.0,
                    help="share of each layer's compute spent holding the interpreter (0 to 1; default 0)")
    ap.add_argument("--code", default=TOP,
                    help="blkps trees, comma-separated, each measured with its own build/cmake (this tree: --build)")
    ap.add_argument("--models", default="resnet50,gpt2")
    ap.add_argument("--wires", default="float32,bfloat16")
    ap.add_argument("--learners", default="1,2")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--pipeline", action="store_true", help="pass pipeline=True to DistributedOptimizer")
    ap.add_argument("--build", default=os.path.join(TOP, "build", "cmake"), help="this tree's build")
    ap.add_argument("--reference", default=REFERENCE, help="the H100 run's folder (its gpu.json)")
    ap.add_argument("--run-timeout", type=float, default=300.0, help="seconds a run may take (default 300)")
    ap.add_argument("--mode", choices=("async", "bsp"), default="async",
                    help="the shards' mode (default async; bsp: no --pipeline, no --calibrate)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    # A stop (kill PID) ends the runs and the servers as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.child:
        child(json.loads(args.child))
        return 0
    if not args.out:
        ap.error("give --out DIR")
    if not 0 <= args.interpreter_share < 1:
        ap.error(f"--interpreter-share: {args.interpreter_share} is not in [0, 1)")
    args.models, args.wires = args.models.split(","), args.wires.split(",")
    for name in args.models:
        if name not in H100_BY_HAND_MS:
            ap.error(f"--models: {name} is not one of {', '.join(H100_BY_HAND_MS)}")
    for wire in args.wires:
        if wire not in ("float32", "bfloat16"):
            ap.error(f"--wires: {wire} is not float32 or bfloat16")
    if not all(n in ("1", "2") for n in args.learners.split(",")):
        ap.error(f"--learners: {args.learners} is not a list of 1 and 2 (the shards have 2 slots)")
    args.learners = [int(n) for n in args.learners.split(",")]
    args.trees = [Tree(TOP, args.build) if os.path.realpath(c) == TOP else
                  Tree(os.path.abspath(c), os.path.join(os.path.abspath(c), "build", "cmake"))
                  for c in args.code.split(",")]
    for tree in args.trees:
        if tree.missing():
            ap.error(f"--code: {tree.missing()}")
    if args.mode == "bsp" and args.pipeline:
        ap.error("--pipeline: a bsp step computes on its own round's weights; blkps.torch refuses pipeline=True "
                 "in bsp")
    if args.mode == "bsp" and args.calibrate:
        ap.error("--calibrate: the calibration case is the H100's async run; give --interpreter-share with "
                 "--mode bsp")
    if args.pipeline:  # refused before any run, not in its middle
        for tree in args.trees:
            env = dict(os.environ, BLKPS_LIB=tree.lib)
            if not run({"system": "takes_pipeline", "code": tree.path}, [env], args.run_timeout)[0]["pipeline"]:
                ap.error(f"--pipeline: the blkps.torch of {tree.path} has no pipeline= option (from before it)")
    if args.calibrate and (CALIBRATION_CASE[0] not in args.models or "float32" not in args.wires):
        ap.error("--calibrate needs resnet50 in --models and float32 in --wires (the calibration case)")
    h100 = reference(args.reference, args.mode)
    # The clock's compute: the H100's step alone (async records carry it).
    alone_ms = {m: r["standalone_step_ms"] for (m, wire, n), r in reference(args.reference, "async").items()
                if (wire, n) == ("float32", 1)}
    result = {"machine": {"cores": os.cpu_count(), "load_before": load()}, "mode": args.mode,
              "pipeline": args.pipeline,
              "code": {t.path: t.label() for t in args.trees}, "calibration": None, "clock": {}, "runs": []}

    def save():
        write(args.out, result)

    save()
    held = args.interpreter_share
    # The calibration case's model first: its share holds for the others.
    for name in sorted(args.models, key=lambda n: n != CALIBRATION_CASE[0]):
        held = measure(args, name, held, h100, alone_ms, result, save)
    result["machine"]["load_after"] = load()
    save()
    print(f"overlap: {len(result['runs'])} runs in {args.out}/overlap.json and overlap.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
