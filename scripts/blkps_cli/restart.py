"""blkps target restart: restart what died, where it was (doc/server.md
"Restarting what died").

Every tgtd `blkps target start` starts (one, or each shard of a scaled-out
job) keeps the options it was started with and its port in
DIR/start.json (tgtd.remember), and its --owner-pid watchdog's pid in DIR/watchdog.pid. A
restart starts a dead tgtd again with those options on the same port, so
learners reconnect to the same addresses (their layouts and URLs stay
valid), and it loads the last committed checkpoint generation. A
target started with --replicas 2 whose backup died gets its backup (and
the backup's lease keeper) started again instead: the primary catches it
up (doc/replicas.md "A backup that returns"); one whose primary died and
whose backup was promoted gets its primary started again as the backup
of the promoted one, caught up before its keeper starts (doc/replicas.md
"A new backup"). In bsp and
ssp a job is one model at one round: the live shards are restarted too, so
that every shard serves that same generation. In async only the dead ones
are. Each learner then reads its receipts and learns exactly what was lost
(doc/libblkps.md "Faults"). A one-tgtd target's --metrics exporter is
started again on its address (a scaled-out job's keeps running: its
target.env stays).
"""

import os
import time

from . import checkpoints, lease, metrics, replicas, state, tgtd
from .errors import UserError
from .tgtd import START_OPTIONS, started_with


def restart_target(folder, options=None):
    """Stops the tgtd of `folder` if it runs (no final checkpoint: it rolls
    back) and starts it again with `options` (default: as it was started),
    on its port. Returns its target.env values."""
    options = options or started_with(folder)
    tgtd.stop_watchdog(folder)
    t = tgtd.Target(folder)
    t.stop()
    return t.start(options)


def restart_as_backup(folder):
    """The dead primary of a target whose backup was promoted starts again
    as that one's backup (doc/replicas.md "A new backup"): on its port,
    which the layouts name, following a new replication address that the
    promoted one is given (replicate_to=); once it is caught up its lease
    keeper starts (it may take over from then on, never before)."""
    primary = replicas.backup_dir(folder)
    address = f"127.0.0.1:{tgtd.free_port('127.0.0.1')}"
    env = restart_target(folder, replicas.as_backup(started_with(folder), address))
    took = replicas.catch_up(primary, address, "target restart")
    keeper = lease.restart_keeper(folder, folder, caught_up=True)
    print(f"restarted the dead primary on port {env['PORT']} as the backup of the promoted one ({primary}): in sync "
          f"{took:.2f} s after it was asked{', its lease keeper started' if keeper else ''}; it takes over if that one "
          "dies")
    return 0


def restart_backup(folder):
    """Starts the dead backup of the live target in `folder` again, and its
    lease keeper: its primary catches it up while training goes on
    (doc/replicas.md "A backup that returns")."""
    env = restart_target(replicas.backup_dir(folder))
    keeper = lease.restart_keeper(folder, replicas.backup_dir(folder), caught_up=False)
    print(f"restarted the backup (dead) on port {env['PORT']}{' with its lease keeper' if keeper else ''}: its "
          f"primary catches it up while training goes on (status `backup` is empty once it is in sync)")
    return 0


def command_restart(a):
    folder = os.path.abspath(a.dir)
    env = state.read(os.path.join(folder, state.TARGET_ENV))
    if env is None:
        if not os.path.exists(os.path.join(folder, START_OPTIONS)):
            state.target(folder, "target restart")  # its one-line error: no target here
        env = {}  # one tgtd whose --owner-pid watchdog cleaned up after its death
    scaled = "TGTD" in env
    dirs = env["SHARD_DIRS"].split() if scaled else [folder]
    dead = [k for k, d in enumerate(dirs) if not tgtd.Target(d).alive()]
    backup = replicas.backup_dir(folder)
    if not scaled and os.path.isdir(backup) and not tgtd.Target(backup).alive():
        if dead:
            raise UserError("target restart", "the primary and its backup are both dead",
                            "start the target again (blkps target start)")
        return restart_backup(folder)
    if not scaled and dead and os.path.isdir(backup) and replicas.promoted_without_backup(backup, "target restart"):
        return restart_as_backup(folder)
    if not dead:
        print("every tgtd runs: nothing to restart")
        return 0
    first = started_with(dirs[0])
    model = tgtd.check_bsopts(first.bsopts)
    mode = dict(model["options"]).get("mode", "async")
    again = list(range(len(dirs))) if scaled and mode != "async" else dead
    found = checkpoints.committed(model, what="target restart")
    began = time.monotonic()
    if not scaled:
        metrics.stop(folder, wait_s=5)  # its target.env is written anew: started again below
    for k in again:
        restart_target(dirs[k])
    exporter = None
    if not scaled and getattr(first, "metrics", None):
        exporter = metrics.start(folder, *first.metrics, first.metrics_auth)["METRICS"]
    took = time.monotonic() - began
    if scaled:
        env["PIDS"] = " ".join(str(tgtd.Target(d).pid()) for d in dirs)
        state.write(os.path.join(folder, state.TARGET_ENV), env)
    label = (lambda k: f"shard {k}") if scaled else (lambda k: "tgtd")
    loaded = (f"generation {found['generation']} of job {found['job']}" if found
              else "no checkpoint: a fresh model")
    for k in again:
        why = "dead" if k in dead else f"live, rolled back ({mode})"
        print(f"restarted {label(k)} ({why}) on port {started_with(dirs[k]).port}: {loaded}")
    if exporter:
        print(f"metrics: http://{exporter}/metrics")
    print(f"restart took {took:.3f} s; learners reconnect to the same addresses and resend what their receipts lack")
    return 0
