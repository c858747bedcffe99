#!/usr/bin/python3
"""How fast a returning backup catches up (doc/replicas.md "A backup that
returns"), while a learner trains: a target with a backup (`blkps target
start --replicas 2`), the lease keeper's part played through the primary's
control LUN (lease_until=, then backup_outdated=1, as tests/
backup_verdict_test.cc does: no etcd), one learner pushing the whole model
in a loop throughout. Each run kills the backup's tgtd, declares it
outdated once the primary says it is lost, restarts it (`blkps target
restart`) and waits until the primary says it is in sync. Reports the
catch-up as the primary logs it (seconds and MiB of state, from its
instant to the last snapshot record acknowledged), the time from the
restart to in sync, and the learner's pushes per second alone, during the
catch-up, and with its backup in sync after it.

  sudo bench/catch_up.py [--params N] [--rule sgd] [--runs 3] [--hosts LINK]
                         [--out DIR] [--build DIR]

--hosts LINK: the primary, its backup and the learner each on a host of
the netns cluster, links shaped to LINK (catch_up_hosts.py; the backup
served by `blkps target serve --replicas 2`, killed and served again).

Writes catch-up.md and catch-up.json to --out (default
bench/results/catch-up) and prints the table.
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

import catch_up_hosts
from bench_results import top, use_this_checkout, write_results

BLKPS = os.path.join(top, "scripts", "blkps")
CAUGHT_UP = re.compile(r"caught up in ([0-9.]+) s \(([0-9]+) MiB of state\)")
WAIT_S = 120
OUT = os.path.join(top, "bench", "results", "catch-up")


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--params", type=int, default=1 << 26, help="model parameters (default 67108864: 256 MiB)")
    p.add_argument("--rule", default="sgd", help="the rule (momentum, adam: more state per parameter)")
    p.add_argument("--runs", type=int, default=3, help="catch-ups measured (default 3)")
    p.add_argument("--settle", type=float, default=2, metavar="S", help="seconds the learner runs alone before the "
                   "restart, and in sync after it, for its rates (default 2; several of its pushes' time)")
    p.add_argument("--hosts", metavar="LINK", help="primary, backup and learner on hosts of their own in the netns "
                   "cluster (bench/cluster/net.py), every link shaped to LINK (e.g. 1gbit)")
    p.add_argument("--learn", help=argparse.SUPPRESS)  # --hosts's learner: pushes to this URL until stdin ends
    p.add_argument("--out", default=OUT)
    p.add_argument("--build", default=os.path.join(top, "build", "cmake"))
    a = p.parse_args()
    if a.params < 1024 or a.runs < 1:
        p.error("--params must be 1024 or more, --runs 1 or more")
    return a


def wait_for(what, condition):
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            sys.exit(f"catch_up: not within {WAIT_S} s: {what}")
        time.sleep(0.02)


class Learner:
    """Pushes the whole model in a loop, in a thread; `done` holds each
    push's end time."""

    def __init__(self, blkps, url, params):
        self.model = blkps.Model(url)
        self.grad = np.full(params, 1e-6, dtype=np.float32)
        self.done, self.error = [], None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    def _run(self):
        try:
            while not self._stop.is_set():
                self.model.push(0, self.grad)
                self.done.append(time.monotonic())
        except OSError as e:
            self.error = str(e)

    def rate(self, start, end):
        """Pushes a second that ended in [start, end)."""
        return sum(start <= t < end for t in self.done) / (end - start)

    def stop(self):
        self._stop.set()
        self._thread.join()
        self.model.close()


def caught_up(log):
    """The last catch-up the primary's tgtd.log `log` says: (seconds, MiB)."""
    with open(log, errors="replace") as f:
        logged = CAUGHT_UP.findall(f.read())
    if not logged:
        sys.exit("catch_up: the primary logged no catch-up")
    return float(logged[-1][0]), int(logged[-1][1])


def result(logged, alone_from, restarted, in_sync, settle, rate):
    """A run's figures: the primary's `logged` (seconds, MiB), the times
    the backup's kill, its restart and in sync were seen, `settle` (the
    learner's time in sync after it), and the learner's rate(start, end)
    in pushes a second."""
    seconds, mib = logged
    return {"catch_up_s": seconds, "state_mib": mib, "mib_per_s": mib / seconds if seconds > 0 else None,
            "restart_to_in_sync_s": in_sync - restarted,
            "pushes_per_s_alone": rate(alone_from + 1, restarted),
            "pushes_per_s_during": rate(in_sync - seconds, in_sync),
            "pushes_per_s_in_sync": rate(in_sync, in_sync + settle)}


