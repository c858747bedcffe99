"""One tgtd: a private tgtd in a folder (its own control socket, log, port
and target.env) serving a model of backing-store type "blkps" on LUNs 1..N
(one per learner slot) and its control LUN N+1: start it (Options, typed),
ask it (tgtadm), stop it, and keep what a restart needs. The layers above:
shards (several tgtds, one model), scaleout, then the commands (target.py,
serve.py, restart.py); this module imports none of them.

Process handling (each point was a bug once; keep them):
  - tgtd runs in its own session and outlives the command that started it
    (serve's stays its child: tgtd_session); only tgtd gets LD_PRELOAD of
    the plugin.
  - An exited but unreaped tgtd (a zombie) counts as stopped.
  - One stop at a time per folder (flock on DIR/stop.lock): a stop by hand
    and the --owner-pid watchdog may run together, and the second must not
    remove the control socket under the first one's tgtadm, which would then
    retry connect(2) forever. Every tgtadm call is bounded by a timeout.
  - One start at a time per folder (flock on DIR/start.lock, not waited
    for: a second concurrent start is refused).
  - The locks' descriptors are never inherited by a tgtd or a watchdog started
    later (Python opens files close-on-exec).
  - tgtd ignores SIGTERM: stop deletes its targets, then asks it to exit
    (tgtadm --op delete --mode system), and kills it only if it does not.
"""

import contextlib
import dataclasses
import fcntl
import glob
import hashlib
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import types

from . import chap, processes, session, state, tools
from .processes import running
from .errors import UserError
from .files import write_atomically

# tgt 1.0.85's iSER driver listens on every address at port 3260: its
# `--iser port=N` is refused whatever N (it tests a stale errno).
ISER_PORT = 3260
# The CHAP account of the operator target (--operator); its secret is new at
# every start and only DIR/operator.chap holds it.
OPERATOR_USER = "blkps-operator"
ADMIN_TIMEOUT_S = 5      # tgtadm queries and deletes
CREATE_TIMEOUT_S = 300   # creating a LUN allocates (and may load) the model
READY_TIMEOUT_S = 10     # from starting tgtd to its answering tgtadm
# tgt 1.0.85's management protocol (usr/tgtadm.h), for the one request that
# carries a secret (Target.add_account).
TGTADM_REQ = struct.Struct("@ii64sIiQQIIIIII")  # mode op lld len tid sid lun cid host_no device_type ac_dir pack force
TGTADM_RSP = struct.Struct("@II")               # err len
TGTADM_MODE_ACCOUNT, TGTADM_OP_NEW, TGTADM_USER_EXIST = 7, 0, 14


@dataclasses.dataclass
class Options:
    """What one tgtd is started with: `blkps target start`'s options that
    concern it, typed (doc/server.md). Kept in DIR/start.json for a
    restart, with `metrics` and `metrics_auth`, which the command (not this
    module) acts on."""
    bsopts: str
    name: str = "model"
    luns: int = 1
    transport: str = "iscsi"
    address: str = "127.0.0.1"
    port: str = "auto"
    iqn: str | None = None
    allow: list | None = None
    initiator: list = dataclasses.field(default_factory=list)
    operator: str | None = None
    chap_file: str | None = None
    plugin: str | None = None
    null_lun: bool = False
    rdwr_lun: str | None = None
    owner_pid: int | None = None
    foreground: bool = False  # target serve: tgtd stays its child (tgtd_session)
    metrics: list | None = None
    metrics_auth: str | None = None

    @classmethod
    def of(cls, values):
        """The Options among `values`' attributes (a parsed command line,
        start.json's namespace); the others are left out."""
        return cls(**{f.name: getattr(values, f.name) for f in dataclasses.fields(cls) if hasattr(values, f.name)})


