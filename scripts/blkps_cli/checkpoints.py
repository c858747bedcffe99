"""A model's checkpoint set as the server reads it (doc/server.md
"Checkpoints"): what a start would load, asked of blkps-checkpoint (the
server's own reader, aggregator/checkpoint_set.h), and the identity options
every shard of a scaled-out job is given so that their files make one set.
"""

import json
import os
import secrets
import subprocess
import threading
import time
import types

from . import control, state, tgtd, tools
from .errors import UserError


def checkpoint_path(model):
    """The model's checkpoint= path (blkps-bsopts's JSON), or None."""
    return dict(model["options"]).get("checkpoint") or None


def committed(model, fresh=False, what="target start"):
    """The committed set a start of `model` loads (blkps-checkpoint's JSON:
    job, generation, shards, parts), or None for a new job (no checkpoint=,
    nothing committed yet, or `fresh`). A set a restart would refuse
    (incomplete, mixed, foreign) raises a UserError with the server's reason
    and the way out."""
    path = checkpoint_path(model)
    if path is None or fresh:
        return None
    out = subprocess.run([tools.built("blkps-checkpoint"), path], capture_output=True, text=True)
    if out.returncode != 0:
        reason = (out.stderr.strip().splitlines() or [f"blkps-checkpoint exit {out.returncode}"])[-1]
        reason = reason.removeprefix("blkps: checkpoint: ").split("; the job was not started from it")[0]
        raise UserError(what, reason, "restore the missing or replaced files, or give --fresh to start "
                        "a new job over them (they are removed as its generations commit)")
    found = json.loads(out.stdout)
    return found if found["committed"] else None


def shard_options(model, shards, fresh=False, what="target start"):
    """The --bsopts pairs every shard of a job of `shards` tgtds adds to the
    model's so that their checkpoint files make one set: shard=K/N (K filled
    in by the caller as {k}), the job id at a first or fresh start (a
    restart's shards take the committed set's), fresh=1. Empty without a
    checkpoint."""
    if checkpoint_path(model) is None:
        return []
    given = dict(model["options"])
    pairs = [("shard", "{k}/" + str(shards))] if shards > 1 else []
    if "job" not in given and committed(model, fresh, what) is None:
        pairs.append(("job", secrets.token_hex(8)))
    if fresh:
        pairs.append(("fresh", "1"))
    return pairs


def keeps_checkpoint(folder):
    """Whether the model of the tgtd in `folder` has checkpoint=, by the
    options it was started with; True when they are not kept (a tgtd
    started by an older blkps: its status says)."""
    try:
        options = tgtd.started_with(folder)
    except UserError:
        return True
    return checkpoint_path(tgtd.check_bsopts(options.bsopts)) is not None


def unreachable(what, url, error):
    """The UserError of a final checkpoint whose control LUN `url` could not
    be read (OSError `error`)."""
    why = (error.strerror or str(error)).removeprefix("blkps: ")
    return UserError(what, f"no final checkpoint: cannot read the control LUN {url}: {why}; the target was "
                     "stopped, and a restart loads the last committed generation (the pushes since are lost)")


def write_final(folder, what="target stop"):
    """Asks every tgtd of the target in `folder` (a target, shards or shard
    folder) for one more checkpoint, all at once (control checkpoint=1): a
    scaled-out job's shards each write their part of one generation, and the
    last one commits it. Returns the line that says so and how long it
    took, or None when nothing runs there or the model keeps no checkpoint.
    A tgtd that is not running, or a checkpoint that fails, raises a
    UserError that says so; the caller stops the target all the same."""
    values = state.shards(folder)
    dirs = [folder] if values is None else values["SHARD_DIRS"].split()
    if state.read(os.path.join(folder, state.TARGET_ENV)) is None and values is None:
        return None
    alive = [tgtd.Target(d).alive() for d in dirs]
    if not any(alive):
        return None  # what a kill of every tgtd lost, no stop can keep
    if not keeps_checkpoint(dirs[0]):
        return None  # known without a login (an iSER portal may not take one from here)
    down = [f"shard {k}" for k, up in enumerate(alive) if not up] if values is not None else []
    controls = control.control_targets(types.SimpleNamespace(dir=folder, control=None), what, down)
    devices, results = [], {}
    try:
        for label, url, chap_file in controls:
            try:
                devices.append((label, control.open_control(url, chap_file, None)))
            except OSError as e:  # a refused login: the caller stops the target all the same
                raise unreachable(what, url, e) from None
        try:
            if not devices[0][1].status()["checkpoint"]["path"]:
                return None
        except OSError as e:
            raise unreachable(what, controls[0][1], e) from None
        if not all(alive):
            down = dirs[alive.index(False)]
            raise UserError(what, f"no final checkpoint: the tgtd of {down} is not running; the target was "
                            "stopped, and a restart loads the last committed generation (the pushes since are lost)")
        start = time.monotonic()

        def ask(label, device):
            try:
                device.command("checkpoint=1")
                results[label] = device.status()["checkpoint"]
            except OSError as e:
                results[label] = {"error": device.status().get("control_error") or e.strerror}

        threads = [threading.Thread(target=ask, args=device) for device in devices]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        took = time.monotonic() - start
    finally:
        for _, device in devices:
            device.close()
    failed = [(label, r["error"]) for label, r in results.items() if "generation" not in r]
    if failed:
        label, why = failed[0]
        raise UserError(what, f"the final checkpoint failed{' on ' + label if label else ''}: {why}; the target "
                        "was stopped, and a restart loads the last committed generation (the pushes since are lost)")
    first = next(iter(results.values()))
    return (f"final checkpoint: generation {first['generation']} of job {first['job']} written by "
            f"{len(results)} tgtd(s) in {took:.3f} s")