def one_run(job, settle):
    """Kills the backup's tgtd, declares it outdated once the primary says
    it is lost (the lease keeper's part, through the primary's control
    LUN), starts it again and waits until it is in sync. `job`: set(command)
    on the primary's control LUN, backup_state() (its status `backup`),
    backup_pid(), restart_backup(), primary_log. Returns (the primary's
    logged (seconds, MiB), alone from, restarted, in sync, settle)."""
    job.set(f"lease_until={int(time.monotonic() * 1000) + 3_600_000}")
    alone_from = time.monotonic()
    os.kill(job.backup_pid(), signal.SIGKILL)
    wait_for("the primary says its backup is lost", lambda: job.backup_state().startswith("lost: "))
    job.set("backup_outdated=1")
    time.sleep(settle)  # the learner alone, for its rate
    restarted = time.monotonic()
    job.restart_backup()
    wait_for("the backup in sync", lambda: job.backup_state() == "")
    in_sync = time.monotonic()
    time.sleep(settle)  # the learner with its backup in sync, for its rate
    return caught_up(job.primary_log), alone_from, restarted, in_sync, settle


class LoopbackJob:
    """one_run's job for a target with a backup on loopback (`blkps target
    start --replicas 2` in `state`; restarted with `blkps target restart`)."""

    def __init__(self, blkps, state, env):
        self.state, self.primary_log = state, os.path.join(state, "tgtd.log")
        self.control = blkps.control.Control(env["CONTROL_URL"])

    def set(self, command):
        self.control.command(command)

    def backup_state(self):
        return self.control.status()["backup"]

    def backup_pid(self):
        return int(subprocess.run([BLKPS, "target", "show", "--dir", os.path.join(self.state, "backup"), "--get",
                                   "PID"], check=True, capture_output=True, text=True).stdout)

    def restart_backup(self):
        subprocess.run([BLKPS, "target", "restart", "--dir", self.state], check=True, stdout=subprocess.DEVNULL)


def on_loopback(a, bsopts):
    import blkps
    import blkps.control  # noqa: F401  (blkps.control.Control)
    from torch_fashion_job import start_server, stop_server
    state = tempfile.mkdtemp(prefix="blkps-catch-up-")
    runs = []
    try:
        env = start_server(state, bsopts, 1, a.build, replicas=2)
        learner = Learner(blkps, env["URL"], a.params)
        job = LoopbackJob(blkps, state, env)
        try:
            for k in range(a.runs):
                runs.append(result(*one_run(job, a.settle), learner.rate))
                r = runs[-1]
                print(f"catch-up {k + 1}/{a.runs}: {r['state_mib']} MiB in {r['catch_up_s']:.3f} s; in sync "
                      f"{r['restart_to_in_sync_s']:.2f} s after the restart began", file=sys.stderr, flush=True)
        finally:
            job.control.close()
            learner.stop()
        if learner.error:
            sys.exit(f"catch_up: {learner.error}")
    finally:
        stop_server(state)
    return runs


def learn(a):
    """--hosts's learner: pushes to a.learn until stdin ends, then prints
    its pushes' end times (CLOCK_MONOTONIC, one clock for every host)."""
    import blkps
    learner = Learner(blkps, a.learn, a.params)
    sys.stdin.read()
    learner.stop()
    if learner.error:
        sys.exit(f"catch_up: the learner: {learner.error}")
    print(json.dumps(learner.done))
    return 0


def main():
    a = parse()
    if os.geteuid() != 0:
        sys.exit("catch_up: needs root (tgtd): sudo " + sys.argv[0])
    use_this_checkout(a.build)
    if a.learn:
        return learn(a)
    bsopts = f"params={a.params};rule={a.rule};lr=1e-9"
    runs = catch_up_hosts.on_hosts(a, bsopts, one_run, result) if a.hosts else on_loopback(a, bsopts)
    load = os.getloadavg()[0]
    numbers = {"params": a.params, "rule": a.rule, "cpus": os.cpu_count(), "load_average": load, "runs": runs}
    def median(key):
        return statistics.median(r[key] for r in runs)
    lines = ["# A returning backup's catch-up, a learner pushing throughout", "",
             f"One tgtd and its backup, {catch_up_hosts.described(a.hosts) if a.hosts else 'loopback'}, "
             f"{os.cpu_count()} CPUs; a {a.params * 4 / 2**20:.0f} MiB model, "
             f"rule {a.rule}; one learner pushing the whole model in a loop; medians of {a.runs} catch-ups; load "
             f"average {load:.1f} at the end. Command: `sudo bench/catch_up.py --params {a.params} --rule {a.rule} "
             f"--runs {a.runs}{f' --settle {a.settle:g}' if a.settle != 2 else ''}"
             f"{f' --hosts {a.hosts}' if a.hosts else ''}"
             f"{'' if a.out == OUT else ' --out ' + os.path.relpath(a.out, top)}`.", "",
             "| state sent | catch-up (primary's log) | rate | restart to in sync | learner pushes/s alone | during the "
             "catch-up | in sync after it |", "|---:|---:|---:|---:|---:|---:|---:|",
             f"| {median('state_mib'):.0f} MiB | {median('catch_up_s'):.2f} s | {median('mib_per_s'):.0f} MiB/s | "
             f"{median('restart_to_in_sync_s'):.2f} s | {median('pushes_per_s_alone'):.2f} | "
             f"{median('pushes_per_s_during'):.2f} | {median('pushes_per_s_in_sync'):.2f} |"]
    write_results(a.out, "catch-up", numbers, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
