#!/usr/bin/python3
"""Tables and plots of the blkps benchmarks, from the raw files the bench
scripts write:

  report.py training --raw DIR/raw --out DIR [--target-accuracy 0.90]
      DIR/training.md, DIR/training-*.png   (bench/training.sh)
  report.py peers --raw DIR/raw --out DIR --params P
      DIR/peers.md, DIR/peers.json          (bench/peers.sh)
  report.py run-all --out DIR
      DIR/report.md from the stages' outputs in DIR (bench/run-all.sh)

Plots need matplotlib (python3-matplotlib); without it the tables are still
written and the report says the plots were skipped.
"""
import argparse
import glob
import json
import os
import re
import statistics
import sys
import time

MODES = ["async", "bsp", "ssp2"]
MODE_NAMES = {"async": "async", "bsp": "bsp", "ssp2": "ssp:2"}


def pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        print("report: no matplotlib (python3-matplotlib): plots skipped", file=sys.stderr)
        return None


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- training

def digits_run(path, batch):
    """Figures of one digits run from the evaluator's polls."""
    polls = [json.loads(line) for line in open(path)]
    started = [p for p in polls if p["updates"] == 0]
    # Time zero: the last poll before the first gradient arrived.
    t0 = started[-1]["t"] if started else polls[0]["t"]
    final = polls[-1]["updates"]
    t_end = next(p["t"] for p in polls if p["updates"] == final)
    samples = sum(polls[-1]["iterations"]) * batch
    seconds = max(t_end - t0, 1e-9)
    curve = [(p["t"] - t0, p["accuracy"]) for p in polls if p["t"] >= t0]
    return {"seconds": seconds, "samples": samples, "samples_s": samples / seconds,
            "final_accuracy": polls[-1]["accuracy"], "curve": curve,
            "exact_start": bool(started)}


def synthetic_run(paths):
    learners = [json.load(open(p)) for p in paths]
    start = min(r["start"] for r in learners)
    end = max(r["start"] + r["seconds"] for r in learners)
    wall = end - start
    iterations = sum(r["iterations"] for r in learners)
    samples = sum(r["samples"] for r in learners)
    moved = sum(r["bytes_pushed"] + r["bytes_pulled"] for r in learners)
    comm = sum(r["comm_seconds"] for r in learners) / sum(r["seconds"] for r in learners)
    first = statistics.mean(statistics.mean(r["losses"][:3]) for r in learners)
    last = statistics.mean(statistics.mean(r["losses"][-3:]) for r in learners)
    curve = sorted((r["start"] + t - start, loss) for r in learners for t, loss in zip(r["times"], r["losses"]))
    return {"params": learners[0]["params"], "wall": wall, "iterations": iterations,
            "it_s": iterations / wall, "samples_s": samples / wall, "gb_s": moved / wall / 1e9,
            "comm": comm, "loss_first": first, "loss_last": last, "curve": curve}


