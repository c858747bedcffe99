"""One model served by S server tasks (`blkps target serve --part K/S`),
each through T co-located tgtds (--tgtd): a stripe of two levels, written
as one flat stripe (doc/server.md "Serving in the foreground").

The model is striped over S x T shards with one stripe unit (the rule of
shards.stripe); part K's tgtd t serves shard K + S*t of that stripe. So
part K holds stripe units K, K+S, K+2S, ... (1/S of the model, and
consecutive units on different hosts), and its tgtd t holds those of them
whose rank in the part is t mod T: the part alone is again a stripe of its
units over its T tgtds, with the same unit, which is how each part serves
itself (scaleout.py). Learners need to know none of it: the layout
(publish.py) lists the S x T shards in stripe order, the comments saying
which part and tgtd each is, and libblkps, blkps.torch, `blkps mount` and
`blkps login` read it as any layout. A checkpoint set of S x T shards is
the same set whichever S and T serve it.

Every part uses the same T: `--tgtd auto` resolves it per host
(scaleout.tgtds_for), so each part publishes it and the part that
completes the set refuses a mismatch (publish.assemble).
"""

import collections
import os

from . import checkpoints, scaleout, shards
from .errors import UserError

Part = collections.namedtuple("Part", "part parts tgtds plan")
Part.__doc__ = """Part `part` of `parts`, served by `tgtds` tgtds: `plan` is the
shards.Plan of its tgtds, tgtd t first."""


def stripe_shard(part, parts, tgtd):
    """The shard of the flat stripe that part `part` of `parts`'s tgtd
    `tgtd` serves."""
    return part + parts * tgtd


def part_and_tgtd(shard, parts):
    """Which part of `parts` serves `shard` of the flat stripe, and which
    of its tgtds: (part, tgtd)."""
    return shard % parts, shard // parts


def plan(a, model, part, parts):
    """The Part that `blkps target serve` options `a` serve of the WHOLE
    model `model` (blkps-bsopts's JSON). Refuses, in one line, what the
    parts cannot share: init=file:, a checkpointed model without one job
    id, a tgtd count the model or its checkpoint set cannot take. A hashed
    table's S x T shards split it by id hash (shards.plan_hashed), in the
    same flat order."""
    given = dict(model["options"])
    if parts > 1 and given.get("init", "").startswith("file:"):
        raise UserError("--bsopts", "init=file: is not split over server tasks yet",
                        "start the parts from init=zeros, normal or uniform (or a checkpoint)")
    if (parts > 1 and checkpoints.checkpoint_path(model) and "job" not in given
            and checkpoints.committed(model, a.fresh, "target serve") is None):
        raise UserError("--bsopts", "the parts of a checkpointed model write one checkpoint set, so they need one "
                        "job id", "give job=ID (1 to 64 of [0-9a-z-]), the same on every part, e.g. "
                        "job=slurm-$SLURM_JOB_ID")
    tgtds = scaleout.tgtds_for(a, model, parts)
    count = parts * tgtds
    if count == 1:
        identity = []  # one tgtd alone: a set of one, started as any target
    else:
        identity = checkpoints.shard_options(model, count, a.fresh, "target serve")
        if tgtds == 1:  # one tgtd is started as any target: start adds fresh=1 itself
            identity = [pair for pair in identity if pair[0] != "fresh"]
    served = [stripe_shard(part, parts, t) for t in range(tgtds)]
    return Part(part, parts, tgtds, shards.plan_shards("target serve", model, str(scaleout.stripe_unit(model, count)),
                                                       count, os.path.abspath(a.dir), identity, served))
