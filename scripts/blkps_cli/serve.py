"""blkps target serve: the server in the foreground, as Slurm and systemd
run it (doc/server.md "Serving in the foreground"). It starts as `blkps
target start` does (the same options and code) but its tgtds stay its
children, and it stays until a signal:

  - stdout holds one line once it serves: `serving PORTAL[,PORTAL...] URL`
    (URL: learner slot 1's LUN, or layout: file); progress goes to stderr.
  - SIGTERM or SIGINT: a final checkpoint generation (as `target stop`),
    then its tgtds stop and it exits 0 (1 if the checkpoint failed: its
    line says so), leaving nothing behind.
  - One of its tgtds dies: one line naming it, the rest stopped, exit 1.
    It does not restart it (a scheduler restarts the task if asked to).

--part K/S serves part K (0-based) of a model of --bsopts params= split
over S server tasks, each through --tgtd T tgtds: one flat stripe over
S x T shards (serve_parts.py); --publish JOBDIR meets the other parts
there (publish.py).
"""

import contextlib
import ipaddress
import os
import signal
import socket
import subprocess
import sys

from . import lease, metrics, publish, serve_parts, serve_replicas, state, target, tgtd
from .errors import UserError


def part_of(a):
    """--part's (K, S): K/S, or slurm (SLURM_PROCID of SLURM_NTASKS; with
    --replicas 2, two tasks a part, serve_replicas.py, which also sets
    a.replica); (0, 1) without --part."""
    text = a.part
    if text is None:
        return 0, 1
    if text == "slurm":
        if "SLURM_PROCID" not in os.environ or "SLURM_NTASKS" not in os.environ:
            raise UserError("--part", "slurm: SLURM_PROCID and SLURM_NTASKS are not set (not run by srun?)",
                            "run it as an srun task, or give --part K/S")
        if a.replicas > 1:
            k, s, role = serve_replicas.slurm_part_and_role()
            a.replica = a.replica or role
            return k, s
        text = f"{os.environ['SLURM_PROCID']}/{os.environ['SLURM_NTASKS']}"
    k, slash, s = text.partition("/")
    if not (slash and k.isdigit() and s.isdigit() and int(k) < int(s)):
        raise UserError("--part", f"expected K/S with 0 <= K < S (part K of S server tasks), or slurm, got {text!r}")
    return int(k), int(s)


def listen_address(text):
    """--address: as given, or this host's address (of `hostname`)."""
    if text is not None:
        return text
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError as e:
        raise UserError("--address", f"cannot resolve this host's name {socket.gethostname()}: {e}",
                        "give --address ADDRESS") from None


def allowed(entries):
    """--allow entries as addresses: `slurm` becomes the allocation's nodes
    (SLURM_JOB_NODELIST, through `scontrol show hostnames`), a host name
    its addresses; addresses, subnets and ALL stay."""
    out = []
    for entry in entries or []:
        if entry == "slurm":
            nodes = os.environ.get("SLURM_JOB_NODELIST")
            if not nodes:
                raise UserError("--allow", "slurm: SLURM_JOB_NODELIST is not set (not inside a Slurm job?)",
                                "give the learners' hosts or subnet")
            try:
                listed = subprocess.run(["scontrol", "show", "hostnames", nodes], capture_output=True, text=True)
            except FileNotFoundError:
                raise UserError("--allow", "slurm: scontrol not found", "give the learners' hosts or subnet") from None
            if listed.returncode != 0:
                raise UserError("--allow", f"slurm: scontrol show hostnames {nodes}: {listed.stderr.strip()}")
            out += [address for host in listed.stdout.split() for address in host_addresses(host)]
        elif entry == "ALL" or is_network(entry):
            out.append(entry)
        else:
            out += host_addresses(entry)
    return out or None


def is_network(text):
    try:
        ipaddress.ip_network(text, strict=False)
        return True
    except ValueError:
        return False


def host_addresses(host):
    """The IPv4 addresses `host` resolves to."""
    try:
        found = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError as e:
        raise UserError("--allow", f"cannot resolve {host}: {e}", "give an address or a subnet") from None
    return sorted({info[4][0] for info in found})


def tgtd_envs(env):
    """Each tgtd's target.env values of a target.env, tgtd 0 first."""
    if "TGTD" not in env:
        return [env]
    return [state.target(d) for d in env["SHARD_DIRS"].split()]


def portals(env):
    """Every tgtd's ADDRESS:PORT of a target.env."""
    return [publish.portal(e["URL"]) for e in tgtd_envs(env)]


