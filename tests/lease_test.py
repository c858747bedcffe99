#!/usr/bin/python3
"""Failover by a lease (doc/replicas.md "Failover by a lease"), end to
end: `blkps target start --tgtd 1 --replicas 2 --lease ...` against a
private three-member etcd (etcd_cluster.py), real tgtds on loopback,
pushes written through libblkps.

Cases:
  primary-killed-backup-takes-over   kill -9 of the primary's tgtd: the
      backup becomes primary (status, its keeper's log) and takes pushes.
  stopped-keeper-fences-primary      the primary's keeper SIGSTOPped (the
      split-brain attempt): the old primary refuses pushes once its
      deadline passed, and the backup takes over.
  etcd-member-killed-lease-held      kill -9 of etcd's leader: the
      primary's lease is renewed after it and nothing fails over.
  learner-follows-the-lease          two learners pushing through libblkps
      over the layouts `target start` wrote (doc/replicas.md "Learners
      follow a failover") while the primary's tgtd is killed: the backup
      takes over by the lease, the learners follow it with no error, and
      the backup holds every acknowledged push exactly once.
  learner-follows-past-a-frozen-primary   the same while the primary's
      tgtd is stopped (SIGSTOP) until the backup took over by the lease,
      then woken: the learners follow and every acknowledged push is held
      exactly once.
  learner-follows-past-a-silent-primary   the same while the primary's
      tgtd stays stopped (as a host cut off looks to the learner).
  backup-killed-training-goes-on     kill -9 of the backup's tgtd while two
      learners push: the primary's keeper records the backup as outdated in
      etcd, the primary goes on alone, and holds every acknowledged push
      exactly once.
  outdated-backup-never-promoted     the backup stopped (SIGSTOP) while the
      learners push, so it misses pushes; then the primary killed: the
      backup's keeper refuses to take over (etcd says it is outdated).
  bsp-learners-follow-exactly      two bsp learners, each pushing ones to
      the whole model and pulling every round, while the primary is
      killed: the backup, whose clocks and accumulator are the primary's,
      takes over and every pull before and after shows exactly the
      rounds applied (no gradient lost or counted twice in a round).
  ssp-learners-follow-exactly      the same in ssp:1 (each push applied as
      it comes, reads gated by the clocks): the learners follow with no
      error, and the backup holds every acknowledged push exactly once.
  restarted-backup-catches-up-and-takes-over   kill -9 of the backup while
      two learners push; `blkps target restart` starts it and its keeper
      again; the primary catches it up while the learners go on, its
      keeper removes the outdated mark, and a kill -9 of the primary then
      fails over to it with every acknowledged push held exactly once.
  dead-primary-returns-as-backup   kill -9 of the primary while two
      learners push; the backup takes over by the lease; `blkps target
      restart` starts the dead one again as the backup of the promoted one,
      which catches it up while the learners go on; a kill -9 of the
      promoted one then fails over to the returned one, which holds every
      acknowledged push exactly once.
  keeper-started-after-the-primary-died   the backup's keeper killed, then
      the primary's tgtd: the backup's keeper, started again as `blkps
      target restart` starts a caught-up backup's, never sees the lease
      held, and takes over (its target's primary took the key before it
      started).

Waits are for a state (status, a log line) with generous deadlines; no
timing is asserted.
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import testbed

top, build, args = testbed.setup("lease_test")
import blkps  # noqa: E402  (this checkout's package, this build's library)
import etcd_cluster  # noqa: E402
import failover_learner  # noqa: E402
import numpy as np  # noqa: E402
sys.path.insert(0, os.path.join(top, "scripts"))
from blkps_cli import lease, processes  # noqa: E402

BLKPS = os.path.join(top, "scripts", "blkps")
PLUGIN = os.path.join(build, "target-plugin", "bs_blkps.so")
TTL = 2
WAIT_S = 60  # for a state the test waits for: far above any failover here


def blkps_cli(*argv):
    """Runs `blkps ARGV`: (exit status, stdout, stderr)."""
    out = subprocess.run([BLKPS, *argv], capture_output=True, text=True)
    return out.returncode, out.stdout, out.stderr


def status(folder):
    rc, out, err = blkps_cli("status", "--dir", folder, "--json")
    testbed.check(rc == 0, f"blkps status --dir {folder}: {err.strip()}")
    return json.loads(out)


def wait_for(what, condition):
    """Returns condition()'s first true value, asked until WAIT_S passed."""
    deadline = time.monotonic() + WAIT_S
    while True:
        value = condition()
        if value:
            return value
        testbed.check(time.monotonic() < deadline, f"not within {WAIT_S} s: {what}")
        time.sleep(0.1)


