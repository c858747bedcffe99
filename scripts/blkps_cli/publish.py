"""A job's published layout (doc/server.md "Serving in the foreground"):
the server tasks of one model, each `blkps target serve --part K/S
--publish JOBDIR` on its own host, and the learners that wait for them,
meet in a folder every node sees (a Slurm job's working folder).

  JOBDIR/servers/part-K-of-S.json  what part K serves (written atomically
                                   once it serves; removed when it stops)
  JOBDIR/slot-L.layout             every learner slot's layout file, in the
                                   one format shards.write_layouts writes,
                                   written by whichever server completes
                                   the set of S parts: with T tgtds each,
                                   the S x T shards of serve_parts.py

`blkps layout wait JOBDIR` waits for slot-1.layout, bounded.
"""

import glob
import json
import os
import re
import socket
import sys
import time

from . import serve_parts, shards
from .errors import Parser, UserError
from .files import write_atomically

SERVERS = "servers"
WAIT_TIMEOUT_S = 300
PROGRESS_EVERY_S = 10
PART_FILE = re.compile(r"^part-(\d+)-of-(\d+)\.json$")


def portal(url):
    """ADDRESS:PORT of an iscsi://ADDRESS:PORT/IQN/LUN URL."""
    return url.split("://", 1)[1].split("/", 1)[0]


def part_path(jobdir, part, parts):
    return os.path.join(jobdir, SERVERS, f"part-{part}-of-{parts}.json")


def publish(jobdir, served, envs, model, backup=None):
    """Writes the file of the part `served` (serve_parts.Part) from its
    tgtds' target.env values `envs` (tgtd 0 first) and `model`
    (blkps-bsopts's JSON of the WHOLE model), with its `backup`'s learner
    URLs and replication address if it has one (serve_replicas.py: the
    backup's file); then, if
    every part is present, the layouts."""
    os.makedirs(os.path.join(jobdir, SERVERS), exist_ok=True)
    unit = served.plan.unit if served.plan.unit == shards.HASHED else int(served.plan.unit)  # a layout's unit
    values = {"part": served.part, "parts": served.parts, "tgtds": served.tgtds, "host": socket.gethostname(),
              "portals": [portal(env["URL"]) for env in envs], "urls": [env["URLS"].split() for env in envs],
              "control_urls": [env["CONTROL_URL"] for env in envs], "stripe_unit": unit,
              "params": model["params"], "dtype": model["dtype"]}
    if backup:
        values["backup_urls"], values["replication"] = backup["urls"], backup["replication"]
    path = part_path(jobdir, served.part, served.parts)
    write_atomically(path, json.dumps(values, indent=1))
    assemble(jobdir, served.parts)


def published(jobdir, parts):
    """The parts of `parts` published in `jobdir`, by number."""
    found = {}
    for path in glob.glob(os.path.join(jobdir, SERVERS, f"part-*-of-{parts}.json")):
        try:
            with open(path) as f:
                values = json.load(f)
            found[values["part"]] = values
        except (OSError, ValueError, KeyError):
            continue  # removed meanwhile, or not ours: not a part
    return found


def assemble(jobdir, parts):
    """Writes JOBDIR/slot-L.layout once all `parts` parts are published
    (atomically: two servers completing the set at once write the same
    files): the S x T shards in stripe order (serve_parts.py). Parts that
    serve through different numbers of tgtds are refused."""
    found = published(jobdir, parts)
    if len(found) < parts:
        return None
    ordered = [found[k] for k in range(parts)]
    counts = {p["tgtds"] for p in ordered}
    if len(counts) > 1:
        said = ", ".join(f"part {p['part']} on {p['host']}: {p['tgtds']}" for p in ordered)
        raise UserError("--tgtd", f"the parts of one model serve through different numbers of tgtds ({said}); "
                        "each part serves its 1/S through as many", "give every part the same --tgtd N")
    tgtds = counts.pop()
    envs, labels = [], []
    for shard in range(parts * tgtds):
        part, t = serve_parts.part_and_tgtd(shard, parts)
        envs.append({"URLS": " ".join(ordered[part]["urls"][t]), "CONTROL_URL": ordered[part]["control_urls"][t]})
        labels.append(f"part {part} tgtd {t} on {ordered[part]['host']}")
    first = ordered[0]
    levels = f": {parts} server task(s) (parts) x {tgtds} tgtd(s)" if parts > 1 and tgtds > 1 else ""
    backups = [{"URLS": " ".join(p["backup_urls"])} if "backup_urls" in p else None for p in ordered] \
        if tgtds == 1 else ()  # a part with a backup has one tgtd (serve_replicas.check_options)
    return shards.write_layouts(jobdir, envs, len(first["urls"][0]), first["stripe_unit"], first["params"],
                                first["dtype"], levels, labels, backups)


def unpublish(jobdir, part, parts):
    """Removes part `part`'s file and the layouts that named it."""
    for path in [part_path(jobdir, part, parts), *glob.glob(os.path.join(jobdir, "slot-*.layout"))]:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


def missing(jobdir):
    """What `layout wait` still waits for, in words."""
    counts = set()
    for path in glob.glob(os.path.join(jobdir, SERVERS, "part-*-of-*.json")):
        m = PART_FILE.match(os.path.basename(path))
        if m:
            counts.add(int(m.group(2)))
    if not counts:
        return f"no server has published in {os.path.join(jobdir, SERVERS)}"
    if len(counts) > 1:
        return f"parts of {' and '.join(map(str, sorted(counts)))} servers are mixed in {os.path.join(jobdir, SERVERS)}"
    parts = counts.pop()
    absent = [str(k) for k in range(parts) if k not in published(jobdir, parts)]
    return f"part(s) {', '.join(absent)} of {parts} not published in {os.path.join(jobdir, SERVERS)}"


def command_wait(argv):
    """`blkps layout wait JOBDIR [--timeout S]`: prints slot 1's layout path
    once the servers have assembled it."""
    p = Parser(prog="blkps layout wait", description="Waits until the server tasks publishing to JOBDIR "
               "(blkps target serve --publish) have assembled the layouts; prints slot 1's layout path.")
    p.add_argument("jobdir")
    p.add_argument("--timeout", type=float, default=WAIT_TIMEOUT_S, metavar="S",
                   help=f"give up after S seconds (default {WAIT_TIMEOUT_S})")
    a = p.parse_args(argv)
    layout = os.path.join(os.path.abspath(a.jobdir), "slot-1.layout")
    wait_for_file(layout, a.timeout, lambda: f"blkps: layout wait: waiting: {missing(a.jobdir)}",
                  lambda: UserError("layout wait", f"no layout after {a.timeout:g} s: {missing(a.jobdir)}",
                                    "see each server task's output (blkps target serve --publish)"))
    print(layout)
    return 0


def wait_for_file(path, timeout_s, progress, gave_up):
    """Returns once `path` exists (its writers replace it whole); prints
    progress() on stderr every PROGRESS_EVERY_S meanwhile, and raises
    gave_up() (a UserError) after `timeout_s`."""
    start = said = time.monotonic()
    while not os.path.exists(path):
        now = time.monotonic()
        if now - start >= timeout_s:
            raise gave_up()
        if now - said >= PROGRESS_EVERY_S:
            print(progress(), file=sys.stderr)
            said = now
        time.sleep(0.2)
