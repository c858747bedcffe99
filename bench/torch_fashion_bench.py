#!/usr/bin/python3
"""The Fashion-MNIST CNN (learner/examples/torch_fashion.py) through blkps
beside torch DistributedDataParallel (gloo): 1, 2 and 4 learners; blkps in
async, bsp and ssp:2, gradient mode (server rule momentum) and delta mode
(local SGD with momentum, server rule sum); DDP with the same model, data
split, batch size, epochs and SGD. Each run is one torch_fashion_job.py;
rank 0 measures held-out accuracy every 1/8 epoch (evaluation time is not
training time). Writes OUT/torch-fashion.md (final accuracy, training
seconds to 85% held-out accuracy, samples/s) and OUT/torch-fashion.png
(accuracy over training time per learner count).

  bench/torch_fashion_bench.py [--out DIR] [--epochs 2] [--learners 1,2,4] [--build DIR]
"""
import argparse
import json
import os
import subprocess
import sys

TOP = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
JOB = os.path.join(TOP, "learner", "examples", "torch_fashion_job.py")
TRAIN_IMAGES = 60_000
BATCH = 32
LR, MOMENTUM = 0.05, 0.9
GOAL = 0.85


def configurations(learner_counts):
    for n in learner_counts:
        for mode in ("async", "bsp", "ssp:2"):
            for optimizer in ("gradient", "delta"):
                yield n, f"blkps {mode} {optimizer}", ["--mode", mode, "--optimizer", optimizer,
                                                       "--rule", "momentum", "--server-lr", str(LR)]
        yield n, "DDP (gloo)", ["--ddp"]


def run(n, job_args, args):
    eval_every = max(1, TRAIN_IMAGES // n // BATCH // 8)
    cmd = [sys.executable, JOB, "--learners", str(n), "--build", args.build, *job_args,
           "--epochs", str(args.epochs), "--batch", str(BATCH), "--lr", str(LR), "--momentum", str(MOMENTUM),
           "--eval-every", str(eval_every)]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("result: ")]
    if out.returncode != 0 or not lines:
        print(out.stdout[-2000:], file=sys.stderr)
        return None
    return json.loads(lines[-1][len("result: "):])


def time_to(curve, goal):
    return next((t for t, _, acc in curve if acc >= goal), None)


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    counts = sorted({n for n, _, _ in results})
    fig, axes = plt.subplots(1, len(counts), figsize=(6 * len(counts), 4.5), squeeze=False)
    for ax, n in zip(axes[0], counts):
        for m, name, r in results:
            if m == n and r:
                ax.plot([p[0] for p in r["curve"]], [p[2] for p in r["curve"]], marker=".", label=name,
                        linestyle="--" if name.startswith("DDP") else "-")
        ax.axhline(GOAL, color="grey", linewidth=0.8)
        ax.set_title(f"{n} learner{'s' if n > 1 else ''}")
        ax.set_xlabel("training time, s")
        ax.set_ylabel("held-out accuracy")
        ax.set_ylim(0.6, 0.92)
        ax.legend(fontsize=7)
    fig.suptitle("Fashion-MNIST CNN: blkps beside DistributedDataParallel")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(TOP, "build", "bench-report"))
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--learners", default="1,2,4", help="comma-separated learner counts")
    ap.add_argument("--build", default=os.path.join(TOP, "build", "cmake"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    results = []
    for n, name, job_args in configurations(int(c) for c in args.learners.split(",")):
        r = run(n, job_args, args)
        results.append((n, name, r))
        summary = (f"accuracy {r['accuracy']:.4f}, {r['train_s']:.1f} s, to {GOAL:.0%}: "
                   f"{time_to(r['curve'], GOAL)} s" if r else "FAILED")
        print(f"torch-fashion: {n} learner(s), {name}: {summary}", flush=True)
    rows = [f"Fashion-MNIST CNN (11,274 parameters), {args.epochs} epochs, batch {BATCH} per learner, "
            f"SGD lr {LR} momentum {MOMENTUM} (blkps gradient mode: server rule momentum; delta mode: local "
            "SGD, server rule sum), held-out accuracy on 10,000 test images every 1/8 epoch; one run.\n",
            f"| learners | system | final accuracy | training s to {GOAL:.0%} | training s | samples/s |",
            "|---|---|---|---|---|---|"]
    for n, name, r in results:
        if r is None:
            rows.append(f"| {n} | {name} | failed | | | |")
            continue
        reach = time_to(r["curve"], GOAL)
        rows.append(f"| {n} | {name} | {r['accuracy']:.4f} | {'not reached' if reach is None else f'{reach:.1f}'} "
                    f"| {r['train_s']:.1f} | {r['samples_per_s']:.0f} |")
    table = "\n".join(rows) + "\n"
    with open(os.path.join(args.out, "torch-fashion.md"), "w") as f:
        f.write(table)
    with open(os.path.join(args.out, "torch-fashion.json"), "w") as f:
        json.dump([{"learners": n, "system": name, "result": r} for n, name, r in results], f)
    plot(results, os.path.join(args.out, "torch-fashion.png"))
    print(table)
    sys.exit(0 if all(r for _, _, r in results) else 1)


if __name__ == "__main__":
    main()
