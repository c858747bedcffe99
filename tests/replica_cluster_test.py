#!/usr/bin/python3
"""Replicas on hosts of their own (doc/replicas.md "Replicas on several
hosts"), in the netns cluster (bench/cluster/net.py), four hosts:

  host 0  the part's primary: blkps target serve --replicas 2 --replica
          primary --lease ... --publish JOBDIR
  host 1  its backup (--replica backup), and etcd member 0
  host 2  two learners (failover_learner.py processes over the layout the
          primary published), and etcd member 1
  host 3  etcd member 2

Cases, MODE-FAULT with MODE async (learners push ones, rule sum) or bsp
(they push ones to the whole model and pull it every round):
  primary-killed  the primary's tgtd killed (kill -9)
  link-cut        host 0's link taken down (the primary, its keeper and
                  its connections cut off), until the backup took over by
                  the lease and the learners went on there; then up again:
                  the old primary's keeper finds its lease gone and ends,
                  and the old primary acknowledges nothing
  primary-frozen  the primary's tgtd stopped (SIGSTOP) until the backup took
                  over, then woken (the split-brain attempt)
and async-link-cut-back-network: link-cut with the primary's records to its
backup on a network of their own (eth1, the backup's --replication-address;
doc/replicas.md "A network for the records"): only host 0's eth0 is cut, so
the old primary still reaches its backup, which must refuse its records
once promoted; the records crossed eth1. And two async cases of
their own:
  async-backup-restarted  the backup's tgtd killed, its task started again
                  and caught up while the learners push, then the primary
                  killed: the caught-up backup takes over
  async-both-killed  both replicas' tgtds killed: each learner fails in one
                  line naming the shard and what each replica answered
  async-primary-lost-unseen  the backup's keeper, watching, stopped
                  (SIGSTOP) while the primary takes the lease and loses it
                  (its tgtd killed): it never reads the key held, and takes
                  over once it runs again (the primary's mark in etcd)

Each (but the last): the learners go on with no error (20 more rounds each
after the fault) and the backup, promoted, holds every acknowledged push exactly once
(async: the weights are the count of acknowledged pushes, as a one-process
reference has them; bsp: every pull, before and after, shows exactly the
rounds applied). Prints the time from the fault to the first round
acknowledged that began after it. Waits are for a state, with generous
deadlines; no timing is asserted.

  replica_cluster_test.py TOP BUILD CASE
"""
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import testbed

top, build, args = testbed.setup("replica_cluster_test")
sys.path.insert(0, os.path.join(top, "bench", "cluster"))
import etcd_cluster  # noqa: E402
import net  # noqa: E402

BLKPS = os.path.join(top, "scripts", "blkps")
LEARNER = os.path.join(top, "tests", "failover_learner.py")
PLUGIN = os.path.join(build, "target-plugin", "bs_blkps.so")
PRIMARY, BACKUP, LEARNERS = 0, 1, 2
ROLES = {PRIMARY: "primary", BACKUP: "backup"}
WAIT_S = 60  # for a state the test waits for: far above any failover here


def wait_for(what, condition):
    deadline = time.monotonic() + WAIT_S
    while not (value := condition()):
        testbed.check(time.monotonic() < deadline, f"not within {WAIT_S} s: {what}")
        time.sleep(0.1)
    return value


