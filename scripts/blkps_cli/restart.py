"""blkps target restart: restart what died, where it was (doc/server.md
"Restarting what died").

Every tgtd `blkps target start` starts (one, or each shard of a scaled-out
job) keeps the options it was started with and its port in
DIR/start.json, and its --owner-pid watchdog's pid in DIR/watchdog.pid. A
restart starts a dead tgtd again with those options on the same port, so
learners reconnect to the same addresses (their layouts and URLs stay
valid), and it loads the last committed checkpoint generation. In bsp and
ssp a job is one model at one round: the live shards are restarted too, so
that every shard serves that same generation. In async only the dead ones
are. Each learner then reads its receipts and learns exactly what was lost
(doc/libblkps.md "Faults"). A one-tgtd target's --metrics exporter is
started again on its address (a scaled-out job's keeps running: its
target.env stays).
"""

import json
import os
import time
import types

from . import processes
from .errors import UserError

START_OPTIONS = "start.json"
WATCHDOG_PID = "watchdog.pid"


def remember(folder, a, port):
    """Keeps the `blkps target start` options `a` of the target in `folder`
    and the port it got, for a restart. fresh=1 is dropped: a restart loads
    what the fresh job has committed since."""
    options = {key: value for key, value in vars(a).items() if not callable(value) and key != "foreground"}
    options["port"] = str(port)
    options["bsopts"] = ";".join(pair for pair in a.bsopts.split(";") if pair != "fresh=1")
    path = os.path.join(folder, START_OPTIONS)
    with open(path + ".tmp", "w") as f:
        json.dump(options, f)
    os.replace(path + ".tmp", path)


def started_with(folder):
    """The options the target in `folder` was started with; a UserError if
    it was not started by a blkps that keeps them."""
    try:
        with open(os.path.join(folder, START_OPTIONS)) as f:
            return types.SimpleNamespace(**json.load(f))
    except (OSError, ValueError):
        raise UserError("target restart", f"{folder} has no readable {START_OPTIONS} (started by an older blkps?)",
                        "stop it and start it again: blkps target stop, then blkps target start") from None


def stop_watchdog(folder):
    """Ends the --owner-pid watchdog of the target in `folder`, if it runs:
    it would stop the tgtd restarted in its place."""
    try:
        with open(os.path.join(folder, WATCHDOG_PID)) as f:
            pid = int(f.read().strip())
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except (OSError, ValueError):
        return
    if b"watch" not in argv or folder.encode() not in argv:
        return  # the pid was reused: not ours
    processes.terminate(pid, 5)


def restart_target(folder):
    """Stops the tgtd of `folder` if it runs (no final checkpoint: it rolls
    back) and starts it again as it was started, on its port. Returns its
    target.env values."""
    from . import target  # target imports this module
    options = started_with(folder)
    stop_watchdog(folder)
    t = target.Target(folder)
    t.stop()
    return t.start(options)


def command_restart(a):
    from . import checkpoints, metrics, state, target
    folder = os.path.abspath(a.dir)
    env = state.read(os.path.join(folder, state.TARGET_ENV))
    if env is None:
        if not os.path.exists(os.path.join(folder, START_OPTIONS)):
            state.target(folder, "target restart")  # its one-line error: no target here
        env = {}  # one tgtd whose --owner-pid watchdog cleaned up after its death
    scaled = "TGTD" in env
    dirs = env["SHARD_DIRS"].split() if scaled else [folder]
    dead = [k for k, d in enumerate(dirs) if not target.Target(d).alive()]
    if not dead:
        print("every tgtd runs: nothing to restart")
        return 0
    first = started_with(dirs[0])
    model = target.check_bsopts(first.bsopts)
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
        env["PIDS"] = " ".join(str(target.Target(d).pid()) for d in dirs)
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