def log_of(folder):
    with open(os.path.join(folder, "lease.log")) as f:
        return f.read()


def keeper_pid(folder):
    with open(os.path.join(folder, "lease.pid")) as f:
        return int(f.read())


class LeasedTarget:
    """A target with a backup and leases in `cluster`, stopped on leaving
    the block (also on failure)."""

    def __init__(self, cluster, bsopts="params=1024;rule=sum"):
        self.dir = tempfile.mkdtemp(prefix="blkps-lease-test-")
        self.backup = os.path.join(self.dir, "backup")
        rc, _, err = blkps_cli("target", "start", "--dir", self.dir, "--plugin", PLUGIN, "--owner-pid",
                               str(os.getpid()), "--tgtd", "1", "--replicas", "2", "--lease", cluster.endpoints,
                               "--lease-ttl", str(TTL), "--luns", "2", "--bsopts", bsopts)
        if rc != 0:
            self.__exit__()
            testbed.fail(f"target start: {err.strip()}")
        self.models = {}

    def url(self, folder):
        rc, out, err = blkps_cli("target", "show", "--dir", folder, "--get", "URL")
        testbed.check(rc == 0, f"target show --dir {folder}: {err.strip()}")
        return out.strip()

    def push(self, folder):
        """Pushes ones to parameters 0..127 through the learner LUN of the
        tgtd in `folder`: None if acknowledged, else the error's text."""
        if folder not in self.models:
            self.models[folder] = blkps.Model(self.url(folder))
        try:
            self.models[folder].write_bytes(0, b"\x00\x00\x80\x3f" * 128)
            return None
        except OSError as e:
            return str(e)

    def __enter__(self):
        return self

    def print_logs(self, lines=40):
        """The last lines of both servers' logs, for a failure's reader."""
        for folder in (self.dir, self.backup):
            for name in ("tgtd.log", "lease.log"):
                try:
                    with open(os.path.join(folder, name)) as f:
                        tail = f.readlines()[-lines:]
                except OSError:
                    continue
                print(f"---- {os.path.join(folder, name)} (last {len(tail)} lines)", flush=True)
                print("".join(tail), end="", flush=True)

    def __exit__(self, *exc):
        if exc and exc[0] is not None:
            self.print_logs()
        for model in getattr(self, "models", {}).values():
            model.close()
        for folder in (self.backup, self.dir):  # a keeper this test stopped must run to end
            try:
                os.kill(keeper_pid(folder), signal.SIGCONT)
            except (OSError, ValueError):
                pass
        blkps_cli("target", "stop", "--dir", self.dir, "--no-checkpoint")
        subprocess.run(["rm", "-rf", self.dir])


def test_primary_killed_backup_takes_over():
    with etcd_cluster.EtcdCluster() as cluster, LeasedTarget(cluster) as t:
        testbed.check(t.push(t.dir) is None, "a push to the primary failed before any fault")
        testbed.check(status(t.backup)["replica"] == "backup", "the backup is not on standby at the start")
        rc, pid, _ = blkps_cli("target", "show", "--dir", t.dir, "--get", "PID")
        os.kill(int(pid), signal.SIGKILL)
        wait_for("the backup's status says primary", lambda: status(t.backup)["replica"] == "primary")
        took_over = re.compile(r"became primary: the lease of .* lapsed \([0-9.]+ s after")
        line = wait_for("the backup's keeper logs its takeover", lambda: took_over.search(log_of(t.backup)))
        testbed.check(t.push(t.backup) is None, f"the new primary refused a push after: {line.group(0)}")
        testbed.check(status(t.backup)["lease"].startswith("held: "), "the new primary holds no lease")


