#!/usr/bin/python3
"""The cluster bench's hosts (bench/cluster/net.py) and its arithmetic.

  cluster_net_test.py TOP CASE
    hosts-linked-shaped-and-removed  (integration, root) two hosts reach each
        other over the bridge, every link carries tbf at the asked rate on
        both ends, the counters count, what goes to a host's back-network
        address crosses eth1 and not eth0, and leaving the with-block ends a
        host's process and deletes every namespace, also on an exception
    rates-and-targets                (unit) link rates parse or say what is
        expected; the time to a target loss is the first window at or under it;
        the learners' phase alignment counts their overlap in the same phase
    hashed-table-case                (integration, root; BLKPS_BUILD) the
        cluster bench's hashed-table case (bench/cluster/hashed_table.py)
        on 2 server and 2 learner hosts: it passes its own check of every
        touched row, and its parts made exactly one row per distinct id
        pushed, no more
    report-goals                     (unit) cluster.md's goals take blkps
        bfloat16 against MPI float32 and DDP fp16, and float32 from the case
        that does not drop gradients; the dropping case gets its own line;
        the engine's row has its own goal line and approximate wire bytes; a
        late learner is named; the push's and the pull's share of the link
        and the phase alignment are stated
"""
import json
import os
import subprocess
import sys
import tempfile
import time

top, case = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(top, "bench", "cluster"))
import net  # noqa: E402


PAYLOAD = 200000
# host 1 receives PAYLOAD bytes on port 5999 and prints how many came; host
# 0 connects (retrying until the server listens) and sends them.
SERVER = """import socket, sys
s = socket.create_server((sys.argv[1], 5999)); c, _ = s.accept(); n = 0
while (b := c.recv(65536)): n += len(b)
print(n)"""
CLIENT = f"""import socket, sys, time
for _ in range(100):
    try: c = socket.create_connection((sys.argv[1], 5999)); break
    except OSError: time.sleep(0.05)
c.sendall(bytes({PAYLOAD})); c.close()"""


def fail(why):
    sys.exit(f"FAIL {case}: {why}")


def qdisc(ns, dev):
    return subprocess.run(["tc", "-n", ns, "qdisc", "show", "dev", dev], capture_output=True, text=True).stdout


def namespaces():
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def send_payload(cluster, address):
    """Host 0 sends PAYLOAD bytes to `address` (host 1's) over TCP."""
    server = cluster.popen(1, [sys.executable, "-c", SERVER, address], stdout=subprocess.PIPE, text=True)
    client = subprocess.run(cluster.exec_argv(0, [sys.executable, "-c", CLIENT, address]),
                            capture_output=True, text=True)
    if client.returncode != 0 or server.communicate(timeout=30)[0].strip() != str(PAYLOAD):
        fail(f"host 0 could not send {PAYLOAD} bytes to host 1 at {address}: {client.stderr}")


def hosts_linked_shaped_and_removed():
    try:
        with net.Cluster(2, "200mbit", back_network=True) as cluster:
            made = [cluster.switch, cluster.networks[1][0], cluster.netns(0), cluster.netns(1)]
            if not all(ns in namespaces() for ns in made):
                fail(f"namespaces {made} not all made: {namespaces()}")
            shaped = [(cluster.netns(h), dev) for h in range(2) for dev in ("eth0", "eth1")]
            shaped += [(switch, f"p{h}") for switch, _, _ in cluster.networks for h in range(2)]
            for ns, dev in shaped:
                if "tbf" not in qdisc(ns, dev) or "200Mbit" not in qdisc(ns, dev):
                    fail(f"{ns} {dev} is not shaped to 200Mbit: {qdisc(ns, dev)!r}")
            for h in range(2):  # IPv4 only (MPI's daemons once tried a tentative IPv6 address)
                shown = subprocess.run(cluster.exec_argv(h, ["ip", "-6", "addr", "show", "dev", "eth0"]),
                                       capture_output=True, text=True).stdout
                if "inet6" in shown:
                    fail(f"host {h}'s eth0 has an IPv6 address: {shown!r}")
            if cluster.subnet() != f"{cluster.address(0).rsplit('.', 1)[0]}.0/24":
                fail(f"subnet() {cluster.subnet()} is not the hosts' /24")
            if cluster.back_subnet() != f"{cluster.back_address(0).rsplit('.', 1)[0]}.0/24":
                fail(f"back_subnet() {cluster.back_subnet()} is not the hosts' back /24")
            sent0, _ = cluster.wire_bytes(0)
            _, received1 = cluster.wire_bytes(1)
            send_payload(cluster, cluster.address(1))
            if cluster.wire_bytes(0)[0] - sent0 < PAYLOAD or cluster.wire_bytes(1)[1] - received1 < PAYLOAD:
                fail(f"the links' counters did not count the {PAYLOAD} bytes sent")
            sent0, back_sent0 = cluster.wire_bytes(0)[0], cluster.wire_bytes(0, "eth1")[0]
            send_payload(cluster, cluster.back_address(1))
            if cluster.wire_bytes(0, "eth1")[0] - back_sent0 < PAYLOAD or cluster.wire_bytes(0)[0] - sent0 >= PAYLOAD:
                fail(f"the {PAYLOAD} bytes sent to the back address did not cross eth1 alone")
            sleeper = cluster.popen(1, ["sleep", "600"])
            for _ in range(100):  # until ip netns exec has become sleep, inside host 1
                with open(f"/proc/{sleeper.pid}/cmdline", "rb") as f:
                    if f.read().startswith(b"sleep"):
                        break
                time.sleep(0.05)
            raise KeyError("an error inside the with-block")
    except KeyError:
        pass
    if sleeper.poll() is None:
        fail(f"host 1's process {sleeper.pid} still runs after the cluster went")
    left = [ns for ns in made if ns in namespaces()]
    if left:
        fail(f"namespaces left behind: {left}")


