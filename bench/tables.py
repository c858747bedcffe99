#!/usr/bin/env python3
"""The result tables of the docs (doc/performance.md, doc/embeddings.md,
README.md: any README.md or doc/*.md with a marked table), made from the
committed runs in bench/results/, never typed by hand.

A generated table sits between two marker lines in the doc:

    <!-- table NAME: made by bench/tables.py from bench/results/...; do not edit -->
    ...the table...
    <!-- end table NAME -->

`bench/tables.py` rewrites every marked region from bench/results;
`bench/tables.py --check` changes nothing and exits 1, naming the table,
when a doc differs from what the results give (the unit test Docs.tables
runs it). A table's name may be marked in several docs (README.md and
doc/embeddings.md show the same figures). After committing a new run
under bench/results/, run `bench/tables.py` and commit the doc with it.
The prose around a table (what a figure means, the run's date and load) is
the doc's own and is written by hand.
"""
import argparse
import json
import os
import re
import sys

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(TOP, "bench", "results")
sys.path.insert(0, os.path.join(TOP, "bench", "cluster"))


def _read(*path):
    with open(os.path.join(RESULTS, *path), encoding="utf-8") as f:
        return f.read()


def _section(markdown, heading):
    """The text of `markdown` under the heading line `heading`, to the next
    heading of the same or a higher level."""
    lines = markdown.split("\n")
    level = len(heading) - len(heading.lstrip("#"))
    start = lines.index(heading) + 1
    end = next((i for i in range(start, len(lines))
                if re.match(r"^#{1,%d} " % level, lines[i])), len(lines))
    return "\n".join(lines[start:end])


