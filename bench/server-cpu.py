#!/usr/bin/python3
"""The server's own work per byte: tgtd's CPU time (user and system, from
/proc/PID/stat) per GB pushed and per GB pulled, for a blkps model LUN and
for tgt's "null" store in the same tgtd (same transport and request stream;
null moves the bytes and does nothing with them), through libblkps over
iSCSI on loopback (bench/blkps-iobench, 1 MiB x QD16 by default).

    sudo bench/server-cpu.py [--bs 1M] [--qd 16] [--seconds 3] [--rounds 3]
                             [--bsopts OPTS] [--ops write,read] [--plugin SO]
                             [--json FILE]

Rounds interleave the stores so that machine noise hits both; figures are
medians over rounds. Prints, per op and store: MB/s, tgtd user and system
CPU ms per GB (GB = 1e9 bytes), and the blkps/null throughput ratio. The
plugin's own cost per GB is blkps minus null. Needs a build
(scripts/build.sh). The machine's other load adds noise: compare figures
of one run.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLKPS = os.path.join(TOP, "scripts", "blkps")
IOBENCH = os.path.join(TOP, "build", "cmake", "bench", "blkps-iobench")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """tgtd's (user, system) CPU seconds so far, all threads."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLOCK_TICKS, int(fields[12]) / CLOCK_TICKS  # utime, stime


def run_once(pid, url, op, a):
    """One iobench run; returns (MB/s, user ms/GB, system ms/GB)."""
    before = cpu_seconds(pid)
    run = subprocess.run([IOBENCH, "--target", url, "--op", op, "--bs", a.bs, "--qd", str(a.qd),
                          "--span", "32M", "--seconds", str(a.seconds)], capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"server-cpu: {run.stderr.strip() or 'blkps-iobench failed'}")
    out = run.stdout
    after = cpu_seconds(pid)
    fields = dict(item.split("=", 1) for item in out.split())
    gb = int(fields["bytes"]) / 1e9
    return (float(fields["MBps"]), (after[0] - before[0]) * 1000 / gb, (after[1] - before[1]) * 1000 / gb)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bs", default="1M")
    p.add_argument("--qd", type=int, default=16)
    p.add_argument("--seconds", type=float, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--bsopts", default="params=16777216;lr=1e-9")
    p.add_argument("--plugin", help="bs_blkps.so to preload (default: the build tree's)")
    p.add_argument("--ops", default="write,read", help="which of write (push) and read (pull); default both")
    p.add_argument("--json", help="also write the results here")
    a = p.parse_args()
    ops = a.ops.split(",")
    if not ops or any(op not in ("write", "read") for op in ops):
        sys.exit(f"server-cpu: --ops: expected write, read or write,read, got '{a.ops}'")
    if not os.access(IOBENCH, os.X_OK):
        sys.exit(f"server-cpu: {IOBENCH} not built: run scripts/build.sh")
    state = tempfile.mkdtemp(prefix="blkps-cpu-")
    try:
        subprocess.run([BLKPS, "target", "start", "--dir", state, "--null-lun", "--bsopts", a.bsopts,
                        "--owner-pid", str(os.getpid())] + (["--plugin", a.plugin] if a.plugin else []),
                       check=True, stdout=subprocess.DEVNULL)
        url, null_url, pid = subprocess.run(
            [BLKPS, "target", "show", "--dir", state, "--get", "URL", "--get", "NULL_URL", "--get", "PID"],
            check=True, capture_output=True, text=True).stdout.split()
        runs = {}
        for r in range(1, a.rounds + 1):
            for op in ops:
                for store, target in (("blkps", url), ("null", null_url)):
                    m = run_once(pid, target, op, a)
                    print(f"round {r}/{a.rounds}: {store} {op} {m[0]:.0f} MB/s, tgtd user {m[1]:.0f} "
                          f"sys {m[2]:.0f} ms/GB", file=sys.stderr)
                    runs.setdefault((op, store), []).append(m)
    finally:
        subprocess.run([BLKPS, "target", "stop", "--dir", state], stderr=subprocess.DEVNULL)
        subprocess.run(["rm", "-rf", state])

    records = []
    print(f"{'op':6} {'store':6} {'MB/s':>7} {'user ms/GB':>11} {'sys ms/GB':>10} {'ratio':>6}")
    for op in ops:
        med = {store: [statistics.median(m[i] for m in runs[(op, store)]) for i in range(3)]
               for store in ("blkps", "null")}
        ratio = med["blkps"][0] / med["null"][0]
        for store in ("blkps", "null"):
            mbps, user, system = med[store]
            print(f"{op:6} {store:6} {mbps:7.0f} {user:11.0f} {system:10.0f} "
                  f"{ratio if store == 'blkps' else 1:6.2f}")
            records.append({"op": "push" if op == "write" else "pull", "store": store, "bs": a.bs, "qd": a.qd,
                            "MBps": mbps, "tgtd_user_ms_per_GB": user, "tgtd_sys_ms_per_GB": system,
                            "ratio_to_null": ratio if store == "blkps" else 1.0})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