class Job:
    """A part's primary and backup, each `blkps target serve` on its host,
    with lease keepers in a three-member etcd spread over hosts 1 to 3, and
    two learners of `kind` on host 2; all ended on leaving the block."""

    def __init__(self, cluster, mode, reconnect_s=WAIT_S, back_network=False, after_backup=None):
        self.cluster, self.serves, self.learners = cluster, {}, []
        self.after_backup = after_backup  # called with the job once the backup serves
        self.back_network = back_network
        self.folder = tempfile.mkdtemp(prefix="blkps-replica-cluster-")
        try:
            self._start(mode, reconnect_s)
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise

    def _start(self, mode, reconnect_s):
        cluster = self.cluster
        self.jobdir = os.path.join(self.folder, "job")
        self.etcd = etcd_cluster.EtcdCluster(places=[(cluster.address(h), cluster.exec_argv(h, []))
                                                     for h in (1, 2, 3)])
        self.bsopts = "params=1024;rule=sum" + (";mode=bsp" if mode == "bsp" else "")
        self.serve(BACKUP)
        if self.after_backup:
            self.after_backup(self)
        self.serve(PRIMARY)
        self.acknowledged, self.failure = [0, 0], []
        self.marked, self.first_after = None, None
        self.kind = kind = "bsp" if mode == "bsp" else "push"
        self.learners = [cluster.popen(LEARNERS, [sys.executable, LEARNER, top, build, self.layout(k), kind],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                       env={**os.environ, "BLKPS_RECONNECT_SECONDS": str(reconnect_s)})
                         for k in range(2)]
        self.readers = [threading.Thread(target=self._read, args=(k,)) for k in range(2)]
        for reader in self.readers:
            reader.start()

    def serve(self, host):
        """Starts the primary's or the backup's serve task on `host`;
        returns once it serves (its stderr goes to serve-ROLE.err)."""
        role = ROLES[host]
        # the network's form: each host takes its own address on it
        back = ["--replication-address", self.cluster.back_subnet()] if self.back_network else []
        if host in self.serves:  # a task started again: the one before has ended
            self.serves[host].wait(timeout=WAIT_S)
        with open(os.path.join(self.folder, f"serve-{role}.err"), "a") as err:
            self.serves[host] = self.cluster.popen(host, [
                BLKPS, "target", "serve", "--dir", self.dir(host), "--plugin", PLUGIN, "--address",
                self.cluster.address(host), "--allow", self.cluster.subnet(), "--luns", "2", "--bsopts", self.bsopts,
                "--replicas", "2", "--replica", role, "--publish", self.jobdir, "--lease", self.etcd.endpoints, *back],
                stdout=subprocess.PIPE, stderr=err, text=True)
        line = self.serves[host].stdout.readline()
        testbed.check(line.startswith("serving "), f"the {role}'s serve ended: {self.serve_errors(host)}")

    def dir(self, host):
        return os.path.join(self.folder, f"host-{host}")

    def layout(self, k):
        return os.path.join(self.jobdir, f"slot-{k + 1}.layout")

    def serve_errors(self, host):
        with open(os.path.join(self.folder, f"serve-{ROLES[host]}.err")) as f:
            return f.read().strip()

    def _read(self, k):
        for line in self.learners[k].stdout:
            if line.startswith("ack "):
                self.acknowledged[k] += 1
                if self.marked is not None and float(line.split()[1]) > self.marked and self.first_after is None:
                    self.first_after = time.monotonic()
            else:
                self.failure.append(f"learner {k + 1}: {line.strip()}")

    def wait_for_more(self, what, rounds=20):
        at = list(self.acknowledged)
        wait_for(f"{rounds} more rounds of each learner acknowledged {what}",
                 lambda: all(a >= f + rounds for a, f in zip(self.acknowledged, at)) or self.failure)
        testbed.check(not self.failure, f"a learner failed {what}: {self.failure}")

    def blkps(self, host, *argv):
        out = subprocess.run(self.cluster.exec_argv(host, [BLKPS, *argv]), capture_output=True, text=True)
        return out.returncode, out.stdout, out.stderr

    def status(self, host):
        rc, out, err = self.blkps(host, "status", "--dir", self.dir(host), "--json")
        return json.loads(out) if rc == 0 else {}

    def tgtd_pid(self, host):
        rc, out, err = self.blkps(host, "target", "show", "--dir", self.dir(host), "--get", "PID")
        testbed.check(rc == 0, f"target show: {err.strip()}")
        return int(out)

    def stop_learners(self):
        """Ends the learners; bsp ones after the same round (failover_learner.py),
        well past any acknowledged yet."""
        last = max(self.acknowledged) + 50 if self.kind == "bsp" else None
        for p in self.learners:
            if p.poll() is None:
                try:
                    if last is not None:
                        p.stdin.write(f"{last}\n")
                    p.stdin.close()
                except BrokenPipeError:
                    pass  # it has just ended (its output says why)
        for p, reader in zip(self.learners, self.readers):
            p.wait(timeout=WAIT_S)
            reader.join()
            p.stdout.close()

    def weights(self, host):
        """The first 1024 weights the tgtd on `host` serves learners, read
        from the learners' host."""
        rc, url, err = self.blkps(host, "target", "show", "--dir", self.dir(host), "--get", "URL")
        out = subprocess.run(self.cluster.exec_argv(LEARNERS, [sys.executable, LEARNER, top, build, url.strip(), "read"]),
                             capture_output=True, text=True)
        testbed.check(out.returncode == 0, f"reading the weights of {url}: {out.stdout}{out.stderr}")
        return json.loads(out.stdout)

    def check_exactly_once(self):
        """No learner failed, and the promoted backup holds every
        acknowledged push once: what a one-process reference that applies
        each acknowledged push once holds (async learners, rule sum)."""
        testbed.check(not self.failure, f"a learner failed: {self.failure}")
        pushes = sum(self.acknowledged)
        weights = self.weights(BACKUP)
        testbed.check(weights[:128] == [pushes] * 128 and weights[128:] == [0] * 896,
                      f"{pushes} pushes acknowledged, the promoted backup holds {sorted(set(weights[:128]))} "
                      f"and {sorted(set(weights[128:]))} beyond")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        """Ends the learners, then each serve (SIGTERM: it stops its tgtd
        and keeper), then etcd; prints the serves' output, and their
        keepers' and tgtds' logs, on a failure."""
        for p in self.learners:
            if p.poll() is None:
                p.kill()
        for serve in self.serves.values():
            if serve.poll() is None:
                serve.send_signal(signal.SIGTERM)
        for host, serve in self.serves.items():
            try:
                serve.wait(timeout=WAIT_S)
            except subprocess.TimeoutExpired:
                serve.kill()
            if exc and exc[0] is not None:
                print(f"---- serve on host {host}:\n{self.serve_errors(host)}", flush=True)
                for name, lines in (("lease.log", 20), ("tgtd.log", 15)):  # what its keeper and tgtd said
                    path = os.path.join(self.dir(host), name)
                    if os.path.exists(path):
                        with open(path, errors="replace") as f:
                            tail = f.read().splitlines()[-lines:]
                        print(f"---- {path} (last {len(tail)} lines)\n" + "\n".join(tail), flush=True)
        if hasattr(self, "etcd"):
            self.etcd.stop()
        subprocess.run(["rm", "-rf", self.folder])


