"""blkps metrics: a job's Prometheus exporter (doc/monitoring.md). One
process beside the tgtds serves GET /metrics for the whole job, every shard
included: each scrape reads every shard's status through its control LUN,
as `blkps status --dir` does (control.control_targets: on an --operator
target through DIR/operator.chap), and each tgtd's CPU time and resident
memory from /proc.

Who runs it: `blkps target start --metrics ADDR:PORT` binds the address
(so a taken port is its one-line error) and starts this exporter detached
on that socket; its pid and address go into DIR/target.env (METRICS_PID,
METRICS). It ends by itself within a second of DIR/target.env going away
(`blkps target stop`, the --owner-pid watchdog), and `target stop` ends it
first. If it dies, the job runs on unwatched: start it again by hand with
`blkps metrics --dir DIR --listen ADDR:PORT` (it then runs in the
foreground until the target stops); under systemd the unit's restart
restarts both.

Metric names follow Prometheus's conventions: blkps_ prefix, _total
counters, seconds and bytes, a `shard` label on everything ("0" for a
one-tgtd target) and `lun` on a learner slot's.
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import types

from . import chap, control, processes, state, tools
from .errors import UserError

DEFAULT_ADDRESS = "127.0.0.1"
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def listen_address(text):
    """ADDR:PORT or PORT (then DEFAULT_ADDRESS) as (address, port); an IPv6
    address in brackets, [::1]:9465. A ValueError otherwise (argparse's
    "invalid listen address")."""
    address, colon, port = text.rpartition(":")
    address = address[1:-1] if address.startswith("[") and address.endswith("]") else address
    if not port.isdigit() or not 0 < int(port) < 65536 or (colon and not address):
        raise ValueError(text)
    return (address if colon else DEFAULT_ADDRESS), int(port)


listen_address.__name__ = "listen address (ADDR:PORT or PORT)"


def job_parts(folder):
    """[(shard label, tgtd pid)] of the job in `folder`: a target, a target
    served by several tgtds or a `blkps shards` folder."""
    shards = state.shards(folder)
    dirs = [folder] if shards is None else shards["SHARD_DIRS"].split()
    return [(str(k), int(state.target(d, "metrics").get("PID") or 0)) for k, d in enumerate(dirs)]


def process_usage(pid):
    """(CPU seconds, resident bytes) of process `pid` from /proc, or None if
    it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # After the command: state is field 3; utime 14, stime 15; rss 24 (pages).
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS, int(fields[21]) * _PAGE_BYTES


class JobMetrics:
    """The exporter's view of the job in `folder`: its shards' control LUNs,
    opened on the first scrape and kept open (a login per scrape would cost
    the tgtds more than the read), reopened after an error."""

    def __init__(self, folder, initiator=None):
        self.folder = folder
        self.initiator = initiator
        self.controls = None
        self.last_error = None

    def close(self):
        for _, device in self.controls or []:
            device.close()
        self.controls = None

    def statuses(self):
        """[(shard label, status dict)], every shard's."""
        if self.controls is None:
            where = types.SimpleNamespace(dir=self.folder, control=None)
            opened = []
            try:
                for k, (_, url, chap_file) in enumerate(control.control_targets(where, "metrics")):
                    opened.append((str(k), control.open_control(url, chap_file, self.initiator)))
            except BaseException:
                for _, device in opened:
                    device.close()
                raise
            self.controls = opened
        try:
            return [(shard, device.status()) for shard, device in self.controls]
        except OSError:
            self.close()
            raise

    def page(self):
        """The exposition text of one scrape. A failure raises (the scrape
        answers 503) and is logged once, when it first happens (stderr:
        DIR/metrics.log of a detached exporter)."""
        out = exposition().Exposition()
        try:
            statuses = self.statuses()
        except (OSError, UserError) as e:
            why = (e.strerror if isinstance(e, OSError) and e.strerror else str(e)).removeprefix("blkps: ")
            if why != self.last_error:
                print(f"blkps metrics: {time.strftime('%Y-%m-%d %H:%M:%S')}: cannot read the status: {why}",
                      file=sys.stderr, flush=True)
            self.last_error = why
            raise
        self.last_error = None
        for shard, s in statuses:
            write_status(out, shard, s)
        for shard, pid in job_parts(self.folder):
            usage = process_usage(pid) if pid else None
            if usage:
                out.add("blkps_tgtd_cpu_seconds_total", "counter", "CPU time of the shard's tgtd (user and system).",
                        usage[0], shard=shard)
                out.add("blkps_tgtd_resident_memory_bytes", "gauge", "Resident memory of the shard's tgtd.",
                        usage[1], shard=shard)
        return out.text()


