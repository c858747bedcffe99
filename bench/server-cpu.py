#!/usr/bin/python3
"""CPU per byte on both ends of one host's data path: for tgt's "null" store
and for blkps model LUNs of each --dtypes (one model; a 16-bit LUN converts
on both ends), push and pull rates through libblkps over iSCSI on loopback
(bench/blkps-iobench --op push|pull, 1 MiB x QD16 by default), with the CPU
seconds per GB of the learner (blkps-iobench's own getrusage) and of tgtd
(user and system, all threads, from /proc/PID/stat) beside them.

    sudo bench/server-cpu.py [--bs 1M] [--qd 16] [--seconds 3] [--rounds 3]
                             [--bsopts OPTS] [--dtypes float32,bfloat16]
                             [--ops write,read] [--plugin SO] [--iobench PROG] [--json FILE]

GB are float32 GB (1e9 bytes of float32 parameters, 4 per parameter)
whatever a LUN carries, so a bfloat16 row's rate and CPU compare with the
float32 row's for the same model; `wall` is a store's time per pass over
float32's (the 16-bit wire's goal: at most 0.6). Rounds interleave the
stores so that the machine's other load hits all of them; figures are
medians over rounds. The plugin's own tgtd cost per GB is a blkps row minus
the null row. Needs a build (scripts/build.sh). The machine's other load
adds noise: compare figures of one run, and say the load (printed).
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
DTYPES = ("float32", "bfloat16", "float16")
FIRST_EXTRA_LUN = 100  # the 16-bit LUNs this bench adds, past blkps target's own


def cpu_seconds(pid):
    """tgtd's (user, system) CPU seconds so far, all threads."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLOCK_TICKS, int(fields[12]) / CLOCK_TICKS  # utime, stime