def link(job, state):
    subprocess.run(["ip", "-n", job.cluster.netns(PRIMARY), "link", "set", "eth0", state], check=True)


def mend_link(job, pid):
    link(job, "up")
    with open(os.path.join(job.dir(PRIMARY), "lease.log")) as f:
        wait_for("the old primary's keeper says its lease is lost", lambda: "lost the lease" in f.read())


# Each fault: how it strikes the primary (its tgtd's pid), and how it ends:
# at the backup's takeover, or once the learners went on without the primary.
FAULTS = {"primary-killed": (lambda job, pid: os.kill(pid, signal.SIGKILL), None, None),
          "link-cut": (lambda job, pid: link(job, "down"), None, mend_link),
          "primary-frozen": (lambda job, pid: os.kill(pid, signal.SIGSTOP),
                             lambda job, pid: os.kill(pid, signal.SIGCONT), None)}


def run(mode, fault, back_network=False):
    strike, at_takeover, at_end = FAULTS[fault]
    with net.Cluster(4, "none", back_network=back_network) as cluster, \
            Job(cluster, mode, back_network=back_network) as job:
        pid = job.tgtd_pid(PRIMARY)
        job.wait_for_more("by the primary")
        if back_network:  # 20 rounds of 2 learners, each record 128 weights and more
            sent = {dev: cluster.wire_bytes(PRIMARY, dev)[0] for dev in ("eth0", "eth1")}
            testbed.check(sent["eth1"] > 40 * 512, f"the records did not cross the back network: sent {sent}")
        try:
            strike(job, pid)
            job.marked = time.monotonic()  # a round begun from here on is the backup's
            try:
                wait_for("the backup took over", lambda: job.status(BACKUP).get("replica") == "primary")
            finally:
                if at_takeover:
                    at_takeover(job, pid)
            job.wait_for_more("after the fault")
        finally:
            if at_end:
                at_end(job, pid)
        job.stop_learners()
        testbed.check(not job.failure, f"a learner failed: {job.failure}")
        print(f"rounds of each learner: {job.acknowledged}")
        print(f"the first push acknowledged after the fault: {job.first_after - job.marked:.2f} s after it")
        if mode == "async":
            job.check_exactly_once()


