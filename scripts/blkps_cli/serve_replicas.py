"""`blkps target serve --replicas 2`: a part's primary and its backup on
hosts of their own (doc/replicas.md "Replicas on several hosts"). The two
server tasks meet in the --publish JOBDIR:

  - the backup (--replica backup) starts first, its plugin listening for
    its primary on a free port of its --replication-address (default its
    --address: a network of its own keeps the records off the learners'
    links, doc/replicas.md "A network for the records"), and writes
    JOBDIR/servers/backup-K-of-S.json (that address and its learner URLs)
    once it serves;
  - the primary (--replica primary) waits for that file (bounded, with
    progress), starts with replicate_to= that address, and publishes its
    part with the backup's URLs and address, so that the layouts name both
    (publish.assemble: a replica line under each shard);
  - a backup started again while its primary serves takes the addresses
    the primary's part file names (where it replicates to, the backup's
    portal), and is caught up there.

With --part slurm, task P of N serves part P // 2 of N / 2, as the primary
if P is even: two consecutive tasks are one part's replicas (place them on
different nodes: one task per node).
"""

import ipaddress
import json
import os
import socket
import subprocess

from . import publish, replicas, tgtd
from .errors import UserError
from .files import write_atomically

ROLES = ("primary", "backup")


def slurm_part_and_role():
    """(K, S, role) of this Slurm task when two tasks serve each part."""
    task, tasks = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    if tasks % 2:
        raise UserError("--replicas", f"2 with --part slurm needs an even number of tasks, got {tasks}",
                        "run two tasks (a primary and its backup) per part")
    return task // 2, tasks // 2, ROLES[task % 2]


def check_options(a):
    """Refuses, in one line, what --replicas 2 on serve cannot do (more
    than one tgtd a replica: target.start_locked)."""
    if a.replicas < 2:
        if a.replica:
            raise UserError("--replica", "names a replica's role", "give --replicas 2 with it")
        if a.replication_address:
            raise UserError("--replication-address", "is where a backup listens", "give --replicas 2 with it")
        return
    if not a.publish:
        raise UserError("--replicas", "2: a primary and its backup meet in the job's folder",
                        "give --publish JOBDIR (a folder both hosts see)")
    if a.replica not in ROLES:
        raise UserError("--replicas", "2: which replica this task is must be said",
                        "give --replica primary or --replica backup (or --part slurm)")
    if a.replication_address:
        a.replication_address = own_address(a.replication_address)


def own_address(text):
    """--replication-address: an address as given, or NETWORK/BITS: this
    host's IPv4 address on that network (one command line for every host
    of a Slurm job)."""
    try:
        network = ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise UserError("--replication-address", f"expected an address or NETWORK/BITS, got {text!r}") from None
    if "/" not in text:
        return text
    try:
        shown = subprocess.run(["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True)
    except FileNotFoundError:
        raise UserError("--replication-address", f"{text}: `ip` (iproute2) is not installed to find this "
                        "host's address there", "give the address itself") from None
    mine = [info["local"] for link in json.loads(shown.stdout or "[]") for info in link.get("addr_info", [])]
    for address in mine:
        if ipaddress.ip_address(address) in network:
            return address
    raise UserError("--replication-address", f"this host has no address on {network} (it has {', '.join(mine)})",
                    "give an address of this host, or the network of one")


def backup_path(jobdir, part, parts):
    return os.path.join(jobdir, publish.SERVERS, f"backup-{part}-of-{parts}.json")


def replication_option(a, served):
    """The --bsopts option that makes this task the part's primary or its
    backup: the backup listens on a free port of a.address; the primary
    waits for its backup's file and replicates to it. Also remembers the
    backup's URLs on `a` for publish()."""
    jobdir = os.path.abspath(a.publish)
    if a.replica == "backup":
        listen = a.replication_address or a.address
        before = backup_before(jobdir, served, listen)
        if before and a.port == "auto":
            a.replication, a.port = before
        else:
            a.replication = f"{listen}:{tgtd.free_port(listen)}"
        return f"backup={a.replication}"
    path = backup_path(jobdir, served.part, served.parts)
    publish.wait_for_file(
        path, publish.WAIT_TIMEOUT_S,
        lambda: f"blkps: target serve: waiting for the backup of part {served.part} ({path})",
        lambda: UserError("--replica", f"primary: no backup of part {served.part} published {path} within "
                          f"{publish.WAIT_TIMEOUT_S} s", "start its backup: blkps target serve --replica backup ..."))
    try:
        with open(path) as f:
            a.backup_of_part = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError("--replicas", f"{path}: not a backup's file ({e})") from None
    return f"replicate_to={a.backup_of_part['replication']}"


def backup_before(jobdir, served, address):
    """If the part's primary serves with a backup on `address` (its part
    file says so): the address it replicates to and the backup's portal
    port, (HOST:PORT, PORT). A backup started again while its primary
    serves takes both, so that the primary, which looks for its lost
    backup there, catches it up (doc/replicas.md "A backup that returns"),
    and the learners' layouts, which name its portal, find it."""
    try:
        with open(publish.part_path(jobdir, served.part, served.parts)) as f:
            values = json.load(f)
        replication, urls = values["replication"], values["backup_urls"]
    except (OSError, ValueError, KeyError):
        return None
    if replication.rpartition(":")[0] != address:
        return None
    return replication, int(publish.portal(urls[0]).rpartition(":")[2])


def writes_checkpoints(a):
    """Whether this task's tgtd writes its part's checkpoint generations,
    the final one included: not a backup that was never promoted, nor a
    primary past its lease (a backup may serve by then, and a generation
    from here would roll back what that one acknowledged). True without
    --replicas 2, or if its status cannot be read (its stop then says why
    the checkpoint failed)."""
    if not a.replica:
        return True
    try:
        with replicas.operator_control(a.dir, "target serve") as c:
            values = c.status()
    except (OSError, UserError):
        return True
    return values.get("replica") != "backup" and not values.get("lease", "").startswith("lapsed ")


def publish_backup(a, served, env):
    """The backup's file, once it serves (target.env `env`)."""
    path = backup_path(os.path.abspath(a.publish), served.part, served.parts)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    values = {"part": served.part, "parts": served.parts, "host": socket.gethostname(),
              "replication": a.replication, "urls": env["URLS"].split(), "control_url": env["CONTROL_URL"]}
    write_atomically(path, json.dumps(values, indent=1))


def unpublish_backup(a, part, parts):
    try:
        os.remove(backup_path(os.path.abspath(a.publish), part, parts))
    except FileNotFoundError:
        pass
