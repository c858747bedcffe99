#!/usr/bin/python3
"""What a Prometheus scrape costs a job's pushes (issue 41's goal: at most
2% of push throughput with a scrape every second). One target started with
`blkps target start --metrics`; rounds alternate between pushing alone and
pushing while a scraper fetches /metrics every --interval seconds (what
Prometheus does: each fetch makes the exporter read every shard's status
through its control LUN and tgtd's /proc entries). The pushes are
blkps-iobench --op push (1 MiB x QD16 by default), the learner's own path.

    sudo bench/scrape_cost.py [--rounds 5] [--seconds 5] [--interval 1] [--bs 1M] [--qd 16]
                              [--bsopts OPTS] [--tgtd N] [--build DIR] [--json FILE]

Prints each round's MB/s and the cost: 1 - median(with) / median(without).
Rounds alternate (without, with / with, without, ...) so that the
machine's other load falls on both. Before them, one scrape (the exporter
logs in to the control LUN at its first) and one push round of --seconds
(tgtd touches the model's memory for the first time) are made and not
counted: a job Prometheus watches is past both. On a shared or loaded
machine the noise (printed: the spread of the rounds without) can exceed
the cost, so measure on a quiet one and say its load. The defaults take
about 2 x 5 x 5 s of pushing, a minute in all. Needs a build
(scripts/build.sh) and root (tgtd).
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import urllib.request

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLKPS = os.path.join(TOP, "scripts", "blkps")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def push_rate(url, a):
    run = subprocess.run([a.iobench, "--target", url, "--op", "push", "--bs", a.bs, "--qd", str(a.qd),
                          "--span", "32M", "--seconds", str(a.seconds)], capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"scrape_cost: {run.stderr.strip() or 'blkps-iobench failed'}")
    return float(dict(item.split("=", 1) for item in run.stdout.split())["MBps"])


class Scraper(threading.Thread):
    """Fetches `url` every `interval` seconds until stop() (counts the
    fetches and the failed ones)."""

    def __init__(self, url, interval):
        super().__init__(daemon=True)
        self.url, self.interval = url, interval
        self.done = threading.Event()
        self.fetches = self.failures = 0

    def run(self):
        while not self.done.wait(self.interval):
            try:
                with urllib.request.urlopen(self.url, timeout=10) as r:
                    r.read()
                self.fetches += 1
            except OSError:
                self.failures += 1

    def stop(self):
        self.done.set()
        self.join()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5, help="rounds of each kind (default 5)")
    p.add_argument("--seconds", type=float, default=5, help="seconds of pushing per round")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between scrapes (default 1)")
    p.add_argument("--bs", default="1M")
    p.add_argument("--qd", type=int, default=16)
    p.add_argument("--bsopts", default="params=16777216;lr=1e-9", help="the model's options")
    p.add_argument("--tgtd", default="1", help="tgtds serving the model (default 1)")
    p.add_argument("--build", default=os.environ.get("BLKPS_BUILD", os.path.join(TOP, "build", "cmake")),
                   help="the build to use (default $BLKPS_BUILD or build/cmake)")
    p.add_argument("--json", metavar="FILE", help="also write the rounds and the cost as JSON")
    a = p.parse_args()
    a.iobench = os.path.join(a.build, "bench", "blkps-iobench")
    plugin = os.path.join(a.build, "target-plugin", "bs_blkps.so")
    for part in (a.iobench, plugin):
        if not os.path.isfile(part):
            sys.exit(f"scrape_cost: {part} not built: run scripts/build.sh (or pass --build)")
    if os.geteuid() != 0:
        sys.exit("scrape_cost: needs root (tgtd): run it as root, or with sudo")
    state = tempfile.mkdtemp(prefix="blkps-scrape-cost-")
    port = free_port()
    try:
        subprocess.run([BLKPS, "target", "start", "--dir", state, "--bsopts", a.bsopts, "--tgtd", a.tgtd,
                        "--plugin", plugin, "--metrics", f"127.0.0.1:{port}", "--owner-pid", str(os.getpid())],
                       check=True, stdout=subprocess.DEVNULL)
        url = subprocess.run([BLKPS, "target", "show", "--dir", state, "--get", "URL"], check=True,
                             capture_output=True, text=True).stdout.strip()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:  # warm-up, not counted
            r.read()
        push_rate(url, a)  # warm-up, not counted
        rounds = {"without": [], "with": []}
        scrapes = failures = 0
        for k in range(a.rounds):
            for kind in ("without", "with") if k % 2 == 0 else ("with", "without"):
                scraper = Scraper(f"http://127.0.0.1:{port}/metrics", a.interval) if kind == "with" else None
                if scraper:
                    scraper.start()
                rate = push_rate(url, a)
                if scraper:
                    scraper.stop()
                    scrapes, failures = scrapes + scraper.fetches, failures + scraper.failures
                rounds[kind].append(rate)
                print(f"round {k + 1} {kind:7} scrape: push {rate:.0f} MB/s", flush=True)
        without, with_ = statistics.median(rounds["without"]), statistics.median(rounds["with"])
        spread = (max(rounds["without"]) - min(rounds["without"])) / without
        result = {"rounds": rounds, "median_without_MBps": without, "median_with_MBps": with_,
                  "cost": 1 - with_ / without, "spread_without": spread, "scrapes": scrapes,
                  "failed_scrapes": failures, "interval_s": a.interval, "load": os.getloadavg()}
        print(f"cost of a scrape every {a.interval:g} s: {100 * result['cost']:.2f}% of push throughput "
              f"(median {with_:.0f} vs {without:.0f} MB/s; rounds without spread {100 * spread:.1f}%; "
              f"{scrapes} scrapes, {failures} failed; load {result['load'][0]:.2f})")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(result, f, indent=2)
    finally:
        subprocess.run([BLKPS, "target", "stop", "--dir", state], stdout=subprocess.DEVNULL)
        subprocess.run(["rm", "-rf", state])


if __name__ == "__main__":
    main()
