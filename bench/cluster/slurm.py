"""A real Slurm cluster out of network namespaces (Debian 12's Slurm 22.05):
munged, slurmctld, and one slurmd per node host, on the hosts of
bench/cluster/net.py.

  with SlurmCluster(nodes=4, folder=tmp) as slurm:
      job = slurm.sbatch(["-N2", "--wrap", "srun hostname"])
      slurm.wait_job(job, timeout=60)        # -> "COMPLETED"
      slurm.leftovers()                      # {} when every node is clean

Host 0 is the controller (hostname `ctl`): munged and `slurmctld -i` run
there, and the client commands (sbatch, scontrol, sinfo) run in its
namespace. Hosts 1..N are nodes n1..nN.

Arrangement: one slurmd per node, each in its node's network namespace inside
a UTS namespace whose hostname is the node's name, with
`ProctrackType=proctrack/linuxproc` (a process tree, no cgroup tree per node)
and `TaskPlugin=task/none`. Debian's slurmd is built for one node per
machine; a UTS namespace per node gives each its own name without the
multiple-slurmd build, and its own address makes `srun` reach it as a real
host would. See DESIGN.md, "A Slurm cluster out of network namespaces".

Each slurmd and slurmctld also has a mount namespace whose /etc/hosts is the
cluster's (every node's name and address), so that a job step resolves the
node names (`blkps target serve --allow slurm`) as on a real cluster.

Every daemon's state sits under `folder` (key, socket, spool, pid, log):
nothing is written to /etc or /var. munged runs as user munge; the Slurm
daemons run as root (SlurmUser=root).

Contract: leaving the with-block (also on an exception) ends every process
still running in the cluster's namespaces, by its pid (the daemons and any
job step they left), then deletes the namespaces; nothing is left behind.
"""

import os
import pwd
import signal
import subprocess
import time

import net

CONTROLLER = 0
# The daemons log to their files under the folder, not to the caller's terminal.
QUIET = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
TERMINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                   "BOOT_FAIL", "DEADLINE"}


class SlurmError(RuntimeError):
    pass


