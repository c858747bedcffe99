"""blkps target start|stop|show|watch: the commands of a blkps parameter
server (one tgtd, tgtd.py; or N co-located tgtds, scaleout.py), with
`blkps target serve` (serve.py) and `restart` (restart.py) beside them.
"""

import json
import os
import signal
import time

from . import chap, checkpoints, lease, metrics, replicas, restart, scaleout, state, tgtd
from .arguments import port_or_auto, positive_int
from .errors import UserError
from .processes import running


def command_start(a, part=None):
    """`blkps target start`; with `part` (serve_parts.Part, from target
    serve --part) its shards of a model over several server tasks."""
    with tgtd.start_lock(a.dir, "target start"):
        return start_locked(a, part)


def start_locked(a, part=None):
    metrics.check_start_options(a)
    lease.check_options(a)
    if scaleout.running(a.dir):
        if len(scaleout.dead_tgtds(state.target(a.dir))) < int(state.target(a.dir)["TGTD"]):
            raise UserError("target start", f"a target is already running in {os.path.abspath(a.dir)}",
                            f"stop it first: blkps target stop --dir {a.dir}")
        scaleout.stop(os.path.abspath(a.dir))  # what tgtds that died (--owner-pid) left
    model = tgtd.check_bsopts(a.bsopts)
    if a.fresh and not dict(model["options"]).get("checkpoint"):
        raise UserError("--fresh", "starts a new job over a checkpoint, and --bsopts names none (checkpoint=)",
                        "leave --fresh out")
    tgtds = part.tgtds if part else scaleout.tgtds_for(a, model)
    if getattr(a, "replicas", 1) > 1 and tgtds > 1:  # here or on another host (target serve)
        raise UserError("--replicas", f"a backup for each of {tgtds} tgtds is not done yet", "give --tgtd 1")
    if tgtds > 1:
        env = scaleout.start(a, model, tgtds, part and part.plan)
        print("\n".join(scaleout.labelled_urls(env)))
        split = "ids split by hash" if model.get("hashed_capacity") else f"stripe unit {env['STRIPE_UNIT']} bytes"
        print(f"tgtds: {tgtds} (--tgtd), {split}")
    else:
        if part:
            a.bsopts = part.plan.bsopts[0]
        if a.fresh:
            a.bsopts += ";fresh=1"
        if replicas.local_backup(a):
            a.bsopts = replicas.start_backup(a)
        try:
            env = tgtd.Target(a.dir).start(tgtd.Options.of(a))
        except BaseException:
            replicas.stop(a.dir)  # a failed start leaves nothing running
            raise
        if getattr(a, "lease", None):
            try:
                lease.start(a)
            except BaseException:
                stop(a.dir, final_checkpoint=False)
                raise
        print("\n".join(tgtd.labelled_urls(env)))
        if replicas.local_backup(a):
            print(f"backup: {replicas.backup_dir(a.dir)} (serves learners once promoted: blkps target promote "
                  f"--dir {a.dir})")
            for lun, path in enumerate(replicas.write_layouts(a.dir, env, model), 1):
                print(f"learner {lun}, following a failover: layout:{path}")
    if a.metrics:
        try:
            env = metrics.start(os.path.abspath(a.dir), *a.metrics, a.metrics_auth)
        except BaseException:
            stop(a.dir, final_checkpoint=False)  # a failed start leaves nothing running
            raise
        print(f"metrics: http://{env['METRICS']}/metrics")
    print(f"admits: {env['ALLOW']} (--allow)")
    return 0


def command_stop(a):
    line = stop(a.dir, final_checkpoint=not a.no_checkpoint)
    if line:
        print(line)
    return 0


def stop(folder, final_checkpoint=True):
    """Stops the target in `folder` (one tgtd or a scaled-out job's), its
    --metrics exporter and its --owner-pid watchdogs; first, with
    `final_checkpoint`, has every tgtd write a final checkpoint generation.
    Returns the line saying how long that took (None without one); if it
    failed, raises its UserError once everything is stopped all the same."""
    folder = os.path.abspath(folder)
    failure, line = None, None
    if final_checkpoint and os.path.isdir(folder):
        try:
            line = checkpoints.write_final(folder)
        except UserError as e:
            failure = e  # stopped all the same: said after the stop
    metrics.stop(folder)
    # The --owner-pid watchdogs go first: one that wakes after the stop would
    # stop whatever a quick new start put in the same folder.
    shards = state.shards(folder)
    for d in [folder, *(shards["SHARD_DIRS"].split() if shards else [])]:
        tgtd.stop_watchdog(d)
    lease.stop(folder)  # before the tgtds: a keeper whose tgtd ends gives its lease to the backup
    if scaleout.running(folder):
        scaleout.stop(folder)
    tgtd.Target(folder).stop()
    replicas.stop(folder)  # after its primary, which needs it for every write
    if failure:
        raise failure
    return line


