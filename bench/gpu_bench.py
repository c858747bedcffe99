#!/usr/bin/python3
"""GPU learners through blkps (doc/gpu.md "bench/gpu.sh"): ResNet-50 (batch
128) and a 124M-parameter GPT-2-shaped transformer (batch 16, sequence
1024), both built from torch.nn with synthetic data, bf16 autocast. For
each: the step time alone on the GPU; then blkps.torch gradient mode
through co-located shards (`blkps shards start`, one tgtd each, stripe 1
MiB, server rule sgd; the layout's control LUNs are the job's control, rank
0 broadcasts its weights) in each server mode (async, bsp), pipeline
setting, wire (float32, bfloat16 LUNs) and learner count (sharing the GPU,
each at batch / learners), and with --ceiling as many plain processes
(gpu_ceiling), in gpu_plan's order, within a time budget.
Each run is a record of OUT/gpu.json and a row of OUT/gpu.md
(gpu_report), both rewritten after every run; where rank 0 waits for
weights, by module: gpu_waits. A run that fails or passes --run-timeout
is a record with "failed": the reason; the others still run.

  bench/gpu.sh --out DIR [--mode async,bsp] [--pipeline default,on,off] [--wires float32,bfloat16]
               [--learners 1,2] [--models resnet50,gpt2] [--budget-s S] [--steps 20] [--warmup 3]
               [--shards 8] [--stripe-unit 1M] [--run-timeout 300] [--build DIR]
               [--pull-during-backward default|yes|no] [--switch-interval S] [--look-ahead X]
               [--bucket-mb N] [--ceiling off,on] [--device cpu --batch N]
  bench/gpu.sh --check [--check-cases LIST]   tests/gpu_test.py's cases (the CUDA ones need a GPU)
  bench/gpu.sh --all --out DIR                --check into DIR/check.log, then every mode, pipeline,
                                              wire, learner count and ceiling within --budget-s (330)

DIR may hold {gpu}: the GPU's name as a folder (h100-80gb-hbm3). With OUT
set (a lent GPU host's folder), the files are also written to
$OUT/<DIR's last part>/. Without a CUDA device the measurement says so in
one line and exits 1: no GPU figure is ever estimated. --device cpu runs
the same bench on the CPU (with --batch, a smaller batch) to try its
machinery: its records say "gpu": "cpu (not a GPU figure)".
"""
import argparse
import atexit
import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

TOP = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
# The CLI through this interpreter: a GPU host's /usr/bin/python3 (what
# scripts/blkps runs) may lack what the CLI's subcommands load.
BLKPS = [sys.executable, os.path.join(TOP, "scripts", "blkps_cli", "__main__.py")]
sys.path.insert(0, os.path.join(TOP, "scripts"))  # blkps_cli's state: the shards' target.env
sys.path.insert(0, os.path.join(TOP, "learner", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_ceiling  # noqa: E402
import gpu_plan  # noqa: E402
import gpu_report  # noqa: E402
import gpu_waits  # noqa: E402

# tests/gpu_test.py's cases but bench (Gpu.CheckRunsEveryCaseButTheBench keeps them in step).
CHECK_CASES = ["wire-patterns", "staging", "look-ahead-switched", "pipeline", "overlap-server", "pipelined",
               "pipeline-depth", "skipped", "layout", "cuda", "cuda-async"]
SKIP = 77
LR = 0.01
MODELS = {"resnet50": 128, "gpt2": 16}  # model: batch
MODEL_PARAMS = {"resnet50": 25557032, "gpt2": 124439808}
ALL_CHECK_S = 120  # --all: the check's cases run at once, ended past this
RUN_GRACE_S = 45  # how long a run started near the end of --budget-s may run past it
CPU_LABEL = "cpu (not a GPU figure)"  # --device cpu's records
PIPELINE_ABSENT = "pipeline on or off asked, but this blkps.torch's DistributedOptimizer takes no pipeline="
ALL_BUDGET_S = 330  # --all's default --budget-s: with --check, about 5 minutes on a GPU host


# ---- the models, from torch.nn only ----

def resnet50(torch):
    """ResNet-50 v1.5 (torchvision's layout: 25,557,032 parameters)."""
    nn = torch.nn

    class Bottleneck(nn.Module):
        def __init__(self, cin, width, stride):
            super().__init__()
            cout = width * 4
            self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(width)
            self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
            self.down = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else None)

        def forward(self, x):
            out = torch.relu(self.bn1(self.conv1(x)))
            out = torch.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            return torch.relu(out + (x if self.down is None else self.down(x)))

    layers, cin = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)], 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for k in range(blocks):
            layers.append(Bottleneck(cin, width, stride if k == 0 else 1))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000)]
    return nn.Sequential(*layers)


