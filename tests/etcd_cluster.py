"""A private etcd cluster for tests: three members of Debian's etcd
(etcd-server, scripts/setup.sh) on loopback, each on free client and peer
ports with its own --data-dir in a temporary folder.

    with etcd_cluster.EtcdCluster() as cluster:
        ... cluster.endpoints ...   # "127.0.0.1:PORT,127.0.0.1:PORT,..."
        cluster.kill(0)             # kill -9 of member 0

Contract: the constructor returns once every member answers /health with
"true" (within `deadline_s`, else it stops what it started and raises
RuntimeError naming the member and its log). Leaving the block, or the
test process ending any way Python ends, stops each member it started by
its pid (SIGKILL: the data is a throwaway) and removes the folder.
"""
import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

MEMBERS = 3


def _free_ports(count):
    """`count` distinct free TCP ports on 127.0.0.1 (held open together
    while chosen, so that they differ)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class EtcdCluster:
    def __init__(self, deadline_s=60):
        self.folder = tempfile.mkdtemp(prefix="blkps-etcd-")
        self.procs = []
        atexit.register(self.stop)
        ports = _free_ports(2 * MEMBERS)
        clients = [f"http://127.0.0.1:{ports[2 * k]}" for k in range(MEMBERS)]
        peers = [f"http://127.0.0.1:{ports[2 * k + 1]}" for k in range(MEMBERS)]
        cluster = ",".join(f"e{k}={peers[k]}" for k in range(MEMBERS))
        self.clients = clients
        self.endpoints = ",".join(c.removeprefix("http://") for c in clients)
        try:
            for k in range(MEMBERS):
                with open(self.log(k), "w") as log:
                    self.procs.append(subprocess.Popen(
                        ["etcd", "--name", f"e{k}", "--data-dir", os.path.join(self.folder, f"e{k}"),
                         "--listen-client-urls", clients[k], "--advertise-client-urls", clients[k],
                         "--listen-peer-urls", peers[k], "--initial-advertise-peer-urls", peers[k],
                         "--initial-cluster", cluster, "--initial-cluster-state", "new",
                         "--initial-cluster-token", os.path.basename(self.folder)],
                        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT))
            deadline = time.monotonic() + deadline_s
            for k in range(MEMBERS):
                while not self.healthy(k):
                    if self.procs[k].poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"etcd member e{k} did not become healthy; its log: {self.log(k)}")
                    time.sleep(0.1)
        except BaseException:
            self.stop()
            raise

    def log(self, k):
        return os.path.join(self.folder, f"e{k}.log")

    def healthy(self, k):
        """Whether member k answers /health with "true"."""
        try:
            with urllib.request.urlopen(self.clients[k] + "/health", timeout=2) as answer:
                return json.loads(answer.read()).get("health") == "true"
        except (OSError, ValueError):
            return False

    def kill(self, k):
        """kill -9 of member k; returns once it has exited."""
        self.procs[k].send_signal(signal.SIGKILL)
        self.procs[k].wait()

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
        self.procs = []
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
