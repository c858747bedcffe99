#!/usr/bin/python3
"""The Fashion-MNIST CNN (learner/examples/torch_fashion.py) through blkps
beside one process and torch DistributedDataParallel (gloo): 1, 2 and 4
learners; blkps in async, bsp and ssp:2, gradient mode (server rule momentum)
and delta mode (local SGD with momentum, server rule sum); DDP with the same
model, data split, batch size, epochs and SGD; and, per learner count N, one
process trained with the same SGD on batch N x 32 (the total batch), the
reference every blkps row is compared with. Each run is one
torch_fashion_job.py (or torch_fashion.py --local); rank 0 measures held-out
accuracy and the mean training loss every 1/8 epoch (--evals-per-epoch; evaluation time is not
training time). Writes OUT/torch-fashion.md (final accuracy, its difference
to one process, training seconds to 85% held-out accuracy, samples/s, the
server's push staleness), OUT/torch-fashion.json and OUT/torch-fashion.png
(accuracy over training time and loss over training images per learner count).

  bench/torch_fashion_bench.py [--out DIR] [--epochs 2] [--learners 1,2,4] [--build DIR]
      [--modes async,bsp,ssp:2] [--optimizers gradient,delta] [--no-ddp] [--no-reference]
      [--server-options staleness_aware=0] [--train-subset N] [--evals-per-epoch 8]
      [--pipeline on|off|default] [--seeds 0,1,2]
  bench/torch_fashion_bench.py --plot OUT/torch-fashion.json [--out DIR]   the plot again
  bench/torch_fashion_bench.py --straggler [--learners 4]   one learner at half speed:
      blkps async (gradient and delta mode) beside DDP, time to 85%
"""
import argparse
import json
import os
import subprocess
import sys

TOP = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
JOB = os.path.join(TOP, "learner", "examples", "torch_fashion_job.py")
LEARNER = os.path.join(TOP, "learner", "examples", "torch_fashion.py")
TRAIN_IMAGES = 60_000
BATCH = 32
LR, MOMENTUM = 0.05, 0.9
GOAL = 0.85


def configurations(args):
    """(learners, system, the job's arguments) of every run, each seed of
    --seeds in turn (a run's --seed: its model's initial weights and each
    rank's data order). A pipelined system's name ends in "pipelined"."""
    pipelined = " pipelined" if args.pipeline == "on" else ""
    for n in (int(c) for c in args.learners.split(",")):
        for seed in (int(s) for s in args.seeds.split(",")):
            seeded = ["--seed", str(seed)]
            if not args.straggler and not args.no_reference:
                yield n, f"one process, batch {n * BATCH}", ["--local", "--batch", str(n * BATCH), *seeded]
            for mode in (m for m in args.modes.split(",") if m):
                for optimizer in args.optimizers.split(","):
                    yield n, f"blkps {mode} {optimizer}{pipelined}", [
                        "--mode", mode, "--optimizer", optimizer, "--rule", "momentum", "--server-lr", str(LR),
                        "--server-options", args.server_options, "--pipeline", args.pipeline, *seeded]
            if not args.no_ddp:
                yield n, "DDP (gloo)", ["--ddp", *seeded]