def command_show(a):
    target = tgtd.Target(a.dir)
    env = state.target(target.dir, "target show")
    if "TGTD" in env:  # a model served through several tgtds (scaleout)
        dirs = env["SHARD_DIRS"].split()
        dead = scaleout.dead_tgtds(env)
        if dead:
            raise UserError("target show", f"the tgtd of {dead[0]} is not running; its log is {dead[0]}/tgtd.log",
                            f"restart it where it was: blkps target restart --dir {a.dir}")
        lines = scaleout.labelled_urls(env)
        lines.append(f"tgtds: {env['TGTD']}, pids {env['PIDS']}, logs {' '.join(d + '/tgtd.log' for d in dirs)}")
    else:
        dirs = [target.dir]
        if not target.alive():
            raise UserError("target show",
                            f"tgtd ({env.get('PID')}) of {target.dir} is not running; its log is {target.log}",
                            f"blkps target stop --dir {a.dir}, then start it again")
        lines = tgtd.labelled_urls(env) + [f"tgtd: pid {env['PID']}, log {env['LOG']}"]
    if a.get:
        state.print_values(env, a.get, "target show")
    elif a.json:
        print(json.dumps(env, indent=2))
    elif a.tgtadm:
        for k, d in enumerate(dirs):
            status, out = tgtd.Target(d).tgtadm(["--op", "show", "--mode", "target"])
            print(f"== tgtd {k} ==\n{out}" if len(dirs) > 1 else out)
            if status != 0:
                return 1
    else:
        print("\n".join(lines))
    return 0


def command_watch(a):
    """The --owner-pid watchdog (tgtd.Target.start_watchdog starts it):
    stops the target as `blkps target stop` does, final checkpoint and all,
    once process a.owner_pid has exited or tgtd has died; a scaled-out
    job's shards each have one, and each asks its own shard for its part of
    the final generation (the last one commits it)."""
    watched = tgtd.Target(a.dir)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while running(a.owner_pid) and watched.alive():
        time.sleep(1)
    if watched.alive():
        try:
            checkpoints.write_final(watched.dir, "target watch")
        except (UserError, OSError):
            pass  # no one to tell, and the stop below must run: each tgtd's log has the reason
    watched.stop()
    return 0


def add_parser(sub):
    """`blkps target ...` on the subparsers `sub`; returns target's own
    subparsers (serve.py adds `serve`)."""
    p = sub.add_parser("target", help="start, stop or show a blkps server (a private tgtd)",
                       description="A blkps parameter server: a private tgtd (its own control socket, log and port "
                       "in --dir) serving a model on LUNs 1..N, one per learner slot, and its status and control "
                       "LUN N+1. start writes DIR/target.env; scripts read it with `blkps target show --get KEY`.")
    cmds = p.add_subparsers(dest="target_command", required=True, metavar="{start,serve,stop,restart,show,promote}")
    s = cmds.add_parser("start", help="start a target", description="Starts a target; prints its learner and "
                        "control URLs, labelled. Every failure prints one line and leaves no tgtd.")
    add_start_arguments(s)
    add_tgtd_argument(s)
    metrics.add_start_arguments(s)
    s.set_defaults(run=command_start)
    t = cmds.add_parser("stop", help="stop a target, after a final checkpoint (quiet when none runs)",
                        description="Stops a target. A model with checkpoint= first writes a final checkpoint "
                        "generation on every tgtd, so that no acknowledged push is lost, and says how long it took; "
                        "if that fails the target is stopped all the same and the line says what a restart loads.")
    t.add_argument("--dir", required=True)
    t.add_argument("--no-checkpoint", action="store_true", help="skip the final checkpoint: a restart loads the "
                   "last one written (the pushes since are lost)")
    t.set_defaults(run=command_stop)
    r = cmds.add_parser("restart", help="restart the tgtds that died, on their own ports",
                        description="Restarts the tgtds of a target that are not running, each with the options "
                        "it was started with, on its own port, from the last committed checkpoint generation; in "
                        "bsp and ssp a scaled-out job's live tgtds are restarted too, so that every shard serves "
                        "that generation. Learners reconnect to the same addresses and resend what their receipts "
                        "lack.")
    r.add_argument("--dir", required=True)
    r.set_defaults(run=restart.command_restart)
    w = cmds.add_parser("show", help="print a running target's URLs", description="Prints the running target's "
                        "URLs, labelled; --get KEY prints target.env values one per line (for scripts).")
    w.add_argument("--dir", required=True)
    how = w.add_mutually_exclusive_group()
    how.add_argument("--get", action="append", metavar="KEY", help="print this target.env value (URL, URLS, "
                     "CONTROL_URL, NULL_URL, RDWR_URL, OPERATOR_URL, OPERATOR_CHAP_FILE, PORT, IQN, TRANSPORT, PID, "
                     "TGT_IPC_SOCKET, LOG, with --metrics METRICS and METRICS_PID; with several tgtds CONTROL_URLS, TGTD, STRIPE_UNIT, SHARD_DIRS, PIDS "
                     "instead of PORT, IQN, PID, TGT_IPC_SOCKET, LOG); repeatable")
    how.add_argument("--json", action="store_true", help="print target.env as JSON")
    how.add_argument("--tgtadm", action="store_true", help="print tgtadm's view of the target")
    w.set_defaults(run=command_show)
    replicas.add_arguments(s, cmds)  # --replicas on start; promote, the rare one, listed last
    lease.add_arguments(s, cmds)  # --lease on start; the lease keeper (started by start; not for people)
    # The --owner-pid watchdog (started by start; not for people).
    d = cmds.add_parser("watch")
    d.add_argument("--dir", required=True)
    d.add_argument("--owner-pid", type=positive_int, required=True)
    d.set_defaults(run=command_watch)
    return cmds