def report_training(args):
    raw, out = args.raw, args.out
    plt = pyplot()
    md = ["# Training scaling through blkps\n",
          "One blkps target (tgtd + bs_blkps.so) on loopback; learners are separate processes "
          "(Python/numpy through libblkps over iSCSI), one LUN each. "
          f"Measured {time.strftime('%Y-%m-%d %H:%M:%S %Z')} on {os.cpu_count()} cores.\n"]

    digits = {}
    for path in sorted(glob.glob(os.path.join(raw, "digits-*.jsonl"))):
        m = re.match(r"digits-(\w+)-(\d+)\.jsonl$", os.path.basename(path))
        if m:
            digits[(m.group(1), int(m.group(2)))] = digits_run(path, args.batch)
    if digits:
        md.append("## Digits MLP (9,610 parameters, sgd lr 0.2, batch 32)\n")
        md.append("samples/s: all learners' samples over the time from the first gradient to the last "
                  "update the evaluator saw (it polls the control LUN every 0.025 s). "
                  f"Time to {args.target_accuracy:.2f}: first poll with held-out accuracy at or "
                  "above it, from the first gradient.\n")
        rows = []
        for mode in MODES:
            for n in sorted(k[1] for k in digits if k[0] == mode):
                r = digits[(mode, n)]
                hit = next((t for t, a in r["curve"] if a >= args.target_accuracy), None)
                rows.append([MODE_NAMES[mode], n, f"{r['samples_s']:.0f}", f"{r['seconds']:.2f}",
                             f"{hit:.2f} s" if hit is not None else "not reached",
                             f"{r['final_accuracy']:.3f}"])
        md.append(table(["mode", "learners", "samples/s", "train s", f"time to {args.target_accuracy:.2f}",
                         "final accuracy"], rows))
        if plt:
            modes = [m for m in MODES if any(k[0] == m for k in digits)]
            fig, axes = plt.subplots(1, len(modes), figsize=(4.5 * len(modes), 3.6), sharey=True, squeeze=False)
            for ax, mode in zip(axes[0], modes):
                for n in sorted(k[1] for k in digits if k[0] == mode):
                    t, a = zip(*digits[(mode, n)]["curve"])
                    ax.plot(t, a, label=f"{n} learner{'s' if n > 1 else ''}")
                ax.axhline(args.target_accuracy, color="grey", linestyle=":", linewidth=1)
                ax.set_title(f"digits MLP, {MODE_NAMES[mode]}")
                ax.set_xlabel("seconds since the first gradient")
                ax.grid(alpha=0.3)
                ax.legend(loc="lower right")
            axes[0][0].set_ylabel("held-out accuracy")
            fig.tight_layout()
            fig.savefig(os.path.join(out, "training-digits-accuracy.png"), dpi=110)
            plt.close(fig)
            md.append("\n![accuracy over time](training-digits-accuracy.png)\n")

    synthetic = {}
    for path in sorted(glob.glob(os.path.join(raw, "synthetic-*.0.json"))):
        m = re.match(r"synthetic-(\w+)-(\w+)-(\d+)\.0\.json$", os.path.basename(path))
        if m:
            stem = path[:-len(".0.json")]
            synthetic[(m.group(1), m.group(2), int(m.group(3)))] = synthetic_run(sorted(glob.glob(stem + ".*.json")))
    if synthetic:
        params = next(iter(synthetic.values()))["params"]
        md.append(f"\n## Synthetic communication-bound model ({params / 1e6:.1f}M parameters, "
                  "softmax regression, batch 64)\n")
        md.append("Every iteration pulls the whole model and pushes a gradient for all of it "
                  f"({2 * 4 * params / 1e6:.0f} MB per learner iteration). Aggregate rates over the "
                  "run's wall time (learners start together); comm = share of the learners' time spent "
                  "waiting in push and pull (engine: in step and finish; double buffering overlaps the "
                  "rest with compute); engine = blkps.Engine, double-buffered, adaptive pulling off; loss = mean of the first 3 iterations -> last 3.\n")
        rows = []
        for variant in ["plain", "engine"]:
            for mode in MODES:
                for n in sorted(k[2] for k in synthetic if k[:2] == (variant, mode)):
                    r = synthetic[(variant, mode, n)]
                    rows.append([variant, MODE_NAMES[mode], n, f"{r['it_s']:.2f}", f"{r['samples_s']:.0f}",
                                 f"{r['gb_s']:.2f}", f"{100 * r['comm']:.0f}%",
                                 f"{r['loss_first']:.2f} -> {r['loss_last']:.2f}"])
        md.append(table(["variant", "mode", "learners", "iterations/s", "samples/s", "GB/s moved", "comm",
                         "loss"], rows))
        if plt:
            fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
            for mode in MODES:
                ns = sorted(k[2] for k in synthetic if k[:2] == ("plain", mode))
                if ns:
                    axes[0].plot(ns, [synthetic[("plain", mode, n)]["samples_s"] for n in ns], marker="o",
                                 label=MODE_NAMES[mode])
                    n = ns[-1]
                    t, loss = zip(*synthetic[("plain", mode, n)]["curve"])
                    axes[1].plot(t, loss, ".", markersize=3, label=f"{MODE_NAMES[mode]}, {n} learners")
            axes[0].set_xticks(sorted({k[2] for k in synthetic}))
            axes[0].set_xlabel("learners")
            axes[0].set_ylabel("samples/s (all learners)")
            axes[0].set_title("synthetic model: throughput")
            axes[1].set_xlabel("seconds")
            axes[1].set_ylabel("minibatch loss")
            axes[1].set_title("synthetic model: loss")
            for ax in axes:
                ax.grid(alpha=0.3)
                ax.legend()
            fig.tight_layout()
            fig.savefig(os.path.join(out, "training-synthetic.png"), dpi=110)
            plt.close(fig)
            md.append("\n![synthetic throughput and loss](training-synthetic.png)\n")
    with open(os.path.join(out, "training.md"), "w") as f:
        f.write("\n".join(md))


