#!/usr/bin/python3
"""The failover soak (doc/replicas.md "Failover soak"): each fault of
tests/lease_test.py's learner cases, repeated --times times, each run a
fresh three-member etcd, a primary and its backup with lease keepers, and
two learners pushing through libblkps over their layouts. Each run checks
exactly that the new primary holds every acknowledged push once, and
prints the time from the fault to the first push acknowledged after it;
this script counts the passes and collects those times.

  sudo bench/failover_soak.py [--times N] [--faults kill,freeze,silent]
                              [--out DIR] [--build DIR]

Faults (the lease test's cases; doc/replicas.md "Failover by a lease"):
  kill    the primary's tgtd killed (kill -9)
  freeze  the primary's tgtd stopped (SIGSTOP) until the backup took over,
          then woken
  silent  the primary's tgtd stopped for good: what a host cut off from the
          network looks like to the learners (the connection stays up and
          nothing answers); not a cut link itself
  backup-restart  the backup's tgtd killed, then started again (blkps
          target restart) and caught up while the learners push; then the
          primary killed (the fault timed): the caught-up backup takes over
          (doc/replicas.md "A backup that returns"). Also collects the time
          from the restart to the backup in sync.
  bsp-kill, ssp-kill  kill, with two learners in bsp (ssp:1) that push to
          the whole model and pull it every round: every bsp pull must
          show exactly the rounds applied; the time is to the first round
          begun after the primary's tgtd was gone.
  hosts-MODE-FAULT  tests/replica_cluster_test.py's cases: the primary and
          its backup on hosts of their own in the netns cluster, etcd on
          three other hosts, the learners on one of them; MODE async or
          bsp, FAULT primary-killed, link-cut (the primary's host's link
          down until the learners went on) or primary-frozen; and
          hosts-async-backup-restarted (the backup's task killed, started
          again and caught up; then the primary killed: the time is to the
          first push after that kill).

Writes failover-soak.md and failover-soak.json to --out (default
bench/results/failover-soak). Exit status 1 if any run failed.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

top = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LEASE_TEST, CLUSTER_TEST = "lease_test.py", "replica_cluster_test.py"
CASES = {"kill": (LEASE_TEST, "learner-follows-the-lease"),
         "freeze": (LEASE_TEST, "learner-follows-past-a-frozen-primary"),
         "silent": (LEASE_TEST, "learner-follows-past-a-silent-primary"),
         "backup-restart": (LEASE_TEST, "restarted-backup-catches-up-and-takes-over"),
         "bsp-kill": (LEASE_TEST, "bsp-learners-follow-exactly"), "ssp-kill": (LEASE_TEST, "ssp-learners-follow-exactly"),
         **{f"hosts-{mode}-{fault}": (CLUSTER_TEST, f"{mode}-{fault}") for mode in ("async", "bsp")
            for fault in ("primary-killed", "link-cut", "primary-frozen")},
         "hosts-async-backup-restarted": (CLUSTER_TEST, "async-backup-restarted")}
FIRST_ACK = re.compile(r"the first push acknowledged after the fault: ([0-9.]+) s after it")
OUT = os.path.join(top, "bench", "results", "failover-soak")
IN_SYNC = re.compile(r"the backup was in sync ([0-9.]+) s after the restart began")


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--times", type=int, default=20, help="runs of each fault (default 20)")
    p.add_argument("--faults", default=",".join(f for f in CASES if not f.startswith("hosts-")),
                   help="comma-separated, of: " + ", ".join(CASES) + " (default: those on loopback)")
    p.add_argument("--out", default=OUT)
    p.add_argument("--build", default=os.path.join(top, "build", "cmake"))
    a = p.parse_args()
    a.faults = a.faults.split(",")
    unknown = [f for f in a.faults if f not in CASES]
    if unknown or a.times < 1:
        p.error(f"unknown fault {unknown[0]!r}" if unknown else "--times must be 1 or more")
    return a


def run_once(a, fault):
    """One run of the fault's case: (passed, seconds to the first ack after
    the fault or None, seconds from a backup's restart to its catch-up or
    None, the case's last line)."""
    script, case = CASES[fault]
    out = subprocess.run([sys.executable, os.path.join(top, "tests", script), top, a.build, case],
                         capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    first, in_sync = FIRST_ACK.search(text), IN_SYNC.search(text)
    lines = [line for line in text.splitlines() if line.strip()]
    return (out.returncode == 0, float(first.group(1)) if first else None,
            float(in_sync.group(1)) if in_sync else None, lines[-1] if lines else "")


def where(faults):
    """Where the runs of `faults` ran, in words."""
    hosts = [f for f in faults if f.startswith("hosts-")]
    if not hosts:
        return "Loopback"
    said = ("hosts-*: a netns cluster of 4 hosts (the primary on host 0, its backup on 1, the learners on 2, "
            "etcd's members on 1 to 3; links unshaped)")
    return said if len(hosts) == len(faults) else "Loopback, and " + said


def main():
    a = parse()
    if os.geteuid() != 0:
        sys.exit("failover_soak: needs root (tgtd): sudo " + sys.argv[0])
    os.makedirs(a.out, exist_ok=True)
    results = {}
    started = time.time()
    for fault in a.faults:
        runs = results[fault] = []
        for k in range(a.times):
            passed, seconds, in_sync, last = run_once(a, fault)
            runs.append({"passed": passed, "first_ack_s": seconds, "in_sync_s": in_sync, "last_line": last})
            print(f"failover soak: {fault} {k + 1}/{a.times}: {'pass' if passed else 'FAIL'}"
                  f"{f', first ack after {seconds:.2f} s' if seconds is not None else ''}"
                  f"{'' if passed else ': ' + last}", file=sys.stderr, flush=True)
    load = os.getloadavg()[0]
    with open(os.path.join(a.out, "failover-soak.json"), "w") as f:
        json.dump({"times": a.times, "minutes": (time.time() - started) / 60, "load_average": load,
                   "faults": results}, f, indent=2)
    lines = ["# Failover soak: a primary's fault under two learners, each fault repeated", "",
             f"Each run: a fresh three-member etcd, a primary and its backup (lease TTL 2 s), two learners "
             f"pushing through libblkps over their layouts; the run passes if the learners follow with no "
             f"error and the new primary holds every acknowledged push exactly once (in bsp every pull "
             f"shows exactly the rounds applied). {where(a.faults)}; load average {load:.1f} at the end. Command: "
             f"`sudo bench/failover_soak.py --times {a.times} --faults {','.join(a.faults)}"
             f"{'' if a.out == OUT else ' --out ' + os.path.relpath(a.out, top)}`.", "",
             "| fault | runs | passed | first ack after the fault: median | max | backup in sync after its "
             "restart: median | max |",
             "|---|---:|---:|---:|---:|---:|---:|"]

    def median_and_max(runs, key):
        times = [r[key] for r in runs if r.get(key) is not None]
        return (f"{statistics.median(times):.2f} s", f"{max(times):.2f} s") if times else ("-", "-")
    for fault, runs in results.items():
        first, in_sync = median_and_max(runs, "first_ack_s"), median_and_max(runs, "in_sync_s")
        lines.append(f"| {fault} | {len(runs)} | {sum(r['passed'] for r in runs)} | {' | '.join(first)} | "
                     f"{' | '.join(in_sync)} |")
    with open(os.path.join(a.out, "failover-soak.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(r["passed"] for runs in results.values() for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
