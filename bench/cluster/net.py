"""A cluster of H hosts on one machine: each host is a network namespace
whose eth0 is one port of a bridge (the switch, in a namespace of its own),
and each host's link is shaped in both directions with tc tbf to one rate.

  with Cluster(hosts=4, link="1gbit") as cluster:
      cluster.popen(0, ["tgtd", ...])        # a process of host 0
      cluster.address(0)                     # 10.80.0.10
      cluster.wire_bytes(0)                  # (tx, rx) of host 0's link

Host h is namespace blkpscl<pid>-h<h>, address 10.80.0.<10+h>; the switch is
blkpscl<pid>-sw. The names carry this process's pid, so clusters of
concurrent runs never meet; the addresses live only inside these namespaces.

With back_network=True every host also has eth1 on a second switch
(blkpscl<pid>-bk), address 10.81.0.<10+h> (`back_address`), shaped as eth0:
a network of its own for what servers send each other (a backup's records:
doc/replicas.md "A network for the records"), as Ceph's cluster network.

Shaping: tbf on the host's eth0 limits what the host sends; tbf on the
switch's port to the host limits what it receives (a switch with one
RATE port per host). netem delay is added where the kernel has sch_netem
(`has_netem`); where it has not, the link is rate-limited only and
`shaping` says so.

Contract: leaving the with-block (an exception, Ctrl-C: the caller turns
SIGTERM into SystemExit) ends every process started through popen() that
still runs, by its pid, then deletes every namespace this Cluster made;
nothing is left behind. Not thread-safe: one thread drives a Cluster.
"""

import json
import os
import signal
import subprocess
import time

SUBNET = "10.80.0"
BACK_SUBNET = "10.81.0"
PREFIX_BITS = 24
FIRST_HOST = 10
RATE_UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


def link_bits_per_s(link):
    """'1gbit' -> 1e9; raises ValueError with the accepted form."""
    for unit, scale in RATE_UNITS.items():
        if link.endswith(unit):
            try:
                value = float(link[:-len(unit)])
            except ValueError:
                break
            if value > 0:
                return value * scale
    raise ValueError(f"expected a rate such as 1gbit, 500mbit; got '{link}'")


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