def test_stopped_keeper_fences_primary():
    with etcd_cluster.EtcdCluster() as cluster, LeasedTarget(cluster) as t:
        testbed.check(t.push(t.dir) is None, "a push to the primary failed before any fault")
        os.kill(keeper_pid(t.dir), signal.SIGSTOP)
        refusal = wait_for("the old primary refuses pushes", lambda: t.push(t.dir))
        # NOT READY, TARGET PORT IN STANDBY STATE: "use another path".
        testbed.check("(asc/ascq 0x040b)" in refusal, f"the refusal is not the standby sense: {refusal}")
        testbed.check(status(t.dir)["lease"].startswith("lapsed "), f"status: {status(t.dir)['lease']!r}")
        wait_for("the backup's status says primary", lambda: status(t.backup)["replica"] == "primary")
        testbed.check(t.push(t.dir) is not None, "the old primary took a push after the backup took over")
        testbed.check(t.push(t.backup) is None, "the new primary refused a push")


def etcd_leader(cluster):
    """The index of the member that leads the cluster now."""
    for k, url in enumerate(cluster.clients):
        request = urllib.request.Request(url + "/v3/maintenance/status", data=b"{}")
        with urllib.request.urlopen(request, timeout=5) as answer:
            s = json.loads(answer.read())
        if s.get("leader") == s["header"]["member_id"]:
            return k
    testbed.fail("no etcd member says it leads")


def test_etcd_member_killed_lease_held():
    with etcd_cluster.EtcdCluster() as cluster, LeasedTarget(cluster) as t:
        cluster.kill(etcd_leader(cluster))
        killed = time.monotonic()

        def renewed_since_kill():
            # "held: S s left": a deadline of renewal-send + 3/4 TTL later
            # than killed + 3/4 TTL says etcd confirmed a renewal sent after it.
            asked = time.monotonic()
            held = re.match(r"held: ([0-9.]+) s left", status(t.dir)["lease"])
            return held and asked + float(held.group(1)) > killed + TTL * 3 / 4
        wait_for("a renewal of the primary's lease after the kill", renewed_since_kill)
        testbed.check(status(t.backup)["replica"] == "backup", "the backup took over")
        testbed.check(t.push(t.dir) is None, "the primary refused a push")
        testbed.check("became primary" not in log_of(t.backup), f"backup's keeper: {log_of(t.backup)}")


class Learners:
    """Two learners of `kind` (failover_learner.py) training through their
    layouts of target `t`, in threads, from entering the block to leaving
    it: `acknowledged` counts each one's acknowledged rounds, `failure`
    their errors (a failure stops both), `first_after` the time of the
    first round acknowledged that began after `mark()`."""

    def __init__(self, t, kind="push"):
        self.t, self.kind = t, kind
        self.acknowledged = [0, 0]
        self.failure = []
        self.marked, self.first_after = None, None
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._train, args=(k,)) for k in range(2)]

    def _train(self, k):
        try:
            with blkps.Model("layout:" + os.path.join(self.t.dir, f"slot-{k + 1}.layout")) as m:
                why = failover_learner.train(m, self.kind, lambda: self._stop.is_set() or self.failure,
                                             lambda began: self._acknowledged(k, began))
        except OSError as e:  # the open
            why = str(e)
        if why:
            self.failure.append(f"learner {k + 1}: {why}")

    def _acknowledged(self, k, began):
        """Learner k's push (round) begun at `began` was acknowledged."""
        self.acknowledged[k] += 1
        if self.marked is not None and began > self.marked and self.first_after is None:
            self.first_after = time.monotonic()

    def mark(self):
        self.marked = time.monotonic()

    def wait_for_more(self, what, pushes=20):
        """Waits until each learner had `pushes` more acknowledged (or one failed)."""
        at = list(self.acknowledged)
        wait_for(f"{pushes} more pushes of each learner acknowledged {what}",
                 lambda: all(a >= f + pushes for a, f in zip(self.acknowledged, at)) or self.failure)

    def __enter__(self):
        os.environ["BLKPS_RECONNECT_SECONDS"] = str(WAIT_S)
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        for thread in self._threads:
            thread.join()
        del os.environ["BLKPS_RECONNECT_SECONDS"]

    def check_exactly_once(self, folder):
        """No learner failed, and the tgtd in `folder` holds every
        acknowledged push exactly once."""
        testbed.check(not self.failure, f"a learner failed: {self.failure}")
        with blkps.Model(self.t.url(folder)) as reader:
            weights = reader.pull(0, 1024)
        expected = np.zeros(1024, dtype=np.float32)
        expected[:128] = sum(self.acknowledged)
        testbed.check(np.array_equal(weights, expected),
                      f"{sum(self.acknowledged)} pushes acknowledged, but {folder}'s weights 0..127 are "
                      f"{sorted(set(weights[:128].tolist()))} and 128.. are {sorted(set(weights[128:].tolist()))}")