def run_once(pid, url, dtype, op, a):
    """One iobench run; returns {MBps, learner and tgtd s/GB (user, sys)}."""
    before = cpu_seconds(pid)
    run = subprocess.run([a.iobench, "--target", url, "--op", "push" if op == "write" else "pull", "--dtype", dtype,
                          "--bs", a.bs, "--qd", str(a.qd), "--span", "32M", "--seconds", str(a.seconds)],
                         capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"server-cpu: {run.stderr.strip() or 'blkps-iobench failed'}")
    after = cpu_seconds(pid)
    fields = dict(item.split("=", 1) for item in run.stdout.split())
    gb = int(fields["bytes"]) / 1e9
    return {"MBps": float(fields["MBps"]),
            "learner_user_s_per_GB": float(fields["cpu_user"]) / gb,
            "learner_sys_s_per_GB": float(fields["cpu_sys"]) / gb,
            "tgtd_user_s_per_GB": (after[0] - before[0]) / gb,
            "tgtd_sys_s_per_GB": (after[1] - before[1]) / gb}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bs", default="1M")
    p.add_argument("--qd", type=int, default=16)
    p.add_argument("--seconds", type=float, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--bsopts", default="params=16777216;lr=1e-9", help="the model's options (no dtype=)")
    p.add_argument("--dtypes", default="float32", help="blkps LUNs to measure, comma-separated: "
                   "float32, bfloat16, float16 (default float32)")
    p.add_argument("--plugin", help="bs_blkps.so to preload (default: the build tree's)")
    p.add_argument("--iobench", default=IOBENCH, help="blkps-iobench to run (default: the build tree's); with "
                   "--plugin, compares another build's two ends")
    p.add_argument("--ops", default="write,read", help="which of write (push) and read (pull); default both")
    p.add_argument("--json", help="also write the results here")
    a = p.parse_args()
    ops = a.ops.split(",")
    if not ops or any(op not in ("write", "read") for op in ops):
        sys.exit(f"server-cpu: --ops: expected write, read or write,read, got '{a.ops}'")
    dtypes = a.dtypes.split(",")
    if not dtypes or any(d not in DTYPES for d in dtypes) or len(set(dtypes)) != len(dtypes):
        sys.exit(f"server-cpu: --dtypes: expected some of {', '.join(DTYPES)}, got '{a.dtypes}'")
    if "dtype=" in a.bsopts:
        sys.exit("server-cpu: --bsopts: leave dtype= out and name the LUNs' types with --dtypes")
    if not os.access(a.iobench, os.X_OK):
        sys.exit(f"server-cpu: {a.iobench} not built: run scripts/build.sh")
    state = tempfile.mkdtemp(prefix="blkps-cpu-")
    try:
        subprocess.run([BLKPS, "target", "start", "--dir", state, "--null-lun", "--bsopts", a.bsopts,
                        "--owner-pid", str(os.getpid())] + (["--plugin", a.plugin] if a.plugin else []),
                       check=True, stdout=subprocess.DEVNULL)
        url, null_url, pid, iqn, socket = subprocess.run(
            [BLKPS, "target", "show", "--dir", state, "--get", "URL", "--get", "NULL_URL", "--get", "PID",
             "--get", "IQN", "--get", "TGT_IPC_SOCKET"], check=True, capture_output=True, text=True).stdout.split()
        stores = [("null", null_url, "float32")]
        for k, dtype in enumerate(dtypes):
            if dtype == "float32":
                stores.append(("blkps float32", url, dtype))
                continue
            lun = FIRST_EXTRA_LUN + k
            subprocess.run(["tgtadm", "--lld", "iscsi", "--op", "new", "--mode", "logicalunit", "--tid", "1",
                            "--lun", str(lun), "--bstype", "blkps", "--backing-store", "model",
                            "--bsopts", f"{a.bsopts};dtype={dtype}"],
                           env=dict(os.environ, TGT_IPC_SOCKET=socket), check=True)
            stores.append((f"blkps {dtype}", url.rsplit("/", 1)[0] + f"/{lun}", dtype))
        runs = {}
        for r in range(1, a.rounds + 1):
            for op in ops:
                for store, target, dtype in stores:
                    m = run_once(pid, target, dtype, op, a)
                    print(f"round {r}/{a.rounds}: {store} {op} {m['MBps']:.0f} MB/s, learner "
                          f"{m['learner_user_s_per_GB'] + m['learner_sys_s_per_GB']:.3f} s/GB, tgtd "
                          f"{m['tgtd_user_s_per_GB'] + m['tgtd_sys_s_per_GB']:.3f} s/GB", file=sys.stderr)
                    runs.setdefault((op, store), []).append(m)
    finally:
        subprocess.run([BLKPS, "target", "stop", "--dir", state], stderr=subprocess.DEVNULL)
        subprocess.run(["rm", "-rf", state])

    load = os.getloadavg()
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} CPUs; "
          f"{a.bs} x QD{a.qd}, medians of {a.rounds} rounds; GB = 1e9 float32 bytes")
    print(f"{'op':5} {'store':15} {'MB/s':>6} {'wall':>5} {'/null':>5} {'learner s/GB':>12} {'tgtd s/GB':>9} "
          f"{'(user':>6} {'sys)':>5}")
    records = []
    for op in ops:
        med = {store: {k: statistics.median(m[k] for m in runs[(op, store)]) for k in runs[(op, store)][0]}
               for store, _, _ in stores}
        float32 = med.get("blkps float32")
        for store, _, dtype in stores:
            m = med[store]
            learner = m["learner_user_s_per_GB"] + m["learner_sys_s_per_GB"]
            tgtd = m["tgtd_user_s_per_GB"] + m["tgtd_sys_s_per_GB"]
            wall = float32["MBps"] / m["MBps"] if float32 and store.startswith("blkps") else None
            ratio = m["MBps"] / med["null"]["MBps"]
            print(f"{op:5} {store:15} {m['MBps']:6.0f} {wall if wall else float('nan'):5.2f} {ratio:5.2f} "
                  f"{learner:12.3f} {tgtd:9.3f} {m['tgtd_user_s_per_GB']:6.3f} {m['tgtd_sys_s_per_GB']:5.3f}")
            records.append({"op": "push" if op == "write" else "pull", "store": store.split()[0], "dtype": dtype,
                            "bs": a.bs, "qd": a.qd, "rounds": a.rounds, "load": load[0], **m,
                            "ratio_to_null": ratio, "wall_to_float32": wall})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
