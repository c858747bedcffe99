"""A model's checkpoint set as the server reads it (doc/server.md
"Checkpoints"): what a start would load, asked of blkps-checkpoint (the
server's own reader, aggregator/checkpoint_set.h), and the identity options
every shard of a scaled-out job is given so that their files make one set.
"""

import json
import secrets
import subprocess

from . import tools
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