def rates_and_targets():
    if net.link_bits_per_s("1gbit") != 1e9 or net.link_bits_per_s("500mbit") != 5e8:
        fail("1gbit / 500mbit parsed wrong")
    for bad in ("1gb", "fast", "0gbit", "-1mbit"):
        try:
            net.link_bits_per_s(bad)
            fail(f"'{bad}' was taken as a rate")
        except ValueError as e:
            if "such as 1gbit" not in str(e):
                fail(f"'{bad}': the error does not say what is expected: {e}")
    sys.path.insert(0, os.path.join(top, "scripts"))
    import results  # noqa: E402  (bench/cluster/results.py)
    import run  # noqa: E402  (bench/cluster/run.py)
    samples = [(1.0, 6.0), (2.0, 4.0), (3.0, 2.0), (4.0, 2.0), (5.0, 1.0)]
    if run.time_to_loss(samples, 3.0, 2) != 3.0:
        fail(f"time_to_loss: window (2,4),(3,2) has mean 3.0 at t=3, got {run.time_to_loss(samples, 3.0, 2)}")
    if run.time_to_loss(samples, 0.5, 2) is not None:
        fail("time_to_loss: a target never reached gave a time")
    # Learner 1 starts half a push late: of the 3 s the two overlap, 2 s in the same phase.
    spans = [(0, "push", 0.0, 2.0), (0, "pull", 2.0, 4.0), (1, "push", 1.0, 3.0), (1, "pull", 3.0, 5.0)]
    if abs(results.phase_alignment(spans) - 2 / 3) > 1e-9:
        fail(f"phase_alignment: expected 2/3 for learners half a phase apart, got {results.phase_alignment(spans)}")
    if results.phase_alignment(spans[:2] + [(1, "push", 0.0, 2.0), (1, "pull", 2.0, 4.0)]) != 1.0:
        fail("phase_alignment: learners in step did not give 1.0")


def record(system, dtype, ms, sent, drop_ratio=0.0, placement="co-located"):
    return {"system": system, "placement": placement, "hosts": 4, "link": "1gbit", "shaping": "tbf", "params": 10**8,
            "dtype": dtype, "drop_ratio": drop_ratio, "ms_per_exchange": ms, "wire_bytes_per_host": sent,
            "wire_rx_bytes_per_host": sent + 1e6, "ms_per_push": ms / 4, "ms_per_pull": ms * 3 / 4}


