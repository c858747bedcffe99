#!/usr/bin/python3
"""bench/embeddings.sh's body: see that script for what it measures.

For each row width: one target serving a table (rule sgd). Batches of
Zipf(1.05) ids, scattered over the table by a fixed permutation (--permute,
the default: without it the hot ids are rows 0, 1, 2, ..., side by side in
one model block), go two ways to the same LUN, batch by batch in turn (who
goes first alternating) so that machine noise hits both alike:
  - rows: pull_rows and push_rows of the batch (through the server's row
    windows; a batch's distinct rows are moved once);
  - contiguous: the same bytes as one range, pull_into and push of
    distinct x width floats from parameter 0 (the rate the issue's bar is
    set against); with --hashed, of a dense model on a second target.
Each call is timed, and tgtd's CPU and socket bytes read around it, on its
own. Every row of the batches and of the contiguous range is pushed once
before the rounds (a row's first push makes it: its initial values and
memory, a one-off; a row not made reads as its initial values, computed
on each read). Then a local torch.nn.EmbeddingBag (sum, sparse
gradients, SGD) takes the same batches: forward, backward and step.
Figures are medians over rounds, in ids per second (a batch's ids, repeats
included) and distinct rows per second; the rows side's ratio to
contiguous is of distinct rows per second.
"""
import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

top = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLKPS = os.path.join(top, "scripts", "blkps")


def parse():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--qd", type=int, default=16)
    p.add_argument("--widths", default="32,128,512")
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--permute", action=argparse.BooleanOptionalAction, default=True,
                   help="scatter the ids over the table by a fixed permutation (default: on)")
    p.add_argument("--hashed", type=int, default=0, metavar="CAPACITY",
                   help="serve a hashed table of CAPACITY rows (table=hash:CAPACITY:WIDTH) keyed by ids in "
                        "[0, --rows), instead of a dense table of --rows rows; the contiguous side then runs on "
                        "a dense model of its own on a second target (a hashed table is reached through the row "
                        "windows only)")
    p.add_argument("--out", default=os.path.join(top, "bench", "results", "embeddings"))
    p.add_argument("--build", default=os.path.join(top, "build", "cmake"))
    return p.parse_args()


def scatter(ids, rows):
    """ids mapped by a fixed permutation of [0, rows): id -> (a * id + b) mod
    rows, a coprime to rows (a bijection), a near rows times the golden
    ratio's fraction, so that neighbouring ids land far apart."""
    a = int(rows * 0.6180339887) | 1
    while math.gcd(a, rows) != 1:
        a += 2
    b = rows // 3
    return ((ids.astype(object) * a + b) % rows).astype(np.uint64)


def batches(rows, batch, count, permute, seed=1):
    rng = np.random.default_rng(seed)
    out = [((rng.zipf(1.05, batch) - 1) % rows).astype(np.uint64) for _ in range(count)]
    return [scatter(ids, rows) for ids in out] if permute else out


def rate(fn, ids_list, seconds):
    """Runs fn(ids) over the batches, round robin, for about `seconds`;
    returns (ids/s, distinct rows/s)."""
    ids_done = rows_done = 0
    k = 0
    start = time.perf_counter()
    while True:
        ids = ids_list[k % len(ids_list)]
        fn(ids)
        ids_done += len(ids)
        rows_done += len(np.unique(ids))
        k += 1
        took = time.perf_counter() - start
        if took >= seconds:
            return ids_done / took, rows_done / took


def rates_side_by_side(fns, ids_list, seconds, server_pids):
    """Runs each of fns (name -> fn(ids)) on the same batch in turn, batch
    after batch (who goes first alternating), for about `seconds` in all;
    returns, per name, (ids/s,
    distinct rows/s, server CPU microseconds per row, server socket bytes
    per row) over its own calls, the server being its tgtd
    (server_pids[name])."""
    done = {name: [0, 0, 0.0, 0.0, 0] for name in fns}  # ids, rows, seconds, cpu s, bytes
    k = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        ids = ids_list[k % len(ids_list)]
        rows = len(np.unique(ids))
        k += 1
        order = list(fns.items())
        for name, fn in order if k % 2 else order[::-1]:
            before = server_counters(server_pids[name])
            t0 = time.perf_counter()
            fn(ids)
            took = time.perf_counter() - t0
            after = server_counters(server_pids[name])
            d = done[name]
            d[0] += len(ids)
            d[1] += rows
            d[2] += took
            d[3] += after[0] - before[0]
            d[4] += after[1] - before[1]
    return {name: (d[0] / d[2], d[1] / d[2], 1e6 * d[3] / d[1], d[4] / d[1]) for name, d in done.items()}