def free_port(address):
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def tgtd_session(a):
    """Popen's arguments for tgtd's session: `blkps target start`'s tgtd
    has a session of its own, so that it outlives the command; `blkps
    target serve`'s (a.foreground) stays its child in its session, where
    a scheduler's signals and process tracking reach it, in a process group
    of its own (a terminal's Ctrl-C reaches serve, which then asks it for
    the final checkpoint)."""
    if getattr(a, "foreground", False):
        return {"process_group": 0}
    return {"start_new_session": True}


def check_bsopts(bsopts, what="--bsopts"):
    """The options as the plugin's parser sees them (blkps-bsopts's JSON);
    a UserError with its reason, first, if it refuses them."""
    out = subprocess.run([tools.built("blkps-bsopts"), bsopts], capture_output=True, text=True)
    if out.returncode != 0:
        reason = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"
        raise UserError(what, reason.removeprefix("blkps: --bsopts: "), "see doc/server.md, \"--bsopts reference\"")
    return json.loads(out.stdout)


def replica_identity(bsopts, lun):
    """tgtadm's --params that give learner LUN `lun` of a replicated shard
    (--bsopts with replicate_to= or backup=) one SCSI identity on every
    replica: scsi_id and scsi_sn, 32 hex digits named by the replication
    address the primary and its backup share, so that a path-failover
    initiator (dm-multipath) sees the replicas' LUNs as one disk (doc/replicas.md,
    "Learners follow a failover"). None for a shard without replicas."""
    if "replicate_to=" not in bsopts and "backup=" not in bsopts:
        return None
    options = dict(check_bsopts(bsopts)["options"])
    address = options.get("replicate_to") or options.get("backup")
    if not address:
        return None
    digits = hashlib.sha256(f"blkps replica {address} lun {lun}".encode()).hexdigest()[:32]
    return f"scsi_id={digits},scsi_sn={digits}"