def gpt2(torch, layers=12, width=768, heads=12, seq=1024, vocab=50257):
    """A GPT-2-shaped decoder (tied embedding): 124.4M parameters."""
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
            self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
            self.register_buffer("mask", torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1), persistent=False)

        def forward(self, x):
            h = self.ln1(x)
            x = x + self.attn(h, h, h, attn_mask=self.mask[:x.shape[1], :x.shape[1]], need_weights=False)[0]
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(seq, width)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(width)

        def forward(self, tokens):
            x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
            for b in self.blocks:
                x = b(x)
            return self.ln(x) @ self.wte.weight.t()  # tied

    return GPT()


def build_model(torch, name):
    return resnet50(torch) if name == "resnet50" else gpt2(torch)


def batch_of(torch, name, batch, device):
    g = torch.Generator(device="cpu").manual_seed(0)
    if name == "resnet50":
        x = torch.randn(batch, 3, 224, 224, generator=g).to(device).to(memory_format=torch.channels_last)
        return x, torch.randint(0, 1000, (batch,), generator=g).to(device)
    tokens = torch.randint(0, 50257, (batch, 1025), generator=g).to(device)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def loss_of(torch, name, model, x, y):
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        out = model(x)
        if name == "gpt2":
            out, y = out.reshape(-1, out.shape[-1]), y.reshape(-1)
        return torch.nn.functional.cross_entropy(out.float(), y)


# ---- one training process (standalone or a blkps learner) ----

def train(cfg):
    """Runs cfg["steps"] timed steps after cfg["warmup"]; prints one JSON line."""
    import torch
    torch.backends.cudnn.benchmark = True
    if cfg.get("switch_interval"):
        sys.setswitchinterval(cfg["switch_interval"])
    name, device = cfg["model"], cfg.get("device", "cuda")  # "cpu": only to try the machinery
    model = build_model(torch, name).to(device)
    if name == "resnet50":
        model = model.to(memory_format=torch.channels_last)
    x, y = batch_of(torch, name, cfg["batch"], device)
    waits = None
    if cfg["blkps"]:
        import blkps.torch as bps
        bps.init()
        compression = bps.Compression.bf16 if cfg["wire_dtype"] == "bfloat16" else bps.Compression.none
        # Rank 0 gives each wait for weights to its module (its pre-hook runs before the optimizer's).
        waits = gpu_waits.ModuleWaits(torch, model) if int(os.environ.get("RANK", "0")) == 0 else None
        # The layout's control LUNs are the job's control: the mode, and the
        # broadcast, as in training. overlap_pull is a CUDA model's default;
        # on the CPU it takes the same path. Options this blkps.torch lacks
        # are not passed (the parent refuses a run that asks for one).
        opt = bps.DistributedOptimizer(None, named_parameters=model.named_parameters(), compression=compression,
                                       **optimizer_options(bps, cfg))
        if waits is not None:
            waits.watch(opt)
        bps.broadcast_parameters(model.state_dict(), root_rank=0)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=LR)
    for t in range(cfg["warmup"] + cfg["steps"]):
        if t == cfg["warmup"]:  # timed from here: steps flow into each other as in training
            sync(torch, device)
            cpu0, wall0 = time.process_time(), time.perf_counter()
            if cfg["blkps"]:
                seconds0, transfers0 = dict(opt.seconds), getattr(opt, "transfers", 0)
                if waits is not None:
                    waits.reset()
        opt.zero_grad()
        loss = loss_of(torch, name, model, x, y)
        if waits is not None:
            waits.forward_done()
        loss.backward()
        opt.step()
    if cfg["blkps"]:
        opt.wait_weights()
    sync(torch, device)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    steps, spent, transfers, memory, schedule, module_waits = cfg["steps"], {}, 0, {}, {}, {}
    if device == "cuda":  # the peak over the run: the model, its activations and what blkps adds
        memory["gpu_peak_mb"] = round(torch.cuda.max_memory_allocated() / 1e6, 1)
    if cfg["blkps"]:  # where the time goes, ms per timed step (warm-up excluded)
        spent = {k: round(1000 * (v - seconds0.get(k, 0.0)) / steps, 2) for k, v in opt.seconds.items()}
        transfers = round((getattr(opt, "transfers", 0) - transfers0) / steps, 2)
        if waits is not None:
            module_waits = waits.summary(steps, embedding="wte" if name == "gpt2" else None)
            waits.close()
            if "gpu" in module_waits:
                spent["gpu_weights_wait"] = module_waits["gpu"]["ms_per_step"]
        schedule = {"mode": getattr(opt, "mode", None),
                    "pull_during_backward": getattr(opt, "pull_during_backward", None),
                    "pipeline": pipeline_of(opt, cfg.get("pipeline"))}
        flat = getattr(opt, "flat", None)
        memory.update(blkps_gpu_mb=round(flat.device_bytes() / 1e6, 1) if flat is not None else None,
                      host_staging_mb=round(flat.host_bytes() / 1e6, 1) if flat is not None else None)
        opt.close()
    print(json.dumps({"step_ms": 1000 * wall / steps, "cpu_s_per_step": cpu / steps, "ms_per_step": spent,
                      "transfers": transfers, "memory": memory, "module_waits": module_waits, **schedule,
                      "params": sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()),
                      "gpu": torch.cuda.get_device_name(0) if device == "cuda" else CPU_LABEL}), flush=True)


