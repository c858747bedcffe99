"""bench/replica_cost.py --hosts LINK: the sides on hosts of their own in
the netns cluster (bench/cluster/net.py), every link shaped to LINK in both
directions:

  host 0  the primary: blkps target serve --replicas 2 --replica primary
  host 1  its backup (--replica backup)
  host 2  the side without a backup: blkps target serve
  host 3  the learner: replica_cost.py --measure, run there

so that the primary's records to its backup leave over the link its pulls
leave over (doc/replicas.md "What a backup costs"); with --back-network,
over a second link of their own (the backup's --replication-address on the
cluster's back network). The hosts share this machine's cores.
"""
import json
import os
import subprocess
import sys
import tempfile

from bench_results import top

sys.path.insert(0, os.path.join(top, "bench", "cluster"))
import net  # noqa: E402

BLKPS = os.path.join(top, "scripts", "blkps")
PRIMARY, BACKUP, ALONE, LEARNER = 0, 1, 2, 3


def described(link, back_network):
    records = "a back network of its own, links as fast" if back_network else "the learners' network"
    return (f"netns cluster (the primary, its backup, the side without one and the learner on 4 hosts, links "
            f"{link}; the records to the backup over {records})")


def serve(cluster, folder, a, bsopts, host, extra):
    """Starts `blkps target serve` on `host` with `extra` options; its
    learner URL and tgtd pid once it serves."""
    state = os.path.join(folder, f"host-{host}")
    with open(state + ".err", "w") as err:
        p = cluster.popen(host, [BLKPS, "target", "serve", "--dir", state, "--plugin",
                                 os.path.join(a.build, "target-plugin", "bs_blkps.so"), "--address",
                                 cluster.address(host), "--allow", cluster.subnet(), "--bsopts", bsopts, *extra],
                          stdout=subprocess.PIPE, stderr=err, text=True)
    line = p.stdout.readline()
    if not line.startswith("serving "):
        with open(state + ".err") as err:
            sys.exit(f"replica_cost: the server on host {host} did not start: {err.read().strip()}")
    pid = subprocess.run([BLKPS, "target", "show", "--dir", state, "--get", "PID"], check=True, capture_output=True,
                         text=True).stdout
    return line.split()[2], int(pid)


def on_hosts(a, bsopts):
    """replica_cost.measure()'s result, measured on the learner's host."""
    folder = tempfile.mkdtemp(prefix="blkps-replica-cost-hosts-")
    try:
        with net.Cluster(4, a.hosts, back_network=a.back_network) as cluster:
            print(f"replica cost: {cluster.shaping}", file=sys.stderr, flush=True)
            job = ["--replicas", "2", "--publish", os.path.join(folder, "job")]
            back = ["--replication-address", cluster.back_address(BACKUP)] if a.back_network else []
            _, backup_pid = serve(cluster, folder, a, bsopts, BACKUP, [*job, "--replica", "backup", *back])
            primary_url, primary_pid = serve(cluster, folder, a, bsopts, PRIMARY, [*job, "--replica", "primary"])
            alone_url, alone_pid = serve(cluster, folder, a, bsopts, ALONE, [])
            urls, pids = {1: alone_url, 2: primary_url}, {1: [alone_pid], 2: [primary_pid, backup_pid]}
            measured = subprocess.run(cluster.exec_argv(LEARNER, [
                sys.executable, os.path.join(top, "bench", "replica_cost.py"), "--params", str(a.params), "--rule",
                a.rule, "--rounds", str(a.rounds), "--calls", str(a.calls), "--build", a.build,
                "--measure", json.dumps([urls, pids])]), stdout=subprocess.PIPE, text=True)
            if measured.returncode != 0:
                sys.exit("replica_cost: the learner's host failed (its error is above)")
    finally:
        subprocess.run(["rm", "-rf", folder])
    values = json.loads(measured.stdout)
    return ({(op, r): v for op, r, v in values["times"]}, {(op, r): v for op, r, v in values["cores"]})