def round_learners_follow_exactly(mode):
    """Two learners pushing and pulling every round in `mode` while the primary is killed."""
    bsp = mode == "bsp"
    with etcd_cluster.EtcdCluster() as cluster, LeasedTarget(cluster, "params=1024;rule=sum;mode=" + mode) as t:
        with Learners(t, "bsp" if bsp else "ssp") as learners:
            learners.wait_for_more("by the primary")
            pid = primary_pid(t)
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + WAIT_S
            while processes.running(pid):  # polled closely: the time is counted from here
                testbed.check(time.monotonic() < deadline, "the primary's tgtd outlived kill -9")
                time.sleep(0.001)
            learners.mark()  # a round begun from here on is the backup's
            wait_for("the backup took over", lambda: status(t.backup)["replica"] == "primary")
            learners.wait_for_more("after the failover")
        testbed.check(not learners.failure, f"a learner failed: {learners.failure}")
        print(f"rounds of each learner: {learners.acknowledged}")
        print(f"the first push acknowledged after the fault: {learners.first_after - learners.marked:.2f} s after it")
        if not bsp:  # each push applied as it came: the sum of them all
            with blkps.Model(t.url(t.backup)) as reader:
                weights = reader.pull(0, 1024)
            pushes = sum(learners.acknowledged)
            testbed.check(np.all(weights == np.float32(pushes)),
                          f"{pushes} pushes acknowledged, the backup holds {sorted(set(weights.tolist()))[:4]}")


def test_bsp_learners_follow_exactly():
    round_learners_follow_exactly("bsp")


def test_ssp_learners_follow_exactly():
    round_learners_follow_exactly("ssp:1")


def learner_follows_through(fault, repair=lambda t, pid: None):
    """Two learners push through their layouts while fault(t, pid) strikes
    the primary (its tgtd's pid): the backup takes over by the lease, the
    learners follow it with no error, and the backup holds every
    acknowledged push exactly once. repair(t, pid) runs once each learner
    had 20 more pushes acknowledged after the fault (or the test failed).
    Prints the time from the fault to the first push acknowledged after it."""
    with etcd_cluster.EtcdCluster() as cluster, LeasedTarget(cluster) as t:
        pid = primary_pid(t)
        with Learners(t) as learners:
            learners.wait_for_more("by the primary")
            try:
                learners.mark()
                fault(t, pid)
                learners.wait_for_more("after the fault")
            finally:
                repair(t, pid)
        testbed.check(not learners.failure, f"a learner failed: {learners.failure}")
        print(f"the first push acknowledged after the fault: {learners.first_after - learners.marked:.2f} s after it")
        learners.check_exactly_once(t.backup)


def test_backup_killed_training_goes_on():
    with etcd_cluster.EtcdCluster() as cluster, LeasedTarget(cluster) as t:
        with Learners(t) as learners:
            learners.wait_for_more("by the primary")
            os.kill(backup_pid(t), signal.SIGKILL)
            learners.wait_for_more("after the backup's kill")
        learners.check_exactly_once(t.dir)
        testbed.check(status(t.dir)["backup"].startswith("outdated: "), f"primary: {status(t.dir)['backup']!r}")
        testbed.check("declared the backup outdated" in log_of(t.dir), f"primary's keeper: {log_of(t.dir)}")