def report_goals():
    import report  # noqa: E402  (bench/cluster/report.py)
    records = [record("blkps-async", "float32", 3000, 3.1e8, drop_ratio=0.99),  # must not count as float32
               dict(record("blkps-async", "float32", 6000, 6.0e8), phase_alignment=0.5),
               record("blkps-async", "bfloat16", 3500, 3.0e8),
               dict(record("blkps-async-engine", "float32", 4000, 6.7e8), late_start_s=1.5),
               record("mpi", "float32", 7000, 6.0e8, placement="peer-to-peer"),
               # a pipelined exchange has no phases timed apart
               {k: v for k, v in record("blkps-async-exchange", "float32", 5400, 6.0e8).items()
                if k not in ("ms_per_push", "ms_per_pull")},
               record("ddp", "float32", 5000, 6.5e8, placement="peer-to-peer"),
               record("ddp", "float16", 4000, 3.5e8, placement="peer-to-peer")]
    with tempfile.TemporaryDirectory() as out:
        report.write(out, records, [], {"link": "1gbit", "feed_gbit_s": 5.0, "quick": False, "failures": [],
                                        "seconds": 1.0, "load": 0.0})
        with open(os.path.join(out, "cluster.md")) as f:
            text = f.read()
    for line in ("| blkps float32 / DDP float32 <= 1.0 | 1.20 | missed |",
                 "| blkps bfloat16 / MPI float32 <= 0.6 | 0.50 | met |",
                 "| blkps bfloat16 / DDP fp16 <= 1.0 | 0.88 | met |",
                 "| blkps-async, drop 0.99 | co-located | float32 | 3000 |",
                 "| blkps-async-engine | co-located | float32 | 4000 | 0.57 | 0.80 | ~670 |  |",
                 "(push and next pull at once) / DDP float32 <= 1.0 | 0.80 | met |",
                 "| blkps float32 pipelined exchange (Model.exchange) / MPI float32 <= 1.0 | 0.77 | met |",
                 # each direction carries 2 x 300 MB: 4800 ms at 1 Gbit/s, in an exchange of 5400 ms
                 "The pipelined exchange (async): 5400 ms per exchange; push and pull pipelined, each direction "
                 "of a host's link carried its payload at 89% of the link over the exchange",
                 "blkps-async-engine float32: a learner opened 1.5 s after the common start",
                 "Gradient dropping (ratio 0.99, async", "3000 ms per exchange",
                 "a host's link sent 310.0 MB and received 311.0 MB per exchange",
                 # 3/4 of 400 MB at 1 Gbit/s: 2400 ms, against a push of 1500 ms and a pull of 4500 ms
                 "the push took 1500 ms and the pull 4500 ms (medians), 160% and 53% of the link; the learners "
                 "were in the same phase 50% of the time they overlapped"):
        if line not in text:
            fail(f"cluster.md lacks '{line}':\n{text}")


# A failed case is a result: its record (with "failed") is left out of the
# tables and the goals, listed under "Failed cases", and the headline reads
# past it.
def failed_case_is_a_result():
    import report  # noqa: E402  (bench/cluster/report.py)
    failed = {"system": "mpi", "placement": "peer-to-peer", "hosts": 4, "params": 10**8, "dtype": "bfloat16",
              "drop_ratio": 0.0, "link": "1gbit", "failed": "mpi-peer-to-peer-bfloat16 failed: no daemon"}
    records = [record("blkps-async", "float32", 6000, 6.0e8), failed,
               record("mpi", "float32", 7000, 6.0e8, placement="peer-to-peer")]
    with tempfile.TemporaryDirectory() as out:
        report.write(out, records, [], {"link": "1gbit", "feed_gbit_s": 5.0, "quick": False, "seconds": 1.0,
                                        "failures": ["mpi-peer-to-peer-bfloat16 H=4 P=100000000: no daemon"],
                                        "load": 0.0})
        with open(os.path.join(out, "cluster.md")) as f:
            text = f.read()
        with open(os.path.join(out, "cluster.json"), "w") as f:
            json.dump(records, f)
        with open(os.path.join(out, "cluster-training.json"), "w") as f:
            json.dump([], f)
        headline = report.headline(out)
    if "## Failed cases" not in text or "mpi-peer-to-peer-bfloat16 H=4 P=100000000: no daemon" not in text:
        fail(f"cluster.md does not list the failed case:\n{text}")
    if "| mpi | peer-to-peer | bfloat16 |" in text:
        fail(f"cluster.md has a table row for the failed case:\n{text}")
    if not headline:
        fail("the headline is empty beside a failed case")


def hashed_table_case():
    with tempfile.TemporaryDirectory(prefix="blkps-cluster-hashed-") as out:
        ran = subprocess.run(["/usr/bin/python3", os.path.join(top, "bench", "cluster", "run.py"), "--out", out,
                              "--table", "hash:20000:8", "--table-ids", "100000", "--servers", "2", "--hosts", "2",
                              "--link", "10gbit", "--table-batches", "2", "--table-batch", "256"],
                             capture_output=True, text=True)
        if ran.returncode != 0:
            fail(f"the hashed table case failed: {ran.stderr.strip()[-500:]}")
        with open(os.path.join(out, "table.json")) as f:
            r = json.load(f)
    made = sum(t["rows_made"] for t in r["parts"])
    if r["rows_checked"] < 100 or made != r["rows_checked"] or min(t["rows_made"] for t in r["parts"]) == 0:
        fail(f"{r['rows_checked']} distinct ids pushed, the parts made {[t['rows_made'] for t in r['parts']]} rows")


if __name__ == "__main__":
    started = time.monotonic()
    {"hosts-linked-shaped-and-removed": hosts_linked_shaped_and_removed,
     "hashed-table-case": hashed_table_case,
     "rates-and-targets": rates_and_targets, "report-goals": report_goals,
     "failed-case-is-a-result": failed_case_is_a_result}[case]()
    print(f"PASS {case} ({time.monotonic() - started:.1f} s)")
