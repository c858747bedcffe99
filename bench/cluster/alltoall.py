#!/usr/bin/python3
"""The network alone, in the traffic pattern of one blkps phase: H hosts of
bench/cluster/net.py (links shaped as the cluster bench shapes them), each
sending BYTES to every other host at once over one TCP stream per pair
(iperf3), as a co-located learner pushes to the other hosts' shards. Prints
each stream's rate, the tbf qdiscs' drops, and the phase's time against
the link time of its payload: what TCP and the shaping give a phase with
no iSCSI, tgtd or learner in the way (doc/data-path.md "Phases at link rate").

  sudo bench/cluster/alltoall.py [--hosts 4] [--bytes 100M] [--link 1gbit]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from net import Cluster, link_bits_per_s  # noqa: E402

BASE_PORT = 5200


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--bytes", default="100M", help="bytes per stream, iperf3's form (default 100M = 100 MiB)")
    ap.add_argument("--link", default="1gbit")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("alltoall: run as root (it makes network namespaces)")
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    size = float(args.bytes[:-1]) * units[args.bytes[-1]] if args.bytes[-1] in units else float(args.bytes)
    with Cluster(args.hosts, args.link) as cluster:
        pairs = [(src, dst) for src in range(args.hosts) for dst in range(args.hosts) if src != dst]
        for src, dst in pairs:  # one server per stream: port BASE_PORT + src on host dst
            cluster.popen(dst, ["iperf3", "-s", "-1", "-B", cluster.address(dst), "-p", str(BASE_PORT + src)],
                          stdout=subprocess.DEVNULL)
        time.sleep(1)
        begin = time.monotonic()
        clients = [(src, dst, cluster.popen(src, ["iperf3", "-c", cluster.address(dst), "-p", str(BASE_PORT + src),
                                                  "-n", args.bytes, "-J"], stdout=subprocess.PIPE, text=True))
                   for src, dst in pairs]
        longest = 0.0
        for src, dst, p in clients:
            sent = json.loads(p.communicate()[0])["end"]["sum_sent"]
            longest = max(longest, sent["seconds"])
            print(f"host {src} -> host {dst}: {sent['bits_per_second'] / 1e6:.0f} Mbit/s, "
                  f"{sent.get('retransmits', 0)} retransmits")
        seconds = time.monotonic() - begin
        drops = sum(int(n) for ns in [cluster.switch] + [cluster.netns(h) for h in range(args.hosts)]
                    for n in re.findall(r"dropped (\d+)", subprocess.run(["tc", "-n", ns, "-s", "qdisc"],
                                                                         capture_output=True, text=True).stdout))
        print(f"shaping: {cluster.shaping}")
    link_s = (args.hosts - 1) * size * 8 / link_bits_per_s(args.link)
    print(f"phase: the longest stream took {longest:.2f} s ({seconds:.2f} s with iperf3's start-up); its payload "
          f"at the link rate: {link_s:.2f} s ({100 * link_s / longest:.0f}% of the link, "
          f"{100 * link_s / seconds:.0f}% with start-up); packets dropped by the qdiscs: {drops}")


if __name__ == "__main__":
    main()
