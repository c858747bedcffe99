"""A private etcd cluster for tests: three members of Debian's etcd
(etcd-server, scripts/setup.sh) on loopback, each on free client and peer
ports with its own --data-dir in a temporary folder.

    with etcd_cluster.EtcdCluster() as cluster:
        ... cluster.endpoints ...   # "127.0.0.1:PORT,127.0.0.1:PORT,..."
        cluster.kill(0)             # kill -9 of member 0

`places` puts member k on another host: (its address, the argv prefix that
runs a command there, e.g. bench/cluster/net.py's exec_argv), one per member;
the health checks then run there too.

Contract: the constructor returns once every member answers /health with
"true" (within `deadline_s`, else it stops what it started and raises
RuntimeError naming the member, with its log's end; a port taken before
etcd bound it is retried on new ports). Leaving the block, or the
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
import sys
import tempfile
import time
import urllib.request

MEMBERS = 3
START_ATTEMPTS = 3


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


LOOPBACK = ("127.0.0.1", [])
# Prints member URL's /health answer ("true" when healthy), where it runs.
HEALTH = """import json, sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1] + "/health", timeout=2) as answer:
        print(json.loads(answer.read()).get("health"))
except (OSError, ValueError):
    print("false")"""


class EtcdCluster:
    def __init__(self, deadline_s=60, places=(LOOPBACK,) * MEMBERS):
        self.places = places
        self.procs = []
        self.folder = None
        atexit.register(self.stop)
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                why = self._start(deadline_s)
            except BaseException:
                self.stop()
                raise
            if why is None:
                return
            self.stop()
            # A free port chosen can be taken by another test before etcd
            # binds it: new ports then; any other reason ends the start.
            if "address already in use" not in why or attempt == START_ATTEMPTS:
                raise RuntimeError(why)

    def _start(self, deadline_s):
        """Starts the members on new ports: None once all are healthy, else
        why not (the member and its log's last lines)."""
        self.folder = tempfile.mkdtemp(prefix="blkps-etcd-")
        ports = _free_ports(2 * MEMBERS)
        addresses = [address for address, _ in self.places]
        clients = [f"http://{addresses[k]}:{ports[2 * k]}" for k in range(MEMBERS)]
        peers = [f"http://{addresses[k]}:{ports[2 * k + 1]}" for k in range(MEMBERS)]
        cluster = ",".join(f"e{k}={peers[k]}" for k in range(MEMBERS))
        self.clients = clients
        self.endpoints = ",".join(c.removeprefix("http://") for c in clients)
        for k in range(MEMBERS):
            with open(self.log(k), "w") as log:
                self.procs.append(subprocess.Popen(
                    [*self.places[k][1], "etcd", "--name", f"e{k}", "--data-dir", os.path.join(self.folder, f"e{k}"),
                     "--listen-client-urls", clients[k], "--advertise-client-urls", clients[k],
                     "--listen-peer-urls", peers[k], "--initial-advertise-peer-urls", peers[k],
                     "--initial-cluster", cluster, "--initial-cluster-state", "new",
                     "--initial-cluster-token", os.path.basename(self.folder)],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + deadline_s
        for k in range(MEMBERS):
            while not self.healthy(k):
                if self.procs[k].poll() is not None or time.monotonic() > deadline:
                    with open(self.log(k), errors="replace") as log:
                        tail = "".join(log.readlines()[-5:])
                    return f"etcd member e{k} did not become healthy; the end of its log:\n{tail}"
                time.sleep(0.1)
        return None

    def log(self, k):
        return os.path.join(self.folder, f"e{k}.log")

    def healthy(self, k):
        """Whether member k answers /health with "true"."""
        if self.places[k][1]:
            answer = subprocess.run([*self.places[k][1], sys.executable, "-c", HEALTH, self.clients[k]],
                                    capture_output=True, text=True)
            return answer.stdout.strip() == "true"
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
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