# ---------------------------------------------------------------- peers

def report_peers(args):
    raw, out = args.raw, args.out
    results = {}  # (peer, procs) -> {"median": s, "cpu": s per exchange per process, ...}

    def put(peer, procs, times, cpu_per_exchange, extra=None):
        results[(peer, procs)] = dict({"median": statistics.median(times), "cpu": cpu_per_exchange},
                                      **(extra or {}))

    for path in glob.glob(os.path.join(raw, "peers-mpi*.json")):
        r = json.load(open(path))
        times = [t for rank in r["times"] for t in rank]
        per_rank = len(r["times"][0])
        put(r["peer"], r["procs"], times, statistics.mean(r["cpu"]) / per_rank)
    gloo = {}
    for path in glob.glob(os.path.join(raw, "peers-gloo-*.json")):
        r = json.load(open(path))
        gloo.setdefault(r["procs"], []).append(r)
    for procs, ranks in gloo.items():
        put("gloo", procs, [t for r in ranks for t in r["times"]],
            statistics.mean(r["cpu"] / len(r["times"]) for r in ranks))
    for path in glob.glob(os.path.join(raw, "peers-blkps-*.0.json")):
        m = re.match(r"peers-blkps-(\w+)-(\d+)\.0\.json$", os.path.basename(path))
        mode, procs = m.group(1), int(m.group(2))
        stem = path[:-len(".0.json")]
        learners = [json.load(open(p)) for p in glob.glob(stem + ".[0-9]*.json")]
        tgtd = json.load(open(stem + ".tgtd.json"))
        put(f"blkps-{mode}", procs, [t for r in learners for t in r["times"]],
            statistics.mean(r["cpu"] / len(r["times"]) for r in learners),
            {"push": statistics.median(t for r in learners for t in r["push_times"]),
             "pull": statistics.median(t for r in learners for t in r["pull_times"]),
             "tgtd_cpu": tgtd["tgtd_cpu"] / tgtd["exchanges"]})

    peers = [p for p in ["mpi", "mpi-tcp", "gloo"] if any(k[0] == p for k in results)]
    procs_list = sorted({k[1] for k in results})
    mb = 4 * args.params / 1e6
    md = [f"# blkps beside peer-to-peer exchanges ({args.params / 1e6:.1f}M float32 parameters, "
          f"{mb:.0f} MB per process per exchange)\n",
          "Time of one model exchange per process: the median over processes and timed "
          "iterations (after warm-up), run back to back on loopback. MPI and gloo: one "
          "all_reduce (sum) of the model; blkps: each learner pushes a gradient for the whole "
          "model and pulls the whole model through one blkps target (async: applied on "
          "arrival; bsp: the pull waits for every learner's gradient, like an all_reduce). "
          "mpi uses OpenMPI's default transports (shared memory on one host); mpi-tcp is "
          "restricted to TCP loopback. **Ratio = peer time / blkps time: > 1 means blkps is "
          f"faster.** Measured {time.strftime('%Y-%m-%d %H:%M:%S %Z')} on {os.cpu_count()} cores.\n"]
    rows = []
    for procs in procs_list:
        for peer in peers + ["blkps-async", "blkps-bsp"]:
            r = results.get((peer, procs))
            if not r:
                continue
            row = [peer, procs, f"{1e3 * r['median']:.1f}", f"{mb / r['median'] / 1e3:.2f}",
                   f"{1e3 * r['cpu']:.1f}"]
            if peer.startswith("blkps"):
                row += [f"{1e3 * r['push']:.1f} / {1e3 * r['pull']:.1f}", f"{1e3 * r['tgtd_cpu']:.1f}"]
            else:
                row += ["", ""]
            rows.append(row)
    md.append(table(["exchange", "procs", "ms per exchange", "model GB/s per process",
                     "CPU ms per exchange per process", "blkps push / pull ms", "tgtd CPU ms per learner exchange"],
                    rows))
    ratios = []
    headline = {}
    for procs in procs_list:
        for mode in ["async", "bsp"]:
            b = results.get((f"blkps-{mode}", procs))
            if not b:
                continue
            row = [f"blkps {mode}", procs]
            for peer in peers:
                p = results.get((peer, procs))
                ratio = p["median"] / b["median"] if p else None
                row.append(f"{ratio:.2f}" if ratio else "")
                if ratio:
                    headline[f"blkps-{mode}/{peer}/{procs}"] = ratio
            ratios.append(row)
    md.append("\n## Ratios (peer time / blkps time; > 1: blkps faster)\n")
    md.append(table(["blkps", "procs"] + [f"vs {p}" for p in peers], ratios))
    md.append("\n## Where the time goes\n")
    md.append(where_time_goes(results, procs_list, peers, mb, raw))
    with open(os.path.join(out, "peers.md"), "w") as f:
        f.write("\n".join(md))
    with open(os.path.join(out, "peers.json"), "w") as f:
        json.dump({"params": args.params, "ratios": headline,
                   "results": {f"{k[0]}/{k[1]}": v for k, v in results.items()}}, f, indent=1)