# (status key, metric, type, help): the job's numbers, one sample per shard.
JOB_METRICS = (
    ("updates", "blkps_updates_total", "counter", "Gradient updates applied (status updates)."),
    ("global_step", "blkps_global_step", "gauge", "Updates applied to the least-updated model block."),
    ("rejected_writes", "blkps_rejected_writes_total", "counter", "Gradient writes the server refused."),
    ("control_refused", "blkps_control_refused_total", "counter", "Control writes the server refused."),
    ("held_now", "blkps_held_commands", "gauge", "Commands held now (bsp/ssp reads, waiting writes)."),
    ("uptime_s", "blkps_uptime_seconds", "gauge", "Seconds since the model was created in tgtd."),
    ("live_learners", "blkps_live_learners", "gauge", "Learner slots live now."),
    ("pushing_learners", "blkps_pushing_learners", "gauge",
     "Learner slots that pushed within dead_after: the N of an async push's 1/N."),
    ("params", "blkps_params", "gauge", "Parameters the shard serves."),
    ("device_bytes", "blkps_device_bytes", "gauge", "Bytes of the shard's model device."),
    ("stale_bound", "blkps_stale_bound_updates", "gauge", "Pushes staler than this many updates are counted."),
    ("failed", "blkps_failed", "gauge", "1 when the job failed (status failure says why)."),
    ("stop", "blkps_stop_requested", "gauge", "1 after stop=1: learners are asked to stop training."),
)
# The same for each learner slot, labelled lun.
LEARNER_METRICS = (
    ("iteration", "blkps_learner_iteration", "gauge", "The learner's iteration (its least block clock)."),
    ("idle_s", "blkps_learner_idle_seconds", "gauge", "Seconds since the learner's last I/O."),
    ("held", "blkps_learner_held_commands", "gauge", "The learner's commands held now."),
    ("writes", "blkps_learner_pushes_total", "counter", "Gradient writes (pushes) by the learner."),
    ("reads", "blkps_learner_pulls_total", "counter", "Weight reads (pulls) by the learner."),
    ("bytes_written", "blkps_learner_pushed_bytes_total", "counter", "Bytes of gradient the learner wrote."),
    ("bytes_read", "blkps_learner_pulled_bytes_total", "counter", "Bytes of weights the learner read."),
    ("holds", "blkps_learner_holds_total", "counter", "The learner's commands that were held."),
    ("hold_timeouts", "blkps_learner_hold_timeouts_total", "counter", "Held commands failed at hold_limit."),
    ("deaths", "blkps_learner_deaths_total", "counter", "Times the learner was declared dead."),
    ("staleness_last", "blkps_learner_staleness_last_iterations", "gauge",
     "Iterations the learner's latest read was ahead of the slowest live learner."),
    ("staleness_max", "blkps_learner_staleness_max_iterations", "gauge",
     "Most iterations the learner's reads were ahead of the slowest live learner."),
    ("staleness_mean", "blkps_learner_staleness_mean_iterations", "gauge",
     "Mean iterations the learner's reads were ahead of the slowest live learner."),
    ("push_staleness_max", "blkps_learner_push_staleness_max_updates", "gauge",
     "Most updates between the learner's read of a block and its push to it."),
    ("push_staleness_mean", "blkps_learner_push_staleness_mean_updates", "gauge",
     "Mean updates between the learner's read of a block and its push to it."),
    ("stale_pushes", "blkps_learner_stale_pushes_total", "counter", "The learner's pushes staler than stale_bound."),
    ("pipeline_depth", "blkps_learner_pipeline_depth", "gauge",
     "The learner's pipeline depth (0 or 1): its pushes' staleness counts from that many reads back."),
)
# A replica's states as status says them (doc/replicas.md): its role, and a
# leased primary's backup.
REPLICA_ROLES = ("none", "primary", "backup")
# blkps_backup_state's label -> how status `backup` begins in that state.
BACKUP_STATES = {"lost": "lost: ", "outdated": "outdated: ", "catching_up": "catching up: "}
LEARNER_STATES = ("live", "dead", "detached")


