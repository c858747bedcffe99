"""blkps status|set: look at and steer a running job through its control
LUN. The control LUN is plain bytes (doc/server.md, "Status and control"; its layout
is wire/include/blkps/control_lun.h, which blkps.control reads through
libblkps). Anything that can pread/pwrite can do what these commands do."""

import json
import os
import sys
import time

from . import state, tgtd, tools
from .errors import UserError


def control_targets(a, what, skip=()):
    """[(label, control LUN, CHAP file or None)]: one for a target, one per
    shard for a `blkps shards` folder (label "shard K", K from 0 as in
    DIR/shard-K; a target served by several tgtds is such a folder too, and a
    layout:PATH naming control LUNs gives those). A target started with --operator gives its operator's
    control LUN and credentials; else the control LUN, as --control does.
    Shards labelled in `skip` are left out."""
    if a.control and a.control.startswith("layout:"):
        controls = control_package().describe_layout(a.control[len("layout:"):])["controls"]
        if not controls:
            raise UserError(what, f"{a.control} names no control LUNs", "give a control LUN, or --dir DIR")
        return [(f"shard {k}", url, None) for k, url in enumerate(controls)]
    if a.control:
        return [("", a.control, None)]
    if not a.dir:
        raise UserError(what, "which job?", "give --dir DIR (a blkps target or shards folder) or --control TARGET")
    shards = state.shards(a.dir)
    dirs = [("", a.dir)] if shards is None else [(f"shard {k}", d) for k, d in enumerate(shards["SHARD_DIRS"].split())]
    targets = []
    for label, folder in dirs:
        if label in skip:
            continue
        env = state.target(folder, what)
        if env.get("OPERATOR_URL"):
            targets.append((label, env["OPERATOR_URL"], env["OPERATOR_CHAP_FILE"]))
        else:
            targets.append((label, env["CONTROL_URL"], None))
    return targets


def control_package():
    """The learner's package blkps.control (libblkps through ctypes, numpy),
    imported when a command first needs it: --help and bad arguments work
    before scripts/setup.sh has run."""
    if tools.PYTHON_PACKAGE not in sys.path:
        sys.path.insert(0, tools.PYTHON_PACKAGE)
    try:
        import blkps.control
    except ImportError as e:
        raise UserError(None, f"cannot load the blkps Python package ({e})",
                        "set the machine up first: scripts/setup.sh as root") from None
    return blkps.control


def open_control(url, chap_file, initiator):
    """blkps.control.Control on `url`, logging in with the credentials in
    `chap_file` (libblkps reads BLKPS_CHAP_FILE when it opens) if given. The
    learner's package is imported here (control_package)."""
    package = control_package()
    if chap_file is None:
        return package.Control(url, initiator_name=initiator)
    saved = os.environ.get("BLKPS_CHAP_FILE")
    os.environ["BLKPS_CHAP_FILE"] = chap_file
    try:
        return package.Control(url, initiator_name=initiator)
    finally:
        if saved is None:
            del os.environ["BLKPS_CHAP_FILE"]
        else:
            os.environ["BLKPS_CHAP_FILE"] = saved


