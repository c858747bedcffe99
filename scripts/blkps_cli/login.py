"""blkps login|logout|node-status: a learner node reaches a blkps model with
the kernel's iSCSI initiator (open-iscsi's iscsiadm) over TCP or iSER, so
that the model is a local disk any program trains against with pread/pwrite
(doc/learner-nodes.md, "Learner nodes with a kernel initiator").

login, for each target: an iface for the transport (iscsiadm -m iface -I
IFACE -o new, -o update -n iface.transport_name -v tcp|iser), sendtargets
discovery through it (which must list the IQN; its records are not kept), a
node record for the portal given (-o new), the session settings
(session.initiator) and CHAP settings on it, login, a wait for the stable
name /dev/disk/by-path/ip-HOST:PORT-iscsi-IQN-lun-LUN, and the disk's SCSI
command timeout. With --layout it logs into every shard and assembles the
shard devices into one striped device (--stripe) whose byte 4*i is parameter
i, as libblkps's layout: does; blkps-layout does the stripe arithmetic. A
shard with replicas (the layout's replica lines: doc/replicas.md) becomes
one dm-multipath device over every replica's disk, the primary's path group
first, after a check that they present one SCSI identity: the kernel fails
a dead primary's path over to its backup. The last line on stdout is the
device to open; the programs' own output goes to stderr. logout removes the
striped device and the multipath devices, then logs out of each target
(every LUN of that target on this node goes with the session). node-status
prints each shard's device, or "not logged in", and exits 1 if one is
missing. --dry-run prints every command that would change this node, one per
line, shell-quoted, as on a fresh node (no iface, no sessions): it runs no
iscsiadm. Programs run with list arguments, never through a shell."""

import os
import re
import shutil
import socket
import subprocess
import sys
import time

from . import chap, session, tools
from .target import positive_int
from .errors import UserError

# blkps holds a bsp/ssp command up to hold_limit, at most this many seconds
# (doc/server.md, "--bsopts reference"): a disk's command timeout must be longer.
HOLD_LIMIT_MAX_S = 25
# Discoveries before a login gives up: over soft-RoCE in a guest on a busy
# 2-core host, three in a row have timed out (each waits for iscsiadm's
# PDU timeout; a refused connection fails at once).
DISCOVERY_TRIES, DISCOVERY_PAUSE_S = 5, 2
# --replacement-timeout's default: the kernel queues a dead session's I/O this
# long before failing it; on a shard with replicas, before dm-multipath sends
# it to the next replica (a lease promotes a backup within about 3 s:
# doc/replicas.md "Failover by a lease").
REPLACEMENT_TIMEOUT_S, REPLICATED_REPLACEMENT_TIMEOUT_S = 30, 5
_URL = re.compile(r"(iscsi|iser)://([^/:@]+)(?::([0-9]+))?/([^/]+)/([0-9]+)")
_BARE = re.compile(r"[A-Za-z0-9_./:=@%+,-]+")
_PACKAGES = {"iscsiadm": "open-iscsi", "dmsetup": "dmsetup", "mdadm": "mdadm", "udevadm": "udev",
             "blockdev": "util-linux"}


def quote(word):
    """A word as the shell reads it: bare when safe, else in single quotes."""
    return word if _BARE.fullmatch(word) else "'" + word.replace("'", "'\\''") + "'"


def command_line(argv):
    return " ".join(quote(w) for w in argv)


class Shard:
    """One LUN of a target: its URL, portal (numeric address:port), IQN and
    LUN, and the stable name the kernel gives its disk; `replicas`, the
    shard's other replicas (Shards), in the layout's order."""

    def __init__(self, url, what, replicas=()):
        m = _URL.fullmatch(url)
        if not m:
            raise UserError(what, f"bad target URL '{url}': expected iscsi://HOST[:PORT]/IQN/LUN or iser://...")
        self.url, self.scheme, host, port, self.iqn, self.lun = url, m[1], m[2], m[3] or "3260", m[4], m[5]
        self.portal = f"{address(host, what)}:{port}"
        self.by_path = f"/dev/disk/by-path/ip-{self.portal}-iscsi-{self.iqn}-lun-{self.lun}"
        self.replicas = [Shard(r, what) for r in replicas]

    def paths(self):
        """Every replica's disk, the primary's first."""
        return [self.by_path, *(r.by_path for r in self.replicas)]