def test_outdated_backup_never_promoted():
    with etcd_cluster.EtcdCluster() as cluster, LeasedTarget(cluster) as t:
        backup = backup_pid(t)
        try:
            with Learners(t) as learners:
                learners.wait_for_more("by the primary")
                # The backup alive but answering nothing (its host cut off
                # from the primary): it misses the pushes from here on.
                os.kill(backup, signal.SIGSTOP)
                learners.wait_for_more("while the backup is stopped")
                # Those pushes were acknowledged only once the primary had
                # the verdict: the backup stopped, lost and marked outdated.
                with open(f"/proc/{backup}/stat") as f:
                    stat_fields = f.read().rsplit(")", 1)[1].split()
                testbed.check(stat_fields[0] == "T", f"the backup's tgtd ({backup}) is in state {stat_fields[0]}, "
                                                     "not stopped")
                testbed.check(status(t.dir)["backup"].startswith("outdated: "),
                              f"the primary acknowledged pushes while its backup was stopped, but its status "
                              f"says backup {status(t.dir)['backup']!r}")
            learners.check_exactly_once(t.dir)
            os.kill(primary_pid(t), signal.SIGKILL)
            wait_for("the backup's keeper refuses to take over",
                     lambda: "but etcd says this backup missed acknowledged pushes" in log_of(t.backup))
        finally:
            os.kill(backup, signal.SIGCONT)
        testbed.check(status(t.backup)["replica"] == "backup", "the outdated backup was promoted")
        testbed.check("became primary" not in log_of(t.backup), f"backup's keeper: {log_of(t.backup)}")


def test_restarted_backup_catches_up_and_takes_over():
    with etcd_cluster.EtcdCluster() as cluster, LeasedTarget(cluster) as t:
        with Learners(t) as learners:
            learners.wait_for_more("by the primary")
            os.kill(backup_pid(t), signal.SIGKILL)
            wait_for("the backup declared outdated", lambda: status(t.dir)["backup"].startswith("outdated: "))
            learners.wait_for_more("by the primary alone")
            restarted = time.monotonic()
            rc, out, err = blkps_cli("target", "restart", "--dir", t.dir)
            testbed.check(rc == 0 and "restarted the backup" in out, f"target restart: {out}{err}")
            wait_for("the backup caught up", lambda: status(t.dir)["backup"] == "")
            print(f"the backup was in sync {time.monotonic() - restarted:.2f} s after the restart began")
            wait_for("the primary's keeper removed the outdated mark", lambda: "the backup caught up" in log_of(t.dir))
            learners.wait_for_more("after the catch-up")
            pid = primary_pid(t)
            learners.mark()
            os.kill(pid, signal.SIGKILL)
            wait_for("the caught-up backup took over", lambda: status(t.backup)["replica"] == "primary")
            learners.wait_for_more("after the failover")
        learners.check_exactly_once(t.backup)
        print(f"the first push acknowledged after the fault: {learners.first_after - learners.marked:.2f} s after it")


def test_dead_primary_returns_as_backup():
    with etcd_cluster.EtcdCluster() as cluster, LeasedTarget(cluster) as t:
        with Learners(t) as learners:
            learners.wait_for_more("by the primary")
            os.kill(primary_pid(t), signal.SIGKILL)
            wait_for("the backup took over", lambda: status(t.backup)["replica"] == "primary")
            testbed.check(status(t.backup)["backup"].startswith("outdated: none since"),
                          f"the promoted backup: {status(t.backup)['backup']!r}")
            learners.wait_for_more("by the promoted backup")
            restarted = time.monotonic()
            rc, out, err = blkps_cli("target", "restart", "--dir", t.dir)
            testbed.check(rc == 0 and "as the backup of the promoted one" in out, f"target restart: {out}{err}")
            print(f"the returned primary was in sync {time.monotonic() - restarted:.2f} s after the restart began")
            testbed.check(status(t.backup)["backup"] == "", f"the promoted one's backup: {status(t.backup)['backup']}")
            testbed.check(status(t.dir)["replica"] == "backup", f"the returned one: {status(t.dir)['replica']}")
            learners.wait_for_more("after the catch-up")
            learners.mark()
            os.kill(tgtd_pid(t.backup), signal.SIGKILL)
            wait_for("the returned one took over", lambda: status(t.dir)["replica"] == "primary")
            learners.wait_for_more("after the second failover")
        learners.check_exactly_once(t.dir)
        print(f"the first push acknowledged after the fault: {learners.first_after - learners.marked:.2f} s after it")