def human_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def print_status(s):
    params = ", ".join(f"{k}={v:g}" for k, v in s["rule_params"].items()) or "no parameters"
    print(f"model {s['model']}: {s['params']} parameters ({human_bytes(s['device_bytes'])}), "
          f"{s['blocks']} blocks of {human_bytes(s['block_bytes'])}")
    if s.get("table"):
        t = s["table"]
        if t.get("hashed"):
            print(f"table: hashed, {t['rows_made']} of at most {t['row_limit']} rows of {t['width']} values made, "
                  f"evict={t['evict']}, {t['evictions']} evictions, {human_bytes(t['memory_bytes'])} held")
        else:
            print(f"table: {t['rows']} rows of {t['width']} values ({t['row_bytes']} bytes), {t['rows_made']} made")
    aware = "staleness-aware steps" if s["staleness_aware"] else "stale pushes applied as written"
    print(f"mode {s['mode']}, rule {s['rule']} ({params}), {aware}, stale bound {s['stale_bound']} updates")
    print(f"global step {s['global_step']}, updates {s['updates']}, held now {s['held_now']}, "
          f"rejected writes {s['rejected_writes']}, up {s['uptime_s']:.0f} s")
    fails = f"the job fails at {s['max_dead']} dead" if s["max_dead"] else "dead learners never fail the job"
    print(f"learners: {s['live_learners']} live of {len(s['learners'])}, {s.get('pushing_learners', 0)} pushing "
          f"(dead after {s['dead_after_s']:g} s without I/O; hold limit {s['hold_limit_s']:g} s; {fails})")
    # STALE_*: iterations ahead of the slowest (bsp/ssp); PUSH_*: updates
    # between a learner's pull and its push, and pushes beyond stale_bound.
    columns = ("lun", "state", "iteration", "idle_s", "held", "reads", "writes", "bytes_read",
               "bytes_written", "holds", "hold_timeouts", "staleness_max", "staleness_mean",
               "push_staleness_max", "push_staleness_mean", "stale_pushes")
    header = ("LUN", "STATE", "ITER", "IDLE_S", "HELD", "READS", "WRITES", "READ", "WRITTEN",
              "HOLDS", "TIMEOUTS", "STALE_MAX", "STALE_MEAN", "PUSH_MAX", "PUSH_MEAN", "BEYOND_BOUND")
    rows = [header]
    for learner in s["learners"]:
        row = []
        for c in columns:
            v = learner[c]
            row.append(human_bytes(v) if c.startswith("bytes") else f"{v:.1f}" if isinstance(v, float) else str(v))
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        print("  " + "  ".join(v.rjust(w) for v, w in zip(r, widths)))
    for learner in s["learners"]:
        if learner["stale_pushes"]:
            print(f"learner at LUN {learner['lun']}: {learner['stale_pushes']} pushes more than the stale bound of "
                  f"{s['stale_bound']} updates stale (worst {learner['push_staleness_max']}): it is much slower "
                  "than the others or pulls too rarely; fewer learners, a lower lr or ssp help (doc/async.md)")
    if s.get("ranks"):
        # blkps.torch's collective ranks (their heartbeats), apart from the
        # LUNs: a rank that only does collectives does no I/O on its LUN.
        print("ranks: " + ", ".join(f"{r['rank']} {r['state']} (idle {r['idle_s']:.1f} s)" for r in s["ranks"]))
    c = s["checkpoint"]
    if c["path"]:
        every = f", every {c['every_s']:g} s" if c["every_s"] else ""
        part = f", shard {c['shard']} of {c['shards']}" if c.get("shards", 1) > 1 else ""
        print(f"checkpoint: {c['path']} (job {c.get('job', '')}, generation {c.get('generation', 0)}{part}; "
              f"written {c['written']} times, last took {c['last_seconds']:.3f} s, "
              f"writes waited {c['last_stall_seconds']:.3f} s{every})")
        if c["error"]:
            print(f"checkpoint error: {c['error']}")
    else:
        print("checkpoint: none (set checkpoint=<path> in --bsopts to checkpoint on fsync)")
    if s.get("control_error"):
        print(f"last control write refused: {s['control_error']}")
    if s.get("stop"):
        print("stop asked (stop=1): learners stop training; stop=0 withdraws it")
    if s["failed"]:
        print(f"FAILED: {s['failure']}")


def unreachable_shards(a):
    """The labels of the shards of `--dir` whose tgtd is not running (their
    control LUN would only be retried until libblkps's reconnect deadline)."""
    shards = state.shards(a.dir) if a.dir and not a.control else None
    if shards is None:
        return []
    return [f"shard {k}" for k, d in enumerate(shards["SHARD_DIRS"].split()) if not tgtd.Target(d).alive()]


def shards_line(statuses, down, folder):
    """One line on a scaled-out job's shards as one job: each shard's step
    and checkpoint generation, and what differs (or who is unreachable)."""
    parts = [f"{label} step {s['global_step']} generation {s['checkpoint'].get('generation', 0)}"
             for label, s in statuses]
    parts += [f"{label} unreachable" for label in down]
    differs = []
    for key, value in (("step", lambda s: s["global_step"]),
                       ("generation", lambda s: s["checkpoint"].get("generation", 0))):
        if len({value(s) for _, s in statuses}) > 1:
            differs.append(key)
    if down:
        note = f"; {', '.join(down)} not running (blkps target restart --dir {folder} starts it where it was)"
    elif differs:
        note = f"; the shards differ in {' and '.join(differs)}"
    else:
        note = "; the shards agree"
    return "job: " + ", ".join(parts) + note