def optimizer_options(bps, cfg):
    """DistributedOptimizer's schedule options for `cfg`: only those asked
    for and known to this blkps.torch (pipeline_option())."""
    known = inspect.signature(bps.DistributedOptimizer).parameters
    if cfg.get("pipeline") is not None and "pipeline" not in known:
        sys.exit(PIPELINE_ABSENT)
    options = {"overlap_pull": True, "pull_during_backward": cfg.get("pull_during_backward"),
               "pipeline": cfg.get("pipeline"), "look_ahead": cfg.get("look_ahead"),
               "bucket_bytes": cfg.get("bucket_bytes")}
    return {k: v for k, v in options.items() if v is not None and k in known}


def pipeline_option():
    """Whether this blkps.torch's DistributedOptimizer takes pipeline=
    (issue 36's one-step pipelined learners)."""
    import blkps.torch as bps
    return "pipeline" in inspect.signature(bps.DistributedOptimizer).parameters


def pipeline_of(opt, asked):
    """Whether the optimizer pipelined its steps: what it says (a bool
    attribute pipeline), else what was asked (True, False), else None
    (blkps.torch's default, which it does not say)."""
    said = getattr(opt, "pipeline", None)
    return said if isinstance(said, bool) else asked


def sync(torch, device):
    if device == "cuda":
        torch.cuda.synchronize()


def transfers_alone(cfg):
    """The transfers alone, no GPU: the whole model pushed, pulled and
    exchanged as one call each, then pushed, pulled and exchanged a bucket
    per call (blkps.torch's default bucket), through the layout's first learner LUN
    in its wire type (16-bit as is, as blkps.torch sends it); the mean ms of
    cfg["reps"] of each. Prints one JSON line."""
    import numpy as np
    import blkps
    import blkps.torch as bps
    sixteen = cfg["wire_dtype"] != "float32"
    n, bucket = cfg["params"], bps.DEFAULT_BUCKET_BYTES // 4
    grad = np.zeros(n, np.uint16 if sixteen else np.float32)
    into = np.empty_like(grad)
    target = os.environ["BLKPS_TARGET"].replace("{slot}", "1")
    with blkps.Model(target, dtype=cfg["wire_dtype"] if sixteen else None) as device:
        push, pull, exchange = ((device.push16, device.pull16_into, device.exchange16) if sixteen
                                else (device.push, device.pull_into, device.exchange))
        calls = {"push": lambda: push(0, grad), "pull": lambda: pull(0, into),
                 "exchange": lambda: exchange(0, grad, into),
                 "bucket_push": lambda: [push(f, grad[f:f + bucket]) for f in range(0, n, bucket)],
                 "bucket_pull": lambda: [pull(f, into[f:f + bucket]) for f in range(0, n, bucket)],
                 "bucket_exchange": lambda: [exchange(f, grad[f:f + bucket], into[f:f + bucket])
                                             for f in range(0, n, bucket)]}
        spent = {}
        for name, call in calls.items():
            call()  # warm
            start = time.perf_counter()
            for _ in range(cfg["reps"]):
                call()
            spent[name] = round(1000 * (time.perf_counter() - start) / cfg["reps"], 2)
    print(json.dumps(spent), flush=True)