def backup_restarted():
    """The backup's tgtd killed while the learners push: the primary goes
    on alone (its keeper declares the backup outdated); the backup's task
    started again takes the address its primary replicates to and is
    caught up while the learners push; then the primary killed: the
    caught-up backup takes over and holds every acknowledged push once."""
    with net.Cluster(4, "none") as cluster, Job(cluster, "async") as job:
        job.wait_for_more("by the primary")
        os.kill(job.tgtd_pid(BACKUP), signal.SIGKILL)
        wait_for("the backup declared outdated", lambda: job.status(PRIMARY).get("backup", "").startswith("outdated: "))
        job.wait_for_more("by the primary alone")
        restarted = time.monotonic()
        job.serve(BACKUP)
        wait_for("the backup caught up", lambda: job.status(PRIMARY).get("backup") == "")
        print(f"the backup was in sync {time.monotonic() - restarted:.2f} s after the restart began")
        job.wait_for_more("after the catch-up")
        with open(os.path.join(job.dir(PRIMARY), "lease.log")) as f:
            wait_for("the primary's keeper removed the outdated mark", lambda: "the backup caught up" in f.read())
        os.kill(job.tgtd_pid(PRIMARY), signal.SIGKILL)
        job.marked = time.monotonic()
        wait_for("the caught-up backup took over", lambda: job.status(BACKUP).get("replica") == "primary")
        job.wait_for_more("after the failover")
        job.stop_learners()
        job.check_exactly_once()
        print(f"the first push acknowledged after the fault: {job.first_after - job.marked:.2f} s after it")


def keeper_pid(job, host):
    with open(os.path.join(job.dir(host), "lease.pid")) as f:
        return int(f.read())


def primary_lost_unseen():
    """The backup's keeper watches from before the primary takes the lease,
    but is stopped while the primary takes it and loses it: it never reads
    the key held. Once it runs again it must take over."""
    stopped = []

    def stop_keeper(job):
        stopped.append(keeper_pid(job, BACKUP))
        os.kill(stopped[0], signal.SIGSTOP)

    def resume_keeper():
        while stopped:  # a failure before the resume must not leave it stopped
            os.kill(stopped.pop(), signal.SIGCONT)

    with contextlib.ExitStack() as ending:
        ending.callback(resume_keeper)  # last: after the job's end has asked it to stop
        cluster = ending.enter_context(net.Cluster(4, "none"))
        job = ending.enter_context(Job(cluster, "async", after_backup=stop_keeper))
        job.wait_for_more("by the primary")
        os.kill(job.tgtd_pid(PRIMARY), signal.SIGKILL)
        job.marked = time.monotonic()
        # the primary's task ends once its keeper has given the lease up
        wait_for("the primary's serve ended", lambda: job.serves[PRIMARY].poll() is not None)
        resume_keeper()
        wait_for("the backup took over", lambda: job.status(BACKUP).get("replica") == "primary")
        with open(os.path.join(job.dir(BACKUP), "lease.log")) as f:
            said = f.read()
        testbed.check("taken and lost between two reads" in said, f"the backup's keeper said: {said}")
        job.wait_for_more("after the fault")
        job.stop_learners()
        job.check_exactly_once()
        print(f"the first push acknowledged after the fault: {job.first_after - job.marked:.2f} s after it")


def both_killed():
    """Both replicas' tgtds killed: each learner fails in one line that
    names the shard (its layout file and line) and what each replica
    answered, once its reconnect deadline passed."""
    with net.Cluster(4, "none") as cluster, Job(cluster, "async", reconnect_s=5) as job:
        job.wait_for_more("by the primary")
        for host in (PRIMARY, BACKUP):
            os.kill(job.tgtd_pid(host), signal.SIGKILL)
        for p in job.learners:
            p.wait(timeout=WAIT_S)
        for reader in job.readers:
            reader.join()
        testbed.check(len(job.failure) == 2, f"expected both learners to fail, got {job.failure}")
        for k in range(2):
            line = next(f for f in job.failure if f.startswith(f"learner {k + 1}: "))
            testbed.check(f"{job.layout(k)}:4: shard 0" in line and cluster.address(PRIMARY) in line
                          and cluster.address(BACKUP) in line, f"the failure does not name the shard: {line}")


testbed.run({**{f"{mode}-{fault}": (lambda mode=mode, fault=fault: run(mode, fault))
                for mode in ("async", "bsp") for fault in FAULTS},
             "async-link-cut-back-network": lambda: run("async", "link-cut", back_network=True),
             "async-backup-restarted": backup_restarted, "async-both-killed": both_killed,
             "async-primary-lost-unseen": primary_lost_unseen}, None)
print(f"replica_cluster_test {args[0]}: ok")