def where_time_goes(results, procs_list, peers, mb, raw):
    """A few measured sentences: the bytes each design moves and the CPU it
    spends, for the largest process count."""
    procs = procs_list[-1] if procs_list else None
    b = results.get(("blkps-async", procs))
    if not b:
        return "No blkps figures.\n"
    lines = [f"With {procs} processes, per exchange: a blkps learner sends {mb:.0f} MB and receives "
             f"{mb:.0f} MB through the target, so tgtd moves {2 * procs * mb:.0f} MB over TCP loopback "
             f"for all learners together, and applies {procs} gradients ({procs} x {mb:.0f} MB read "
             "twice: NaN/Inf check, then saxpy). "
             f"Measured: push {1e3 * b['push']:.0f} ms + pull {1e3 * b['pull']:.0f} ms per learner; "
             f"tgtd spent {1e3 * b['tgtd_cpu']:.0f} ms of CPU per learner exchange "
             f"({1e3 * b['tgtd_cpu'] * procs:.0f} ms per round of {procs}) and each learner "
             f"{1e3 * b['cpu']:.0f} ms (libiscsi, TCP send and receive). "
             f"A round needs {1e3 * (b['tgtd_cpu'] + b['cpu']) * procs:.0f} ms of CPU: at least "
             f"{1e3 * (b['tgtd_cpu'] + b['cpu']) * procs / os.cpu_count():.0f} ms on this machine's "
             f"{os.cpu_count()} cores, against {1e3 * b['median']:.0f} ms measured."]
    for peer in peers:
        p = results.get((peer, procs))
        if p:
            lines.append(f"{peer}: {1e3 * p['median']:.0f} ms per exchange, "
                         f"{1e3 * p['cpu']:.0f} ms of CPU per process ({1e3 * p['cpu'] * procs:.0f} ms per round).")
    profile = tgtd_profile(raw, procs)
    if profile:
        lines.append(profile)
    lines.append("A ring all_reduce moves about 2(N-1)/N of the model per process and needs no "
                 "server; OpenMPI between processes of one host uses shared memory (no TCP copies); "
                 "blkps's server receives and sends every learner's full model, so its "
                 "per-round traffic grows with N at one server.")
    return "\n\n".join(lines) + "\n"