def run_learners(cfg, envs, timeout):
    """One training process of `cfg` per environment in `envs`: see run_ranks."""
    return run_ranks([sys.executable, __file__, "--train", json.dumps(cfg)], envs, timeout)


def run_ranks(argv, envs, timeout):
    """Runs `argv` once per environment in `envs` (None: this one's), each
    printing its result as its last line of JSON, and returns the results
    by rank. Raises RuntimeError naming the first that exits non-zero, or
    any still running after `timeout` seconds; every process it started has
    ended by then."""
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True) for env in envs]
    deadline = time.monotonic() + timeout
    try:
        while True:
            codes = [p.poll() for p in procs]
            bad = next((rank for rank, code in enumerate(codes) if code not in (None, 0)), None)
            if bad is not None:
                raise RuntimeError(f"rank {bad} exited with status {codes[bad]} (its stderr is above)")
            if all(code == 0 for code in codes):
                return [json.loads(p.stdout.read().strip().splitlines()[-1]) for p in procs]
            if time.monotonic() > deadline:
                raise RuntimeError(f"still running after {timeout:g} s (--run-timeout): ended")
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            p.stdout.close()


# ---- the bench ----

def tgtd_pids(folder):
    """The shards' tgtd process ids (their target.env, read as the CLI reads it)."""
    from blkps_cli import state
    return [int(state.target(os.path.join(folder, shard))["PID"]) for shard in sorted(os.listdir(folder))
            if os.path.exists(os.path.join(folder, shard, state.TARGET_ENV))]


def tgtd_cpu_s(pids):
    """CPU seconds used so far by the processes `pids`."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def run_head(args, run, batch):
    """The fields that name `run` (gpu_plan.Run), in every record of it."""
    return {"model": run.model, "params": MODEL_PARAMS[run.model], "batch": batch, "mode": run.mode,
            "pipeline_asked": run.pipeline, "wire_dtype": run.wire, "shards": args.shards,
            "learners": run.learners, "steps": args.steps, "warmup": args.warmup}


def plain_cfg(args, model, batch):
    """A training process of `model` at `batch` without blkps: the step alone, or one of a ceiling's."""
    return {"model": model, "batch": batch, "blkps": False, "wire_dtype": "float32", "steps": args.steps,
            "warmup": args.warmup, "device": args.device}


def ceiling_head(args, ceiling, batch):
    """The fields that name `ceiling` (gpu_plan.Ceiling), in every record of it."""
    return {"model": ceiling.model, "params": MODEL_PARAMS[ceiling.model], "batch": batch, "system": "plain",
            "mps": ceiling.mps, "learners": ceiling.learners, "steps": args.steps, "warmup": args.warmup}


