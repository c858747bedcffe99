#!/usr/bin/python3
"""What a backup costs (doc/replicas.md "What a backup costs"): the
pipelined exchange, and a push then a pull, of the whole model through
libblkps, on a target with a backup (`blkps target start --replicas 2`)
against the same target without one, both on loopback and running at once
(one learner works at a time), rounds interleaved with the side that goes
first alternating, medians per call. With a backup, every WRITE completes
only once the backup applied its record (the touched blocks' new state and
the rule's state arrays, doc/replicas.md "What the primary sends"), so the
primary's tgtd also copies and sends that state and the backup applies it,
on the same cores.

  sudo bench/replica_cost.py [--params N] [--rule sgd] [--rounds 9]
                             [--calls 4] [--hosts LINK [--back-network]]
                             [--out DIR] [--build DIR]

--hosts LINK: the primary, its backup, the side without one and the
learner each on a host of its own in the netns cluster, links shaped to
LINK (replica_cost_hosts.py): replication then competes with the pulls on
the primary's link, not with them for the cores alone. --back-network:
every host also has a second link, as fast, on a network of its own, and
the backup listens for its primary there (blkps target serve
--replication-address): the records leave the primary over that link.

Writes replica-cost.md and replica-cost.json to --out (default
bench/results/replica-cost) and prints the table.
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

import replica_cost_hosts
from bench_results import cpu_seconds, top, use_this_checkout, write_results

OPS = ("exchange", "push then pull")
OUT = os.path.join(top, "bench", "results", "replica-cost")


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--params", type=int, default=1 << 22, help="model parameters (default 4194304: 16 MiB)")
    p.add_argument("--rule", default="sgd", help="the rule (sgd: weights only; momentum, adam send more state)")
    p.add_argument("--rounds", type=int, default=9, help="interleaved rounds; medians reported (default 9)")
    p.add_argument("--calls", type=int, default=4, help="calls of each operation per round and side (default 4)")
    p.add_argument("--out", default=OUT)
    p.add_argument("--hosts", metavar="LINK", help="servers and learner on hosts of their own in the netns cluster "
                   "(bench/cluster/net.py), every link shaped to LINK (e.g. 1gbit; none: unshaped)")
    p.add_argument("--back-network", action="store_true", help="with --hosts: the primary's records to its backup "
                   "go over a second network of their own (doc/replicas.md \"A network for the records\")")
    p.add_argument("--measure", help=argparse.SUPPRESS)  # --hosts's learner: {replicas: url}, {replicas: pids}
    p.add_argument("--build", default=os.path.join(top, "build", "cmake"))
    a = p.parse_args()
    if a.params < 1024 or a.rounds < 1 or a.calls < 1:
        p.error("--params must be 1024 or more, --rounds and --calls 1 or more")
    if a.back_network and not a.hosts:
        p.error("--back-network is a network of the --hosts cluster: give --hosts LINK")
    return a


def timed_calls(model, op, grad, out, calls, pids):
    """`calls` calls of `op` of the whole model: (seconds a call, cores busy
    meanwhile: the CPU of this process (the learner) and of the tgtds
    `pids`, over the wall time)."""
    cpu = os.times().user + os.times().system + sum(cpu_seconds(p) for p in pids)
    began = time.perf_counter()
    for _ in range(calls):
        if op == "exchange":
            model.exchange(0, grad, out)
        else:
            model.push(0, grad)
            model.pull_into(0, out)
    wall = time.perf_counter() - began
    cpu = os.times().user + os.times().system + sum(cpu_seconds(p) for p in pids) - cpu
    return wall / calls, cpu / wall


def measure(a, urls, pids):
    """The interleaved rounds against the learner URLs `urls` (of the sides
    with 1 and 2 replicas) whose tgtds are `pids` (replicas -> list):
    (times, cores), each {(op, replicas): [per round]}."""
    import blkps
    models = {replicas: blkps.Model(url) for replicas, url in urls.items()}
    try:
        grad = np.full(a.params, 1e-3, dtype=np.float32)
        out = np.empty(a.params, dtype=np.float32)
        for replicas, model in models.items():  # warm: connections, pages
            timed_calls(model, "exchange", grad, out, 1, pids[replicas])
        times = {(op, r): [] for op in OPS for r in (1, 2)}
        cores = {(op, r): [] for op in OPS for r in (1, 2)}
        for k in range(a.rounds):
            for replicas in ((1, 2) if k % 2 == 0 else (2, 1)):
                for op in OPS:
                    seconds, busy = timed_calls(models[replicas], op, grad, out, a.calls, pids[replicas])
                    times[op, replicas].append(seconds)
                    cores[op, replicas].append(busy)
            print(f"replica cost: round {k + 1}/{a.rounds}", file=sys.stderr, flush=True)
    finally:
        for model in models.values():
            model.close()
    return times, cores


def on_loopback(a, bsopts):
    """Both sides started here with `blkps target start`: measure()'s result."""
    from torch_fashion_job import start_server, stop_server
    states = {replicas: tempfile.mkdtemp(prefix=f"blkps-replica-cost-{replicas}-") for replicas in (1, 2)}
    urls, pids = {}, {}
    try:
        for replicas, state in states.items():
            env = start_server(state, bsopts, 1, a.build, replicas=replicas)
            urls[replicas], pids[replicas] = env["URL"], [int(env["PID"])]
            if replicas == 2:
                pids[replicas].append(int(subprocess.run(
                    [os.path.join(top, "scripts", "blkps"), "target", "show", "--dir", os.path.join(state, "backup"),
                     "--get", "PID"], check=True, capture_output=True, text=True).stdout))
        return measure(a, urls, pids)
    finally:
        for state in states.values():
            stop_server(state)