def address(host, what):
    """The kernel names a LUN by the portal's address, so a host name is resolved."""
    if re.fullmatch(r"[0-9.]+", host):
        return host
    try:
        return socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0]
    except (OSError, IndexError):
        raise UserError(what, f"cannot resolve target host '{host}'") from None


def device_size(path):
    """The size of block device `path` in bytes, or None if it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)


def identity(path):
    """The SCSI identity (VPD page 0x83, as the kernel keeps it in sysfs) of
    the disk at `path`, or None if it has none."""
    try:
        with open(f"/sys/block/{os.path.basename(os.path.realpath(path))}/device/wwid") as f:
            return f.read().strip() or None
    except OSError:
        return None


def is_block(path):
    try:
        return os.path.exists(path) and os.stat(path).st_mode & 0o170000 == 0o060000
    except OSError:
        return False


class Node:
    """One `blkps login|logout|node-status` on this node, for parsed options `a`."""

    def __init__(self, a):
        self.a, self.what = a, a.command
        if a.command_timeout <= HOLD_LIMIT_MAX_S:
            raise UserError("--command-timeout", f"must be more than {HOLD_LIMIT_MAX_S} s (blkps's longest "
                            f"hold_limit), got {a.command_timeout}: a held gradient write aborted by the kernel "
                            "would be applied twice")
        self.credentials = chap.credentials(a.chap_file)
        self.stripe_unit = None
        if a.url:
            lines = [[a.url]]
        else:
            if not os.access(a.layout, os.R_OK):
                raise UserError(self.what, f"cannot read the layout file {a.layout}")
            parsed = self.layout_tool("read", a.layout)
            if len(parsed) < 2:
                raise UserError(self.what, f"the layout file {a.layout} names no shard")
            self.stripe_unit, lines = int(parsed[0]), [line.split() for line in parsed[1:]]
        default_name = "blkps-" + re.sub(r"\.layout$", "", os.path.basename(a.layout)) if a.layout else ""
        self.name = a.name or default_name
        if not re.fullmatch(r"[A-Za-z0-9_.+-]*", self.name):
            raise UserError("--name", f"use letters, digits and _.+- only, got '{self.name}'")
        self.shards = [Shard(urls[0], self.what, urls[1:]) for urls in lines]
        self.replicated = any(s.replicas for s in self.shards)
        if a.replacement_timeout is None:
            a.replacement_timeout = REPLICATED_REPLACEMENT_TIMEOUT_S if self.replicated else REPLACEMENT_TIMEOUT_S
        if len({s.scheme for s in self.all_replicas()}) > 1:
            raise UserError(self.what, "the shards mix iscsi:// and iser:// URLs; use one transport")
        transport = a.transport or ("iser" if self.shards[0].scheme == "iser" else "tcp")
        self.transport = "tcp" if transport == "iscsi" else transport
        self.iface = a.iface or f"blkps-{self.transport}"

    # --- running programs ----------------------------------------------------

    def all_replicas(self):
        """Every shard's every replica, in shard order, each primary first."""
        return [r for s in self.shards for r in (s, *s.replicas)]

    def layout_tool(self, *args):
        """blkps-layout's output lines; its one-line error is ours."""
        out = subprocess.run([tools.built("blkps-layout"), *args], capture_output=True, text=True)
        if out.returncode != 0:
            lines = (out.stderr or out.stdout).strip().splitlines() or [f"blkps-layout exit {out.returncode}"]
            raise UserError(self.what, lines[-1].removeprefix("blkps: "))
        return out.stdout.splitlines()

    def run(self, argv, shown=None, input=None):
        """Runs a program that changes the node, its output on stderr (stdout
        is the device's name), or under --dry-run prints it. `shown` is the
        line printed in its place (a secret's argument masked)."""
        shown = shown or command_line(argv)
        if self.a.dry_run:
            print(shown)
            return
        rc = subprocess.run(argv, stdout=sys.stderr, input=input, text=input is not None).returncode
        if rc != 0:
            raise UserError(self.what, f"'{shown}' failed (exit {rc})")

    @staticmethod
    def quiet(argv):
        """Whether a query succeeds (its output dropped)."""
        return subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0

    def need(self, *programs):
        if self.a.dry_run:
            return
        for program in ("iscsiadm", *programs):
            if not shutil.which(program):
                remedy = (", or use libblkps with an iscsi:// URL, which needs no kernel initiator"
                          if program == "iscsiadm" else "")
                raise UserError(self.what, f"{program} not found: install {_PACKAGES[program]} (Debian: apt-get "
                                f"install {_PACKAGES[program]}){remedy}")

    def targets(self):
        """Each (IQN, portal) once, in shard order: LUNs of one target share a session."""
        return list(dict.fromkeys((s.iqn, s.portal) for s in self.all_replicas()))

    def logged_in(self, iqn, portal):
        """Whether a session to this target exists now; never under --dry-run."""
        if self.a.dry_run:
            return False
        out = subprocess.run(["iscsiadm", "-m", "session"], capture_output=True, text=True).stdout
        # Lines read "tcp: [1] 127.0.0.1:3260,1 iqn.2026-11.io.blkps:model (non-flash)".
        return any(len(f) > 3 and f[2].split(",")[0] == portal and f[3] == iqn
                   for f in (line.split() for line in out.splitlines()))

    def iscsiadm_node(self, iqn, portal, *args):
        return ["iscsiadm", "-m", "node", "-T", iqn, "-p", portal, "-I", self.iface, *args]

    # --- login ------------------------------------------------------------------

    def discover(self, iqn, portal):
        """sendtargets discovery at `portal` checks that it serves `iqn`. Its
        records are not kept (-o nonpersistent): a target reports the address
        it knows itself by, which is not the one this node reaches it by
        through NAT or a forwarded port (a QEMU guest reaches the host's
        127.0.0.1 as 10.0.2.2). A failed discovery is tried again, 2 s apart:
        a target just started, or one over a slow RDMA link, may let the
        first PDU time out."""
        argv = ["iscsiadm", "-m", "discovery", "-t", "sendtargets", "-p", portal, "-I", self.iface, "-o",
                "nonpersistent"]
        if self.a.dry_run:
            print(command_line(argv))
            return
        for attempt in range(1, DISCOVERY_TRIES + 1):
            out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            last = (out.stdout.strip().splitlines() or [""])[-1]
            if out.returncode == 0:
                break
            if attempt == DISCOVERY_TRIES:
                raise UserError(self.what, f"sendtargets discovery at {portal} failed {attempt} times: {last}",
                                "is the target running, and reachable from this node?")
            print(f"blkps: {self.what}: sendtargets discovery at {portal} failed ({last}); trying again in "
                  f"{DISCOVERY_PAUSE_S} s", file=sys.stderr)
            time.sleep(DISCOVERY_PAUSE_S)
        # Lines read "127.0.0.1:3260,1 iqn.2026-11.io.blkps:model".
        served = sorted({f[1] for f in (line.split() for line in out.stdout.splitlines()) if len(f) > 1})
        if iqn not in served:
            raise UserError(self.what, f"the target at {portal} does not serve {iqn}; it serves: {' '.join(served)}")

    def set_chap(self, iqn, portal):
        """The node record's CHAP settings (--chap-file), or authmethod None.
        iscsiadm takes a secret only on its command line: it is visible in ps
        for the milliseconds that iscsiadm runs; the printed line shows
        <secret of FILE> instead."""
        update = self.iscsiadm_node(iqn, portal, "-o", "update", "-n")
        c = self.credentials
        if c is None:
            self.run([*update, "node.session.auth.authmethod", "-v", "None"])
            return
        masked = command_line(["<secret of " + self.a.chap_file + ">"])
        self.run([*update, "node.session.auth.authmethod", "-v", "CHAP"])
        self.run([*update, "node.session.auth.username", "-v", c.user])
        self.run([*update, "node.session.auth.password", "-v", c.secret],
                 f"{command_line([*update, 'node.session.auth.password', '-v'])} {masked}")
        if c.target_user:
            self.run([*update, "node.session.auth.username_in", "-v", c.target_user])
            self.run([*update, "node.session.auth.password_in", "-v", c.target_secret],
                     f"{command_line([*update, 'node.session.auth.password_in', '-v'])} {masked}")

    def wait_for(self, paths):
        """Waits until every path is a block device (udev makes the by-path
        links). `udevadm settle` first, which waits for udev's queue; one that
        fails (a busy udevd has closed its socket: "Failed to wait for daemon
        to reply") is said in a line and the paths are waited for all the same."""
        if self.a.dry_run:
            print(command_line(["udevadm", "settle"]))
            return
        rc = subprocess.run(["udevadm", "settle"], stdout=sys.stderr).returncode
        if rc != 0:
            print(f"blkps: {self.what}: 'udevadm settle' failed (exit {rc}); waiting for {' '.join(paths)} all the "
                  "same", file=sys.stderr)
        deadline = time.monotonic() + self.a.timeout
        for p in paths:
            while not is_block(p):
                if time.monotonic() > deadline:
                    raise UserError(self.what, f"{p} did not appear within {self.a.timeout}s after login (is LUN "
                                    f"{p.rsplit('-lun-', 1)[-1]} served by the target?)")
                time.sleep(0.2)

    def set_command_timeout(self, path):
        """The disk's SCSI command timeout (--command-timeout), in sysfs."""
        seconds = str(self.a.command_timeout)
        if self.a.dry_run:  # the shell's words for what happens below
            print(command_line(["sh", "-c", 'echo "$1" > "/sys/block/$(basename "$(readlink -f "$2")")/device/timeout"',
                                "sh", seconds, path]))
            return
        sysfs = f"/sys/block/{os.path.basename(os.path.realpath(path))}/device/timeout"
        try:
            with open(sysfs, "w") as f:
                f.write(seconds + "\n")
        except OSError as e:
            raise UserError(self.what, f"cannot set the command timeout of {path} in {sysfs}: {e.strerror}") from None

    def login(self):
        a = self.a
        if self.transport == "iser" and not tools.has_rdma():
            raise UserError(self.what, f"iSER needs an RDMA device and this host has none ({tools.rdma_class()} is "
                            "empty)", "use --transport tcp")
        striped = len(self.shards) > 1
        if a.dry_run and (striped or self.replicated) and not a.params:
            raise UserError(self.what, "--dry-run of a --layout login needs --params N (the shard sizes come from "
                            "the devices otherwise)")
        mapper = ["dmsetup"] if self.replicated or (striped and a.stripe == "dm") else []
        self.need("udevadm", "blockdev", *mapper, *(["mdadm"] if striped and a.stripe == "md" else []))
        if a.dry_run or not self.quiet(["iscsiadm", "-m", "iface", "-I", self.iface]):
            self.run(["iscsiadm", "-m", "iface", "-I", self.iface, "-o", "new"])
        self.run(["iscsiadm", "-m", "iface", "-I", self.iface, "-o", "update", "-n", "iface.transport_name", "-v",
                  self.transport])
        for iqn, portal in self.targets():
            if self.logged_in(iqn, portal):
                print(f"blkps: {self.what}: already logged in to {iqn} at {portal}", file=sys.stderr)
                continue
            self.discover(iqn, portal)
            if a.dry_run or not self.quiet(self.iscsiadm_node(iqn, portal)):
                self.run(["iscsiadm", "-m", "node", "-o", "new", "-T", iqn, "-p", portal, "-I", self.iface])
            for key, value in session.initiator(a.queue_depth, a.replacement_timeout):
                self.run(self.iscsiadm_node(iqn, portal, "-o", "update", "-n", key, "-v", value))
            self.set_chap(iqn, portal)
            self.run(self.iscsiadm_node(iqn, portal, "--login"))
        paths = [p for s in self.shards for p in s.paths()]
        self.wait_for(paths)
        for p in paths:
            self.set_command_timeout(p)
        if not striped and not self.replicated:
            print(self.shards[0].by_path)
            return 0
        for device in (*filter(None, self.multipath_devices()), f"/dev/mapper/{self.name}", f"/dev/md/{self.name}"):
            if not a.dry_run and is_block(device):
                raise UserError(self.what, f"a device named {device} exists already",
                                f"log out first (blkps logout --layout {a.layout}) or choose --name")
        sizes = self.shard_sizes()
        devices = [self.follow(s, d, size) if s.replicas else s.by_path
                   for s, d, size in zip(self.shards, self.multipath_devices(), sizes)]
        if striped:
            devices = [self.assemble(devices, sizes)]
        self.wait_for(devices)
        print(devices[-1])
        return 0

    # --- the replicas of a shard -----------------------------------------------------

    def multipath_devices(self):
        """Each shard's dm-multipath device, None for a shard without
        replicas: /dev/mapper/NAME for a layout of one shard (the device
        learners open), /dev/mapper/NAME-shardK under a striped one."""
        one = len(self.shards) == 1
        return [None if not s.replicas else f"/dev/mapper/{self.name}" if one else f"/dev/mapper/{self.name}-shard{k}"
                for k, s in enumerate(self.shards)]

    def follow(self, shard, device, size):
        """`device`, a dm-multipath device over the disks of `shard`'s
        replicas (`size` bytes each): a path group per replica in the
        layout's order, the primary's first. A dead primary's disk fails
        its I/O after replacement_timeout and a backup answers standby
        until promoted (sense 02/04/0B, which fails the path, not the disk):
        dm-multipath then sends it to the next group. No queueing once
        every path has failed: the I/O fails (EIO), as a dead target's
        does without replicas. Refused if the replicas present different
        SCSI identities (not one disk)."""
        if not self.a.dry_run:
            ids = [identity(p) for p in shard.paths()]
            if None in ids or len(set(ids)) > 1:
                shown = ", ".join(f"{r.url}: {i or 'none'}" for r, i in zip((shard, *shard.replicas), ids))
                raise UserError(self.what, f"the replicas of {shard.url} do not present one SCSI identity ({shown})",
                                "start them with --replicas 2 (blkps target start or serve), which gives a LUN's "
                                "replicas one scsi_id")
        groups = " ".join(f"round-robin 0 1 1 {p} 1" for p in shard.paths())
        name = device.removeprefix("/dev/mapper/")
        self.run(["dmsetup", "create", name, "--table",
                  f"0 {size // 512} multipath 0 0 {len(shard.paths())} 1 {groups}"])
        return device

    # --- the striped device --------------------------------------------------------

    def shard_sizes(self):
        """Each shard's device size in bytes: from --params and the layout
        (blkps-layout sizes: the layout's striping, rounded up to 512-byte
        blocks as blkps shards gives each server its part) under --dry-run,
        else read from the devices and checked against --params if given."""
        a = self.a
        want = None
        if a.params:
            want = [int(n) for n in self.layout_tool("sizes", "--stripe-unit", str(self.stripe_unit), "--shards",
                                                     str(len(self.shards)), "--params", str(a.params), "--device")]
        sizes = []
        for k, s in enumerate(self.shards):
            if a.dry_run:
                size = want[k]
            else:
                size = device_size(s.by_path)
                if size is None:
                    raise UserError(self.what, f"cannot read the size of {s.by_path}")
                for r in s.replicas:
                    if device_size(r.by_path) != size:
                        raise UserError(self.what, f"replica {r.url} of {s.url} is {device_size(r.by_path)} bytes, "
                                        f"not {size}")
                if want and size != want[k]:
                    raise UserError(self.what, f"{s.url} is {size} bytes but a model of {a.params} params striped by "
                                    f"this layout gives it {want[k]}", "check --params and the layout")
            if size <= 0:
                raise UserError(self.what, f"{s.url} holds no part of the model (more shards than stripe units?)")
            sizes.append(size)
        return sizes

    def assemble(self, paths, sizes):
        """The striped device over the shard devices `paths`; returns its path.
        dm: blkps-layout's table, whole rows of stripe units as one striped
        segment, then the last row's units as linear segments. md: RAID-0
        built without a superblock (mdadm --build; --create would write md
        metadata into the model, which the server applies as gradient)."""
        unit = self.stripe_unit
        if self.a.stripe == "dm":
            table = self.layout_table(paths, sizes)
            create = ["dmsetup", "create", self.name]
            if len(table) == 1:
                self.run([*create, "--table", table[0]])
            elif self.a.dry_run:
                print(" ".join(["printf", quote(r"%s\n"), command_line(table), "|", command_line(create)]))
            else:
                self.run(create, f"{command_line(create)} for the table: {'; '.join(table)}",
                         input="\n".join(table) + "\n")
            return f"/dev/mapper/{self.name}"
        if unit % 4096:
            raise UserError(self.what, f"md RAID-0 needs a stripe unit that is a multiple of 4096 bytes (stripe_unit "
                            f"= {unit})", "use --stripe dm")
        if any(s != sizes[0] or s % unit for s in sizes):
            raise UserError(self.what, f"md RAID-0 needs shards of equal size, each a whole number of stripe units "
                            f"({unit} bytes), but they are {' '.join(map(str, sizes))} bytes", "use --stripe dm")
        self.run(["mdadm", "--build", f"/dev/md/{self.name}", "--level=0", f"--chunk={unit // 1024}",
                  f"--raid-devices={len(paths)}", *paths])
        return f"/dev/md/{self.name}"

    def layout_table(self, paths, sizes):
        out = subprocess.run([tools.built("blkps-layout"), "dm-table", "--stripe-unit", str(self.stripe_unit),
                              *(f"{p}={size}" for p, size in zip(paths, sizes))],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise UserError(self.what, (out.stderr.strip().splitlines() or ["blkps-layout dm-table failed"])[-1]
                            .removeprefix("blkps: "))
        return out.stdout.strip().splitlines()

    # --- logout and status -----------------------------------------------------------

    def logout(self):
        self.need()
        if len(self.shards) > 1:
            dm, md = f"/dev/mapper/{self.name}", f"/dev/md/{self.name}"
            if (self.a.dry_run and self.a.stripe == "dm") or (not self.a.dry_run and is_block(dm)):
                self.run(["dmsetup", "remove", self.name])
            elif self.a.dry_run or is_block(md):
                self.run(["mdadm", "--stop", md])
        for device in filter(None, self.multipath_devices()):
            if self.a.dry_run or is_block(device):
                self.run(["dmsetup", "remove", device.removeprefix("/dev/mapper/")])
        for iqn, portal in self.targets():
            if not self.a.dry_run and not self.logged_in(iqn, portal):
                print(f"blkps: {self.what}: not logged in to {iqn} at {portal}", file=sys.stderr)
                continue
            self.run(self.iscsiadm_node(iqn, portal, "--logout"))
        return 0

    def status(self):
        def described(path):
            size = device_size(path)
            return f"{path} -> {os.path.realpath(path)} ({'?' if size is None else size} bytes)"
        missing = 0
        for s in self.all_replicas():
            print(f"{s.url}  {described(s.by_path) if is_block(s.by_path) else 'not logged in'}")
            missing |= not is_block(s.by_path)
        for device in filter(None, self.multipath_devices()):
            shown = described(device) if is_block(device) else "not assembled"
            print(f"{device.removeprefix('/dev/mapper/')}  {shown}")
            missing |= not is_block(device)
        if len(self.shards) > 1:
            device = next((d for d in (f"/dev/mapper/{self.name}", f"/dev/md/{self.name}") if is_block(d)), None)
            print(f"{self.name}  {described(device) if device else 'not assembled'}")
            missing |= device is None
        return 1 if missing else 0


def command(a):
    node = Node(a)
    return {"login": node.login, "logout": node.logout, "node-status": node.status}[a.command]()


def add_parsers(sub):
    for name, helptext in (("login", "log this node into a model with the kernel's iSCSI initiator; prints the device"),
                           ("logout", "log this node out of a model"),
                           ("node-status", "show this node's devices of a model; exit 1 if one is missing")):
        doc = 'doc/learner-nodes.md, "Learner nodes with a kernel initiator"'
        p = sub.add_parser(name, help=helptext, description=f"{helptext}. {doc}, says what each step does.")
        which = p.add_mutually_exclusive_group(required=True)
        which.add_argument("--url", help="a learner slot's LUN: iscsi://HOST[:PORT]/IQN/LUN or iser://... (as "
                           "blkps target start prints it; PORT defaults to 3260)")
        which.add_argument("--layout", metavar="FILE", help="a shard layout (blkps shards start writes "
                           "DIR/slot-K.layout): one device over all shards")
        p.add_argument("--transport", choices=("tcp", "iscsi", "iser"), help="tcp (default; iscsi is the same) or "
                       "iser (RDMA; needs a device in /sys/class/infiniband); an iser:// URL selects iser")
        p.add_argument("--iface", help="the open-iscsi iface to create and use (default blkps-TRANSPORT)")
        p.add_argument("--stripe", choices=("dm", "md"), default="dm", help="how --layout shards become one "
                       "device: dm, device-mapper (default; stripe_unit a power of two >= 4096) or md, RAID-0 "
                       "without a superblock (shards of equal size, stripe_unit a multiple of 4096)")
        p.add_argument("--name", help="the striped device: /dev/mapper/NAME or /dev/md/NAME (default "
                       "blkps-<layout file name without .layout>)")
        p.add_argument("--params", type=positive_int, metavar="N", help="the model's parameter count: shard "
                       "sizes follow from it and the layout (needed by --dry-run of a --layout login; otherwise "
                       "read from the devices and checked)")
        p.add_argument("--queue-depth", type=positive_int, default=64, metavar="N",
                       help="SCSI commands in flight per LUN (default 64)")
        p.add_argument("--replacement-timeout", type=positive_int, metavar="S",
                       help=f"seconds the kernel queues I/O while a session is down before failing it (default "
                       f"{REPLACEMENT_TIMEOUT_S}, like libblkps; {REPLICATED_REPLACEMENT_TIMEOUT_S} where a shard has "
                       "replicas, whose multipath device then sends it to the next replica)")
        p.add_argument("--command-timeout", type=positive_int, default=30, metavar="S",
                       help=f"the SCSI command timeout of each disk (default 30; more than {HOLD_LIMIT_MAX_S}: blkps "
                       "holds a bsp/ssp command up to hold_limit, and a held gradient write aborted and retried "
                       "would be applied twice)")
        p.add_argument("--timeout", type=positive_int, default=30, metavar="S",
                       help="seconds to wait for devices to appear (default 30)")
        chap.add_argument(p, "log in as user= with secret=; with target_user=, the target must prove itself with "
                          "target_secret= (mutual CHAP). iscsiadm takes a secret only on its command line (in ps "
                          "for milliseconds) and keeps it in the node record (root only)")
        p.add_argument("--dry-run", action="store_true", help="print every command that would change this node, "
                       "one per line, shell-quoted, instead of running it (as on a fresh node); needs no iscsiadm")
        p.set_defaults(run=command)