def measure_ceiling(args, ceiling, head, alone, timeout):
    """A ceiling (gpu_plan.Ceiling): its plain processes at once, each at
    the batch / learners; its record (a failure is a record with "failed")."""
    started = time.monotonic()
    try:
        outs = gpu_ceiling.measure(plain_cfg(args, ceiling.model, head["batch"] // ceiling.learners),
                                   ceiling.learners, ceiling.mps, run_learners, timeout)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        return dict(head, failed=str(e), run_s=round(time.monotonic() - started, 1))
    step_ms = max(o["step_ms"] for o in outs)
    return dict(head, step_ms=round(step_ms, 2), standalone_step_ms=round(alone["step_ms"], 2),
                ratio=round(alone["step_ms"] / step_ms, 3), gpu=outs[0]["gpu"],
                learner_cpu_s_per_step=round(sum(o["cpu_s_per_step"] for o in outs), 4),
                memory=learners_memory(outs, alone["memory"].get("gpu_peak_mb")),
                run_s=round(time.monotonic() - started, 1), alone_run_s=alone["run_s"])


def measure(args, run, batch, alone, with_transfers, timeout):
    """One run (gpu_plan.Run) of blkps.torch through co-located shards of
    its own, started and stopped here; returns its record (a failure is a
    record with "failed"). with_transfers: first measure the transfers
    alone on the same shards."""
    row = run_head(args, run, batch)
    params = alone["params"]
    folder = tempfile.mkdtemp(prefix="blkps-gpu-bench-")
    started = time.monotonic()
    deadline = started + timeout
    try:
        dtype = f";dtype={run.wire}" if run.wire != "float32" else ""
        bsopts = f"params={params};rule=sgd;lr={LR};mode={run.mode}{dtype}"
        plugin = os.path.join(args.build, "target-plugin", "bs_blkps.so")
        # bsp's rounds count the learner LUNs: one per learner.
        subprocess.run([*BLKPS, "shards", "start", "--dir", folder, "--shards", str(args.shards),
                        "--stripe-unit", args.stripe_unit, "--luns", str(run.learners),
                        "--owner-pid", str(os.getpid()), "--bsopts", bsopts, "--plugin", plugin],
                       check=True, stdout=subprocess.DEVNULL, timeout=timeout)
        pids = tgtd_pids(folder)
        cfg = {"model": run.model, "batch": batch // run.learners, "blkps": True, "wire_dtype": run.wire,
               "steps": args.steps, "warmup": args.warmup, "device": args.device,
               "pull_during_backward": {"yes": True, "no": False}.get(args.pull_during_backward),
               "pipeline": {"on": True, "off": False}.get(run.pipeline),
               "switch_interval": args.switch_interval, "look_ahead": args.look_ahead,
               "bucket_bytes": args.bucket_mb << 20 if args.bucket_mb else None}
        envs = []
        for rank in range(run.learners):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(run.learners),
                       BLKPS_TARGET=f"layout:{folder}/slot-{{slot}}.layout")
            env.pop("BLKPS_CONTROL", None)  # the layout's control lines are the job's control
            envs.append(env)
        if with_transfers:  # the ceiling: the same transfers with no GPU, on this shard set
            reps = min(5, args.steps)  # each after one to warm up
            row["transfers_alone_ms"] = run_ranks([sys.executable, __file__, "--transfers", json.dumps(
                {"params": params, "wire_dtype": run.wire, "reps": reps})], envs[:1],
                max(deadline - time.monotonic(), 1))[0]
        before = tgtd_cpu_s(pids)  # the learners' only: from their start to their end
        outs = run_learners(cfg, envs, max(deadline - time.monotonic(), 1))
        tgtd = tgtd_cpu_s(pids) - before
    except (RuntimeError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        row["failed"] = str(e)
    finally:
        subprocess.run([*BLKPS, "shards", "stop", "--dir", folder], stdout=subprocess.DEVNULL)
        shutil.rmtree(folder, ignore_errors=True)
        # What the run cost the host, start and stop of its shards included: for the next budget.
        row.update(run_s=round(time.monotonic() - started, 1), alone_run_s=alone["run_s"])
    if "failed" in row:
        return row
    if outs[0]["mode"] != run.mode:
        return dict(row, failed=f"the learners found the server in mode {outs[0]['mode']}, not {run.mode}")
    step_ms = max(o["step_ms"] for o in outs)
    alone_peak = alone["memory"].get("gpu_peak_mb")
    return dict(row, step_ms=round(step_ms, 2), standalone_step_ms=round(alone["step_ms"], 2),
                ratio=round(alone["step_ms"] / step_ms, 3),
                learner_cpu_s_per_step=round(sum(o["cpu_s_per_step"] for o in outs), 4),
                tgtd_cpu_s_per_step=round(tgtd / (args.warmup + args.steps), 4), gpu=outs[0]["gpu"],
                pipeline=outs[0]["pipeline"], pull_during_backward=outs[0]["pull_during_backward"],
                stripe_unit=args.stripe_unit,
                **({"switch_interval": args.switch_interval} if args.switch_interval else {}),
                **({"look_ahead": args.look_ahead} if args.look_ahead is not None else {}),
                **({"bucket_mb": args.bucket_mb} if args.bucket_mb else {}),
                rank0_ms_per_step=outs[0]["ms_per_step"], rank0_transfers_per_step=outs[0]["transfers"],
                rank0_module_waits=outs[0]["module_waits"],
                rank0_memory=dict(outs[0]["memory"], alone_gpu_peak_mb=alone_peak),
                memory=learners_memory(outs, alone_peak))


def learners_memory(outs, alone_peak):
    """Issue 37 item 5's measure, all learners together (MB): the GPU's
    peaks summed, what that is beyond training alone (one process, the
    whole batch: for 2 learners at half batch each it includes the second
    copy of the model and its CUDA state), what blkps.torch added on the
    GPU, and its host staging (page-locked with a CUDA model); plain
    processes (a ceiling) have neither of the last two."""
    peaks = [o["memory"].get("gpu_peak_mb") for o in outs]
    out = {}
    for key in ("blkps_gpu_mb", "host_staging_mb"):
        values = [o["memory"].get(key) for o in outs]
        if None not in values:
            out[key] = round(sum(values), 1)
    if None not in peaks:
        out["gpu_peak_mb"] = round(sum(peaks), 1)
        if alone_peak is not None:
            out["beyond_alone_mb"] = round(sum(peaks) - alone_peak, 1)
    return out


def measure_all(args, runs, budget, record):
    """Each of `runs` (gpu_plan.Run or Ceiling) in order, each model's
    step alone first; once `budget` is spent the rest are records "not
    run (budget)". Hands each record to record()."""
    alone, transfers_done = {}, set()
    for run in runs:
        batch = args.batch or MODELS[run.model]
        ceiling = isinstance(run, gpu_plan.Ceiling)
        head = ceiling_head(args, run, batch) if ceiling else run_head(args, run, batch)
        if budget.spent():
            record(dict(head, not_run=gpu_plan.NOT_RUN))
            continue
        if not ceiling and run.pipeline != "default" and not args.pipeline_option:
            record(dict(head, failed=PIPELINE_ABSENT))
            continue
        timeout = budget.capped(args.run_timeout, RUN_GRACE_S)
        if run.model not in alone:
            started = time.monotonic()
            try:
                alone[run.model] = dict(run_learners(plain_cfg(args, run.model, batch), [None], timeout)[0],
                                        run_s=round(time.monotonic() - started, 1))
            except RuntimeError as e:
                alone[run.model] = f"alone: {e}"
            timeout = budget.capped(args.run_timeout, RUN_GRACE_S)
        if isinstance(alone[run.model], str):
            record(dict(head, failed=alone[run.model]))
            continue
        if ceiling:
            record(measure_ceiling(args, run, head, alone[run.model], timeout))
            continue
        with_transfers = run.learners == 1 and (run.model, run.wire) not in transfers_done
        row = measure(args, run, batch, alone[run.model], with_transfers, timeout)
        if "transfers_alone_ms" in row:
            transfers_done.add((run.model, run.wire))
        record(row)


def check(args, cases, timeout, log):
    """tests/gpu_test.py's cases, all at once (each starts its own servers
    on free ports); the CUDA ones need a GPU. Each runs in a process group
    of its own, ended whole `timeout` seconds after the start or on a stop (its
    servers stop with it: --owner-pid). Prints, and hands to log(), each
    case's output and result, in the order of `cases`; returns 1 if any
    failed."""
    test = os.path.join(TOP, "tests", "gpu_test.py")
    start, procs = time.monotonic(), []
    try:
        for case in cases:
            output = tempfile.TemporaryFile("w+")
            procs.append((case, output, subprocess.Popen([sys.executable, test, TOP, args.build, case],
                                                         stdout=output, stderr=subprocess.STDOUT,
                                                         start_new_session=True)))
        failed = 0
        for case, output, proc in procs:
            try:
                rc = proc.wait(timeout=max(start + timeout - time.monotonic(), 0))
                result = "passed" if rc == 0 else "skipped" if rc == SKIP else f"FAILED ({rc})"
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc, result = None, f"FAILED (still running after {timeout:g} s, --run-timeout: ended)"
            output.seek(0)
            text = output.read() + f"gpu check {case}: {result} in {time.monotonic() - start:.0f} s\n"
            print(text, end="", flush=True)
            log(text)
            failed += rc not in (0, SKIP)
        text = f"gpu check: {len(cases)} cases, {failed} failed, in {time.monotonic() - start:.0f} s\n"
        print(text, end="", flush=True)
        log(text)
        return 1 if failed else 0
    finally:
        for _, output, proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            output.close()


def folder_name(gpu):
    """A results folder named for the GPU: "NVIDIA H100 80GB HBM3" -> h100-80gb-hbm3."""
    words = gpu.lower().replace("nvidia", " ").split()
    return "-".join("".join(c if c.isalnum() else "-" for c in w).strip("-") for w in words) or "gpu"


def list_option(p, args, name, known, default):
    """The comma-separated list --NAME (default if not given), each of `known` (None: positive counts)."""
    given = getattr(args, name.replace("-", "_"))
    items = (given or default).split(",")
    bad = [i for i in items if not (i.isdigit() and int(i) > 0 if known is None else i in known)]
    if bad:
        p.error(f"--{name}: {bad[0]} is not " + ("a learner count" if known is None else
                                                  f"one of {', '.join(known)}"))
    return [int(i) for i in items] if known is None else items


def copy_output(path):
    """From here on, this process's output and its children's (stdout and
    stderr) also go to `path`, appended: a tee reading a pipe that fds 1
    and 2 now are. At exit the pipe is closed and the tee has written all
    (what a process started meanwhile still writes, within 10 s)."""
    reader, writer = os.pipe()
    with open(path, "a") as log:
        tee = subprocess.Popen(["tee", "-a", path], stdin=reader, stdout=os.dup(1), stderr=log,
                               start_new_session=True)  # a stop ends the bench, then the tee at EOF
    os.close(reader)
    os.dup2(writer, 1)
    os.dup2(writer, 2)
    os.close(writer)

    def drain():
        sys.stdout.flush()
        sys.stderr.flush()
        os.close(1)
        os.close(2)
        try:  # a daemon started meanwhile may still hold the pipe: the tee is not waited for long
            tee.wait(timeout=10)
        except subprocess.TimeoutExpired:
            tee.kill()
    atexit.register(drain)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--out", help="folder for gpu.json and gpu.md; {gpu} in it: the GPU's name (h100-80gb-hbm3); "
                                 "also copied into $OUT/<its last part> when OUT is set")
    p.add_argument("--check", action="store_true", help="run the GPU checks instead of measuring")
    p.add_argument("--all", action="store_true",
                   help="--check (into OUT/check.log), then every mode, pipeline, wire and learner count, most "
                        "telling first, within --budget-s")
    p.add_argument("--check-cases", default=",".join(CHECK_CASES), help="the cases --check and --all run")
    p.add_argument("--models", default="resnet50,gpt2")
    p.add_argument("--mode", help="the server's modes to run: async, bsp (default async)")
    p.add_argument("--pipeline", help="blkps.torch's pipeline in async: default (blkps.torch's, nothing "
                                      "passed), on, off (default: default); bsp runs take none")
    p.add_argument("--wires", help="the learner LUNs' types: float32, bfloat16 (default both)")
    p.add_argument("--learners", help="learner counts to run, sharing the GPU (default 1,2)")
    p.add_argument("--ceiling", help="for each learner count above 1, that many plain processes on the GPU "
                                     "at once, without blkps, with MPS off, on or both (off,on); default none")
    p.add_argument("--budget-s", type=float, help=f"seconds from the start after which no run starts; the rest are "
                                                   f"records \"{gpu_plan.NOT_RUN}\" (--all: {ALL_BUDGET_S})")
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--build", default=os.path.join(TOP, "build", "cmake"))
    p.add_argument("--run-timeout", type=float, default=300.0,
                   help="seconds a run (or --check) may take; past it the run is a failed record (default 300)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: try the bench's machinery on the CPU (its records are not GPU figures)")
    p.add_argument("--batch", type=int, help="each model's batch instead of its own (with --device cpu)")
    p.add_argument("--stripe-unit", default="1M", help="the shards' stripe unit (blkps shards start)")
    p.add_argument("--pull-during-backward", choices=("default", "yes", "no"), default="default",
                   help="yes: each bucket pulled right after its push (an exchange); no: every bucket pulled "
                        "after step(); default: blkps.torch's")
    p.add_argument("--look-ahead", type=float, help="DistributedOptimizer's look_ahead (default: blkps.torch's)")
    p.add_argument("--bucket-mb", type=int, help="DistributedOptimizer's bucket_bytes in MiB (default: blkps.torch's)")
    p.add_argument("--switch-interval", type=float,
                   help="the learners' Python switch interval in seconds (sys.setswitchinterval)")
    p.add_argument("--train", help=argparse.SUPPRESS)
    p.add_argument("--transfers", help=argparse.SUPPRESS)
    args = p.parse_args()
    # A stop (kill PID) ends the runs and the servers as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.environ.setdefault("BLKPS_LIB", os.path.join(args.build, "learner", "libblkps.so"))
    if args.train:
        train(json.loads(args.train))
        return 0
    if args.transfers:
        transfers_alone(json.loads(args.transfers))
        return 0
    if os.environ.get("OUT"):  # a lent GPU host's call returns only what is under $OUT
        os.makedirs(os.environ["OUT"], exist_ok=True)
        copy_output(os.path.join(os.environ["OUT"], "gpu-bench.log"))
    budget = gpu_plan.Budget(args.budget_s if args.budget_s is not None or not args.all else ALL_BUDGET_S)
    cases = list_option(p, args, "check-cases", CHECK_CASES, "")
    if args.check:
        return check(args, cases, args.run_timeout, lambda text: None)
    if not args.out:
        p.error("give --out DIR, or --check")
    models = list_option(p, args, "models", list(MODELS), "")
    if args.all:
        given = [o for o in ("mode", "pipeline", "wires", "learners", "ceiling") if getattr(args, o) is not None]
        if given:
            p.error(f"--all runs every mode, pipeline, wire, learner count and ceiling: leave out --{given[0]}")
        runs = gpu_plan.all_runs(models, gpu_ceiling.MPS_SETTINGS)
    else:
        runs = gpu_plan.runs(models, list_option(p, args, "mode", gpu_plan.MODES, "async"),
                             list_option(p, args, "pipeline", gpu_plan.PIPELINES, "default"),
                             list_option(p, args, "wires", gpu_plan.WIRES, ",".join(gpu_plan.WIRES)),
                             list_option(p, args, "learners", None, "1,2"))
        if args.ceiling is not None:
            runs = gpu_plan.with_ceilings(runs, models, list_option(p, args, "ceiling", gpu_ceiling.MPS_SETTINGS, ""))
    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu bench: no CUDA device here (torch.cuda.is_available() is False): run it on a GPU host; "
              "no figure is recorded", file=sys.stderr)
        return 1
    gpu = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    out = args.out.replace("{gpu}", folder_name(gpu))
    folders = [out] + ([os.path.join(os.environ["OUT"], os.path.basename(os.path.normpath(out)))]
                       if os.environ.get("OUT") else [])
    args.pipeline_option = pipeline_option()
    failed = 0
    if args.all:
        for folder in folders:
            os.makedirs(folder, exist_ok=True)
            open(os.path.join(folder, "check.log"), "w").close()

        def log(text):
            for folder in folders:
                with open(os.path.join(folder, "check.log"), "a") as f:
                    f.write(text)
        failed += check(args, cases, min(args.run_timeout, ALL_CHECK_S), log)
    rows = []

    def record(row):  # every run's record is on disk as soon as it ends
        rows.append(row)
        print(json.dumps(row), flush=True)
        gpu_report.write(folders, rows)

    measure_all(args, runs, budget, record)
    failed += sum("failed" in r for r in rows)
    not_run = sum("not_run" in r for r in rows)
    print(f"gpu bench: {len(rows)} runs ({failed} failed, {not_run} {gpu_plan.NOT_RUN}) in "
          f"{' and '.join(folders)}: gpu.json, gpu.md" + (", check.log" if args.all else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
