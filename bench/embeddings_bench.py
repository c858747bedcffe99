#!/usr/bin/python3
"""bench/embeddings.sh's body: see that script for what it measures.

For each row width: one target serving a table (rule sgd) and tgt's null
store; the same batches of ids go to both with pull_rows and push_rows (so
the same requests at the same queue depth), batch by batch in turn (a batch
to the table and the same batch to null, who goes first alternating) so
that machine noise hits both alike; each call is timed, and tgtd's CPU and socket bytes read around it,
on its own. Every row of the batches is pushed once before the rounds (a
row's first push makes it: its initial values and memory, a one-off).
Then a local torch.nn.EmbeddingBag (sum, sparse gradients, SGD) takes the
same batches: forward, backward and step. Figures are medians over rounds,
in ids per second (a batch's ids, repeats included) and distinct rows per
second.
"""
import argparse
import json
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
    p.add_argument("--out", default=os.path.join(top, "bench", "results", "embeddings"))
    p.add_argument("--build", default=os.path.join(top, "build", "cmake"))
    return p.parse_args()


def batches(rows, batch, count, seed=1):
    rng = np.random.default_rng(seed)
    return [((rng.zipf(1.05, batch) - 1) % rows).astype(np.uint64) for _ in range(count)]


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


def rates_side_by_side(fns, ids_list, seconds, server_pid):
    """Runs each of fns (name -> fn(ids)) on the same batch in turn, batch
    after batch (who goes first alternating), for about `seconds` in all;
    returns, per name, (ids/s,
    distinct rows/s, server CPU microseconds per row, server socket bytes
    per row) over its own calls."""
    done = {name: [0, 0, 0.0, 0.0, 0] for name in fns}  # ids, rows, seconds, cpu s, bytes
    k = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        ids = ids_list[k % len(ids_list)]
        rows = len(np.unique(ids))
        k += 1
        order = list(fns.items())
        for name, fn in order if k % 2 else order[::-1]:
            before = server_counters(server_pid)
            t0 = time.perf_counter()
            fn(ids)
            took = time.perf_counter() - t0
            after = server_counters(server_pid)
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


def served(a, width, ids_list):
    import blkps
    state = tempfile.mkdtemp(prefix="blkps-emb-bench-")
    started = subprocess.run([BLKPS, "target", "start", "--dir", state, "--null-lun", "--owner-pid",
                              str(os.getpid()), "--plugin", os.path.join(a.build, "target-plugin", "bs_blkps.so"),
                              "--bsopts", f"table={a.rows}:{width};rule=sgd;lr=1e-6;init=normal:0.01"],
                             stdout=subprocess.DEVNULL)
    if started.returncode != 0:
        subprocess.run(["rm", "-rf", state])
        sys.exit(f"embeddings: the target for width {width} did not start (its error is above)")
    try:
        env = json.loads(subprocess.run([BLKPS, "target", "show", "--dir", state, "--json"], check=True,
                                        capture_output=True, text=True).stdout)
        with open(os.path.join(state, "tgtd.pid")) as f:
            pid = int(f.read())
        grads = np.full((a.batch, width), 1e-3, dtype=np.float32)
        runs = {}
        with blkps.Model(env["URL"], queue_depth=a.qd) as table, \
                blkps.Model(env["NULL_URL"], queue_depth=a.qd) as null:
            for ids in ids_list:  # every row made
                table.push_rows(ids, grads[:len(ids)])
            for r in range(a.rounds):
                for op in ("pull", "push"):
                    if op == "pull":
                        fns = {store: lambda ids, m=m: m.pull_rows(ids, width)  # noqa: E731
                               for store, m in (("blkps", table), ("null", null))}
                    else:
                        fns = {store: lambda ids, m=m: m.push_rows(ids, grads[:len(ids)])  # noqa: E731
                               for store, m in (("blkps", table), ("null", null))}
                    got = rates_side_by_side(fns, ids_list, 2 * a.seconds, pid)
                    for store, g in got.items():
                        runs.setdefault((store, op), []).append(g)
                    print(f"width {width} round {r + 1}/{a.rounds}: {op} blkps {got['blkps'][0]:,.0f} ids/s, "
                          f"null {got['null'][0]:,.0f} ({got['blkps'][0] / got['null'][0]:.2f})", file=sys.stderr)
        # ids/s, rows/s, server CPU µs per row, server socket bytes per row
        return {f"{store}.{op}": [statistics.median(v[i] for v in got) for i in range(4)]
                for (store, op), got in runs.items()}
    finally:
        subprocess.run([BLKPS, "target", "stop", "--dir", state], stdout=subprocess.DEVNULL)
        subprocess.run(["rm", "-rf", state])