def test_keeper_started_after_the_primary_died():
    """The backup's keeper dies (kill -9) while its tgtd stays in sync; the
    primary's tgtd is killed, so its keeper gives the lease up; the backup's
    keeper is then started again as `blkps target restart` starts a
    caught-up backup's (lease.restart_keeper): it never saw the lease held,
    yet it must take over (its target's primary took the key before it
    started)."""
    with etcd_cluster.EtcdCluster() as cluster, LeasedTarget(cluster) as t:
        testbed.check(t.push(t.dir) is None, "a push to the primary failed before any fault")
        keeper = keeper_pid(t.backup)
        os.kill(keeper, signal.SIGKILL)
        wait_for("the backup's keeper ended", lambda: not processes.running(keeper))
        primary_keeper = keeper_pid(t.dir)
        os.kill(primary_pid(t), signal.SIGKILL)
        wait_for("the primary's keeper gave the lease up", lambda: not processes.running(primary_keeper))
        testbed.check(status(t.backup)["replica"] == "backup", "the backup was promoted with no keeper")
        testbed.check(lease.restart_keeper(t.dir, t.backup, caught_up=True), "the target kept no lease options")
        wait_for("the backup's status says primary", lambda: status(t.backup)["replica"] == "primary")
        said = log_of(t.backup)
        testbed.check("it was lost before this keeper began to watch" in said, f"the backup's keeper said: {said}")
        testbed.check(t.push(t.backup) is None, "the new primary refused a push")


def tgtd_pid(folder):
    rc, pid, err = blkps_cli("target", "show", "--dir", folder, "--get", "PID")
    testbed.check(rc == 0, f"target show: {err.strip()}")
    return int(pid)


def primary_pid(t):
    return tgtd_pid(t.dir)


def backup_pid(t):
    return tgtd_pid(t.backup)


def test_learner_follows_the_lease():
    def kill(t, pid):
        os.kill(pid, signal.SIGKILL)
        wait_for("the backup's status says primary", lambda: status(t.backup)["replica"] == "primary")
    learner_follows_through(kill)


def test_learner_follows_past_a_frozen_primary():
    def freeze(t, pid):
        # The primary's tgtd stopped past its lease: the backup takes over;
        # woken, the old primary must refuse what it received meanwhile.
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_for("the backup's status says primary", lambda: status(t.backup)["replica"] == "primary")
        finally:
            os.kill(pid, signal.SIGCONT)
    learner_follows_through(freeze)


def test_learner_follows_past_a_silent_primary():
    # The primary's tgtd stopped for good (as a host cut off looks to the
    # learner: its connection stays up and nothing answers): the learner
    # leaves it after kReplicaSilenceSeconds and follows the backup.
    def freeze(t, pid):
        os.kill(pid, signal.SIGSTOP)

    def wake(t, pid):
        os.kill(pid, signal.SIGCONT)
    learner_follows_through(freeze, wake)


testbed.run({"primary-killed-backup-takes-over": test_primary_killed_backup_takes_over,
             "stopped-keeper-fences-primary": test_stopped_keeper_fences_primary,
             "etcd-member-killed-lease-held": test_etcd_member_killed_lease_held,
             "learner-follows-the-lease": test_learner_follows_the_lease,
             "learner-follows-past-a-frozen-primary": test_learner_follows_past_a_frozen_primary,
             "learner-follows-past-a-silent-primary": test_learner_follows_past_a_silent_primary,
             "backup-killed-training-goes-on": test_backup_killed_training_goes_on,
             "outdated-backup-never-promoted": test_outdated_backup_never_promoted,
             "bsp-learners-follow-exactly": test_bsp_learners_follow_exactly,
             "ssp-learners-follow-exactly": test_ssp_learners_follow_exactly,
             "restarted-backup-catches-up-and-takes-over": test_restarted_backup_catches_up_and_takes_over,
             "dead-primary-returns-as-backup": test_dead_primary_returns_as_backup,
             "keeper-started-after-the-primary-died": test_keeper_started_after_the_primary_died}, None)
print(f"lease_test {args[0]}: ok")