def run(n, job_args, args):
    images = args.train_subset or TRAIN_IMAGES
    eval_every = max(1, images // n // BATCH // args.evals_per_epoch) if args.evals_per_epoch else 0
    common = ["--epochs", str(args.epochs), "--batch", str(BATCH), "--lr", str(LR), "--momentum", str(MOMENTUM),
              "--eval-every", str(eval_every)]
    if args.train_subset:
        common += ["--train-subset", str(args.train_subset)]
    if args.straggler:
        common += ["--straggler", str(n - 1), "--slowdown", "2"]
    if job_args[0] == "--local":  # one process: its batch is the total batch, evaluated as often per epoch
        cmd = [sys.executable, LEARNER, *common, *job_args]
    else:
        cmd = [sys.executable, JOB, "--learners", str(n), "--build", args.build, *job_args, *common]
    out = subprocess.run(["nice", "-n", "10", *cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("result: ")]
    if out.returncode != 0 or not lines:
        print(out.stdout[-2000:], file=sys.stderr)
        return None
    r = json.loads(lines[-1][len("result: "):])
    server = [line for line in out.stdout.splitlines() if line.startswith("server: ")]
    if server:
        r["server"] = json.loads(server[-1][len("server: "):])
    r["command"] = " ".join(cmd[1:]).replace(TOP + "/", "")
    r["seed"] = int(job_args[job_args.index("--seed") + 1])
    return r


def staleness(r):
    """The server's push staleness over all learners: (mean, max), or None."""
    learners = (r or {}).get("server", {}).get("learners")
    if not learners:
        return None
    return (sum(s["push_staleness_mean"] for s in learners) / len(learners),
            max(s["push_staleness_max"] for s in learners))


def time_to(curve, goal):
    return next((p[0] for p in curve if p[2] >= goal), None)


def plot(results, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("torch-fashion: no matplotlib (python3-matplotlib): plot skipped", file=sys.stderr)
        return
    counts = sorted({n for n, _, _ in results})
    fig, axes = plt.subplots(2, len(counts), figsize=(6 * len(counts), 9), squeeze=False)
    for col, n in enumerate(counts):
        top, bottom = axes[0][col], axes[1][col]
        for m, name, r in results:
            if m != n or not r or not r["curve"]:
                continue
            style = "--" if name.startswith(("DDP", "one")) else "-"
            top.plot([p[0] for p in r["curve"]], [p[2] for p in r["curve"]], marker=".", label=name,
                     linestyle=style)
            # Rank 0's steps x the total batch (one process: its batch is the total batch).
            bottom.plot([p[1] * n * BATCH / 1000 for p in r["curve"]], [p[3] for p in r["curve"]], marker=".",
                        label=name, linestyle=style)
        top.axhline(GOAL, color="grey", linewidth=0.8)
        top.set_title(f"{n} learner{'s' if n > 1 else ''}")
        top.set_xlabel("training time, s")
        top.set_ylabel("held-out accuracy")
        top.set_ylim(0.6, 0.92)
        top.legend(fontsize=7)
        bottom.set_xlabel("thousand training images taken (rank 0's steps x learners x batch)")
        bottom.set_ylabel("rank 0's mean training loss since the last point")
        bottom.set_ylim(0.2, 2.5)
        bottom.legend(fontsize=7)
    fig.suptitle("Fashion-MNIST CNN: blkps, one process, DDP")
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(TOP, "build", "bench-report"))
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--learners", default="1,2,4", help="comma-separated learner counts")
    ap.add_argument("--modes", default="async,bsp,ssp:2", help="comma-separated consistency modes")
    ap.add_argument("--optimizers", default="gradient,delta", help="gradient, delta or both")
    ap.add_argument("--no-ddp", action="store_true", help="leave DDP out")
    ap.add_argument("--no-reference", action="store_true",
                    help="leave the one-process rows out (they are deterministic: seed 0)")
    ap.add_argument("--server-options", default="", help="more --bsopts, e.g. staleness_aware=0")
    ap.add_argument("--pipeline", choices=["default", "on", "off"], default="default",
                    help="gradient mode's one-step pipelined learners (doc/gpu.md); on: the rows say pipelined")
    ap.add_argument("--seeds", default="0", help="comma-separated seeds: every configuration once per seed")
    ap.add_argument("--evals-per-epoch", type=int, default=8,
                    help="rank 0's held-out evaluations per epoch (0: only the final one; in async a "
                         "learner that evaluates falls behind the others, as a straggler does)")
    ap.add_argument("--train-subset", type=int, default=0, help="the first N training images (0: all)")
    ap.add_argument("--straggler", action="store_true",
                    help="the last rank runs at half speed; no one-process row")
    ap.add_argument("--build", default=os.path.join(TOP, "build", "cmake"))
    ap.add_argument("--plot", metavar="JSON", help="only plot a torch-fashion.json (into OUT) and stop")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.plot:
        with open(args.plot) as f:
            plot([(e["learners"], e["system"], e["result"]) for e in json.load(f)],
                 os.path.join(args.out, "torch-fashion.png"))
        return
    results, table = [], ""
    for n, name, job_args in configurations(args):
        r = run(n, job_args, args)
        results.append((n, name, r))
        summary = (f"accuracy {r['accuracy']:.4f}, {r['train_s']:.1f} s, to {GOAL:.0%}: "
                   f"{time_to(r['curve'], GOAL)} s, push staleness {staleness(r)}" if r else "FAILED")
        print(f"torch-fashion: {n} learner(s), {name}: {summary}", flush=True)
        table = write_report(results, args)  # after every row: a long run stopped early keeps its rows
    plot(results, os.path.join(args.out, "torch-fashion.png"))
    print(table)
    sys.exit(0 if all(r for _, _, r in results) else 1)


def write_report(results, args):
    """Writes OUT/torch-fashion.md and .json for the rows so far; returns the table."""
    images = f"first {args.train_subset} of 60,000" if args.train_subset else "60,000"
    straggler = "; the last rank at half speed (it waits as long as it computed)" if args.straggler else ""
    server = f"; server options {args.server_options}" if args.server_options else ""
    rows = [f"Fashion-MNIST CNN (11,274 parameters), {args.epochs} epochs of {images} training images, batch "
            f"{BATCH} per learner, SGD lr {LR} momentum {MOMENTUM} (blkps gradient mode: server rule momentum; "
            f"delta mode: local SGD, server rule sum){server}{straggler}; held-out accuracy on 10,000 test images "
            f"{f'every 1/{args.evals_per_epoch} epoch' if args.evals_per_epoch else 'at the end'}; one run each "
            f"of seed(s) {args.seeds}. "
            "Δ: to one process with the same SGD on the total batch. "
            "Push staleness: updates between a learner's pull and its push, mean / max over learners.\n",
            f"| learners | system | final accuracy | Δ one process | training s to {GOAL:.0%} | training s | "
            "samples/s | push staleness mean / max |",
            "|---|---|---|---|---|---|---|---|"]
    reference = {(n, r["seed"]): r for n, name, r in results if name.startswith("one") and r}
    for n, name, r in results:
        if r is None:
            rows.append(f"| {n} | {name} | failed | | | | | |")
            continue
        reach = time_to(r["curve"], GOAL)
        same = reference.get((n, r["seed"]))  # one process of the same seed
        delta = (f"{100 * (r['accuracy'] - same['accuracy']):+.2f} pt"
                 if same and not name.startswith("one") else "")
        st = staleness(r)
        rows.append(f"| {n} | {name} | {r['accuracy']:.4f} | {delta} | "
                    f"{'not reached' if reach is None else f'{reach:.1f}'} "
                    f"| {r['train_s']:.1f} | {r['samples_per_s']:.0f} | "
                    f"{'' if st is None else f'{st[0]:.2f} / {st[1]}'} |")
    table = "\n".join(rows) + "\n"
    with open(os.path.join(args.out, "torch-fashion.md"), "w") as f:
        f.write(table)
    with open(os.path.join(args.out, "torch-fashion.json"), "w") as f:
        json.dump([{"learners": n, "system": name, "result": r} for n, name, r in results], f)
    return table


if __name__ == "__main__":
    main()