class Cluster:
    def __init__(self, hosts, link, delay=None, back_network=False):
        """hosts >= 1; link a tc rate ('1gbit') or 'none' (unshaped); delay
        a netem delay per direction ('0.1ms') or None; back_network: a
        second network (eth1), shaped as the first."""
        if link != "none":
            link_bits_per_s(link)
        self.hosts, self.link, self.delay = hosts, link, delay
        self.tag = f"blkpscl{os.getpid()}"
        self.switch = f"{self.tag}-sw"
        # (switch namespace, host device, subnet) of each network
        self.networks = [(self.switch, "eth0", SUBNET)]
        if back_network:
            self.networks.append((f"{self.tag}-bk", "eth1", BACK_SUBNET))
        self.namespaces = []
        self.processes = []
        self.has_netem = False
        self.shaping = "none"

    # --- names ---------------------------------------------------------------

    def netns(self, host):
        return f"{self.tag}-h{host}"

    def address(self, host):
        return f"{SUBNET}.{FIRST_HOST + host}"

    def back_address(self, host):
        """host's address on the back network (back_network=True)."""
        assert len(self.networks) > 1, "a Cluster made without back_network"
        return f"{BACK_SUBNET}.{FIRST_HOST + host}"

    def back_subnet(self):
        """The back network, ADDRESS/BITS: what every host's eth1 is on."""
        assert len(self.networks) > 1, "a Cluster made without back_network"
        return f"{BACK_SUBNET}.0/{PREFIX_BITS}"

    def subnet(self):
        """The hosts' network, ADDRESS/BITS: what every host's eth0 is on."""
        return f"{SUBNET}.0/{PREFIX_BITS}"

    def exec_argv(self, host, argv):
        """argv run as a process of `host` (inside its namespace)."""
        return ["ip", "netns", "exec", self.netns(host), *argv]

    # --- set-up and tear-down ----------------------------------------------

    def __enter__(self):
        try:
            self._up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc_info):
        self.down()

    def _new_netns(self, name):
        _ip("netns", "add", name)
        self.namespaces.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _up(self):
        for h in range(self.hosts):
            ns = self.netns(h)
            self._new_netns(ns)
            # IPv4 only: an eth0 that also had an IPv6 link-local address
            # (tentative while the kernel checks it is unique) gave OpenMPI's
            # daemons an address to try that leads nowhere.
            _ip("netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1",
                "net.ipv6.conf.default.disable_ipv6=1")
        for switch, dev, subnet in self.networks:
            self._new_netns(switch)
            _ip("-n", switch, "link", "add", "sw", "type", "bridge")
            _ip("-n", switch, "link", "set", "sw", "up")
            for h in range(self.hosts):
                ns, port = self.netns(h), f"p{h}"
                _ip("-n", switch, "link", "add", port, "type", "veth", "peer", "name", dev, "netns", ns)
                _ip("-n", switch, "link", "set", port, "master", "sw", "up")
                _ip("-n", ns, "addr", "add", f"{subnet}.{FIRST_HOST + h}/{PREFIX_BITS}", "dev", dev)
                _ip("-n", ns, "link", "set", dev, "up")
        self.has_netem = self._try_qdisc(self.switch, "p0", ["netem", "delay", "1ms"])
        if self.link != "none":
            for switch, dev, _ in self.networks:
                for h in range(self.hosts):
                    self._shape(self.netns(h), dev)
                    self._shape(switch, f"p{h}")
            how = "tbf rate {0} on both directions of every host's link".format(self.link)
            if len(self.networks) > 1:
                how += " (eth0, and eth1 on a back network of its own)"
            how += f", TCP congestion control {self.congestion_control()} (the machine's default)"
            if self.delay and self.has_netem:
                how += f", netem delay {self.delay} each way"
            elif not self.has_netem:
                how += "; no delay added: this kernel has no sch_netem"
            else:
                how += "; no delay added (none asked)"
            self.shaping = how

    def congestion_control(self):
        """The TCP congestion control the hosts' connections use: a new
        namespace takes the machine's default (net.ipv4.tcp_congestion_control)."""
        return _ip("netns", "exec", self.netns(0), "sysctl", "-n", "net.ipv4.tcp_congestion_control").stdout.strip()

    def _try_qdisc(self, ns, dev, qdisc):
        ok = subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", *qdisc],
                            capture_output=True).returncode == 0
        if ok:
            subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], capture_output=True)
        return ok

    def _shape(self, ns, dev):
        tc = ["tc", "-n", ns, "qdisc", "add", "dev", dev]
        # tbf's bucket holds 2 ms at the rate, and at least a few 64K GSO packets.
        burst = max(int(link_bits_per_s(self.link) / 8 / 500), 262144)
        parent = ["root"]
        if self.delay and self.has_netem:
            subprocess.run([*tc, "root", "handle", "1:", "netem", "delay", self.delay, "limit", "100000"], check=True)
            parent = ["parent", "1:1", "handle", "10:"]
        subprocess.run([*tc, *parent, "tbf", "rate", self.link, "burst", str(burst), "latency", "100ms"], check=True)

    def down(self):
        """Ends the processes still running (SIGTERM, then SIGKILL after 5 s),
        then deletes the namespaces. Safe to call twice."""
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            alive = [p for p in self.processes if p.poll() is None]
            for p in alive:
                _signal_group(p, signal.SIGTERM)
            deadline = time.monotonic() + 5
            for p in alive:
                try:
                    p.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    _signal_group(p, signal.SIGKILL)
                    p.wait()
            self.processes = []
            for ns in reversed(self.namespaces):
                _ip("netns", "del", ns, check=False)
            self.namespaces = []
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})

    # --- processes and counters ------------------------------------------------

    def popen(self, host, argv, **kwargs):
        """Starts argv as a process of `host`, in a process group of its own
        (so that down() ends it and its children); returns the Popen."""
        p = subprocess.Popen(self.exec_argv(host, argv), start_new_session=True, **kwargs)
        self.processes.append(p)
        return p

    def wire_bytes(self, host, dev="eth0"):
        """(bytes sent, bytes received) on host's link so far: the kernel's
        counters of its `dev` (eth1: the back network's), Ethernet headers
        included."""
        out = _ip("-n", self.netns(host), "-j", "-s", "link", "show", dev).stdout
        stats = json.loads(out)[0]["stats64"]
        return stats["tx"]["bytes"], stats["rx"]["bytes"]


def _signal_group(p, sig):
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:
        pass
