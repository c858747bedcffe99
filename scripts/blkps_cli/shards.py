"""blkps shards start|stop|show: one model striped over several blkps
servers (shards), each a private target in DIR/shard-K, and the layout files
learners open as layout:PATH.

Stripe unit k of the model lives on shard k mod S at shard byte
(k div S) * unit; the last unit may be partial (StripeMap; blkps-layout does
the arithmetic). Shard K is served with exactly its part: params = its
bytes / 4. No server knows of the others.

A table (table=ROWS:WIDTH, doc/embeddings.md "Tables over shards") is
striped the same way; its stripe unit holds whole rows, so shard K serves
table=(its bytes / row bytes):WIDTH, and its model block is the stripe unit
unless block= is given.

A hashed table (table=hash:CAPACITY:WIDTH, doc/embeddings.md "Hashed ids")
is not striped: id's row lives on shard blkps_feature_id_shard(id, S), so
shard K serves table=hash:ceil(CAPACITY / S):WIDTH with the same options
otherwise (the same seed: an id's initial row does not depend on its
shard), and the layout files say `kind = hashed`.
"""

import collections
import glob
import math
import os
import subprocess

from . import chap, checkpoints, state, tgtd, tools
from .arguments import positive_int
from .errors import UserError
from .files import write_atomically

Plan = collections.namedtuple("Plan", "unit bsopts sizes")
Plan.__doc__ = """What one host serves of a stripe (plan_shards): the stripe unit in
bytes (text), then for each of its shards, in order, its --bsopts and its
size in bytes."""


def layout_tool(what, args):
    """Runs blkps-layout; its stdout lines, or a UserError with its reason."""
    out = subprocess.run([tools.built("blkps-layout"), *args], capture_output=True, text=True)
    if out.returncode != 0:
        reason = (out.stderr.strip().splitlines() or [f"blkps-layout exit {out.returncode}"])[-1]
        raise UserError(what, reason.split(": ", 2)[-1] if reason.startswith("blkps: layout") else reason)
    return out.stdout.split()


def shard_bsopts(options, k, shard_params, folder, table_width=0, table_block=0, identity=()):
    """Shard K's --bsopts from the whole model's option pairs: params is the
    shard's (a table's: table=ROWS:WIDTH with the shard's rows, and
    block=table_block unless block= is given); init=file:PATH becomes the
    shard's part of the file; init=normal and uniform use seed+K;
    checkpoint=PATH stays (the shard writes its part of the set as
    PATH.shard-K.gen-G); then the `identity` pairs
    (checkpoints.shard_options), {k} in them made K."""
    given = dict(options)
    out = []
    if table_width and "block" not in given:
        out.append(f"block={table_block}")
    for key, value in options:
        if key == "params":
            value = str(shard_params)
        elif key == "table":
            value = f"{shard_params // table_width}:{table_width}"
        elif key == "init" and value.startswith("file:"):
            value = f"file:{folder}/init.f32"
        elif key == "seed" and given.get("init", "zeros").split(":")[0] in ("normal", "uniform"):
            value = str(int(value) + k)
        out.append(f"{key}={value}")
    if "seed" not in given and given.get("init", "zeros").split(":")[0] in ("normal", "uniform"):
        out.append(f"seed={k}")
    out += [f"{key}={value.format(k=k)}" for key, value in identity]
    return ";".join(out)


def stop(folder):
    for d in sorted(glob.glob(os.path.join(folder, "shard-*"))):
        tgtd.Target(d).stop()
    for f in [os.path.join(folder, state.SHARDS_ENV), *glob.glob(os.path.join(folder, "slot-*.layout"))]:
        try:
            os.remove(f)
        except FileNotFoundError:
            pass


