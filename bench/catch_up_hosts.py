"""bench/catch_up.py --hosts LINK: the catch-up across hosts of the netns
cluster (bench/cluster/net.py), every link shaped to LINK both ways:

  host 0  the primary: blkps target serve --replicas 2 --replica primary
  host 1  its backup (--replica backup), killed and served again each run
  host 2  the learner (catch_up.py --learn, pushing the whole model in a
          loop), and the keeper's part played through the primary's
          control LUN (blkps set --control: lease_until=, backup_outdated=1)

so that the snapshot leaves the primary over its link, beside the
acknowledgements of the learner's pushes (doc/replicas.md "A backup that
returns"). The hosts share this machine's cores.
"""
import json
import os
import subprocess
import sys
import tempfile

from bench_results import top
import replica_cost_hosts
from replica_cost_hosts import BLKPS, net

PRIMARY, BACKUP, LEARNER = 0, 1, 2


def described(link):
    return f"netns cluster (the primary, its backup and the learner on 3 hosts, links {link})"


class Job:
    """catch_up.one_run's job: the served part in `cluster`, its control
    LUN reached from the learner's host."""

    def __init__(self, cluster, folder, a, bsopts):
        self.cluster, self.folder, self.a, self.bsopts = cluster, folder, a, bsopts
        self.replicas = ["--replicas", "2", "--publish", os.path.join(folder, "job")]
        self.serve_backup()
        self.url, _ = replica_cost_hosts.serve(cluster, folder, a, bsopts, PRIMARY, [*self.replicas, "--replica",
                                                                                     "primary"])
        self.control = self.show(PRIMARY, "CONTROL_URL")
        self.primary_log = os.path.join(folder, f"host-{PRIMARY}", "tgtd.log")

    def serve_backup(self):
        replica_cost_hosts.serve(self.cluster, self.folder, self.a, self.bsopts, BACKUP,
                                 [*self.replicas, "--replica", "backup"])

    restart_backup = serve_backup

    def backup_pid(self):
        return int(self.show(BACKUP, "PID"))

    def show(self, host, key):
        return subprocess.run([BLKPS, "target", "show", "--dir", os.path.join(self.folder, f"host-{host}"), "--get",
                               key], check=True, capture_output=True, text=True).stdout.strip()

    def set(self, command):
        subprocess.run(self.cluster.exec_argv(LEARNER, [BLKPS, "set", "--control", self.control, command]),
                       check=True, stdout=subprocess.DEVNULL)

    def backup_state(self):
        out = subprocess.run(self.cluster.exec_argv(LEARNER, [BLKPS, "status", "--control", self.control, "--json"]),
                             check=True, capture_output=True, text=True).stdout
        return json.loads(out)["backup"]


def on_hosts(a, bsopts, one_run, result):
    """The runs of catch_up.py on hosts: one_run(job, settle) each;
    result(*what one_run returned, rate) makes its figures, rate(start,
    end) being the learner's pushes a second."""
    folder = tempfile.mkdtemp(prefix="blkps-catch-up-hosts-")
    runs = []
    try:
        with net.Cluster(3, a.hosts) as cluster:
            print(f"catch-up: {cluster.shaping}", file=sys.stderr, flush=True)
            job = Job(cluster, folder, a, bsopts)
            learner = cluster.popen(LEARNER, [sys.executable, os.path.join(top, "bench", "catch_up.py"), "--params",
                                              str(a.params), "--build", a.build, "--learn", job.url],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            timed = []
            for k in range(a.runs):
                timed.append(one_run(job, a.settle))
                print(f"catch-up {k + 1}/{a.runs}: {timed[-1][0]}", file=sys.stderr, flush=True)
            out, _ = learner.communicate("")  # its stdin closed: it stops and prints its pushes' end times
            if learner.returncode != 0:
                sys.exit("catch_up: the learner's host failed (its error is above)")
            done = json.loads(out)
    finally:
        subprocess.run(["rm", "-rf", folder])

    def rate(start, end):
        return sum(start <= t < end for t in done) / (end - start)
    for run in timed:
        runs.append(result(*run, rate))
    return runs