def tgtd_profile(raw, procs):
    """A sentence on where tgtd's CPU went, from perf's flat profile of
    blkps async with `procs` learners (peers.sh), or None."""
    path = os.path.join(raw, f"peers-tgtd-perf-{procs}.txt")
    if not os.path.exists(path):
        return None
    groups = {"kernel copies to and from TCP sockets": 0.0, "rest of the kernel (TCP stack, scheduling)": 0.0,
              "memcpy (weights into tgt's buffer)": 0.0, "update rule (saxpy)": 0.0,
              "NaN/Inf check": 0.0, "other user space": 0.0}
    for line in open(path):
        m = re.match(r"\s*([0-9.]+)%\s+(\S+)\s+\[(.)\]\s+(\S+)", line)
        if not m:
            continue
        share, kind, sym = float(m.group(1)), m.group(3), m.group(4)
        if kind == "k":
            key = ("kernel copies to and from TCP sockets" if sym in ("_copy_to_iter", "_copy_from_iter")
                   else "rest of the kernel (TCP stack, scheduling)")
        elif "memmove" in sym or "memcpy" in sym:
            key = "memcpy (weights into tgt's buffer)"
        elif "axpy" in sym:
            key = "update rule (saxpy)"
        elif "CheckValues" in sym:
            key = "NaN/Inf check"
        else:
            key = "other user space"
        groups[key] += share
    parts = ", ".join(f"{k} {v:.0f}%" for k, v in sorted(groups.items(), key=lambda kv: -kv[1]) if v >= 0.5)
    return f"tgtd's CPU by perf samples (blkps async, {procs} learners): {parts}."


# ---------------------------------------------------------------- run-all

def null_ratio_table(path):
    """{(op, bs): ratio} and the table text from null-ratio.sh's output."""
    ratios = {}
    if not os.path.exists(path):
        return ratios
    for line in open(path):
        f = line.split()
        if len(f) == 6 and f[0] in ("read", "write"):
            try:
                ratios[(f[0], f[1])] = float(f[5])
            except ValueError:
                pass
    return ratios


def read(path):
    return open(path).read() if os.path.exists(path) else None


def git_commit(top):
    """HEAD's commit, read from .git without running git."""
    git = os.path.join(top, ".git")
    try:
        head = open(os.path.join(git, "HEAD")).read().strip()
        if not head.startswith("ref: "):
            return head[:12]
        ref = head[5:]
        if os.path.exists(os.path.join(git, ref)):
            return open(os.path.join(git, ref)).read().strip()[:12]
        for line in open(os.path.join(git, "packed-refs")):
            if line.rstrip().endswith(" " + ref):
                return line.split()[0][:12]
    except OSError:
        pass
    return "unknown"


def machine():
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal"))
    except (OSError, StopIteration):
        mem = 0
    return f"{os.uname().nodename}: {cpu}, {os.cpu_count()} cores, {mem / 2**20:.0f} GiB, Linux {os.uname().release}"