def stripe(what, model, stripe_unit, shards):
    """The one stripe rule of a model over `shards` servers (the arithmetic
    is blkps-layout's): (the stripe unit in bytes as text, each shard's model
    block, each shard's size in bytes). `stripe_unit` is --stripe-unit's
    text (K, M suffixes)."""
    block, width = model["block_bytes"], model["table_width"]
    unit = layout_tool(what, ["bytes", stripe_unit])[0]
    if width:
        row_bytes = 4 * width
        if int(unit) % row_bytes != 0:
            raise UserError("--stripe-unit", f"a table's stripe unit holds whole rows: a multiple of its row's "
                            f"{row_bytes} bytes, got {unit}", f"e.g. --stripe-unit {math.lcm(512, row_bytes)}")
        if "block" not in dict(model["options"]):
            block = int(unit)  # each shard's model block is one stripe unit of rows
    sizes = [int(n) for n in layout_tool(what, ["sizes", "--stripe-unit", unit, "--shards", str(shards),
                                                "--params", str(model["params"]), "--block", str(block)])]
    return unit, block, sizes


def plan_shards(what, model, stripe_unit, count, folder, identity, serves=None):
    """The stripe of `model` over `count` shards (stripe) and the Plan of
    the shards this host serves: `serves`, their numbers in the stripe
    (default all), its i-th in folder/shard-i. `identity`: the checkpoint
    pairs of every shard (checkpoints.shard_options)."""
    serves = range(count) if serves is None else serves
    if model.get("hashed_capacity"):
        return plan_hashed(model, count, identity, serves)
    unit, block, sizes = stripe(what, model, stripe_unit, count)
    return Plan(unit, [shard_bsopts(model["options"], k, sizes[k] // 4, os.path.join(folder, f"shard-{i}"),
                                    model["table_width"], block, identity) for i, k in enumerate(serves)],
                [sizes[k] for k in serves])


HASHED = "hashed"  # a Plan's unit when the shards split a hashed table by id