def server_counters(pid):
    """(CPU seconds, bytes read + written through read/write calls: its
    iSCSI traffic) of process `pid` so far, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    io = {}
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            key, value = line.split(":")
            io[key] = int(value)
    return cpu, io["rchar"] + io["wchar"]


def start_target(a, bsopts, what):
    """A private target serving `bsopts` (torch_fashion_job.start_server,
    the one Python starter): (its folder, `target show`'s environment, its
    tgtd's pid). Exits with one line if it did not start."""
    import torch_fashion_job as job
    state = tempfile.mkdtemp(prefix="blkps-emb-bench-")
    try:
        env = job.start_server(state, bsopts, 1, a.build)
    except subprocess.CalledProcessError:
        job.stop_server(state)
        sys.exit(f"embeddings: the target for {what} did not start (its error is above)")
    return state, env, int(env["PID"])


def served(a, width, ids_list):
    import blkps
    rule = "rule=sgd;lr=1e-6;init=normal:0.01"
    # Per batch, the floats pull_rows and push_rows move (its distinct
    # rows'), worked out before the clock runs.
    floats = {id(ids): len(np.unique(ids)) * width for ids in ids_list}
    table = f"hash:{a.hashed}:{width}" if a.hashed else f"{a.rows}:{width}"
    states = []
    try:
        states.append(start_target(a, f"table={table};{rule}", f"width {width}"))
        if a.hashed:  # the contiguous side's dense model, on a target of its own
            states.append(start_target(a, f"params={max(floats.values())};{rule}", f"width {width}, contiguous"))
        (_, env, pid), (_, dense_env, dense_pid) = states[0], states[-1]
        grads = np.full((a.batch, width), 1e-3, dtype=np.float32)
        pulled = np.empty((a.batch, width), dtype=np.float32)  # every batch has a.batch ids
        flat_grads, flat_pulled = grads.reshape(-1), pulled.reshape(-1)
        runs = {}
        with contextlib.ExitStack() as models:
            rows = models.enter_context(blkps.Model(env["URL"], queue_depth=a.qd))
            dense = models.enter_context(blkps.Model(dense_env["URL"], queue_depth=a.qd)) if a.hashed else rows
            for ids in ids_list:  # every row made, the batches' and the contiguous range's
                rows.push_rows(ids, grads[:len(ids)])
            dense.push(0, flat_grads[:max(floats.values())])
            sides = {
                "pull": {"blkps": lambda ids: rows.pull_rows(ids, width, pulled),
                         "contiguous": lambda ids: dense.pull_into(0, flat_pulled[:floats[id(ids)]])},
                "push": {"blkps": lambda ids: rows.push_rows(ids, grads),
                         "contiguous": lambda ids: dense.push(0, flat_grads[:floats[id(ids)]])},
            }
            for r in range(a.rounds):
                for op, fns in sides.items():
                    got = rates_side_by_side(fns, ids_list, 2 * a.seconds, {"blkps": pid, "contiguous": dense_pid})
                    for side, g in got.items():
                        runs.setdefault((side, op), []).append(g)
                    print(f"width {width} round {r + 1}/{a.rounds}: {op} rows {got['blkps'][1]:,.0f} rows/s "
                          f"({got['blkps'][2]:.2f} µs tgtd CPU a row), contiguous {got['contiguous'][1]:,.0f} "
                          f"({got['blkps'][1] / got['contiguous'][1]:.2f})", file=sys.stderr)
        # ids/s, rows/s, server CPU µs per row, server socket bytes per row
        return {f"{side}.{op}": [statistics.median(v[i] for v in got) for i in range(4)]
                for (side, op), got in runs.items()}
    finally:
        import torch_fashion_job as job
        for state, _, _ in states:
            job.stop_server(state)


def local_torch(a, width, ids_list):
    """The same batches through a local EmbeddingBag: of --rows rows, or
    with --hashed of the rows the batches use (ids renumbered before the
    clock runs), as a hashed table holds only the rows made."""
    import torch
    torch.set_num_threads(1)
    rows = a.rows
    if a.hashed:
        used, renumbered = np.unique(np.concatenate(ids_list), return_inverse=True)
        ids_list = np.split(renumbered.astype(np.uint64), np.cumsum([len(ids) for ids in ids_list])[:-1])
        rows = len(used)
    emb = torch.nn.EmbeddingBag(rows, width, mode="sum", sparse=True)
    opt = torch.optim.SGD(emb.parameters(), lr=1e-6)

    def step(ids):
        t = torch.from_numpy(ids.astype(np.int64))
        opt.zero_grad()
        emb(t, torch.arange(len(t))).sum().backward()
        opt.step()
    return list(map(statistics.median, zip(*[rate(step, ids_list, a.seconds) for _ in range(a.rounds)])))


def main():
    a = parse()
    os.environ.setdefault("BLKPS_LIB", os.path.join(a.build, "learner", "libblkps.so"))
    sys.path.insert(0, os.path.join(top, "learner", "python"))
    sys.path.insert(0, os.path.join(top, "learner", "examples"))
    os.makedirs(a.out, exist_ok=True)
    widths = [int(w) for w in a.widths.split(",")]
    ids_list = batches(a.rows, a.batch, 16, a.permute)
    distinct = statistics.mean(len(np.unique(ids)) for ids in ids_list)
    results = {"rows": a.rows, "batch": a.batch, "distinct_per_batch": distinct, "qd": a.qd,
               "seconds": a.seconds, "rounds": a.rounds, "permute": a.permute, "hashed": a.hashed, "widths": {}}
    for width in widths:
        r = served(a, width, ids_list)
        r["local_torch.step"] = local_torch(a, width, ids_list)
        results["widths"][width] = r
    results["load_average"] = os.getloadavg()[0]
    with open(os.path.join(a.out, "embeddings.json"), "w") as f:
        json.dump(results, f, indent=2)
    scattered = "scattered by a fixed permutation" if a.permute else "not permuted (hot ids side by side)"
    table = (f"ids in [0, {a.rows:,}) keyed into a hashed table of {a.hashed:,} rows (table=hash:{a.hashed}:WIDTH; "
             f"the contiguous side on a dense model of a second target; local torch: a table of the rows the "
             f"batches use)" if a.hashed else f"{a.rows:,} rows")
    lines = ["# Embedding rows through blkps's row windows vs the same bytes contiguous vs local torch",
             "",
             f"{table}, batches of {a.batch} Zipf(1.05) ids ({distinct:.0f} distinct on average), "
             f"{scattered}, queue depth {a.qd}, median of {a.rounds} rounds (each op: {2 * a.seconds:g} s of "
             f"batches, each sent as rows and as contiguous bytes in turn, each call timed on its own; rows made "
             f"before). Rows: pull_rows/push_rows, distinct rows/s; contiguous: the same bytes (distinct x width "
             f"floats) as one range on {'the second target' if a.hashed else 'the same LUN'}, in rows/s; ratio: rows ÷ "
             f"contiguous. Load average "
             f"{os.getloadavg()[0]:.1f} at the end. Command: `sudo bench/embeddings.sh --rows {a.rows} "
             f"--batch {a.batch} --qd {a.qd} --widths {a.widths}{'' if a.permute else ' --no-permute'}"
             f"{f' --hashed {a.hashed}' if a.hashed else ''}`.",
             "",
             "| width | row bytes | pull rows/s | contiguous | ratio | push rows/s | contiguous | ratio | "
             "local torch step ids/s |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for width, r in results["widths"].items():
        pull, cpull = r["blkps.pull"][1], r["contiguous.pull"][1]
        push, cpush = r["blkps.push"][1], r["contiguous.push"][1]
        lines.append(f"| {width} | {4 * width} | {pull:,.0f} | {cpull:,.0f} | {pull / cpull:.2f} | {push:,.0f} | "
                     f"{cpush:,.0f} | {push / cpush:.2f} | {r['local_torch.step'][0]:,.0f} |")
    lines += ["", "Per distinct row, the target's tgtd (over the same rounds): CPU microseconds (/proc/PID/stat) "
              "and iSCSI bytes through its sockets, both directions (/proc/PID/io rchar + wchar; TCP/IP headers "
              "not included), rows beside contiguous.", "",
              "| width | row bytes | pull µs | contiguous pull µs | push µs | contiguous push µs | "
              "pull bytes | push bytes |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for width, r in results["widths"].items():
        lines.append(f"| {width} | {4 * width} | {r['blkps.pull'][2]:.2f} | {r['contiguous.pull'][2]:.2f} | "
                     f"{r['blkps.push'][2]:.2f} | {r['contiguous.push'][2]:.2f} | {r['blkps.pull'][3]:,.0f} | "
                     f"{r['blkps.push'][3]:,.0f} |")
    with open(os.path.join(a.out, "embeddings.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


main()
