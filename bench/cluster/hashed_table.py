"""The cluster bench's hashed-table case (run.py --table
hash:CAPACITY:WIDTH; doc/embeddings.md "Hashed ids"): a table keyed by
64-bit feature ids (rule sgd, lr 1, init zeros) split by id hash over
--servers server hosts, each a part of `blkps target serve --part K/S
--publish JOBDIR` (the parts meet in JOBDIR and write the learners'
`kind = hashed` layouts); --hosts learner hosts
(bench/peers/blkps_rows.py --hashed) pull and push batches of Zipf(1.05)
ranks over --table-ids possible ids, each rank's id a fixed 64-bit hash
of it, all at once through their layout; then every row any learner
touched, and 1,000 none did, is checked against the sum of the
learners' gradients, and each part's rows made and memory are read from
its status. Writes DIR/table.json and DIR/table.md.
"""
import json
import os
import subprocess
import time

import results
from net import Cluster

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BLKPS = os.path.join(TOP, "scripts", "blkps")

SERVE_WAIT_S = 120  # for a part's `serving` line and for the layouts


def parse(text):
    """'hash:CAPACITY:WIDTH' -> (capacity, width); None for another form."""
    kind, _, rest = text.partition(":")
    if kind != "hash":
        return None
    try:
        capacity, width = (int(v) for v in rest.split(":"))
    except ValueError:
        capacity = width = 0
    if capacity < 1 or width < 1:
        raise ValueError(f"expected hash:CAPACITY:WIDTH, e.g. hash:2000000:128; got '{text}'")
    return capacity, width


def serve_part(cluster, runner, host, part, parts, bsopts, learners, jobdir):
    """Starts part `part` of `parts` on `host`; returns (its serve process,
    its --dir) once it serves."""
    folder = os.path.join(runner.state, f"part-{part}")
    err = runner.out(f"hashed-serve-{part}", "err")
    p = cluster.popen(host, [
        BLKPS, "target", "serve", "--dir", folder, "--part", f"{part}/{parts}", "--publish", jobdir,
        "--address", cluster.address(host), "--allow", cluster.subnet(), "--luns", str(learners),
        "--bsopts", bsopts], stdout=subprocess.PIPE, stderr=open(err, "w"), text=True)
    line = p.stdout.readline()
    if not line.startswith("serving "):
        with open(err) as f:
            raise RuntimeError(f"part {part} on host {host} did not serve: {f.read().strip()[-300:]}")
    return p, folder


def run(runner, hosts, servers, capacity, width):
    """The case (see the module's doc); returns its record."""
    a = runner.args
    bsopts = f"table=hash:{capacity}:{width};rule=sgd;lr=1;init=zeros"
    learners, server_hosts = list(range(hosts)), list(range(hosts, hosts + servers))
    tag = f"hashed-{hosts}h-{servers}s"
    jobdir = os.path.join(runner.state, "job")
    work = ["--rows", str(a.table_ids), "--width", str(width), "--batches", str(a.table_batches),
            "--batch", str(a.table_batch), "--hashed"]
    with Cluster(hosts + servers, a.link, a.delay) as cluster:
        parts = [serve_part(cluster, runner, h, k, servers, bsopts, hosts, jobdir)
                 for k, h in enumerate(server_hosts)]
        layouts = [os.path.join(jobdir, f"slot-{slot + 1}.layout") for slot in learners]
        deadline = time.monotonic() + SERVE_WAIT_S
        while not all(os.path.exists(path) for path in layouts):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the parts wrote no layouts in {jobdir} within {SERVE_WAIT_S} s")
            time.sleep(0.1)
        checked, learner_results = runner.row_learners(cluster, tag, layouts, work)
        made = runner.table_status(cluster, [(h, folder) for h, (_, folder) in zip(server_hosts, parts)])
        shaping = cluster.shaping
    return {"capacity": capacity, "width": width, "ids": a.table_ids, "servers": servers, "learners": hosts,
            "link": a.link, "shaping": shaping, "batches": a.table_batches, "batch": a.table_batch,
            "parts": made, **checked, **results.rows(learner_results),
            "learner_results": learner_results, "load": os.getloadavg()[0]}


def write(out, r, command):
    """DIR/table.json and DIR/table.md of the case's record `r`; returns
    the markdown's lines."""
    r["command"] = command
    with open(os.path.join(out, "table.json"), "w") as f:
        json.dump(r, f, indent=1)
    row_bytes = r["width"] * 4
    lines = ["# A hashed table over server hosts in the netns cluster", "",
             f"table=hash:{r['capacity']}:{r['width']} ({row_bytes}-byte rows), rule sgd, split by id hash over "
             f"{r['servers']} server hosts (`blkps target serve --part K/{r['servers']} --publish`), "
             f"{r['learners']} learner hosts, {r['shaping']}; ids: Zipf(1.05) ranks over {r['ids']:,} possible "
             f"ids, each a fixed 64-bit hash of its rank; {r['batches']} batches of {r['batch']} ids per learner, "
             f"each pulled then pushed, all learners at once. Load average {r['load']:.1f}. "
             f"Command: `{command}`.", "",
             "- Parts: " + ", ".join(f"{t['rows_made']:,} rows made of {t['row_limit']:,} "
                                     f"({t['memory_bytes'] / 2**20:.1f} MiB)" for t in r["parts"]),
             *results.rows_lines(r)]
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return lines