def hashed_shard_capacity(capacity, count):
    """The rows each of `count` shards of a hashed table of `capacity` rows
    may make: capacity / count rounded up, so that together they hold at
    least `capacity` (ids spread evenly by their hash, not exactly)."""
    return -(-capacity // count)


def plan_hashed(model, count, identity, serves):
    """The Plan of a hashed table over `count` shards (plan_shards): shard K
    serves table=hash:(hashed_shard_capacity):WIDTH, its other options as
    given (seed included), then `identity` (with checkpoint=, shard=K/N:
    the shards' files make one checkpoint set, as a dense model's)."""
    table = f"hash:{hashed_shard_capacity(model['hashed_capacity'], count)}:{model['table_width']}"
    bsopts = []
    for k in serves:
        pairs = [(key, table if key == "table" else value) for key, value in model["options"]]
        bsopts.append(";".join([f"{key}={value}" for key, value in pairs] +
                               [f"{key}={value.format(k=k)}" for key, value in identity]))
    return Plan(HASHED, bsopts, [model["params"] * 4 for _ in serves])


def start(a, what="shards start", name="shard", model=None, plan=None):
    """Starts the shards of the model a.bsopts in a.dir/shard-K (named
    NAME-K): all a.shards of them, or those of `plan` (a Plan: part of a
    larger stripe, target serve --part); returns (layout files of these
    shards, each shard's target.env values)."""
    folder = os.path.abspath(a.dir)
    model = model or tgtd.check_bsopts(a.bsopts)
    if model["control"]:
        raise UserError("--bsopts", "role=control is not a model", "give the model's options")
    plan = plan or plan_shards(what, model, a.stripe_unit, a.shards, folder,
                               checkpoints.shard_options(model, a.shards, getattr(a, "fresh", False), what))
    unit, bsopts, sizes = plan
    params = sum(sizes) // 4  # the model's, or a part's
    for k in range(len(bsopts)):
        if tgtd.Target(os.path.join(folder, f"shard-{k}")).alive():
            raise UserError(what, f"shard {k} is already running in {folder}/shard-{k}",
                            f"stop it first: blkps shards stop --dir {a.dir}")
    dirs = [os.path.join(folder, f"shard-{k}") for k in range(len(bsopts))]
    check_host_memory(what, params, bsopts)
    for d in dirs:
        os.makedirs(d, exist_ok=True)
    try:
        init = dict(model["options"]).get("init", "")
        if init.startswith("file:") and unit != HASHED:
            layout_tool(what, ["split", "--stripe-unit", unit, "--shards", str(len(dirs)),
                               "--params", str(params), init[len("file:"):],
                               *[os.path.join(d, "init.f32") for d in dirs]])
        envs = []
        for k, d in enumerate(dirs):
            options = tgtd.Options(bsopts=bsopts[k], name=f"{name}-{k}", luns=a.luns, address=a.address,
                                   allow=a.allow, initiator=list(getattr(a, "initiator", None) or []),
                                   operator=a.operator, chap_file=a.chap_file, plugin=a.plugin,
                                   owner_pid=a.owner_pid, foreground=getattr(a, "foreground", False))
            shard = tgtd.Target(d)
            try:
                envs.append(shard.start(options))
            except UserError as e:  # named by its option (--allow: ...), or by the shard alone
                raise UserError(what, f"shard {k}: {e.detail if e.what == 'target start' else e}") from None
        layouts = write_layouts(folder, envs, a.luns, unit, params, model["dtype"])
    except BaseException:
        stop(folder)
        raise
    state.write(os.path.join(folder, state.SHARDS_ENV), {
        "SHARDS": len(dirs), "KIND": HASHED if unit == HASHED else "striped",
        "STRIPE_UNIT": 0 if unit == HASHED else unit, "PARAMS": params, "SHARD_PARAMS": [str(n // 4) for n in sizes],
        "SHARD_DIRS": dirs, "LAYOUT": layouts[0], "LAYOUTS": layouts,
        "CONTROL_URLS": [env["CONTROL_URL"] for env in envs]})
    return layouts, envs


def check_host_memory(what, params, bsopts):
    """Refuses shards of one host whose models need more memory together
    than the host has available: each tgtd checks only its own model
    (doc/server.md "Memory"). `bsopts`: every shard's --bsopts."""
    shards = [tgtd.check_bsopts(b) for b in bsopts]
    need, available = sum(s["memory_bytes"] for s in shards), shards[0]["memory_available_bytes"]
    if available and need > available and len(shards) > 1:
        raise UserError(what, f"params: {len(shards)} co-located tgtds of a model of {params} parameters need "
                        f"{mib(need)} together but only {mib(available)} of this host's memory is available",
                        "use fewer parameters, or serve the shards from several hosts (doc/data-path.md \"Scale-out\")")


def mib(n):
    return f"{-(-n // (1 << 20))} MiB"


def write_layouts(folder, envs, luns, unit, params, dtype, levels="", labels=(), backups=()):
    """DIR/slot-L.layout for every learner slot L, each written atomically: LUN L of every shard
    (16-bit shards, --bsopts dtype: a dtype line says so), and every
    shard's control LUN (control lines: the job's control, blkps.control).
    `unit` is the stripe unit, or HASHED for a hashed table's layout
    (`kind = hashed`, no stripe unit). `levels` and `labels` (one per
    shard) are comments: how the shards are grouped (a two-level stripe,
    serve_parts.py) and where each is. `backups` (one per shard, or none):
    each shard's backup target.env (None: it has none), its LUN L a
    replica line under the shard's (doc/replicas.md "Learners follow a failover")."""
    layouts = []
    for lun in range(1, luns + 1):
        path = os.path.join(folder, f"slot-{lun}.layout")
        text = (f"# blkps shard layout (written by blkps): learner slot {lun} of a model\n"
                + (f"# a hashed table split by id hash over {len(envs)} shard(s).\nkind = {HASHED}\n"
                   if unit == HASHED else
                   f"# of {params} parameters striped over {len(envs)} shard(s){levels}.\n"
                   f"stripe_unit = {unit}\n" + (f"dtype = {dtype}\n" if dtype != "float32" else "")))
        for k, (env, label) in enumerate(zip(envs, labels or [""] * len(envs))):
            text += f"shard = {env['URLS'].split()[lun - 1]}" + (f"  # {label}\n" if label else "\n")
            if backups and backups[k]:
                text += f"replica = {backups[k]['URLS'].split()[lun - 1]}  # its backup\n"
        for env in envs:
            text += f"control = {env['CONTROL_URL']}\n"
        write_atomically(path, text)  # a learner waiting for it never reads half a file
        layouts.append(path)
    return layouts


def command_start(a):
    with tgtd.start_lock(a.dir, "shards start"):
        layouts, envs = start(a)
    for lun, path in enumerate(layouts, 1):
        print(f"learner {lun}: layout:{path}")
    for k, env in enumerate(envs):
        print(f"control shard {k}: {env['CONTROL_URL']}")
    return 0


def command_stop(a):
    if os.path.isdir(a.dir):
        stop(os.path.abspath(a.dir))
    return 0


def command_show(a):
    values = state.shards(a.dir)
    if values is None:
        raise UserError("shards show", f"no shards running in {a.dir} (no {state.SHARDS_ENV})",
                        f"start them: blkps shards start --dir {a.dir} ...")
    if a.get:
        state.print_values(values, a.get, "shards show")
    else:
        for lun, path in enumerate(values["LAYOUTS"].split(), 1):
            print(f"learner {lun}: layout:{path}")
        for k, url in enumerate(values["CONTROL_URLS"].split()):
            print(f"control shard {k}: {url}")
    return 0


def add_parser(sub):
    p = sub.add_parser("shards", help="start or stop one model striped over several servers",
                       description=__doc__.split("\n\n")[0].replace("\n", " "))
    cmds = p.add_subparsers(dest="shards_command", required=True)
    s = cmds.add_parser("start", help="start every shard and write the layout files",
                        description="Starts shard K in DIR/shard-K and writes DIR/slot-L.layout for every learner "
                        "slot L (open it as layout:PATH) and DIR/shards.env. A failure prints one line and leaves "
                        "no shard running.")
    s.add_argument("--dir", required=True, help="state folder")
    s.add_argument("--shards", type=positive_int, required=True, help="number of shards")
    s.add_argument("--stripe-unit", required=True, metavar="BYTES", help="stripe unit: a multiple of 512 and of "
                   "the model block (bsopts block=, default 1M; a table's: of its row, and the block defaults to "
                   "the unit); K, M suffixes")
    s.add_argument("--bsopts", required=True, help="the whole model's options as for blkps target start; "
                   "params= is the whole model's; init=file:PATH is split over the shards; init=normal/uniform "
                   "use seed+K on shard K; with checkpoint=PATH shard K writes PATH.shard-K.gen-G, committed "
                   "by PATH.manifest")
    s.add_argument("--fresh", action="store_true", help="start a new job over an existing checkpoint set "
                   "instead of loading it")
    s.add_argument("--luns", type=positive_int, default=1, help="learner slots on every shard (default 1)")
    s.add_argument("--address", default="127.0.0.1", help="portal address of every shard (default 127.0.0.1)")
    s.add_argument("--plugin", help="bs_blkps.so, as for blkps target start")
    s.add_argument("--allow", action="append", metavar="ADDRESS|SUBNET/BITS|ALL", help="initiator ACL of every "
                   "shard, as for blkps target start (repeatable)")
    s.add_argument("--operator", nargs="?", const="", metavar="", help="as for blkps target start: every shard "
                   "gets an operator target, its secret in DIR/shard-K/operator.chap")
    chap.add_argument(s, "every shard's, as blkps target start --chap-file")
    s.add_argument("--owner-pid", type=positive_int, metavar="PID", help="stop every shard when PID exits")
    s.set_defaults(run=command_start)
    t = cmds.add_parser("stop", help="stop every shard (quiet when none runs)")
    t.add_argument("--dir", required=True)
    t.set_defaults(run=command_stop)
    w = cmds.add_parser("show", help="print the layout files and control URLs")
    w.add_argument("--dir", required=True)
    w.add_argument("--get", action="append", metavar="KEY", help="print this shards.env value (SHARDS, KIND, "
                   "STRIPE_UNIT, PARAMS, SHARD_PARAMS, SHARD_DIRS, LAYOUT, LAYOUTS, CONTROL_URLS); repeatable")
    w.set_defaults(run=command_show)
