"""`blkps target start --tgtd N`: one model served by N co-located tgtds on
this host, striped (doc/data-path.md "Scale-out"). Under the hood these are
`blkps shards` in DIR/shard-K; DIR/target.env then names layout files
instead of LUNs:

  URL, URLS     layout:DIR/slot-L.layout, one per learner slot; each names
                every shard's LUN L and every shard's control LUN
  CONTROL_URL   layout:DIR/slot-1.layout: the whole job's control
                (blkps.control.open_control, blkps status --control)
  CONTROL_URLS  each shard's control LUN, shard 0 first
  OPERATOR_URL, OPERATOR_CHAP_FILE  with --operator: each shard's operator
                control LUN and its CHAP file, shard 0 first; else empty
  TGTD, STRIPE_UNIT, SHARD_DIRS, PIDS, ALLOW, TRANSPORT

and DIR/shards.env is `blkps shards`' own, so that status, set and stop
reach every shard.

The shards share the host: their models' memory together is checked
against the host's available memory before any starts (shards.py), and an
explicit --tgtd above the cores or the model's stripe units is refused.

How many: auto is one tgtd per two cores, at most 8 (measured: 8 tgtds gave
one learner 14.0 GB/s on a 16-core host against 3.5 through one; on a
2-core host 2 did not beat 1), never more than the model has stripe units,
and 1 whenever a feature of one tgtd is asked for (--port, iSER, the null
or rdwr LUN, --iqn, a table). A model checkpointed before is served by as
many tgtds as wrote its committed checkpoint set (blkps-checkpoint; a part
of S server tasks by 1/S of them, serve_parts.py); a set a restart would
refuse is refused here, before any tgtd starts.
"""

import os
import types

from . import checkpoints, shards, state, tgtd
from .errors import UserError

MAX_AUTO_TGTDS = 8
STRIPE_UNIT = 1 << 20  # the unit the GPU host's figures were measured with


def host_cores():
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0))