def write_status(out, shard, s):
    """Adds the metrics of one shard's status `s` to Exposition `out`."""
    out.add("blkps_info", "gauge", "The model's name, mode and rule (value 1).", 1, shard=shard,
            model=s["model"], mode=s["mode"], rule=s["rule"])
    for key, name, kind, help_text in JOB_METRICS:
        if key in s:
            out.add(name, kind, help_text, s[key], shard=shard)
    out.add("blkps_control_last_refused", "gauge",
            "1 when the last control write was refused (status control_error).", bool(s.get("control_error")),
            shard=shard)
    for key, value in s["rule_params"].items():
        out.add("blkps_rule_parameter", "gauge", "The update rule's parameters (lr, momentum, ...) now.", value,
                shard=shard, parameter=key)
    c = s["checkpoint"]
    out.add("blkps_checkpoints_total", "counter", "Checkpoints written.", c["written"], shard=shard)
    out.add("blkps_checkpoint_last_duration_seconds", "gauge", "How long the last checkpoint took.",
            c["last_seconds"], shard=shard)
    out.add("blkps_checkpoint_last_push_stall_seconds", "gauge",
            "How long pushes waited for the last checkpoint (max_over_time gives the longest).",
            c["last_stall_seconds"], shard=shard)
    out.add("blkps_checkpoint_failed", "gauge", "1 when the last checkpoint failed (status checkpoint error).",
            bool(c["error"]), shard=shard)
    if "generation" in c:
        out.add("blkps_checkpoint_generation", "gauge",
                "The shard's last durable checkpoint generation (or the one it loaded).", c["generation"],
                shard=shard)
    if "replica" in s:
        for role in REPLICA_ROLES:
            out.add("blkps_replica_role", "gauge", "1 for the server's replica role (none, primary, backup).",
                    s["replica"] == role, shard=shard, role=role)
        for state_name, said in BACKUP_STATES.items():
            out.add("blkps_backup_state", "gauge",
                    "1 while a leased primary's backup is lost (writes wait for a verdict), outdated (the primary "
                    "acknowledges writes alone) or catching up (it returned).", s.get("backup", "").startswith(said),
                    shard=shard, state=state_name)
        out.add("blkps_lease_lapsed", "gauge", "1 while the server's lease has lapsed: it serves no learner.",
                s.get("lease", "").startswith("lapsed "), shard=shard)
    for rank in s.get("ranks", []):  # blkps.torch's collective ranks, by their heartbeats
        for state_name in ("live", "dead"):
            out.add("blkps_rank_state", "gauge", "1 for a collective rank's state by its heartbeats (live, dead).",
                    rank["state"] == state_name, shard=shard, rank=str(rank["rank"]), state=state_name)
        out.add("blkps_rank_idle_seconds", "gauge", "Seconds since the rank's last heartbeat.", rank["idle_s"],
                shard=shard, rank=str(rank["rank"]))
    for learner in s["learners"]:
        lun = str(learner["lun"])
        for state_name in LEARNER_STATES:
            out.add("blkps_learner_state", "gauge", "1 for the learner slot's state (live, dead, detached).",
                    learner["state"] == state_name, shard=shard, lun=lun, state=state_name)
        for key, name, kind, help_text in LEARNER_METRICS:
            if key in learner:
                out.add(name, kind, help_text, learner[key], shard=shard, lun=lun)


def exposition():
    """The learner package's blkps.exposition (the one writer of the format)."""
    control.control_package()  # puts the package on sys.path, or says how to install it
    import blkps.exposition
    return blkps.exposition


# --- the process ---------------------------------------------------------------

def serve(folder, sock, credentials, initiator=None):
    """Serves the job in `folder` on the listening socket `sock` until its
    target.env (a shards folder's shards.env) goes away, or SIGTERM."""
    job = JobMetrics(folder, initiator)
    # A target's folder (one tgtd or several) has target.env; a `blkps
    # shards` folder only shards.env. Either goes at its stop.
    env_file = os.path.join(folder, state.TARGET_ENV)
    if not os.path.exists(env_file):
        env_file = os.path.join(folder, state.SHARDS_ENV)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    server = exposition().MetricsServer(sock, job.page, credentials and (credentials.user, credentials.secret))
    try:
        server.serve_until(lambda: stopping or not os.path.exists(env_file))
    finally:
        job.close()