class SlurmCluster:
    def __init__(self, nodes, folder, link="none"):
        """nodes >= 1 Slurm nodes n1..nNODES; folder an empty private folder
        for the daemons' files; link as in net.Cluster."""
        self.nodes, self.folder = nodes, os.path.abspath(folder)
        self.net = net.Cluster(hosts=nodes + 1, link=link)
        self.conf = os.path.join(self.folder, "slurm.conf")
        self.munge_socket = os.path.join(self.folder, "munge", "munge.socket")
        self.hosts_file = os.path.join(self.folder, "hosts")

    # --- names ---------------------------------------------------------------

    def node_names(self):
        return [f"n{i}" for i in range(1, self.nodes + 1)]

    def node_host(self, name):
        """The net.Cluster host of node `name` ('n2' -> 2)."""
        return int(name[1:])

    def env(self):
        return {**os.environ, "SLURM_CONF": self.conf}

    # --- set-up and tear-down ----------------------------------------------

    def __enter__(self):
        self.net.__enter__()
        try:
            self._write_files()
            self._start_munged()
            self._start_slurmctld()
            for name in self.node_names():
                self._start_slurmd(name)
            self._wait_nodes_idle(timeout=60)
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc_info):
        self.down()

    def down(self):
        """Ends every process in the cluster's namespaces (the daemons first,
        through net.Cluster, then any job step left), deletes them. Safe twice."""
        for ns in list(self.net.namespaces):
            for pid in _netns_pids(ns):
                _kill(pid, signal.SIGKILL)
        self.net.down()

    def _write_files(self):
        munge = pwd.getpwnam("munge")
        munge_dir = os.path.dirname(self.munge_socket)
        os.makedirs(munge_dir)
        os.chmod(munge_dir, 0o755)  # munged: the socket's folder must be searchable by all
        key = os.path.join(munge_dir, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        for path in (munge_dir, key):
            os.chown(path, munge.pw_uid, munge.pw_gid)
        os.makedirs(os.path.join(self.folder, "ctl", "state"))
        for name in self.node_names():
            os.makedirs(os.path.join(self.folder, name, "spool"))
        d = self.folder
        lines = [
            "ClusterName=blkps",
            f"SlurmctldHost=ctl({self.net.address(CONTROLLER)})",
            "SlurmUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={d}/ctl/state",
            f"SlurmctldPidFile={d}/ctl/slurmctld.pid",
            f"SlurmctldLogFile={d}/ctl/slurmctld.log",
            # %n: the node's name, so that the slurmds share no file.
            f"SlurmdSpoolDir={d}/%n/spool",
            f"SlurmdPidFile={d}/%n/slurmd.pid",
            f"SlurmdLogFile={d}/%n/slurmd.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/linear",
            "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none",
            "MpiDefault=none",
            "ReturnToService=2",
            "KillWait=10",
        ]
        for name in self.node_names():
            lines.append(f"NodeName={name} NodeAddr={self.net.address(self.node_host(name))} CPUs=1 State=UNKNOWN")
        lines.append(f"PartitionName=all Nodes={','.join(self.node_names())} Default=YES MaxTime=INFINITE State=UP")
        # The nodes' /etc/hosts (bound over the machine's in each daemon's
        # mount namespace): job steps resolve the node names, as on a cluster.
        with open(self.hosts_file, "w") as f:
            f.write("127.0.0.1 localhost\n")
            f.write(f"{self.net.address(CONTROLLER)} ctl\n")
            f.writelines(f"{self.net.address(self.node_host(n))} {n}\n" for n in self.node_names())
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")
        # Without a cgroup.conf slurmd stops ("No filesystem mounted on
        # /sys/fs/cgroup"); 22.05 does not accept a disabled plugin.
        with open(os.path.join(self.folder, "cgroup.conf"), "w") as f:
            f.write("CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nCgroupAutomount=no\n")

    def _start_munged(self):
        m = os.path.dirname(self.munge_socket)
        self.net.popen(CONTROLLER, [
            "runuser", "-u", "munge", "--", "munged", "--foreground", f"--key-file={m}/munge.key",
            f"--socket={self.munge_socket}", f"--pid-file={m}/munged.pid", f"--log-file={m}/munged.log",
            f"--seed-file={m}/munged.seed"
        ], **QUIET)
        until(lambda: os.path.exists(self.munge_socket), 20, "munged made no socket: see " + m + "/munged.log")

    def _start_slurmctld(self):
        self.net.popen(CONTROLLER, ["unshare", "--uts", "--mount", "sh", "-c",
                                    'mount --bind "$1" /etc/hosts; hostname ctl; exec slurmctld -D -i -f "$0"',
                                    self.conf, self.hosts_file], **QUIET)

    def _start_slurmd(self, name):
        self.net.popen(self.node_host(name), ["unshare", "--uts", "--mount", "sh", "-c",
            'mount --bind "$2" /etc/hosts; hostname "$0"; exec slurmd -D -f "$1"', name, self.conf, self.hosts_file], **QUIET)

    def _wait_nodes_idle(self, timeout):
        def idle():
            out = self.client(["sinfo", "-h", "-N", "-o", "%N %T"], check=False).stdout.split()
            return sorted(out[0::2]) == sorted(self.node_names()) and set(out[1::2]) == {"idle"}

        until(idle, timeout, f"the Slurm nodes did not all come up idle: see {self.folder}/*/slurm*.log")

    # --- jobs -------------------------------------------------------------------

    def client(self, argv, check=True, **kwargs):
        """A Slurm client command (sbatch, scontrol, ...) run on the controller."""
        r = subprocess.run(self.net.exec_argv(CONTROLLER, argv), env=self.env(), capture_output=True, text=True,
                           **kwargs)
        if check and r.returncode != 0:
            raise SlurmError(f"{' '.join(argv)}: {r.stderr.strip()}")
        return r

    def sbatch(self, args):
        """Submits a batch job; returns its id."""
        return self.client(["sbatch", "--parsable", *args]).stdout.strip().split(";")[0]

    def job_state(self, job):
        out = self.client(["scontrol", "show", "job", job]).stdout
        for field in out.split():
            if field.startswith("JobState="):
                return field.split("=", 1)[1]
        raise SlurmError(f"scontrol show job {job}: no JobState in: {out}")

    def wait_job(self, job, timeout):
        """Waits for the job to end; returns its final state."""
        state = []
        until(lambda: state.append(self.job_state(job)) or state[-1] in TERMINAL_STATES, timeout,
               f"job {job} did not end in {timeout} s")
        return state[-1]

    def leftovers(self):
        """{node: [command names]} of the processes on each node that are not
        its slurmd: empty when every node is clean."""
        left = {}
        for name in self.node_names():
            comms = [_comm(pid) for pid in self._pids(name)]
            others = [c for c in comms if c not in ("slurmd", None)]
            if others:
                left[name] = others
        return left

    def wait_clean(self, timeout):
        """Waits until leftovers() is empty (Slurm ends a job's processes
        after its state changes); SlurmError naming what is left after
        `timeout` s."""
        try:
            until(lambda: self.leftovers() == {}, timeout, "")
        except SlurmError:
            raise SlurmError(f"processes left on nodes after {timeout} s (node: commands): "
                             f"{self.leftovers()}") from None

    def pids(self, name, comm):
        """The ids of node `name`'s processes whose command name is `comm`."""
        return [pid for pid in self._pids(name) if _comm(pid) == comm]

    def _pids(self, name):
        return _netns_pids(self.net.netns(self.node_host(name)))


def _netns_pids(ns):
    r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    return [int(p) for p in r.stdout.split()]


def _comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return None


def _kill(pid, sig):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def until(ready, timeout, message):
    """Polls ready() every 0.2 s until it is true; SlurmError(message) after timeout s."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise SlurmError(message)
        time.sleep(0.2)