def command_serve(a):
    a.foreground = True
    a.address = listen_address(a.address)
    a.allow = allowed(a.allow)
    part, parts = part_of(a)
    serve_replicas.check_options(a)
    model = tgtd.check_bsopts(a.bsopts)
    served = serve_parts.plan(a, model, part, parts) if a.part is not None or a.publish else None
    if a.replica:
        a.lease_part = f"{part}/{parts}" if parts > 1 else None
        option = serve_replicas.replication_option(a, served)
        served = served._replace(plan=served.plan._replace(bsopts=[f"{b};{option}" for b in served.plan.bsopts]))
    with contextlib.redirect_stdout(sys.stderr):  # stdout: the serving line alone
        target.command_start(a, served)
    folder = os.path.abspath(a.dir)
    try:
        env = state.target(folder)
        if a.replica == "backup":
            serve_replicas.publish_backup(a, served, env)
        elif a.publish:
            publish.publish(os.path.abspath(a.publish), served, tgtd_envs(env), model,
                            getattr(a, "backup_of_part", None))
        print(f"serving {','.join(portals(env))} {env['URL']}", flush=True)
        died = wait_for_end(tgtd_pids(env))
    except BaseException:
        stop(a, part, parts, final_checkpoint=False)
        raise
    if died is not None:
        pid, status = died
        log = tgtd_log(folder, pid)  # before the stop removes target.env
        stop(a, part, parts, final_checkpoint=False)
        raise UserError("target serve", f"tgtd {pid} exited ({describe(status)}); its log is {log}; "
                        "stopped the rest, no final checkpoint")
    line = stop(a, part, parts, final_checkpoint=True)
    if line:
        print(line, file=sys.stderr)
    return 0


def tgtd_pids(env):
    return {int(p) for p in (env["PIDS"] if "TGTD" in env else env["PID"]).split()}


def tgtd_log(folder, pid):
    env = state.target(folder)
    dirs = env["SHARD_DIRS"].split() if "TGTD" in env else [folder]
    return next((tgtd.Target(d).log for d in dirs if tgtd.Target(d).pid() == pid), tgtd.Target(folder).log)


def wait_for_end(pids):
    """Waits for SIGTERM or SIGINT (returns None) or for one of the tgtds
    `pids`, this process's children, to exit (returns its pid and wait
    status). Children that are not tgtds (an exporter) are reaped on the
    way."""
    try:
        while True:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:  # reaped elsewhere (subprocess's clean-up): it is gone all the same
                return min(pids), 0
            if pid in pids:
                return pid, status
    except KeyboardInterrupt:  # SIGINT, or SIGTERM (main.py makes it one)
        return None


def describe(status):
    code = os.waitstatus_to_exitcode(status)
    return f"killed by signal {-code}" if code < 0 else f"exit status {code}"


def stop(a, part, parts, final_checkpoint):
    """Stops what serve started (with a final checkpoint if asked; further
    SIGTERM and SIGINT are ignored meanwhile: the scheduler's grace time is
    the checkpoint's), reaps its tgtds and withdraws its published part.
    Returns the checkpoint's line."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return target.stop(a.dir, final_checkpoint and serve_replicas.writes_checkpoints(a))
    finally:
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0] != 0:
                pass
        if a.replica == "backup":
            serve_replicas.unpublish_backup(a, part, parts)
        elif a.publish:
            publish.unpublish(os.path.abspath(a.publish), part, parts)


def add_parser(cmds):
    """`blkps target serve` on target's subparsers `cmds`: start's options
    (target.add_start_arguments) and its own."""
    f = cmds.add_parser("serve", help="serve in the foreground until SIGTERM (Slurm, systemd)",
                        description="Serves as start does, with the same options, in the foreground: its tgtds "
                        "are its children; prints one line `serving PORTAL[,PORTAL...] URL` on stdout; on SIGTERM "
                        "or SIGINT writes a final checkpoint generation, stops its tgtds and exits 0; if a tgtd "
                        "dies, says so and exits 1. --address defaults to the address of this host's name; "
                        "--allow also takes host names and slurm (the job's nodes). "
                        'See doc/server.md "Serving in the foreground".')
    target.add_start_arguments(f)
    target.add_tgtd_argument(f)
    metrics.add_start_arguments(f)
    f.set_defaults(address=None, run=command_serve)
    f.add_argument("--part", metavar="K/S|slurm", help="serve part K (0-based) of S of the model: --bsopts params= "
                   "is the WHOLE model's, and part K serves its stripe units (as shard K of blkps shards; with --tgtd T, "
                   "shards K, K+S, ... of S x T); slurm: K and S from SLURM_PROCID and SLURM_NTASKS")
    f.add_argument("--replicas", dest="replicas", type=int, choices=(1, 2), default=1,
                   help="2: each part has a primary and a backup, two serve tasks on different hosts that meet in "
                   "--publish JOBDIR; the backup holds every push before its WRITE completes and serves once "
                   'promoted (doc/replicas.md "Replicas on several hosts"); one tgtd each')
    f.add_argument("--replica", choices=serve_replicas.ROLES, help="with --replicas 2: whether this task starts as "
                   "the part's primary or its backup (--part slurm: even tasks are primaries)")
    f.add_argument("--replication-address", metavar="ADDRESS", help="with --replicas 2: the address a backup "
                   "listens for its primary's records on, or NETWORK/BITS for this host's address on that network "
                   "(default --address); one on a network of their own keeps "
                   'the records off the learners\' links (doc/replicas.md "A network for the records")')
    lease.add_start_arguments(f)
    f.add_argument("--publish", metavar="JOBDIR", help="write JOBDIR/servers/part-K-of-S.json once serving; the "
                   "part that completes the set writes JOBDIR/slot-L.layout (blkps layout wait JOBDIR)")