def bind(address, port, what="--metrics"):
    """A listening socket on (address, port); a UserError if it cannot."""
    try:
        return exposition().listening_socket(address, port)
    except OSError as e:
        raise UserError(what, f"cannot listen on {address}:{port}: {e.strerror or e}",
                        "choose another port (or stop what holds it)") from None


def check_start_options(a):
    """Refuses `blkps target start`'s --metrics-auth without --metrics, or a
    bad credentials file, before any tgtd starts."""
    if a.metrics_auth and not a.metrics:
        raise UserError("--metrics-auth", "is for the exporter, and no --metrics ADDR:PORT is given",
                        "add --metrics ADDR:PORT")
    chap.credentials(a.metrics_auth, "--metrics-auth")


def start(folder, address, port, auth_file):
    """Starts the exporter of the target in `folder` detached, on
    address:port; adds METRICS and METRICS_PID to its target.env."""
    credentials_given = chap.credentials(auth_file, "--metrics-auth") is not None
    sock = bind(address, port)
    try:
        argv = [tools.script("blkps"), "metrics", "--dir", folder, "--socket-fd", str(sock.fileno())]
        argv += ["--auth", os.path.abspath(auth_file)] if credentials_given else []
        with open(os.path.join(folder, "metrics.log"), "w") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                                    pass_fds=[sock.fileno()], start_new_session=True)
    finally:
        sock.close()
    values = state.target(folder, "target start")
    values["METRICS"] = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
    values["METRICS_PID"] = str(proc.pid)
    state.write(os.path.join(folder, state.TARGET_ENV), values)
    return values


def stop(folder, wait_s=0):
    """Ends the exporter named in folder's target.env, if one runs (SIGTERM;
    it answers within a second), waiting up to wait_s seconds for it to be
    gone (its port free again)."""
    values = state.read(os.path.join(folder, state.TARGET_ENV)) or {}
    pid = values.get("METRICS_PID")
    if not pid:
        return
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"metrics" not in f.read():
                return  # a pid reused since is not ours to end
    except OSError:
        return
    processes.terminate(int(pid), wait_s)


def command_metrics(a):
    folder = os.path.abspath(a.dir)
    job_parts(folder)  # no target: its one-line error now, not at the first scrape
    credentials = chap.credentials(a.auth, "--auth")
    if a.socket_fd is not None:
        sock = socket.socket(fileno=a.socket_fd)
    else:
        sock = bind(*a.listen, "--listen")
        print(f"blkps metrics: serving http://{a.listen[0]}:{a.listen[1]}/metrics for {folder}", file=sys.stderr)
    serve(folder, sock, credentials, a.initiator)
    return 0


def add_parser(sub):
    """`blkps metrics` on the subparsers `sub`."""
    p = sub.add_parser("metrics", help="serve a job's Prometheus metrics (the exporter target start --metrics runs)",
                       description="Serves GET /metrics (Prometheus's text format) for the job in DIR, every shard "
                       "included, until its target stops (doc/monitoring.md). `blkps target start --metrics "
                       "ADDR:PORT` runs it detached; run it by hand to restart one that died.")
    p.add_argument("--dir", required=True, help="a blkps target or shards folder")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--listen", type=listen_address, metavar="ADDR:PORT",
                     help=f"where to serve (PORT alone: {DEFAULT_ADDRESS}:PORT)")
    how.add_argument("--socket-fd", type=int, help=argparse.SUPPRESS)  # target start's bound socket
    p.add_argument("--auth", metavar="FILE", help="require HTTP basic authentication as the user= and secret= of "
                   "this credentials file (the CHAP file's grammar; mode 0600)")
    p.add_argument("--initiator", metavar="IQN", help="log in to the control LUNs with this initiator name")
    p.set_defaults(run=command_metrics)


def add_start_arguments(s):
    """`blkps target start`'s --metrics and --metrics-auth."""
    s.add_argument("--metrics", type=listen_address, metavar="ADDR:PORT",
                   help=f"serve the job's Prometheus metrics there (PORT alone: {DEFAULT_ADDRESS}:PORT) from an "
                   "exporter process beside tgtd (doc/monitoring.md)")
    s.add_argument("--metrics-auth", metavar="FILE", help="with --metrics: require HTTP basic authentication as "
                   "the user= and secret= of this credentials file (the CHAP file's grammar; mode 0600)")
