#!/usr/bin/python3
"""GPU learners through blkps (doc/gpu.md): ResNet-50 (batch 128) and a
124M-parameter GPT-2-shaped transformer (batch 16, sequence 1024), both
built from torch.nn with synthetic data, bf16 autocast. For each: the step
time alone on the GPU; then blkps.torch gradient mode through co-located
shards (`blkps shards start`, one tgtd each, stripe 1 MiB, async, server
rule sgd; the layout's control LUNs are the job's control, rank 0
broadcasts its weights) with float32 and bfloat16 LUNs, 1 learner and 2
learners sharing the GPU (half batch each). Writes OUT/gpu.json (one record
per run: model, params, batch, wire_dtype, shards, learners, step_ms,
standalone_step_ms, ratio, learner_cpu_s_per_step, tgtd_cpu_s_per_step,
gpu; where rank 0's time goes: rank0_ms_per_step copy_out, exchange, push,
pull, step_wait, weights_wait, from the optimizer's seconds; rank0_transfers;
rank0_memory: the GPU's peak allocation through blkps and alone, the GPU and
host staging (page-locked on a GPU) blkps.torch added, in MB) and
OUT/gpu.md, both rewritten after every run. A run that fails or passes
--run-timeout is a record with "failed": the reason; the others still run.

  bench/gpu.sh --out DIR [--models resnet50,gpt2] [--shards 8] [--steps 30] [--build DIR]
               [--run-timeout 300] [--device cpu --batch N] [--learners 1,2]
               [--pull-during-backward default,yes,no] [--stripe-unit 1M]
               [--switch-interval SECONDS]
  bench/gpu.sh --check [--build DIR] [--run-timeout 300]
                                       tests/gpu_test.py's cases (the CUDA one
                                       needs a GPU; skipped without one)

Without a CUDA device the measurement says so in one line and exits 1: no
GPU figure is ever estimated. --device cpu runs the same bench on the CPU
(with --batch, a smaller batch) to try its machinery: its records say
"gpu": "cpu (not a GPU figure)".
"""
import argparse
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
sys.path.insert(0, os.path.join(TOP, "learner", "python"))
CHECK_CASES = ["wire-patterns", "staging", "pipeline", "overlap-server", "skipped", "layout", "cuda", "cuda-async"]
SKIP = 77
LR = 0.01
MODELS = {"resnet50": 128, "gpt2": 16}  # model: batch
CPU_LABEL = "cpu (not a GPU figure)"  # --device cpu's records


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
    if cfg["blkps"]:
        import blkps.torch as bps
        bps.init()
        compression = bps.Compression.bf16 if cfg["wire_dtype"] == "bfloat16" else bps.Compression.none
        # The layout's control LUNs are the job's control: the mode (async:
        # each bucket pulled after its push) and the broadcast, as in training.
        # overlap_pull is a CUDA model's default; on the CPU it takes the same path.
        opt = bps.DistributedOptimizer(None, named_parameters=model.named_parameters(), compression=compression,
                                       overlap_pull=True, pull_during_backward=cfg.get("pull_during_backward"))
        bps.broadcast_parameters(model.state_dict(), root_rank=0)
        stalls = time_weight_waits(torch, opt) if device == "cuda" else []
    else:
        opt = torch.optim.SGD(model.parameters(), lr=LR)
    for t in range(cfg["warmup"] + cfg["steps"]):
        if t == cfg["warmup"]:  # timed from here: steps flow into each other as in training
            sync(torch, device)
            cpu0, wall0 = time.process_time(), time.perf_counter()
        opt.zero_grad()
        loss_of(torch, name, model, x, y).backward()
        opt.step()
    if cfg["blkps"]:
        opt.wait_weights()
    sync(torch, device)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    steps, spent, transfers, memory, schedule = cfg["steps"], {}, 0, {}, {}
    if device == "cuda":  # the peak over the run: the model, its activations and what blkps adds
        memory["gpu_peak_mb"] = round(torch.cuda.max_memory_allocated() / 1e6, 1)
    if cfg["blkps"]:  # where the time goes, ms per step (warm-up included, as the counters are)
        spent = {k: round(1000 * v / (steps + cfg["warmup"]), 2) for k, v in opt.seconds.items()}
        if stalls:  # synchronized above: every event has run
            spent["gpu_weights_wait"] = round(sum(a.elapsed_time(b) for a, b in stalls) / (steps + cfg["warmup"]), 2)
        transfers = opt.transfers
        schedule = {"pull_during_backward": opt.pull_during_backward}
        memory.update(blkps_gpu_mb=round(opt.flat.device_bytes() / 1e6, 1),
                      host_staging_mb=round(opt.flat.host_bytes() / 1e6, 1))
        opt.close()
    print(json.dumps({"step_ms": 1000 * wall / steps, "cpu_s_per_step": cpu / steps, "ms_per_step": spent,
                      "transfers": transfers, "memory": memory, **schedule,
                      "params": sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()),
                      "gpu": torch.cuda.get_device_name(0) if device == "cuda" else CPU_LABEL}), flush=True)