def _tables(markdown):
    """Every markdown table in `markdown`, each a list of rows, each a list of
    cells (the header row first, the |---| row left out)."""
    tables, rows = [], []
    for line in markdown.split("\n") + [""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                rows.append(cells)
        elif rows:
            tables.append(rows)
            rows = []
    return tables


def _render(rows):
    out = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    return "\n".join(out + ["| " + " | ".join(r) + " |" for r in rows[1:]])


def cluster_headline():
    """The full cluster run: every system at the largest model and most
    hosts, and the goals (bench/cluster/report.py's own headline)."""
    import report  # bench/cluster/report.py
    return report.headline(os.path.join(RESULTS, "cluster"))


def one_host_ratios():
    """The headline ratios of the one-host report (bench/run-all.sh)."""
    return _render(_tables(_section(_read("report.md"), "## Headline"))[0])


def null_ratio():
    """Plugin vs tgt's null store (bench/null-ratio.sh's text tables in the
    report), larger requests first."""
    text = _section(_read("report.md"), "## Plugin vs tgt's null store (bench/null-ratio.sh)")
    rows = [["requests", "op", "blkps MB/s", "null MB/s", "ratio"]]
    found = []
    for line in text.split("\n"):
        f = line.split()
        if len(f) == 6 and f[0] in ("write", "read"):
            op, bs, qd, blkps, null, ratio = f
            what = {"write": "write (gradient push)", "read": "read (weight pull)"}[op]
            found.append((bs, [f"{bs.replace('K', ' KiB').replace('M', ' MiB')} × QD{qd}", what, blkps, null, ratio]))
    by_size = {"1M": 0, "256K": 1}
    return _render(rows + [r for _, r in sorted(found, key=lambda x: by_size.get(x[0], 2))])


FIO_LOOPBACK_SIZES = ("4K", "64K", "256K", "1M", "16M")


def fio_subset():
    """The fio sweep's rows at queue depths 1 and 16: every size of the five
    below on loopback libiscsi, 1 MiB on every other link and path."""
    table = _tables(_section(_read("report.md"), "### fio sweep"))[0]
    keep = [table[0]]
    for r in table[1:]:
        link, path, _, bs, qd = r[:5]
        if qd not in ("1", "16"):
            continue
        if (link, path) == ("loopback", "libiscsi") and bs in FIO_LOOPBACK_SIZES or bs == "1M":
            keep.append(r)
    return _render(keep)


F32_VS_DDP_LABELS = {
    "blkps-async": "blkps, push then pull (`Model`)",
    "ddp": "DDP float32 (gloo ring)",
    "blkps-async-engine": "blkps, push and next pull at once (`Engine`)",
}


def f32_vs_ddp():
    """The run that set blkps float32 beside DDP: each exchange against DDP's
    time, with the push's and the pull's medians and the CPU spent."""
    import json
    with open(os.path.join(RESULTS, "cluster-f32-vs-ddp", "cluster.json"), encoding="utf-8") as f:
        records = [r for r in json.load(f) if r["dtype"] == "float32"]
    ddp = next(r["ms_per_exchange"] for r in records if r["system"] == "ddp")
    rows = [["exchange", "ms / exchange", "vs DDP", "push · pull ms (medians)", "MB sent / host",
             "CPU ms / exchange: learner · tgtd"]]
    for r in records:
        phases = f"{r['ms_per_push']:.0f} · {r['ms_per_pull']:.0f}" if "ms_per_push" in r else ""
        sent = r["wire_bytes_per_host"] / 1e6
        # The engine pulls ahead of its steps: its bytes per exchange are off by up to a pull.
        sent = f"~{sent:.0f}" if r["system"].endswith("-engine") else f"{sent:.1f}"
        cpu = f"{r['cpu_ms_per_exchange']:.0f}" + (f" · {r['tgtd_cpu_ms_per_exchange']:.0f}"
                                                  if "tgtd_cpu_ms_per_exchange" in r else "")
        rows.append([F32_VS_DDP_LABELS.get(r["system"], r["system"]), f"{r['ms_per_exchange']:.0f}",
                     f"{r['ms_per_exchange'] / ddp:.2f}", phases, sent, cpu])
    table = _render(rows).split("\n")
    table[1] = "|---|" + "---:|" * (len(rows[0]) - 1)
    return "\n".join(table)


LINKRATE_LABELS = {
    "blkps-async": "blkps async, push then pull (`Model`)",
    "blkps-bsp": "blkps bsp, push then pull (`Model`)",
    "blkps-async-exchange": "blkps async, pipelined exchange (`Model.exchange`; share: each direction)",
    "blkps-bsp-exchange": "blkps bsp, pipelined exchange (`Model.exchange`; share: each direction)",
    "mpi": "MPI_Allreduce float32 (ring)",
}


def cluster_linkrate():
    """The run of doc/data-path.md "Phases at link rate": blkps's push and
    pull beside MPI float32 in one run, each phase's share of the link and
    how much of the time the learners were in the same phase."""
    import report  # bench/cluster/report.py
    with open(os.path.join(RESULTS, "cluster-linkrate", "cluster.json"), encoding="utf-8") as f:
        records = report.measured(json.load(f))
    mpi = next(r["ms_per_exchange"] for r in records if r["system"] == "mpi" and r["dtype"] == "float32")
    rows = [["exchange", "ms / exchange", "vs MPI f32", "push · pull ms (medians)", "push · pull, share of the link",
             "learners in the same phase", "MB sent / host", "CPU ms / exchange: learner · tgtd"]]
    for r in records:
        share = report.phase_link_share(r)
        cpu = f"{r['cpu_ms_per_exchange']:.0f}" + (f" · {r['tgtd_cpu_ms_per_exchange']:.0f}"
                                                  if "tgtd_cpu_ms_per_exchange" in r else "")
        rows.append([LINKRATE_LABELS.get(r["system"], r["system"]), f"{r['ms_per_exchange']:.0f}",
                     f"{r['ms_per_exchange'] / mpi:.2f}",
                     f"{r['ms_per_push']:.0f} · {r['ms_per_pull']:.0f}" if "ms_per_push" in r else "",
                     f"{100 * share[0]:.0f}% · {100 * share[1]:.0f}%" if share else "",
                     f"{100 * r['phase_alignment']:.0f}%" if "phase_alignment" in r else "",
                     f"{r['wire_bytes_per_host'] / 1e6:.1f}", cpu])
    table = _render(rows).split("\n")
    table[1] = "|---|" + "---:|" * (len(rows[0]) - 1)
    return "\n".join(table)


def soak():
    """The committed soak run's figures (bench/soak.py writes them)."""
    return _render(_tables(_read("soak", "soak.md"))[0])


def replica_cost(folder="replica-cost"):
    """The committed replica cost run's table (bench/replica_cost.py writes it)."""
    return _render(_tables(_read(folder, "replica-cost.md"))[0])


def catch_up(folder="catch-up"):
    """The committed catch-up run's table (bench/catch_up.py writes it)."""
    return _render(_tables(_read(folder, "catch-up.md"))[0])


def failover_soak(folder="failover-soak"):
    """A committed failover soak's table (bench/failover_soak.py writes it)."""
    return _render(_tables(_read(folder, "failover-soak.md"))[0])


def _async_runs():
    """Every committed 2-epoch Fashion-MNIST run of bench/torch-fashion.sh
    (bench/results/torch-fashion-async/2epochs/*.json, one file per run):
    {(learners, system): [result, ...]}."""
    import glob
    runs = {}
    for path in sorted(glob.glob(os.path.join(RESULTS, "torch-fashion-async", "2epochs", "*.json"))):
        with open(path, encoding="utf-8") as f:
            for e in json.load(f):
                if e["result"] is not None:
                    runs.setdefault((e["learners"], e["system"]), []).append(e["result"])
    return runs


def _mean_accuracy(results):
    return sum(r["accuracy"] for r in results) / len(results)


def _one_process(runs, learners):
    """The mean accuracy of the one-process runs on `learners`' total batch."""
    ref = next((v for (m, name), v in runs.items() if m == learners and name.startswith("one process")), None)
    return _mean_accuracy(ref) if ref else None


ASYNC_SYSTEMS = ("blkps async gradient", "blkps async delta", "blkps ssp:2 gradient", "blkps ssp:2 delta",
                 "blkps async gradient pipelined", "blkps ssp:2 gradient pipelined")


def _system(name):
    """A run's system without its note: "blkps async gradient (Nov 25: ...)"
    is "blkps async gradient"."""
    return name.split(" (")[0]


def async_two_epochs():
    """Per learner count and system, the final held-out accuracy of each run,
    their mean, and the mean's difference to the mean of the one-process
    runs on the same total batch (doc/async.md "Results")."""
    runs = _async_runs()
    rows = [["learners", "system", "runs: final accuracy", "mean", "Δ one process (mean)", "spread",
             "push staleness mean / max"]]
    order = ("one process",) + ASYNC_SYSTEMS + ("DDP",)
    for (n, system), rs in sorted(runs.items(),
                                  key=lambda kv: (kv[0][0], next((i for i, o in enumerate(order)
                                                                  if _system(kv[0][1]) == o or
                                                                  kv[0][1].startswith(o + ",")), len(order)))):
        accs = [r["accuracy"] for r in rs]
        mean = _mean_accuracy(rs)
        ref = _one_process(runs, n)
        delta = ""
        if ref and not system.startswith("one process"):
            delta = f"{100 * (mean - ref):+.2f} pt"
        stale = [s for r in rs for s in r.get("server", {}).get("learners", [])]
        pushes = (f"{sum(s['push_staleness_mean'] for s in stale) / len(stale):.2f} / "
                  f"{max(s['push_staleness_max'] for s in stale)}" if stale else "")
        spread = f"{100 * (max(accs) - min(accs)):.2f} pt" if len(accs) > 1 else ""
        rows.append([str(n), system, ", ".join(f"{a:.4f}" for a in accs), f"{mean:.4f}", delta, spread, pushes])
    return _render(rows)


def async_summary():
    """README's view of the same runs: per learner count, each async and
    ssp:2 system's difference to one process in points (the mean where
    there are several runs; a system name's parenthesis, such as an earlier
    evaluation, kept as a note)."""
    runs = _async_runs()
    rows = [["learners", "one process"] + [s.removeprefix("blkps ") for s in ASYNC_SYSTEMS]]
    for n in sorted({n for n, _ in runs}):
        ref = _one_process(runs, n)
        row = [str(n), f"{ref:.4f}" if ref else ""]
        for system in ASYNC_SYSTEMS:
            match = [(name, rs) for (m, name), rs in runs.items() if m == n and _system(name) == system]
            if not match or ref is None:
                row.append("not run")
                continue
            name, rs = match[0]
            cell = f"{100 * (_mean_accuracy(rs) - ref):+.2f}"
            worst = min(r["accuracy"] for r in rs)
            notes = ([f"{len(rs)} runs, lowest {100 * (worst - ref):+.2f}"] if len(rs) > 1 else []) + \
                re.findall(r"\((\w+ \d+):", name)
            row.append(cell + (f" ({', '.join(notes)})" if notes else ""))
        rows.append(row)
    return _right(rows)


def straggler():
    """bench/torch-fashion.sh with and without --straggler: blkps against
    DDP with one of the learners at half speed, and with none: final
    accuracy, training seconds to 85% held-out accuracy (the first
    evaluation at or above it), and in all (the one-process reference of
    the run without left out)."""
    rows = [["learners", "system", "straggler", "final accuracy", "training s to 85%", "training s", "samples/s"]]
    for name, straggler in (("straggler-4-quiet.json", "one at half speed"), ("no-straggler-4-quiet.json", "none")):
        with open(os.path.join(RESULTS, "torch-fashion-async", name), encoding="utf-8") as f:
            runs = json.load(f)
        for e in runs:
            if e["system"].startswith("one process"):
                continue
            r = e["result"]
            to85 = next((f"{t:.1f}" for t, _, acc, _ in r["curve"] if acc >= 0.85), "not reached")
            rows.append([str(e["learners"]), e["system"], straggler, f"{r['accuracy']:.4f}", to85,
                         f"{r['train_s']:.1f}", f"{r['samples_per_s']:,.0f}"])
    return _right(rows, left=3)


def checkpoint(prefix=""):
    """Checkpoint bench (bench/checkpoint.sh): before (main) and after the
    copy-on-write snapshots, side by side, per model size, from
    `{prefix}before.jsonl` and `{prefix}after.jsonl`."""
    def runs(name):
        lines = _read("checkpoint", prefix + name + ".jsonl").split("\n")
        return {r["params"]: r for r in (json.loads(line) for line in lines if line.strip())}
    before, after = runs("before"), runs("after")
    rows = [["model", "start (s)", "checkpoint (s)", "longest push wait during it (s)", "restart, cached (s)",
             "restart, from disk (s)"]]
    def pair(key, digits):
        return lambda b, a: f"{b[key]:.{digits}f} → {a[key]:.{digits}f}"
    cells = [pair("start_s", 1), pair("checkpoint_s", 1), pair("stall_s", 3), pair("restart_cached_s", 1),
             pair("restart_disk_s", 1)]
    for params in sorted(after):
        b, a = before.get(params), after[params]
        rows.append([f"{params * 4 / 1e9:g} GB ({params:.2g} params)"] +
                    [c(b, a) if b else "not measured → " + c(a, a).split(" → ")[1] for c in cells])
    return _render(rows)


def readme_performance():
    """README's "Performance": one line per data-path goal of the 2-core
    machine, each figure beside its ceiling or peer from the same run, from
    the committed quiet runs: bench/results/cluster-linkrate (the cluster),
    data-path-2core/server-cpu-quiet.json (the 16-bit wire, reads against
    `null`, CPU per GB) and checkpoint/quiet-*.jsonl."""
    import report  # bench/cluster/report.py
    with open(os.path.join(RESULTS, "cluster-linkrate", "cluster.json"), encoding="utf-8") as f:
        cluster = {r["system"]: r for r in report.measured(json.load(f)) if r["dtype"] == "float32"}
    mpi = cluster["mpi"]["ms_per_exchange"]
    with open(os.path.join(RESULTS, "data-path-2core", "server-cpu-quiet.json"), encoding="utf-8") as f:
        cpu = {(r["op"], r["store"], r["dtype"]): r for r in json.load(f)}
    def per_gb(op, store):
        r = cpu[(op, store, "float32")]
        return (r["learner_user_s_per_GB"] + r["learner_sys_s_per_GB"],
                r["tgtd_user_s_per_GB"] + r["tgtd_sys_s_per_GB"])
    def ckpt(name):
        lines = _read("checkpoint", name).split("\n")
        return max((json.loads(line) for line in lines if line.strip()), key=lambda r: r["params"])
    before, after = ckpt("quiet-before.jsonl"), ckpt("quiet-after.jsonl")
    rows = [["what", "measured", "against, in the same run", "goal"]]
    for system, label in (("blkps-async-exchange", "pipelined `exchange`, async"),
                          ("blkps-bsp-exchange", "pipelined `exchange`, bsp"),
                          ("blkps-async", "push, then pull, async")):
        r = cluster[system]
        share = report.phase_link_share(r)
        shares = (f"{100 * share[0]:.0f}% of the link each way" if share[0] == share[1]
                  else f"push {100 * share[0]:.0f}%, pull {100 * share[1]:.0f}% of the link")
        rows.append([f"model exchange, {r['params'] / 1e6:.0f}M float32, {r['hosts']} hosts, {r['link']} links: "
                     + label, f"{r['ms_per_exchange']:,.0f} ms; {shares}",
                     f"MPI_Allreduce {mpi:,.0f} ms: {r['ms_per_exchange'] / mpi:.2f}×", "≤ 1.0× MPI; ≥ 90% each way"])
    for dtype in ("bfloat16", "float16"):
        rows.append([f"{dtype} LUN, wall time of a push · a pull", f"{cpu[('push', 'blkps', dtype)]['wall_to_float32']:.2f}"
                     f" · {cpu[('pull', 'blkps', dtype)]['wall_to_float32']:.2f}", "a float32 LUN: 1", "≤ 0.6"])
    rows.append(["reads (pulls), 1 MiB × QD16", f"{cpu[('pull', 'blkps', 'float32')]['ratio_to_null']:.2f}",
                 "tgt's `null` store: 1", "≥ 0.95"])
    for op, verb in (("push", "pushed"), ("pull", "pulled")):
        mine, null = per_gb(op, "blkps"), per_gb(op, "null")
        rows.append([f"CPU per GB {verb}, learner · tgtd", f"{mine[0]:.2f} · {mine[1]:.2f} s",
                     f"`null` store: {null[0]:.2f} · {null[1]:.2f} s", "≤ 0.15 · 0.25 s"])
    gb = after["params"] * 4 / 1e9
    rows.append([f"{gb:g} GB model: longest push wait during a checkpoint", f"{after['stall_s']:.2f} s",
                 f"before copy-on-write: {before['stall_s']:.1f} s", "well under 1 s"])
    rows.append([f"{gb:g} GB model: start · restart from the file (cached)",
                 f"{after['start_s']:.1f} · {after['restart_cached_s']:.1f} s",
                 f"before: {before['start_s']:.1f} · {before['restart_cached_s']:.1f} s", "disk and memory speed"])
    return _render(rows)


def _embeddings(folder="embeddings"):
    with open(os.path.join(RESULTS, folder, "embeddings.json"), encoding="utf-8") as f:
        return json.load(f)


def _right(rows, left=1):
    """`rows` rendered with every column after the first `left` right-aligned."""
    table = _render(rows).split("\n")
    table[1] = "|" + "---|" * left + "---:|" * (len(rows[0]) - left)
    return "\n".join(table)


def _baseline(r):
    """What an embeddings run's rows are set against: "contiguous" (the same
    bytes as one range on the same LUN; runs through the row windows) or
    "null" (tgt's null store at the same per-row requests; runs before)."""
    return "contiguous" if "contiguous.pull" in r else "null"


def _one_baseline(runs):
    bases = {_baseline(r) for e in runs for r in e["widths"].values()}
    if len(bases) != 1:
        sys.exit("tables: embeddings runs measured against both null and contiguous; rerun the older ones "
                 "with bench/embeddings.sh")
    return bases.pop()


def _rate(r, op):
    """An embeddings run's rate for `op` with its ratio to its baseline's:
    distinct rows/s against contiguous, ids/s against null."""
    base = _baseline(r)
    i = 1 if base == "contiguous" else 0
    return f"{r['blkps.' + op][i]:,.0f} ({r['blkps.' + op][i] / r[base + '.' + op][i]:.2f})"


def _rate_headers(base):
    unit = "rows/s" if base == "contiguous" else "ids/s"
    return [f"pull {unit} (÷ {base})", f"push {unit} (÷ {base})"]


def embeddings_rows():
    """bench/embeddings.sh: rows pulled and pushed per row width, each with
    its ratio to its baseline in the same run (_baseline), and the local
    torch.nn.EmbeddingBag's step (doc/embeddings.md "Bench")."""
    e = _embeddings()
    rows = [["width", "row bytes", *_rate_headers(_one_baseline([e])), "local torch ids/s"]]
    for width, r in e["widths"].items():
        rows.append([width, str(4 * int(width)), _rate(r, "pull"), _rate(r, "push"),
                     f"{r['local_torch.step'][0]:,.0f}"])
    return _right(rows, 0)


def embeddings_hashed():
    """bench/embeddings.sh --hashed: a hashed table keyed by ids drawn from
    --rows possible ones, rows pulled and pushed per width against the
    same bytes contiguous on a dense model, in the same run, and the local
    table holding the rows the batches use (doc/embeddings.md "Bench")."""
    e = _embeddings("embeddings-hashed")
    rows = [["possible ids", "capacity", "width", *_rate_headers(_one_baseline([e])), "local torch ids/s", "load"]]
    for width, r in e["widths"].items():
        rows.append([f"{e['rows']:,}", f"{e['hashed']:,}", width, _rate(r, "pull"), _rate(r, "push"),
                     f"{r['local_torch.step'][0]:,.0f}", f"{e['load_average']:.1f}"])
    return _right(rows, 0)


def embeddings_sweep():
    """bench/embeddings.sh runs at other table and batch sizes
    (bench/results/embeddings-sweep/*/embeddings.json, one folder a run),
    each with its ratios to its baseline in the same run and its load
    average."""
    import glob
    runs = []
    for path in glob.glob(os.path.join(RESULTS, "embeddings-sweep", "*", "embeddings.json")):
        with open(path, encoding="utf-8") as f:
            runs.append(json.load(f))
    rows = [["rows", "batch (distinct)", "width", *_rate_headers(_one_baseline(runs)), "local torch ids/s", "load"]]
    for e in sorted(runs, key=lambda e: (e["rows"], e["batch"])):
        for width, r in e["widths"].items():
            rows.append([f"{e['rows']:,}", f"{e['batch']:,} ({round(e['distinct_per_batch']):,})", width,
                         _rate(r, "pull"), _rate(r, "push"), f"{r['local_torch.step'][0]:,.0f}",
                         f"{e['load_average']:.1f}"])
    return _right(rows, 0)


def embeddings_row_cost():
    """bench/embeddings.sh: per distinct row, iSCSI bytes through tgtd's
    sockets and tgtd's CPU, blkps beside its baseline (doc/embeddings.md
    "Per-row cost and a 1 TB table")."""
    e = _embeddings()
    base = _one_baseline([e])
    digits = 2 if base == "contiguous" else 0  # through the windows a row costs well under a µs
    rows = [["row bytes", "iSCSI bytes per pulled row", "per pushed row", f"tgtd CPU per pull ({base})",
             f"per push ({base})"]]
    for width, r in e["widths"].items():
        rows.append([str(4 * int(width)), f"{r['blkps.pull'][3]:,.0f}", f"{r['blkps.push'][3]:,.0f}",
                     f"{r['blkps.pull'][2]:.{digits}f} µs ({r[base + '.pull'][2]:.{digits}f})",
                     f"{r['blkps.push'][2]:.{digits}f} µs ({r[base + '.push'][2]:.{digits}f})"])
    return _right(rows, 0)


TCP_IP_BYTES = 66  # a TCP/IP segment's headers on Ethernet, each way of a row's round trip


def embeddings_1tb():
    """A 1 TB table of 512-byte rows (adagrad) on 16 servers, worked out from
    the measured tgtd CPU and iSCSI bytes of a 512-byte row (one tgtd per
    server, one core for row commands)."""
    r = _embeddings()["widths"]["128"]
    rows_total = 1e12 / 512
    servers = 16
    cpu_us = r["blkps.pull"][2] + r["blkps.push"][2]
    per_server = 1e6 / cpu_us
    wire = r["blkps.pull"][3] + r["blkps.push"][3] + 4 * TCP_IP_BYTES
    return _right([
        ["1 TB of 512-byte rows (128 float32), rule adagrad, 16 servers", "figure"],
        ["rows", f"{rows_total / 1e9:.2f}·10⁹"],
        ["memory per server (weights + adagrad state)", f"{2e12 / servers / 1e9:.0f} GB"],
        ["bitmap of rows made, per server", f"{rows_total / 8 / servers / 1e6:.0f} MB"],
        ["tgtd CPU per row pulled and pushed (measured with rule sgd)", f"{cpu_us:.2g} µs"],
        ["rows pulled and pushed per second, one server", f"{per_server:,.0f}"],
        [f"rows pulled and pushed per second, {servers} servers", f"{servers * per_server:,.0f}"],
        ["batches of 3,000 distinct rows per second, all learners", f"{servers * per_server / 3000:.0f}"],
        ["wire bytes per row round trip (iSCSI measured + TCP/IP)", f"{wire:,.0f}"],
        ["wire per server at that rate", f"{per_server * wire / 1e6:.0f} MB/s"],
        ["row round trips per second a 10 Gbit/s link carries", f"{1.25e9 / wire:,.0f}"],
    ])


def clicks():
    """bench/clicks.py: the click model by 2 learners through blkps and by one
    process with a local table (doc/embeddings.md "Click model")."""
    with open(os.path.join(RESULTS, "clicks", "clicks.json"), encoding="utf-8") as f:
        c = json.load(f)
    from clicks import from_new_table
    rows = [["run", "seconds per epoch (the first making the table)", "held-out AUC", "log-loss"]]
    mean = {}
    for key, name in (("local", "one process, local table"), ("blkps", f"{c['learners']} learners, blkps")):
        r = c[key]
        seconds = from_new_table(r)
        mean[key] = sum(seconds) / len(seconds)
        rows.append([name, f"{mean[key]:.2f}", f"{r['auc']:.4f}", f"{r['logloss']:.4f}"])
    rows.append(["blkps vs local", f"{mean['blkps'] / mean['local']:.2f}x", f"{100 * c['auc_relative']:+.2f}%",
                 f"{100 * c['logloss_relative']:+.2f}%"])
    return _right(rows)


def cluster_torch():
    """bench/cluster.sh's blkps.torch cases beside the whole-model exchange in
    one run (doc/gpu.md "blkps.torch's buckets on the netns cluster"): time
    a step, each direction's share of the link, CPU."""
    import report  # bench/cluster/report.py
    with open(os.path.join(RESULTS, "cluster-torch-buckets", "cluster.json"), encoding="utf-8") as f:
        records = report.measured(json.load(f))
    labels = {"blkps-async-exchange": "`Model.exchange`, the whole model",
              "blkps-async-torch": "blkps.torch, `pipeline=False`",
              "blkps-async-torch-pipelined": "blkps.torch, `pipeline=True`"}
    rows = [["learner", "ms a step", "share of the link", "CPU ms a step: learner · a host's tgtd"]]
    for r in records:
        share = report.phase_link_share(r)
        rows.append([labels[r["system"]], f"{r['ms_per_exchange']:,.0f}", f"{100 * share[0]:.1f}%",
                     f"{r['cpu_ms_per_exchange']:,.0f} · {r['tgtd_cpu_ms_per_exchange']:,.0f}"])
    return _right(rows)


def cluster_table():
    """bench/cluster.sh --table: a table larger than one server's memory=,
    over shards on the netns cluster's server hosts, pulled and pushed by
    learners on other hosts (doc/embeddings.md "Tables over shards")."""
    with open(os.path.join(RESULTS, "cluster-table", "table.json"), encoding="utf-8") as f:
        r = json.load(f)
    return _right([
        ["table over shards, netns cluster", "figure"],
        ["table", f"{r['rows']:,} rows × {r['width']} ({r['table_bytes'] / 2**20:.0f} MiB), rule sgd"],
        ["one server with memory=" + r["memory"], "refused"],
        [f"{r['servers']} shards (server hosts)", "; ".join(f"shard {k}: {t['rows']:,} rows, {t['rows_made']:,} made"
                                                           for k, t in enumerate(r["shard_tables"]))],
        [f"{r['learners']} learners (other hosts), links {r['link']}",
         f"{r['batches']} batches of {r['batch']:,} Zipf ids each"],
        ["pull, all learners", f"{r['pull_ids_per_s']:,.0f} ids/s ({r['pull_rows_per_s']:,.0f} rows/s)"],
        ["push, all learners", f"{r['push_ids_per_s']:,.0f} ids/s ({r['push_rows_per_s']:,.0f} rows/s)"],
        ["rows equal to the reference", f"{r['rows_checked']:,} touched, {r['untouched_checked']:,} untouched"],
    ])


def cluster_hashed_table():
    """bench/cluster.sh --table hash:CAPACITY:WIDTH: a hashed table split by
    id hash over the netns cluster's server hosts (serve --part K/S),
    pulled and pushed by learners on other hosts (doc/embeddings.md
    "Hashed ids over shards")."""
    with open(os.path.join(RESULTS, "cluster-hashed-table", "table.json"), encoding="utf-8") as f:
        r = json.load(f)
    return _right([
        ["hashed table over server hosts, netns cluster", "figure"],
        ["table", f"hash:{r['capacity']:,}:{r['width']} (ids: {r['ids']:,} possible, hashed), rule sgd"],
        [f"{r['servers']} parts (server hosts)", "; ".join(
            f"part {k}: {t['rows_made']:,} rows made of {t['row_limit']:,}, {t['memory_bytes'] / 2**20:.1f} MiB"
            for k, t in enumerate(r["parts"]))],
        [f"{r['learners']} learners (other hosts), links {r['link']}",
         f"{r['batches']} batches of {r['batch']:,} Zipf ids each"],
        ["pull, all learners", f"{r['pull_ids_per_s']:,.0f} ids/s ({r['pull_rows_per_s']:,.0f} rows/s)"],
        ["push, all learners", f"{r['push_ids_per_s']:,.0f} ids/s ({r['push_rows_per_s']:,.0f} rows/s)"],
        ["rows equal to the reference", f"{r['rows_checked']:,} touched, {r['untouched_checked']:,} untouched"],
    ])


def overlap():
    """bench/overlap.py's run: blkps.torch and DDP on models whose layers
    sleep for their compute, each step beside the step alone."""
    rows = [["model", "system", "wire", "learners", "step ms", "alone / step", "exchange alone ms",
             "rank 0 step wait ms", "rank 0 weights wait ms"]]
    for r in json.loads(_read("overlap-2core", "overlap.json")):
        t = r.get("rank0_ms_per_step", {})
        system = f"alone ({r['compute_ms']:.0f} ms asleep)" if r["system"] == "alone" else r["system"]
        rows.append([r["model"], system, r["wire_dtype"] or "–", str(r["learners"]), f"{r['step_ms']:.0f}",
                     f"{r['ratio']:.2f}", f"{r['exchange_ms']:.0f}" if "exchange_ms" in r else "–",
                     f"{t['step_wait']:.0f}" if t else "–", f"{t['weights_wait']:.0f}" if t else "–"])
    return _right(rows, left=3)


def gpu():
    """bench/gpu.sh on a GPU host: each model alone and through blkps.torch,
    with where rank 0's time goes."""
    rows = [["model", "wire", "learners", "step ms", "alone ms", "alone / step", "rank 0 copy out ms",
             "rank 0 exchange ms", "rank 0 step wait ms", "rank 0 transfers a step", "learners' CPU s",
             "tgtd CPU s"]]
    for r in json.loads(_read("h100-80gb-hbm3", "gpu.json")):
        t = r["rank0_ms_per_step"]
        calls = r.get("rank0_transfers", r.get("rank0_exchanges"))  # the counter's name before 2026-11-26
        counted = r.get("steps", 30) + r.get("warmup", 5)  # rank 0's counters include the warm-up (defaults)
        rows.append([r["model"], r["wire_dtype"], str(r["learners"]), f"{r['step_ms']:.1f}",
                     f"{r['standalone_step_ms']:.1f}", f"{r['ratio']:.2f}", f"{t['copy_out']:.1f}",
                     f"{t['exchange'] + t['push'] + t['pull']:.1f}", f"{t['step_wait']:.1f}",
                     f"{calls / counted:.1f}", f"{r['learner_cpu_s_per_step']:.2f}", f"{r['tgtd_cpu_s_per_step']:.2f}"])
    return _right(rows, left=2)


def gpu_readme():
    """README's GPU summary: one learner's step through each wire beside
    the step alone."""
    label = {"resnet50": "ResNet-50 (128, bf16 autocast, channels_last)",
             "gpt2": "GPT-2-shaped 124M transformer (16 × 1024 tokens, bf16 autocast)"}
    runs = [r for r in json.loads(_read("h100-80gb-hbm3", "gpu.json")) if r["learners"] == 1]
    rows = [["model (batch)", "alone", "float32 wire", "bfloat16 wire"]]
    for name in dict.fromkeys(r["model"] for r in runs):
        wire = {r["wire_dtype"]: r for r in runs if r["model"] == name}
        rows.append([label[name], f"{wire['float32']['standalone_step_ms']:.1f} ms"]
                    + [f"{wire[w]['step_ms']:.1f} ms: {wire[w]['ratio']:.2f}" for w in ("float32", "bfloat16")])
    return _right(rows)


def gpu_memory():
    """bench/gpu.sh's memory records (rank 0) on the GPU host."""
    rows = [["model", "wire", "learners", "GPU peak MB, through blkps", "GPU peak MB, alone",
             "blkps's GPU MB", "host staging MB (page-locked)"]]
    for r in json.loads(_read("h100-80gb-hbm3", "gpu.json")):
        m = r["rank0_memory"]
        rows.append([r["model"], r["wire_dtype"], str(r["learners"]), f"{m['gpu_peak_mb']:,.0f}",
                     f"{m['alone_gpu_peak_mb']:,.0f}", f"{m['blkps_gpu_mb']:.1f}", f"{m['host_staging_mb']:.1f}"])
    return _right(rows, left=2)


def gpu_pipeline_readme():
    """README's GPU summary on the H200 (bench/results/h200, the first run;
    two-learners, the second): one learner's share of the GPU's own step
    rate, async with the pipeline off and on and bsp, on each wire; two
    learners sharing the GPU, pipelined."""
    label = {"resnet50": "ResNet-50 (128)", "gpt2": "GPT-2 124M (16 × 1024)"}
    runs = [r for f in (("h200", "gpu.json"), ("h200", "two-learners", "gpu.json"))
            for r in json.loads(_read(*f)) if "ratio" in r]
    rows = [["model (batch)", "wire", "alone", "async", "async, pipelined", "bsp", "2 learners, pipelined"]]
    for name in dict.fromkeys(r["model"] for r in runs):
        for wire in ("float32", "bfloat16"):
            def ratio(mode, pipeline, learners=1):
                hit = [r for r in runs if (r["model"], r["wire_dtype"], r["mode"], r["learners"]) ==
                       (name, wire, mode, learners) and (mode == "bsp" or r["pipeline"] == pipeline)]
                return f"{hit[0]['ratio']:.2f}" if hit else "–"
            alone = next(r["standalone_step_ms"] for r in runs if r["model"] == name)
            rows.append([label[name], wire, f"{alone:.1f} ms", ratio("async", False), ratio("async", True),
                         ratio("bsp", False), ratio("async", True, 2)])
    return _right(rows, left=2)


TABLES = {
    "cluster-headline": (cluster_headline, "bench/results/cluster"),
    "f32-vs-ddp": (f32_vs_ddp, "bench/results/cluster-f32-vs-ddp"),
    "cluster-linkrate": (cluster_linkrate, "bench/results/cluster-linkrate"),
    "one-host-ratios": (one_host_ratios, "bench/results/report.md"),
    "null-ratio": (null_ratio, "bench/results/report.md"),
    "fio": (fio_subset, "bench/results/report.md"),
    "soak": (soak, "bench/results/soak/soak.md"),
    "failover-soak": (failover_soak, "bench/results/failover-soak/failover-soak.md"),
    "failover-soak-rounds": (lambda: failover_soak("failover-soak-rounds"),
                             "bench/results/failover-soak-rounds/failover-soak.md"),
    "failover-soak-hosts": (lambda: failover_soak("failover-soak-hosts"),
                            "bench/results/failover-soak-hosts/failover-soak.md"),
    "failover-soak-hosts-restart": (lambda: failover_soak("failover-soak-hosts-restart"),
                                    "bench/results/failover-soak-hosts-restart/failover-soak.md"),
    "replica-cost": (replica_cost, "bench/results/replica-cost/replica-cost.md"),
    "replica-cost-hosts": (lambda: replica_cost("replica-cost-hosts"),
                           "bench/results/replica-cost-hosts/replica-cost.md"),
    "replica-cost-back-network": (lambda: replica_cost("replica-cost-back-network"),
                                  "bench/results/replica-cost-back-network/replica-cost.md"),
    "catch-up": (catch_up, "bench/results/catch-up/catch-up.md"),
    "catch-up-hosts": (lambda: catch_up("catch-up-hosts"), "bench/results/catch-up-hosts/catch-up.md"),
    "async-2epochs": (async_two_epochs, "bench/results/torch-fashion-async/2epochs"),
    "async-summary": (async_summary, "bench/results/torch-fashion-async/2epochs"),
    "straggler": (straggler, "bench/results/torch-fashion-async/straggler-4-quiet.json, no-straggler-4-quiet.json"),
    "checkpoint": (checkpoint, "bench/results/checkpoint"),
    "checkpoint-quiet": (lambda: checkpoint("quiet-"), "bench/results/checkpoint"),
    "readme-performance": (readme_performance, "bench/results (cluster-linkrate, data-path-2core, checkpoint)"),
    "embeddings-rows": (embeddings_rows, "bench/results/embeddings"),
    "embeddings-sweep": (embeddings_sweep, "bench/results/embeddings-sweep"),
    "embeddings-hashed": (embeddings_hashed, "bench/results/embeddings-hashed"),
    "embeddings-row-cost": (embeddings_row_cost, "bench/results/embeddings"),
    "embeddings-1tb": (embeddings_1tb, "bench/results/embeddings"),
    "clicks": (clicks, "bench/results/clicks"),
    "cluster-table": (cluster_table, "bench/results/cluster-table"),
    "cluster-torch": (cluster_torch, "bench/results/cluster-torch-buckets"),
    "cluster-hashed-table": (cluster_hashed_table, "bench/results/cluster-hashed-table"),
    "overlap": (overlap, "bench/results/overlap-2core"),
    "gpu": (gpu, "bench/results/h100-80gb-hbm3"),
    "gpu-readme": (gpu_readme, "bench/results/h100-80gb-hbm3"),
    "gpu-memory": (gpu_memory, "bench/results/h100-80gb-hbm3"),
    "gpu-pipeline-readme": (gpu_pipeline_readme, "bench/results/h200 (and two-learners)"),
}

BEGIN = re.compile(r"^<!-- table ([\w-]+): .*-->$")


def regenerate(doc, name_of_doc="doc"):
    """`doc` with every marked table made again. Raises ValueError on a
    marker without its end, or a name this script does not know."""
    lines, out, i = doc.split("\n"), [], 0
    while i < len(lines):
        m = BEGIN.match(lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        name = m.group(1)
        if name not in TABLES:
            raise ValueError(f"{name_of_doc} line {i + 1}: unknown table '{name}'; known: {', '.join(TABLES)}")
        end = f"<!-- end table {name} -->"
        try:
            j = lines.index(end, i + 1)
        except ValueError:
            raise ValueError(f"{name_of_doc} line {i + 1}: table '{name}' has no '{end}' line") from None
        make, source = TABLES[name]
        out += [f"<!-- table {name}: made by bench/tables.py from {source}; do not edit -->",
                make().rstrip("\n"), end]
        i = j + 1
    return "\n".join(out)


def docs():
    """README.md and doc/*.md: every doc that may hold a marked table."""
    import glob
    return [os.path.join(TOP, "README.md")] + sorted(glob.glob(os.path.join(TOP, "doc", "*.md")))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="change nothing; exit 1 if a doc's tables differ from bench/results")
    ap.add_argument("--doc", action="append",
                    help="a doc to rewrite (repeatable; default: README.md and every doc/*.md)")
    args = ap.parse_args()
    stale = []
    for path in args.doc or docs():
        rel = os.path.relpath(path, TOP)
        with open(path, encoding="utf-8") as f:
            doc = f.read()
        try:
            new = regenerate(doc, rel)
        except ValueError as e:
            sys.exit(f"tables: {e}")
        if new == doc:
            continue
        if args.check:
            old_regions = {m.group(1) for m in map(BEGIN.match, doc.split("\n")) if m}
            names = [n for n in sorted(old_regions) if _region(doc, n) != _region(new, n)]
            stale.append(f"{rel}: table(s) {', '.join(names) or '?'}")
            continue
        with open(path, "w", encoding="utf-8") as f:
            f.write(new)
        print(f"tables: rewrote {rel}")
    if stale:
        sys.exit(f"tables: {'; '.join(stale)} differ from bench/results; run bench/tables.py and commit the docs")


def _region(doc, name):
    lines = doc.split("\n")
    start = next(i for i, l in enumerate(lines) if l.startswith(f"<!-- table {name}:"))
    return lines[start:lines.index(f"<!-- end table {name} -->", start)]


if __name__ == "__main__":
    main()