def local_torch(a, width, ids_list):
    import torch
    torch.set_num_threads(1)
    emb = torch.nn.EmbeddingBag(a.rows, width, mode="sum", sparse=True)
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
    os.makedirs(a.out, exist_ok=True)
    widths = [int(w) for w in a.widths.split(",")]
    ids_list = batches(a.rows, a.batch, 16)
    distinct = statistics.mean(len(np.unique(ids)) for ids in ids_list)
    results = {"rows": a.rows, "batch": a.batch, "distinct_per_batch": distinct, "qd": a.qd,
               "seconds": a.seconds, "rounds": a.rounds, "widths": {}}
    for width in widths:
        r = served(a, width, ids_list)
        r["local_torch.step"] = local_torch(a, width, ids_list)
        results["widths"][width] = r
    results["load_average"] = os.getloadavg()[0]
    with open(os.path.join(a.out, "embeddings.json"), "w") as f:
        json.dump(results, f, indent=2)
    lines = ["# Embedding rows through blkps vs tgt null vs local torch",
             "",
             f"{a.rows:,} rows, batches of {a.batch} Zipf(1.05) ids ({distinct:.0f} distinct on average), "
             f"queue depth {a.qd}, median of {a.rounds} rounds (each op: {2 * a.seconds:g} s of batches, each "
             f"sent to blkps and to null in turn, each call timed on its own; rows made before); ids/s (a batch's ids, "
             f"repeats included). Load average {os.getloadavg()[0]:.1f} at the end. Command: `sudo bench/embeddings.sh "
             f"--rows {a.rows} --batch {a.batch} --qd {a.qd} --widths {a.widths}`.",
             "",
             "| width | row bytes | pull ids/s | null pull | ratio | push ids/s | null push | ratio | local torch step ids/s |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for width, r in results["widths"].items():
        pull, npull = r["blkps.pull"][0], r["null.pull"][0]
        push, npush = r["blkps.push"][0], r["null.push"][0]
        lines.append(f"| {width} | {4 * width} | {pull:,.0f} | {npull:,.0f} | {pull / npull:.2f} | {push:,.0f} | "
                     f"{npush:,.0f} | {push / npush:.2f} | {r['local_torch.step'][0]:,.0f} |")
    lines += ["", "Per distinct row, the target's tgtd (blkps and null LUNs in one tgtd, measured over the same "
              "rounds): CPU microseconds (/proc/PID/stat) and iSCSI bytes through its sockets, both directions "
              "(/proc/PID/io rchar + wchar; TCP/IP headers not included).", "",
              "| width | row bytes | blkps pull µs | null pull µs | blkps push µs | null push µs | "
              "pull bytes | push bytes |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for width, r in results["widths"].items():
        lines.append(f"| {width} | {4 * width} | {r['blkps.pull'][2]:.1f} | {r['null.pull'][2]:.1f} | "
                     f"{r['blkps.push'][2]:.1f} | {r['null.push'][2]:.1f} | {r['blkps.pull'][3]:,.0f} | "
                     f"{r['blkps.push'][3]:,.0f} |")
    with open(os.path.join(a.out, "embeddings.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


main()