class Target:
    """The target whose state lives in `folder` (--dir)."""

    def __init__(self, folder):
        self.dir = os.path.abspath(folder)
        self.socket = os.path.join(self.dir, "tgtd.sock")
        self.log = os.path.join(self.dir, "tgtd.log")
        self.env_file = os.path.join(self.dir, state.TARGET_ENV)
        self.pid_file = os.path.join(self.dir, "tgtd.pid")
        self.lld_file = os.path.join(self.dir, "lld")

    # --- tgtd and tgtadm -------------------------------------------------

    def pid(self):
        try:
            with open(self.pid_file) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return None

    def alive(self):
        p = self.pid()
        return p is not None and running(p)

    def tgtadm(self, args, timeout=ADMIN_TIMEOUT_S):
        """Runs tgtadm on this target's socket: (exit status, output);
        status 124 when it ran past `timeout`."""
        env = dict(os.environ, TGT_IPC_SOCKET=self.socket)
        try:
            out = subprocess.run(["tgtadm", *args], env=env, capture_output=True, text=True, timeout=timeout)
            return out.returncode, (out.stdout + out.stderr).strip()
        except subprocess.TimeoutExpired:
            return 124, f"tgtadm {' '.join(args)} did not answer within {timeout} s"

    def log_lines(self, since=0):
        """tgtd's log lines after byte `since`."""
        try:
            with open(self.log, errors="replace") as f:
                f.seek(since)
                return f.read().splitlines()
        except OSError:
            return []

    def log_size(self):
        try:
            return os.path.getsize(self.log)
        except OSError:
            return 0

    # --- stop --------------------------------------------------------------

    def stop(self):
        """Stops tgtd if it runs and removes the folder's state; quiet and
        successful when nothing runs."""
        if not os.path.isdir(self.dir):
            return
        with open(os.path.join(self.dir, "stop.lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            p = self.pid()
            if p is not None and running(p):
                self._stop_tgtd(p)
            for path in [self.pid_file, self.env_file, self.lld_file, os.path.join(self.dir, "operator.chap"),
                         *glob.glob(self.socket + ".*")]:
                try:
                    os.remove(path)
                except FileNotFoundError:
                    pass

    def _stop_tgtd(self, p):
        try:
            with open(self.lld_file) as f:
                lld = f.read().strip() or "iscsi"
        except OSError:
            lld = "iscsi"
        _, shown = self.tgtadm(["--op", "show", "--mode", "target"])
        for tid in re.findall(r"^Target (\d+):", shown, re.M):
            self.tgtadm(["--lld", lld, "--op", "delete", "--mode", "target", "--tid", tid, "--force"])
        self.tgtadm(["--op", "delete", "--mode", "system"])
        deadline = time.monotonic() + 5
        while running(p) and time.monotonic() < deadline:
            time.sleep(0.05)
        if running(p):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
            print(f"blkps: target stop: tgtd {p} did not exit after 'tgtadm --op delete --mode system'; "
                  "killed it", file=sys.stderr)

    # --- start -------------------------------------------------------------

    def start(self, a):
        """Starts the target for the Options `a`;
        returns target.env's values. Every failure raises a UserError and
        leaves no tgtd."""
        what = "target start"
        check_bsopts(a.bsopts)
        if a.operator not in (None, ""):
            raise UserError("--operator", f"takes no initiator name ({a.operator}): a name proves nothing, any client "
                            "sends the one it likes", "give --operator alone: operators then prove themselves with the "
                            "CHAP secret blkps writes to DIR/operator.chap")
        check_bsopts(control_bsopts(a), "--operator")
        admitted(a)  # refuses a bad --allow, or a wildcard --address without one, before tgtd starts
        credentials = chap.credentials(a.chap_file)
        if a.operator is not None and credentials and OPERATOR_USER in (credentials.user, credentials.target_user):
            raise UserError("--chap-file", f"{OPERATOR_USER} is the operator account's name", "choose another")
        if a.rdwr_lun and not os.path.isfile(a.rdwr_lun):
            raise UserError(what, f"--rdwr-lun: no such file: {a.rdwr_lun}")
        if not shutil.which("tgtd"):
            raise UserError(what, "tgtd not found", "run scripts/setup.sh (Debian package tgt)")
        if a.transport == "iser" and not tools.has_rdma():
            raise UserError(what, f"iSER needs an RDMA device and this host has none ({tools.rdma_class()} is empty)",
                            "use --transport iscsi")
        if a.transport == "iser" and not a.initiator:
            raise UserError(what, "tgt's iSER admits only initiators named in its ACL",
                            "name each with --initiator IQN (libblkps: initiator_name; open-iscsi: "
                            "/etc/iscsi/initiatorname.iscsi)")
        if a.transport == "iser" and a.port not in ("auto", str(ISER_PORT)):
            raise UserError(what, f"--port {a.port}: tgt's iSER listens on port {ISER_PORT} only",
                            f"leave --port out, or --port {ISER_PORT}")
        os.makedirs(self.dir, exist_ok=True)
        if self.alive():
            raise UserError(what, f"a target is already running in {self.dir} (pid {self.pid()})",
                            f"stop it first: blkps target stop --dir {self.dir}")
        # The watchdog of a tgtd that died here (kill -9, a crash) would stop
        # the tgtd started now when it notices the death.
        stop_watchdog(self.dir)
        env = dict(os.environ, TGT_IPC_SOCKET=self.socket)
        tgtd_cwd = None
        plugin = a.plugin or tools.built("bs_blkps.so")
        if plugin != "installed" and not (a.plugin is None and tools.loaded_by_tgtd(plugin)):
            plugin = os.path.abspath(plugin)
            if not os.path.isfile(plugin):
                raise UserError(what, f"plugin {plugin} not found", "build first (scripts/build.sh), or --plugin installed")
            # ld.so splits LD_PRELOAD at spaces and colons: the plugin is
            # named from its own folder, tgtd's (a checkout may be anywhere).
            env["LD_PRELOAD"] = "./" + os.path.basename(plugin)
            tgtd_cwd = os.path.dirname(plugin)
        try:  # from here on, any failure (Ctrl-C or SIGTERM too) leaves no tgtd
            values = self._configure(a, credentials, self._start_tgtd(a, env, tgtd_cwd))
            remember(self.dir, a, values["PORT"])
            if a.owner_pid:
                self.start_watchdog(a.owner_pid)  # before returning: never a tgtd the owner leaves behind
            return values
        except BaseException:
            self.stop()
            raise

    def _start_tgtd(self, a, env, cwd):
        """Starts tgtd on a's portal (with --port auto, retries when another
        process took the port first); returns the port."""
        why = ""
        for _ in range(5):
            if a.transport == "iser":
                # The TCP driver gets a loopback portal of its own, away
                # from the iSER port (it would take *:3260 by default).
                port = ISER_PORT
                lld = ["--iscsi", f"portal=127.0.0.1:{free_port('127.0.0.1')}"]
            else:
                port = free_port(a.address) if a.port == "auto" else int(a.port)
                lld = [f"--{a.transport}", f"portal={a.address}:{port}"]
            with open(self.log, "w") as log:
                proc = subprocess.Popen(["tgtd", "-f", *lld],
                                        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                        env=env, cwd=cwd, **tgtd_session(a))
            with open(self.pid_file, "w") as f:
                f.write(f"{proc.pid}\n")
            with open(self.lld_file, "w") as f:
                f.write(a.transport + "\n")
            ready = False
            deadline = time.monotonic() + READY_TIMEOUT_S
            while self.alive() and time.monotonic() < deadline:
                if self.tgtadm(["--op", "show", "--mode", "sys"])[0] == 0:
                    ready = True
                    break
                time.sleep(0.1)
            # tgtd keeps running when it cannot bind its portal: its log says so.
            lines = self.log_lines()
            port_taken = any("unable to bind" in l or "failed to create/bind" in l or "rdma_bind_addr" in l
                             for l in lines)
            if ready and not port_taken:
                return port
            why = next((l for l in lines if not l.startswith("can't adjust")), "nothing")
            self.stop()
            if a.port != "auto":
                if port_taken:
                    raise UserError("target start", f"port {port} on {a.address} is in use",
                                    "choose another with --port, or --port auto")
                break
        raise UserError("target start", f"tgtd did not start; its log says: {why}")

    def _admin(self, a, what, args, timeout=ADMIN_TIMEOUT_S):
        """Runs tgtadm --lld T args; on failure raises the server's reason
        (the last "blkps:" line tgtd logged meanwhile) or tgtadm's."""
        since = self.log_size()
        status, out = self.tgtadm(["--lld", a.transport, *args], timeout)
        if status == 0:
            return
        if a.transport == "iser" and "driver" in out.lower():
            raise UserError("target start", f"iSER transport unavailable in tgtd (no RDMA device on this host?): {out}",
                            "use --transport iscsi")
        for line in reversed(self.log_lines(since)):
            reason = re.sub(r"^tgtd: \w+\(\d+\) ", "", line)
            if reason.startswith("blkps: "):
                # The plugin's line: "blkps: <reason> (--bsopts '...')" or "(model '...')".
                raise UserError("target start", re.sub(r" \((--bsopts|model) '.*'\)$", "", reason[len("blkps: "):]))
        raise UserError("target start", f"{what} failed: {out}")

    def _configure(self, a, credentials, port):
        allow = admitted(a)
        iqn = a.iqn or f"iqn.2026-11.io.blkps:{a.name}"
        base = f"{a.transport}://{a.address}:{port}/{iqn}"
        self._admin(a, f"creating target {iqn}", ["--op", "new", "--mode", "target", "--tid", "1", "-T", iqn])
        urls = []
        for lun in range(1, a.luns + 1):
            self._admin(a, f"creating model LUN {lun}",
                        ["--op", "new", "--mode", "logicalunit", "--tid", "1", "--lun", str(lun), "--bstype", "blkps",
                         "--backing-store", a.name, "--bsopts", a.bsopts], CREATE_TIMEOUT_S)
            identity = replica_identity(a.bsopts, lun)
            if identity:
                self._admin(a, f"setting model LUN {lun}'s SCSI identity",
                            ["--op", "update", "--mode", "logicalunit", "--tid", "1", "--lun", str(lun),
                             "--params", identity])
            urls.append(f"{base}/{lun}")
        lun = a.luns + 1
        self._admin(a, f"creating the control LUN {lun}",
                    ["--op", "new", "--mode", "logicalunit", "--tid", "1", "--lun", str(lun), "--bstype", "blkps",
                     "--backing-store", a.name, "--bsopts", control_bsopts(a)])
        control_url = f"{base}/{lun}"
        null_url = rdwr_url = ""
        if a.null_lun:
            lun += 1
            self._admin(a, "creating the null LUN", ["--op", "new", "--mode", "logicalunit", "--tid", "1", "--lun",
                                                     str(lun), "--bstype", "null", "--backing-store", "None"])
            null_url = f"{base}/{lun}"
        if a.rdwr_lun:
            lun += 1
            self._admin(a, f"creating the rdwr LUN over {a.rdwr_lun}",
                        ["--op", "new", "--mode", "logicalunit", "--tid", "1", "--lun", str(lun), "--bstype", "rdwr",
                         "--backing-store", os.path.abspath(a.rdwr_lun)])
            rdwr_url = f"{base}/{lun}"
        for key, value in session.TARGET[a.transport]:
            self._admin(a, f"setting {key}", ["--op", "update", "--mode", "target", "--tid", "1", "-n", key, "-v", value])
        for entry in allow:
            self._admin(a, f"setting the initiator ACL ({entry})", ["--op", "bind", "--mode", "target", "--tid", "1",
                                                                    "-I", entry])
        for name in a.initiator:
            self._admin(a, f"setting the initiator name ACL ({name})", ["--op", "bind", "--mode", "target", "--tid",
                                                                        "1", "-Q", name])
        self._set_chap(a, credentials)
        operator_url = operator_chap_file = ""
        if a.operator is not None:
            operator_url, operator_chap_file = self._serve_operator(a, credentials, iqn, a.luns + 1, allow, port)
        values = {"URL": urls[0], "URLS": urls, "CONTROL_URL": control_url, "NULL_URL": null_url,
                  "RDWR_URL": rdwr_url, "OPERATOR_URL": operator_url, "OPERATOR_CHAP_FILE": operator_chap_file,
                  "ALLOW": allow, "PORT": port, "IQN": iqn, "TRANSPORT": a.transport, "PID": self.pid(),
                  "TGT_IPC_SOCKET": self.socket, "LOG": self.log}
        state.write(self.env_file, values)
        return state.target(self.dir)

    def _serve_operator(self, a, credentials, iqn, lun, allow, port):
        """--operator: target 2, IQN.operator, whose only LUN (number `lun`,
        as the learners' control LUN) is the writable control LUN, bound to
        CHAP account OPERATOR_USER with a new random secret that only
        DIR/operator.chap (mode 0600) holds. Returns its URL and that file."""
        op_iqn = iqn + ".operator"
        tid = ["--tid", "2"]
        self._admin(a, f"creating the operator target {op_iqn}", ["--op", "new", "--mode", "target", *tid, "-T", op_iqn])
        self._admin(a, f"creating the operator's control LUN {lun}",
                    ["--op", "new", "--mode", "logicalunit", *tid, "--lun", str(lun), "--bstype", "blkps",
                     "--backing-store", a.name, "--bsopts", "role=control"])
        for key, value in session.TARGET[a.transport]:
            self._admin(a, f"setting {key}", ["--op", "update", "--mode", "target", *tid, "-n", key, "-v", value])
        for entry in allow:
            self._admin(a, f"setting the operator target's ACL ({entry})", ["--op", "bind", "--mode", "target", *tid,
                                                                            "-I", entry])
        for name in a.initiator:
            self._admin(a, f"setting the operator target's name ACL ({name})",
                        ["--op", "bind", "--mode", "target", *tid, "-Q", name])
        secret = chap.generate_secret()
        path = os.path.join(self.dir, "operator.chap")
        mutual = credentials and credentials.target_user
        chap.write_credentials_file(path, OPERATOR_USER, secret, mutual and credentials.target_user,
                                    mutual and credentials.target_secret)
        self.add_account(a.transport, OPERATOR_USER, secret)
        self._admin(a, f"binding the CHAP account {OPERATOR_USER}",
                    ["--mode", "account", "--op", "bind", *tid, "--user", OPERATOR_USER])
        if mutual:
            self._admin(a, f"binding the mutual CHAP account {credentials.target_user} to the operator target",
                        ["--mode", "account", "--op", "bind", *tid, "--user", credentials.target_user, "--outgoing"])
        return f"{a.transport}://{a.address}:{port}/{op_iqn}/{lun}", path

    def _set_chap(self, a, credentials):
        """Creates and binds the CHAP accounts. The secret goes to tgtd over
        its control socket (add_account), never on a command line."""
        if credentials is None:
            return
        accounts = [(credentials.user, credentials.secret, [])]
        if credentials.target_user:
            accounts.append((credentials.target_user, credentials.target_secret, ["--outgoing"]))
        for user, secret, direction in accounts:
            if not user:
                continue
            kind = "mutual" if direction else "incoming"
            self.add_account(a.transport, user, secret)
            self._admin(a, f"binding the {kind} CHAP account {user}",
                        ["--mode", "account", "--op", "bind", "--tid", "1", "--user", user, *direction])

    def add_account(self, lld, user, secret):
        """tgtadm --lld LLD --mode account --op new --user USER --password
        SECRET, sent as tgtadm sends it: tgtadm takes the secret only as an
        argument, which anyone can read in /proc/PID/cmdline while it runs
        (measured: a poller saw it in 6 of 11 runs, for up to 7 ms). The
        request is tgt 1.0.85's struct tgtadm_req (usr/tgtadm.h, native
        layout) and its NUL-terminated "user=U,password=P"; the answer a
        struct tgtadm_rsp {err, len} and len - 8 bytes of text."""
        body = f"user={user},password={secret}".encode() + b"\0"
        header = TGTADM_REQ.pack(TGTADM_MODE_ACCOUNT, TGTADM_OP_NEW, lld.encode(), TGTADM_REQ.size + len(body),
                                 -1, 0, 0, 0, 0, 0, 0, 0, 0)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as ipc:
                ipc.settimeout(ADMIN_TIMEOUT_S)
                ipc.connect(self.socket + ".0")
                ipc.sendall(header + body)
                answer = ipc.recv(TGTADM_RSP.size, socket.MSG_WAITALL)
        except OSError as e:
            raise UserError("target start", f"creating the CHAP account {user}: tgtd's control socket: {e}") from None
        if len(answer) != TGTADM_RSP.size:
            raise UserError("target start", f"creating the CHAP account {user}: tgtd closed its control socket")
        err, _ = TGTADM_RSP.unpack(answer)
        if err != 0:
            why = {TGTADM_USER_EXIST: "an account of that name exists"}.get(err, f"tgtadm error {err}")
            raise UserError("target start", f"creating the CHAP account {user}: tgtd refused it: {why}")

    # --- the --owner-pid watchdog -------------------------------------------

    def start_watchdog(self, owner):
        """A detached process that stops the target when process `owner`
        exits (even by SIGKILL) or tgtd dies."""
        watchdog = subprocess.Popen([tools.script("blkps"), "target", "watch", "--dir", self.dir,
                                     "--owner-pid", str(owner)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True)
        with open(os.path.join(self.dir, WATCHDOG_PID), "w") as f:
            f.write(f"{watchdog.pid}\n")


def acl_entry(text):
    """One --allow value as tgt 1.0.85's initiator ACL takes it: ALL, an
    address, or a subnet ADDRESS/BITS. tgt matches a subnet only when its
    address has no host bits and BITS is below the address's width (/32
    matches nothing), so a subnet is written as its network address and a
    full-width one as the bare address; /0 is ALL."""
    if text == "ALL":
        return text
    try:
        net = ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise UserError("--allow", f"expected an address, a subnet ADDRESS/BITS or ALL, got {text!r}") from None
    if net.prefixlen == 0:
        return "ALL"
    address = str(net.network_address)
    if net.version == 6 and net.prefixlen != net.max_prefixlen:
        address = f"[{address}]"
    return address if net.prefixlen == net.max_prefixlen else f"{address}/{net.prefixlen}"


def admitted(a):
    """The initiator ACL of `blkps target start` options `a`: the --allow
    values, or the portal address. A wildcard portal address (every
    interface) names no initiator, so it needs --allow."""
    if a.allow:
        return [acl_entry(x) for x in a.allow]
    try:
        wildcard = ipaddress.ip_address(a.address).is_unspecified
    except ValueError:
        raise UserError("--address", f"{a.address} is not a numeric address, and tgt's ACL matches numbers only",
                        "give --allow ADDRESS, --allow SUBNET/BITS or --allow ALL") from None
    if wildcard:
        raise UserError("--address", f"{a.address} listens on every interface and names no initiator to admit",
                        "say who may log in with --allow ADDRESS, --allow SUBNET/BITS or --allow ALL (repeatable)")
    return [acl_entry(a.address)]


def control_bsopts(a):
    """The learners' control LUN's --bsopts: with --operator, only what
    learners send (fence=, tag=) and reads; without it, open to anyone the
    target admits."""
    return "role=control" + (";access=learners" if a.operator is not None else "")


def labelled_urls(env):
    """The URLs of a target.env, one `label: URL` line each."""
    lines = [f"learner {k}: {url}" for k, url in enumerate(env["URLS"].split(), 1)]
    lines.append(f"control: {env['CONTROL_URL']}")
    if env.get("OPERATOR_URL"):
        lines.append(f"operator: {env['OPERATOR_URL']} (CHAP: {env['OPERATOR_CHAP_FILE']})")
    lines += [f"{label}: {env[key]}" for label, key in (("null", "NULL_URL"), ("rdwr", "RDWR_URL")) if env.get(key)]
    return lines


@contextlib.contextmanager
def start_lock(folder, what):
    """One start (`blkps target start`, `blkps shards start`) at a time per
    --dir: a second, while the first still runs, is refused at once (a flock
    on DIR/start.lock, released when the first exits however it exits).
    Without it both saw no target and each started tgtds, and stop knew
    only the last one's."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "start.lock"), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(what, f"another start is running in {os.path.abspath(folder)}",
                            "let it finish, then see what it started: blkps target show (or shards show) --dir "
                            f"{folder}") from None
        yield


# --- what a restart needs (blkps target restart, restart.py) -------------------

START_OPTIONS = "start.json"
WATCHDOG_PID = "watchdog.pid"


def remember(folder, a, port):
    """Keeps the Options `a` of the tgtd in `folder` and the port it got,
    for a restart (which starts it in a session of its own). fresh=1 is
    dropped: a restart loads what the fresh job has committed since."""
    options = dict(dataclasses.asdict(a), foreground=False)
    options["port"] = str(port)
    options["bsopts"] = ";".join(pair for pair in a.bsopts.split(";") if pair != "fresh=1")
    path = os.path.join(folder, START_OPTIONS)
    write_atomically(path, json.dumps(options))


def started_with(folder):
    """The options the target in `folder` was started with; a UserError if
    it was not started by a blkps that keeps them."""
    try:
        with open(os.path.join(folder, START_OPTIONS)) as f:
            return Options.of(types.SimpleNamespace(**json.load(f)))
    except (OSError, ValueError):
        raise UserError("target restart", f"{folder} has no readable {START_OPTIONS} (started by an older blkps?)",
                        "stop it and start it again: blkps target stop, then blkps target start") from None


def stop_watchdog(folder):
    """Ends the --owner-pid watchdog of the target in `folder`, if it runs:
    it would stop the tgtd restarted in its place."""
    processes.stop_recorded(os.path.join(folder, WATCHDOG_PID), "watch", folder)