def add_start_arguments(s):
    """The options of `blkps target start` (also used by `blkps shards`,
    which starts its shards' targets with them)."""
    s.add_argument("--dir", required=True, help="state folder: control socket, tgtd.log, target.env")
    s.add_argument("--bsopts", required=True, help="the model's options, key=value;... (doc/server.md, \"--bsopts reference\"), "
                   "e.g. \"params=1000000;lr=0.01\"; checked by the plugin's parser before tgtd starts")
    s.add_argument("--name", default="model", help="the model's name, tgt's --backing-store (default: model)")
    s.add_argument("--luns", type=positive_int, default=1, help="learner slots: the model on LUNs 1..N; "
                   "LUN N+1 is the control LUN (default 1)")
    s.add_argument("--transport", choices=("iscsi", "iser"), default="iscsi", help="iser needs an RDMA device")
    s.add_argument("--address", default="127.0.0.1", help="portal address (default 127.0.0.1)")
    s.add_argument("--port", type=port_or_auto, default="auto", help="portal port, or auto for a free one (default)")
    s.add_argument("--iqn", help="target name (default iqn.2026-11.io.blkps:NAME)")
    s.add_argument("--allow", action="append", metavar="ADDRESS|SUBNET/BITS|ALL",
                   help="initiator ACL: who may log in, by address (repeatable; default: the portal address; "
                        "required with a wildcard --address such as 0.0.0.0)")
    s.add_argument("--initiator", action="append", default=[], metavar="IQN",
                   help="initiator name ACL (repeatable); iser needs one: tgt 1.0.85's iSER admits an initiator "
                        "only when both its address and its name are in the ACL")
    s.add_argument("--operator", nargs="?", const="", metavar="",
                   help="prove operators by a credential: the learners' control LUN takes only reads, fence=, "
                        "tag= and rank=; commands and weights go to a second target (IQN.operator) whose CHAP secret only "
                        "DIR/operator.chap holds (blkps set/status --dir use it); default: anyone the target admits "
                        "may write the control LUN")
    chap.add_argument(s, "initiators must log in as user= with secret=; with target_user=, the target proves "
                      "itself with it to initiators that check (mutual CHAP)")
    s.add_argument("--plugin", help="bs_blkps.so to preload into tgtd (default: the build's, or the one installed "
                   "beside this command; 'installed': none, tgtd loads tgt's plugin folder)")
    s.add_argument("--null-lun", action="store_true", help="also serve tgt's null store (a ceiling for benchmarks)")
    s.add_argument("--rdwr-lun", metavar="FILE", help="also serve FILE through tgt's rdwr store (a plain-disk baseline)")
    s.add_argument("--owner-pid", type=positive_int, metavar="PID", help="stop the target when process PID exits")
    s.add_argument("--fresh", action="store_true", help="start a new job over the checkpoint (checkpoint=) "
                   "instead of loading it; needed when a restart refuses the checkpoint set (incomplete, mixed "
                   "or foreign: doc/server.md \"Checkpoints\"); the old files are replaced as the new job's "
                   "generations commit")


def add_tgtd_argument(s):
    """--tgtd, which only `blkps target start` has (a shard is one tgtd)."""
    s.add_argument("--tgtd", type=tgtd_count, default="auto", metavar="N|auto",
                   help='serve the model through N co-located tgtd processes, striped (doc/data-path.md '
                   '"Scale-out"); auto (default): one per two cores, at most 8, 1 on a 2-core host, fewer '
                   "for a model of fewer 1 MiB units, and 1 with --port, iser, --null-lun, --rdwr-lun, --iqn or "
                   "a table")


def tgtd_count(text):
    return text if text == "auto" else positive_int(text)


tgtd_count.__name__ = "tgtd count (or auto)"