def time_weight_waits(torch, opt):
    """Times the compute stream's waits for weights still arriving (a
    forward's wait on a bucket's event stalls the GPU, not the CPU, so no
    CPU clock sees it): a pair of timing events around each wait whose copy
    had not landed when it was queued, appended to the list returned, read
    once the run has synchronized."""
    flat, stalls = opt.flat, []
    wait = flat.wait_weights

    def timed(first, end):
        if flat.weights_landed(first, end):
            return wait(first, end)  # nothing to stall on: no events, no cost
        stream = torch.cuda.current_stream(flat.device)
        before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        before.record(stream)
        wait(first, end)
        after.record(stream)
        stalls.append((before, after))
    flat.wait_weights = timed
    return stalls


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

def tgtd_cpu_s(folder):
    """CPU seconds used so far by the shards' tgtd processes."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    for shard in sorted(os.listdir(folder)):
        env = os.path.join(folder, shard, "target.env")
        if not os.path.exists(env):
            continue
        pid = subprocess.run([*BLKPS, "target", "show", "--dir", os.path.join(folder, shard), "--get", "PID"],
                             capture_output=True, text=True).stdout.strip()
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def measure(args, name, batch, alone, record):
    """blkps.torch through co-located shards, each schedule, wire and
    learner count; hands each run's record to record()."""
    params = alone["params"]
    runs = [(during, wire, learners) for during in args.pull_during_backward.split(",")
            for wire in ("float32", "bfloat16") for learners in map(int, args.learners.split(","))]
    for during, wire, learners in runs:
        row = {"model": name, "params": params, "batch": batch, "wire_dtype": wire, "shards": args.shards,
               "learners": learners, "steps": args.steps, "warmup": args.warmup}
        folder = tempfile.mkdtemp(prefix="blkps-gpu-bench-")
        try:
            dtype = f";dtype={wire}" if wire != "float32" else ""
            bsopts = f"params={params};rule=sgd;lr={LR};mode=async{dtype}"
            plugin = os.path.join(args.build, "target-plugin", "bs_blkps.so")
            subprocess.run([*BLKPS, "shards", "start", "--dir", folder, "--shards", str(args.shards),
                            "--stripe-unit", args.stripe_unit, "--luns", str(learners),
                            "--owner-pid", str(os.getpid()), "--bsopts", bsopts, "--plugin", plugin],
                           check=True, stdout=subprocess.DEVNULL)
            before = tgtd_cpu_s(folder)
            cfg = {"model": name, "batch": batch // learners, "blkps": True, "wire_dtype": wire,
                   "steps": args.steps, "warmup": args.warmup, "device": args.device,
                   "pull_during_backward": {"yes": True, "no": False}.get(during),
                   "switch_interval": args.switch_interval}
            envs = []
            for rank in range(learners):
                env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(learners),
                           BLKPS_TARGET=f"layout:{folder}/slot-{{slot}}.layout")
                env.pop("BLKPS_CONTROL", None)  # the layout's control lines are the job's control
                envs.append(env)
            if learners == 1:  # the ceiling: the same transfers with no GPU, on this shard set
                reps = min(5, args.steps)  # each after one to warm up
                alone_ms = run_ranks([sys.executable, __file__, "--transfers", json.dumps(
                    {"params": params, "wire_dtype": wire, "reps": reps})], envs, args.run_timeout)[0]
                row["transfers_alone_ms"] = alone_ms
            outs = run_learners(cfg, envs, args.run_timeout)
            tgtd = tgtd_cpu_s(folder) - before
        except (RuntimeError, subprocess.CalledProcessError) as e:
            record(dict(row, failed=str(e)))
            continue
        finally:
            subprocess.run([*BLKPS, "shards", "stop", "--dir", folder], stdout=subprocess.DEVNULL)
            shutil.rmtree(folder, ignore_errors=True)
        step_ms = max(o["step_ms"] for o in outs)
        record(dict(row, step_ms=round(step_ms, 2), standalone_step_ms=round(alone["step_ms"], 2),
                    ratio=round(alone["step_ms"] / step_ms, 3),
                    learner_cpu_s_per_step=round(sum(o["cpu_s_per_step"] for o in outs), 4),
                    tgtd_cpu_s_per_step=round(tgtd / (args.warmup + args.steps), 4), gpu=outs[0]["gpu"],
                    pull_during_backward=outs[0]["pull_during_backward"], stripe_unit=args.stripe_unit,
                    **({"switch_interval": args.switch_interval} if args.switch_interval else {}),
                    rank0_ms_per_step=outs[0]["ms_per_step"], rank0_transfers=outs[0]["transfers"],
                    rank0_memory=dict(outs[0]["memory"], alone_gpu_peak_mb=alone["memory"].get("gpu_peak_mb"))))