def host_tgtds():
    """--tgtd auto's count before the model is looked at: one per two cores
    this process may run on, at least 1, at most MAX_AUTO_TGTDS."""
    return max(1, min(host_cores() // 2, MAX_AUTO_TGTDS))


def single_tgtd_features(a, model):
    """The options of `a` that only one tgtd serves, as option names."""
    named = [("--port", a.port != "auto"), ("--transport iser", a.transport == "iser"),
             ("--null-lun", a.null_lun), ("--rdwr-lun", bool(a.rdwr_lun)), ("--iqn", bool(a.iqn)),
             ("a table (table=ROWS:WIDTH)", model["table_width"] and not model.get("hashed_capacity")),
             ("a gradient in parts (parts=)", any(key == "parts" for key, _ in model["options"]))]
    return [name for name, given in named if given]


def checkpoint_tgtds(model, fresh=False):
    """How many tgtds wrote the model's committed checkpoint set; None when
    there is none yet (or `fresh`). A refused set raises its UserError."""
    found = checkpoints.committed(model, fresh)
    return found["shards"] if found else None


def stripe_unit(model, tgtds):
    """The stripe unit for `tgtds` shards: 1 MiB (a multiple of the model
    block), halved while the model has fewer units than shards."""
    block, size = model["block_bytes"], model["params"] * 4
    unit = block * max(1, STRIPE_UNIT // block)
    while -(-size // unit) < tgtds and unit // 2 % block == 0 and unit // 2 % 1024 == 0:
        unit //= 2
    return unit


def tgtds_for(a, model, parts=1):
    """The number of tgtds `blkps target start` options `a` ask for; with
    `parts` > 1, those of one of `parts` server tasks that each serve as
    many (target serve --part, serve_parts.py): a checkpoint set and the
    stripe units count parts x tgtds."""
    single = single_tgtd_features(a, model)
    saved = checkpoint_tgtds(model, getattr(a, "fresh", False))
    if saved is not None and saved % parts:
        raise UserError("--part", f"the checkpoint {dict(model['options'])['checkpoint']} was written by {saved} "
                        f"tgtd(s), which {parts} server tasks cannot share equally",
                        f"serve it with a number of parts that divides {saved}")
    if a.tgtd == "auto":
        if single:
            return 1
        if saved is not None:
            return saved // parts
        units = -(-model["params"] * 4 // stripe_unit(model, parts))
        return max(1, min(host_tgtds(), units // parts))
    if a.tgtd > 1 and single:
        raise UserError("--tgtd", f"{a.tgtd} tgtds cannot serve {single[0]}", "give --tgtd 1 (or leave --tgtd out)")
    if a.tgtd > host_cores():
        raise UserError("--tgtd", f"{a.tgtd} tgtds on {host_cores()} cores: each tgtd's data path runs on one "
                        "thread, and more than the cores would only take turns",
                        f"give at most --tgtd {host_cores()} (or leave --tgtd out)")
    if saved is not None and saved != a.tgtd * parts:
        served = f"{parts} parts of {a.tgtd}" if parts > 1 else str(a.tgtd)
        raise UserError("--tgtd", f"the checkpoint {dict(model['options'])['checkpoint']} was written by {saved} "
                        f"tgtd(s), not {served}", f"give --tgtd {saved // parts} (or leave --tgtd out)")
    if model.get("hashed_capacity"):
        return a.tgtd  # split by id hash (shards.plan_hashed): no stripe units to fill
    unit = stripe_unit(model, a.tgtd * parts)
    if -(-model["params"] * 4 // unit) < a.tgtd * parts:
        raise UserError("--tgtd", f"a model of {model['params']} parameters fills fewer than {a.tgtd * parts} "
                        f"stripe units of {unit} bytes", "give fewer tgtds (or leave --tgtd out)")
    return a.tgtd


def running(folder):
    """Whether `folder` holds a scaled-out target (its target.env names
    its tgtds)."""
    values = state.read(os.path.join(folder, state.TARGET_ENV))
    return values is not None and "TGTD" in values


def start(a, model, tgtds, plan=None):
    """Starts the model on `tgtds` shards in a.dir, or the shards of `plan`
    (shards.Plan: a part of a model over several server tasks, serve_parts.py);
    returns target.env's values."""
    folder = os.path.abspath(a.dir)
    if tgtd.Target(folder).alive():
        raise UserError("target start", f"a target is already running in {folder}",
                        f"stop it first: blkps target stop --dir {a.dir}")
    unit = plan.unit if plan else stripe_unit(model, tgtds)  # shards.HASHED for a hashed table's plan
    options = types.SimpleNamespace(**vars(a))
    options.shards, options.stripe_unit = tgtds, str(unit)
    layouts, envs = shards.start(options, "target start", a.name, model, plan)
    try:
        values = {"URL": "layout:" + layouts[0], "URLS": ["layout:" + p for p in layouts],
                  "CONTROL_URL": "layout:" + layouts[0], "CONTROL_URLS": [env["CONTROL_URL"] for env in envs],
                  "NULL_URL": "", "RDWR_URL": "", "OPERATOR_URL": [env["OPERATOR_URL"] for env in envs],
                  "OPERATOR_CHAP_FILE": [env["OPERATOR_CHAP_FILE"] for env in envs],
                  "ALLOW": envs[0]["ALLOW"], "TRANSPORT": a.transport, "TGTD": tgtds,
                  "STRIPE_UNIT": 0 if model.get("hashed_capacity") else int(unit),
                  "SHARD_DIRS": [os.path.join(folder, f"shard-{k}") for k in range(tgtds)],
                  "PIDS": [env["PID"] for env in envs]}
        state.write(os.path.join(folder, state.TARGET_ENV), values)
    except BaseException:
        shards.stop(folder)
        raise
    return state.target(folder)


def stop(folder):
    shards.stop(folder)
    try:
        os.remove(os.path.join(folder, state.TARGET_ENV))
    except FileNotFoundError:
        pass


def dead_tgtds(env):
    """The shard folders of a scaled-out target.env whose tgtd is not running."""
    return [d for d in env["SHARD_DIRS"].split() if not tgtd.Target(d).alive()]


def labelled_urls(env):
    """tgtd.labelled_urls, then each shard's control LUN, and with
    --operator each shard's operator target."""
    operators = zip(env.get("OPERATOR_URL", "").split(), env.get("OPERATOR_CHAP_FILE", "").split())
    return (tgtd.labelled_urls(dict(env, OPERATOR_URL="")) +
            [f"control shard {k}: {url}" for k, url in enumerate(env["CONTROL_URLS"].split())] +
            [f"operator shard {k}: {url} (CHAP: {path})" for k, (url, path) in enumerate(operators)])