def report_run_all(args):
    out, top = args.out, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    stages = {}
    if os.path.exists(os.path.join(out, "stages.tsv")):
        for line in open(os.path.join(out, "stages.tsv")):
            name, status, seconds = line.rstrip("\n").split("\t")
            stages[name] = (status, seconds)
    md = ["# blkps benchmark report\n",
          f"- machine: {machine()}",
          f"- date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
          f"- git commit: {git_commit(top)}",
          "- command: `bench/run-all.sh" + (" --quick" if args.quick else "") + "`\n",
          "Ratios are measured within one run (the machine's noise hits both sides).\n",
          "## Headline\n"]
    head = []
    null = {}
    for bs in ("256K", "1M"):
        null.update(null_ratio_table(os.path.join(out, f"null-ratio-{bs}.txt")))
    for op in ("write", "read"):
        for bs in ("256K", "1M"):
            if (op, bs) in null:
                head.append([f"plugin vs tgt null store, {op} {bs} x QD16", f"{null[(op, bs)]:.2f}",
                             "blkps MB/s / null MB/s"])
    mount = read(os.path.join(out, "mount-vs-direct.txt"))
    for line in (mount or "").splitlines():  # "| 1M x QD16 | read | mount | direct | ratio |"
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[1] in ("read", "write") and re.fullmatch(r"[0-9.]+", cells[4]):
            head.append([f"FUSE mount vs direct libiscsi, {cells[1]} {cells[0]}", cells[4],
                         "mount MB/s / direct MB/s"])
    peers = os.path.join(out, "peers.json")
    if os.path.exists(peers):
        ratios = json.load(open(peers))["ratios"]
        order = {"mpi": 0, "mpi-tcp": 1, "gloo": 2}
        for key in sorted(ratios, key=lambda k: (k.split("/")[0], int(k.split("/")[2]),
                                                  order.get(k.split("/")[1], 9))):
            who, peer, procs = key.split("/")
            head.append([f"{who.replace('-', ' ')} vs {peer}, {procs} processes", f"{ratios[key]:.2f}",
                         "peer time / blkps time (> 1: blkps faster)"])
    md.append(table(["what", "ratio", "convention"], head) if head else "No headline figures (stages missing).\n")
    md.append("\n## Stages\n")
    md.append(table(["stage", "status", "seconds"], [[k, v[0], v[1]] for k, v in stages.items()]))
    sections = [
        ("Plugin vs tgt's null store (bench/null-ratio.sh)", ["null-ratio-256K.txt", "null-ratio-1M.txt"], True),
        ("fio (bench/fio/sweep.sh)", ["fio.md"], False),
        ("Mount vs direct (bench/mount-vs-direct.sh)", ["mount-vs-direct.txt"], False),
        ("Engine (bench/engine-bench.sh)", ["engine-bench.txt"], False),
        ("Training (bench/training.sh)", ["training.md"], False),
        ("Peers (bench/peers.sh)", ["peers.md"], False),
    ]
    for title, files, verbatim in sections:
        texts = [(f, read(os.path.join(out, f))) for f in files]
        texts = [(f, t) for f, t in texts if t]
        md.append(f"\n## {title}\n")
        if not texts:
            md.append("Not run (see Stages).\n")
        for f, text in texts:
            if verbatim:
                md.append(f"`{f}`:\n\n```\n{text.rstrip()}\n```\n")
            else:  # demote the stage's own headings under this one
                md.append(re.sub(r"^(#+) ", lambda m: "##" + m.group(1) + " ", text, flags=re.M))
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(md))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    t = sub.add_parser("training")
    t.add_argument("--raw", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--target-accuracy", type=float, default=0.90)
    t.add_argument("--batch", type=int, default=32, help="the digits learners' minibatch")
    p = sub.add_parser("peers")
    p.add_argument("--raw", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--params", type=int, required=True)
    r = sub.add_parser("run-all")
    r.add_argument("--out", required=True)
    r.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    {"training": report_training, "peers": report_peers, "run-all": report_run_all}[args.what](args)


if __name__ == "__main__":
    main()