def write(out, rows):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "gpu.json.tmp"), "w") as f:
        json.dump(rows, f, indent=1)
    os.replace(os.path.join(out, "gpu.json.tmp"), os.path.join(out, "gpu.json"))
    gpu = next((r["gpu"] for r in rows if "gpu" in r), "no run finished")
    with open(os.path.join(out, "gpu.md"), "w") as f:
        f.write(f"# GPU learners through blkps ({gpu})\n\nWritten by `bench/gpu.sh`; a step's time, "
                "with the GPU's own step time alone beside it (ratio = alone / through blkps). Pulls: each "
                "bucket's right after its push (during backward) or all after step(). Rank 0's time per "
                "step: the optimizer's `seconds` (doc/gpu.md \"bench/gpu.sh\").\n\n"
                "| model | params | batch | wire | shards | learners | pulls | step ms | alone ms | ratio | "
                "learner CPU s/step | tgtd CPU s/step | rank 0 ms/step: copy out, exchange, push, pull, "
                "step wait, weights wait (on the GPU) | rank 0 MB: GPU peak (alone), blkps's GPU, host staging |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
        for r in rows:
            head = f"| {r['model']} | {r.get('params', 0):,} | {r.get('batch', '')} | {r.get('wire_dtype', '')} | "
            if "failed" in r:
                f.write(head + f"{r.get('shards', '')} | {r.get('learners', '')} | | failed: {r['failed']} "
                        "| | | | | | |\n")
                continue
            t, m = r["rank0_ms_per_step"], r["rank0_memory"]
            pulls = "during backward" if r.get("pull_during_backward", True) else "after step"
            if r.get("switch_interval"):
                pulls += f" (switch interval {r['switch_interval'] * 1000:g} ms)"
            f.write(head + f"{r['shards']} | {r['learners']} | {pulls} | {r['step_ms']} | "
                    f"{r['standalone_step_ms']} | {r['ratio']} | {r['learner_cpu_s_per_step']} | "
                    f"{r['tgtd_cpu_s_per_step']} | {t['copy_out']}, {t['exchange']}, {t['push']}, {t['pull']}, "
                    f"{t['step_wait']}, {t['weights_wait']} ({t.get('gpu_weights_wait', '–')}) | "
                    f"{m.get('gpu_peak_mb', '–')} "
                    f"({m.get('alone_gpu_peak_mb') or '–'}), {m['blkps_gpu_mb']}, {m['host_staging_mb']} |\n")
        alone = [r for r in rows if "transfers_alone_ms" in r]
        if alone:
            f.write("\nThe transfers alone (no GPU, one learner, the same shards), ms: the whole model as one "
                    "call, then one of blkps.torch's default buckets (1,048,576 parameters) per call.\n\n| model | wire | push | pull | exchange | "
                    "push by bucket | pull by bucket | exchange by bucket |\n|---|---|---|---|---|---|---|---|\n")
            for r in alone:
                a = r["transfers_alone_ms"]
                f.write(f"| {r['model']} | {r['wire_dtype']} | {a['push']} | {a['pull']} | {a['exchange']} | "
                        f"{a['bucket_push']} | {a['bucket_pull']} | {a.get('bucket_exchange', '–')} |\n")


def check(args):
    """tests/gpu_test.py's cases; the CUDA case needs a GPU. Each case runs
    in a process group of its own, ended whole past --run-timeout or on a
    stop (its servers stop with it: --owner-pid)."""
    failed = 0
    for case in CHECK_CASES:
        test = os.path.join(TOP, "tests", "gpu_test.py")
        start = time.monotonic()
        proc = subprocess.Popen([sys.executable, test, TOP, args.build, case], start_new_session=True)
        try:
            rc = proc.wait(timeout=args.run_timeout)
            result = "passed" if rc == 0 else "skipped" if rc == SKIP else f"FAILED ({rc})"
        except subprocess.TimeoutExpired:
            rc, result = None, f"FAILED (still running after {args.run_timeout:g} s, --run-timeout: ended)"
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        print(f"gpu check {case}: {result} in {time.monotonic() - start:.0f} s", flush=True)
        failed += rc not in (0, SKIP)
    return 1 if failed else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--out", help="folder for gpu.json and gpu.md")
    p.add_argument("--check", action="store_true", help="run the GPU checks instead of measuring")
    p.add_argument("--models", default="resnet50,gpt2")
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--build", default=os.path.join(TOP, "build", "cmake"))
    p.add_argument("--run-timeout", type=float, default=300.0,
                   help="seconds a run (or a --check case) may take; past it the run is a failed record (default 300)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: try the bench's machinery on the CPU (its records are not GPU figures)")
    p.add_argument("--batch", type=int, help="each model's batch instead of its own (with --device cpu)")
    p.add_argument("--stripe-unit", default="1M", help="the shards' stripe unit (blkps shards start)")
    p.add_argument("--pull-during-backward", default="default",
                   help="blkps.torch's schedules to run, a list of: yes (each bucket pulled right after its "
                        "push, an exchange), no (every bucket pulled after step()), default (blkps.torch's)")
    p.add_argument("--learners", default="1,2", help="learner counts to run (they share the GPU)")
    p.add_argument("--switch-interval", type=float,
                   help="the learners' Python switch interval in seconds (sys.setswitchinterval)")
    p.add_argument("--train", help=argparse.SUPPRESS)
    p.add_argument("--transfers", help=argparse.SUPPRESS)
    args = p.parse_args()
    if not set(args.pull_during_backward.split(",")) <= {"yes", "no", "default"}:
        p.error(f"--pull-during-backward: {args.pull_during_backward} is not a list of yes, no, default")
    if not all(n.isdigit() and int(n) > 0 for n in args.learners.split(",")):
        p.error(f"--learners: {args.learners} is not a list of learner counts")
    # A stop (kill PID) ends the runs and the servers as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.environ.setdefault("BLKPS_LIB", os.path.join(args.build, "learner", "libblkps.so"))
    if args.train:
        train(json.loads(args.train))
        return 0
    if args.transfers:
        transfers_alone(json.loads(args.transfers))
        return 0
    if args.check:
        return check(args)
    if not args.out:
        p.error("give --out DIR (or --check)")
    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu bench: no CUDA device here (torch.cuda.is_available() is False): run it on a GPU host; "
              "no figure is recorded", file=sys.stderr)
        return 1
    names = args.models.split(",")
    for name in names:
        if name not in MODELS:
            p.error(f"--models: {name} is not one of {', '.join(MODELS)}")
    rows = []

    def record(row):  # every run's record is on disk as soon as it ends
        rows.append(row)
        print(json.dumps(row), flush=True)
        write(args.out, rows)

    for name in names:
        batch = args.batch or MODELS[name]
        cfg = {"model": name, "batch": batch, "blkps": False, "wire_dtype": "float32", "steps": args.steps,
               "warmup": args.warmup, "device": args.device}
        try:
            alone = run_learners(cfg, [None], args.run_timeout)[0]
        except RuntimeError as e:
            record({"model": name, "batch": batch, "failed": f"alone: {e}"})
            continue
        measure(args, name, batch, alone, record)
    failed = sum("failed" in r for r in rows)
    print(f"gpu bench: {len(rows)} runs ({failed} failed) in {args.out}/gpu.json and gpu.md")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