def command_status(a):
    down = unreachable_shards(a)
    devices = [(label, open_control(url, chap_file, a.initiator))
               for label, url, chap_file in control_targets(a, "status", down)]
    try:
        while True:
            statuses = [(label, device.status()) for label, device in devices]
            if a.json:
                body = [s for _, s in statuses]
                print(json.dumps(body if len(body) > 1 or down else body[0], indent=2))
            else:
                for label, s in statuses:
                    if label:
                        print(f"== {label} ==")
                    print_status(s)
                if down or len(statuses) > 1 and statuses[0][0].startswith("shard"):
                    print(shards_line(statuses, down, a.dir))
            if not a.watch:
                return 1 if down or any(s["failed"] for _, s in statuses) else 0
            sys.stdout.flush()
            time.sleep(a.watch)
            print()
    finally:
        for _, device in devices:
            device.close()


def command_set(a):
    for kv in a.settings:
        if "=" not in kv:
            raise UserError("set", f"expected KEY=VALUE, got '{kv}'", "e.g. blkps set --dir DIR lr=0.001")
    for label, url, chap_file in control_targets(a, "set"):
        where = label + ": " if label else ""
        with open_control(url, chap_file, a.initiator) as control:
            try:
                control.command(*a.settings)
            except OSError as e:
                # The writer sees only a SCSI error; the server keeps its reason in the status.
                reason = control.status().get("control_error") or f"{e.strerror} (tgtd's log has the reason)"
                raise UserError("set", f"{where}the server refused '{' '.join(a.settings)}': {reason}",
                                "KEY is a rule parameter (lr, momentum, beta1, beta2, eps) or resume")
            s = control.status()
        print(f"{where}mode {s['mode']}, rule {s['rule']}: " +
              ", ".join(f"{k}={v:g}" for k, v in s["rule_params"].items()) +
              (f"; FAILED: {s['failure']}" if s["failed"] else ""))
    return 0


def command_control_layout(a):
    """Prints the control LUN's layout as libblkps has it: `key value`
    lines, or the value of each --get KEY, one a line (for scripts: no
    number of the layout is copied anywhere else)."""
    layout = control_package().layout()
    values = {k: (" ".join(v) if isinstance(v, list) else v) for k, v in vars(layout).items()}
    for key in a.get or []:
        if key not in values:
            raise UserError("control-layout", f"no key '{key}'", f"one of: {', '.join(values)}")
    for key in a.get or values:
        print(values[key] if a.get else f"{key} {values[key]}")


def add_parsers(sub):
    """`blkps status`, `blkps set` and `blkps control-layout` on the
    subparsers `sub`."""
    p = sub.add_parser("control-layout", help="print the control LUN's layout (offsets, sizes, status keys)",
                       description="Print the control LUN's layout as libblkps has it (wire/include/blkps/"
                       "control_lun.h): `key value` lines, or with --get the values asked for, one a line.")
    p.add_argument("--get", action="append", metavar="KEY", help="print only KEY's value (repeatable)")
    p.set_defaults(run=command_control_layout)
    for name, helptext in (("status", "print a job's status from its control LUN"),
                           ("set", "set rule parameters (lr=0.001) or resume=1 through the control LUN")):
        p = sub.add_parser(name, help=helptext, description=helptext[0].upper() + helptext[1:] + ". DIR is a "
                           "`blkps target` folder or a `blkps shards` folder (every shard); TARGET is the control "
                           "LUN itself: an iscsi:// or iser:// URL, or a file or block device.")
        where = p.add_mutually_exclusive_group()
        where.add_argument("--dir", help="a blkps target or shards folder")
        where.add_argument("--control", metavar="TARGET", help="the control LUN")
        p.add_argument("--initiator", metavar="IQN", help="log in with this initiator name (default: one per "
                       "process); it grants nothing: with blkps target start --operator, --dir logs in to the "
                       "operator target with DIR/operator.chap")
        if name == "status":
            p.add_argument("--json", action="store_true", help="print the raw status JSON")
            p.add_argument("--watch", type=float, metavar="SECONDS", help="print again every SECONDS")
            p.set_defaults(run=command_status)
        else:
            p.add_argument("settings", nargs="+", metavar="KEY=VALUE")
            p.set_defaults(run=command_set)
