"""`blkps target start --replicas 2` and `blkps target promote`: a shard's
backup (doc/replicas.md). The backup is a target of its own in DIR/backup,
started before the primary with the shard's options plus
backup=127.0.0.1:PORT (a free loopback port); the primary, in DIR, gets
replicate_to= that address. A target served by one tgtd only, for now.
DIR/slot-L.layout names learner LUN L of the primary and of the backup, for
learners that follow a failover (libblkps, layout:PATH).
"""

import glob
import os
import time

from . import control, shards, state, tgtd
from .errors import UserError

BACKUP_FOLDER = "backup"
# How long `target restart` waits for a new backup's catch-up (a progress
# line every CATCH_UP_PROGRESS_S).
CATCH_UP_WAIT_S, CATCH_UP_PROGRESS_S = 600, 10
# What a promoted backup's status `backup` says until it has a backup
# (aggregator/job_replica.cc, Promote).
NO_BACKUP_SINCE_PROMOTION = "outdated: none since this server was promoted"
# The stripe unit of a one-shard layout: any serves (one shard holds every
# unit); a multiple of 1024, as 16-bit shards need.
ONE_SHARD_STRIPE_UNIT = 1 << 20


def backup_dir(folder):
    """Where the backup of the target in `folder` keeps its state."""
    return os.path.join(os.path.abspath(folder), BACKUP_FOLDER)


def local_backup(a):
    """Whether start's options `a` ask for a backup here, in DIR/backup
    (`target start --replicas 2`; `target serve --replicas 2` has its
    backup on another host: serve_replicas.py)."""
    return getattr(a, "replicas", 1) > 1 and not getattr(a, "replica", None)


def start_backup(a):
    """Starts the backup of the target that `a` (blkps target start's
    options) describes; returns the --bsopts its primary starts with."""
    address = f"127.0.0.1:{tgtd.free_port('127.0.0.1')}"
    options = as_backup(tgtd.Options.of(a), address)
    options.port = "auto"  # the learners' portal is the primary's
    tgtd.Target(backup_dir(a.dir)).start(options)
    return f"{a.bsopts};replicate_to={address}"


def write_layouts(folder, env, model):
    """DIR/slot-L.layout for every learner LUN L of the primary (its
    target.env `env`, serving `model`, tgtd.check_bsopts's): the primary's
    LUN L with the backup's as its replica, so that libblkps follows a
    failover (doc/replicas.md "Learners follow a failover"). Their paths."""
    backup = state.target(backup_dir(folder), "target start")
    return shards.write_layouts(os.path.abspath(folder), [env], len(env["URLS"].split()), ONE_SHARD_STRIPE_UNIT,
                                model["params"], model["dtype"], backups=[backup])


def stop(folder):
    """Stops the backup of the target in `folder`, if it has one, and
    removes the layouts that name it."""
    backup = backup_dir(folder)
    if os.path.isdir(backup):
        for layout in glob.glob(os.path.join(os.path.abspath(folder), "slot-*.layout")):
            os.remove(layout)
        tgtd.stop_watchdog(backup)
        tgtd.Target(backup).stop()


def promoted_without_backup(folder, what):
    """Whether the target in `folder` serves learners as a promoted backup
    that has no backup of its own (status)."""
    with operator_control(folder, what) as c:
        return c.status().get("backup", "").startswith(NO_BACKUP_SINCE_PROMOTION)


def as_backup(options, address):
    """tgtd.Options `options` of a primary made those of a backup that
    follows its primary at `address`: no replicate_to=, no benchmark LUNs,
    no exporter (the primary's); the learners' portal as given."""
    kept = [pair for pair in options.bsopts.split(";") if not pair.startswith(("replicate_to=", "backup="))]
    options.bsopts = ";".join([*kept, f"backup={address}"])
    options.null_lun, options.rdwr_lun, options.metrics = False, None, None
    return options


def catch_up(folder, address, what):
    """Has the promoted primary in `folder` take the new backup at
    `address` (control replicate_to=) and waits until it is in sync
    (status `backup` empty), a line every CATCH_UP_PROGRESS_S; a UserError
    if it refuses, or if the backup is not in sync within CATCH_UP_WAIT_S."""
    began = time.monotonic()
    with operator_control(folder, what) as c:
        try:
            c.command(f"replicate_to={address}")
        except OSError as e:
            reason = c.status().get("control_error") or f"{e.strerror} (tgtd's log has the reason)"
            raise UserError(what, f"{folder} did not take the new backup: {reason}") from None
        said = began
        while (backup := c.status().get("backup", "")) != "":
            now = time.monotonic()
            if now - began > CATCH_UP_WAIT_S:
                raise UserError(what, f"the new backup was not in sync within {CATCH_UP_WAIT_S} s (status `backup` of "
                                f"{folder}: {backup})", "see both tgtd.log files")
            if now - said >= CATCH_UP_PROGRESS_S:
                print(f"{what}: waiting for the catch-up ({now - began:.0f} s; backup: {backup})", flush=True)
                said = now
            time.sleep(0.1)
    return time.monotonic() - began


def operator_control(folder, what):
    """The control LUN of the target in `folder` that takes operators'
    commands (its operator target's with --operator), open."""
    env = state.target(folder, what)
    url, chap_file = (env["OPERATOR_URL"], env["OPERATOR_CHAP_FILE"]) if env.get("OPERATOR_URL") else \
        (env["CONTROL_URL"], None)
    return control.open_control(url, chap_file, None)


def command_promote(a):
    """Has the backup of the target in a.dir serve learners (control
    command promote=1 on its control LUN)."""
    folder = backup_dir(a.dir)
    if not os.path.isdir(folder):
        raise UserError("target promote", f"{os.path.abspath(a.dir)} has no backup",
                        "start the target with --replicas 2")
    env = state.target(folder, "target promote")
    with operator_control(folder, "target promote") as c:
        try:
            c.command("promote=1")
        except OSError as e:
            reason = c.status().get("control_error") or f"{e.strerror} (tgtd's log has the reason)"
            raise UserError("target promote", f"the backup refused: {reason}") from None
    print(f"promoted: learners use {env['URL']} from now on")
    return 0


def add_arguments(start, cmds):
    """--replicas on `blkps target start` (the parser `start`), and the
    `promote` command on target's subparsers `cmds`."""
    start.add_argument("--replicas", type=int, choices=(1, 2), default=1,
                       help="2: a backup tgtd (in DIR/backup) holds every push before its WRITE completes and serves "
                       "learners once promoted (doc/replicas.md); async, bsp or ssp; one tgtd")
    p = cmds.add_parser("promote", help="have a target's backup serve learners",
                        description="Promotes the backup of a target started with --replicas 2: it serves learners "
                        "from now on, at its own portal (printed). Stop the primary first if it still runs.")
    p.add_argument("--dir", required=True)
    p.set_defaults(run=command_promote)