def main():
    a = parse()
    if os.geteuid() != 0:
        sys.exit("replica_cost: needs root (tgtd): sudo " + sys.argv[0])
    use_this_checkout(a.build)
    bsopts = f"params={a.params};rule={a.rule};lr=1e-9"
    if a.measure:  # a learner host's part of --hosts
        urls, pids = json.loads(a.measure)
        times, cores = measure(a, {int(r): u for r, u in urls.items()}, {int(r): p for r, p in pids.items()})
        print(json.dumps({"times": [[op, r, v] for (op, r), v in times.items()],
                          "cores": [[op, r, v] for (op, r), v in cores.items()]}))
        return 0
    times, cores = replica_cost_hosts.on_hosts(a, bsopts) if a.hosts else on_loopback(a, bsopts)
    load = os.getloadavg()[0]
    mib = a.params * 4 / 2**20
    rows = []
    for op in OPS:
        one, two = statistics.median(times[op, 1]), statistics.median(times[op, 2])
        rows.append({"op": op, "one_replica_s": one, "two_replicas_s": two, "ratio": two / one,
                     "one_replica_cores": statistics.median(cores[op, 1]),
                     "two_replicas_cores": statistics.median(cores[op, 2])})
    numbers = {"params": a.params, "rule": a.rule, "rounds": a.rounds, "calls": a.calls, "cpus": os.cpu_count(),
               "load_average": load, "times": {f"{op}/{r}": v for (op, r), v in times.items()}, "rows": rows}
    where = replica_cost_hosts.described(a.hosts, a.back_network) if a.hosts else "loopback"
    lines = ["# What a backup costs: the whole model through libblkps, with a backup against without", "",
             f"One learner, one tgtd per side (and the backup's), {where}, {os.cpu_count()} CPUs; a {mib:.0f} MiB "
             f"model, rule {a.rule}; medians of {a.rounds} interleaved rounds of {a.calls} calls each; cores busy: "
             f"the CPU time of the learner and the side's tgtds over the wall time; load average {load:.1f} at "
             f"the end. Command: `sudo bench/replica_cost.py --params {a.params} --rule {a.rule} --rounds "
             f"{a.rounds} --calls {a.calls}{f' --hosts {a.hosts}' if a.hosts else ''}"
             f"{' --back-network' if a.back_network else ''}"
             f"{'' if a.out == OUT else ' --out ' + os.path.relpath(a.out, top)}`.", "",
             "| operation | 1 replica | cores busy | 2 replicas | cores busy | 2 / 1 |", "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['op']} | {r['one_replica_s'] * 1000:.1f} ms ({mib / r['one_replica_s']:.0f} MiB/s) | "
                     f"{r['one_replica_cores']:.2f} | {r['two_replicas_s'] * 1000:.1f} ms "
                     f"({mib / r['two_replicas_s']:.0f} MiB/s) | {r['two_replicas_cores']:.2f} | {r['ratio']:.2f} |")
    write_results(a.out, "replica-cost", numbers, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
