"""Failover by a lease (doc/replicas.md "Failover by a lease"): who is a
shard's primary is decided by a lease in etcd, not by a person.

`blkps target start --replicas 2 --lease ENDPOINTS` starts a lease keeper
(`blkps target lease`, this module's command_keep) beside each tgtd, the
primary's first, in the tgtd's folder (its pid in lease.pid, its log in
lease.log). Both use the key blkps/lease/<IQN>; its value names the holder.

- The primary's keeper creates the key on a lease of TTL seconds, only if
  the key is absent (a txn on its create revision being 0), renews the
  lease every TTL/3, and after each renewal etcd confirmed tells its
  plugin the deadline (control lease_until=): the renewal's send time
  + TTL - TTL/4, in ms on CLOCK_MONOTONIC. The plugin acknowledges no
  learner write past it (aggregator/lease_fence.h), so a keeper that is
  stuck fences its own primary before etcd lets the lease go.
- The backup's keeper reads the key every TTL/4; once it is gone, it
  creates it on its own lease (the same txn), tells its plugin the
  deadline, promotes its tgtd (promote=1) and holds the lease as above.
  A primary that took the key and lost it between two of those reads is
  known by its mark: the txn that creates the key also puts
  blkps/lease/<IQN>/held (not on a lease) naming the holder, and a mark
  written after the etcd revision the backup began to watch at counts as
  a lease seen held. A backup's keeper that `blkps target start` starts,
  or `restart` once the backup is caught up, begins after its target's
  primary took the key: a key absent when it begins to watch was held and
  lost, by the holder its mark names, and it takes over as from any
  lapsed lease.
- A keeper whose tgtd dies (or stops answering the control LUN) revokes
  its lease at once: the backup takes over without waiting for the TTL.
  One that is stopped (SIGTERM, blkps target stop) revokes it too.
- A backup that missed acknowledged pushes is never promoted (doc/
  replicas.md "A backup that is lost"): when the primary's status says
  its backup is lost, its keeper writes blkps/lease/<IQN>/outdated (not
  on a lease: it outlives the primary), in a transaction that succeeds
  only while the lease key names this keeper, and only then tells its
  plugin backup_outdated=1 (it acknowledges writes alone from then on).
  The backup's keeper never takes the key while that key exists.
  `blkps target start` deletes it: both replicas start from one state.
- A backup that returns (`blkps target restart` starts a dead backup and
  its keeper again) is caught up by its primary (doc/replicas.md "A
  backup that returns"). Once the primary's status says it is in sync
  again, the primary's keeper deletes the outdated key, in a transaction
  that succeeds only while the lease key names this keeper: the backup
  may take over again from then on.

`blkps target start` keeps the endpoints and the TTL in DIR/lease.json,
for the keeper of a backup restarted later.
"""

import datetime
import json
import os
import types
import subprocess
import sys
import time

from . import etcd, processes, replicas, state, tgtd, tools
from .arguments import lease_ttl
from .errors import UserError

KEEPER_PID = "lease.pid"
KEEPER_LOG = "lease.log"
LEASE_OPTIONS = "lease.json"


def key_of(env, part=None):
    """The etcd key of the shard that target.env `env` serves; `part`
    (K/S, blkps target serve --part) names a part of a model whose parts
    share one IQN."""
    return f"blkps/lease/{env['IQN']}" + (f"/part-{part.replace('/', '-of-')}" if part else "")


def held_key_of(key):
    """The etcd key that names the last keeper to take lease key `key`,
    written with it and left when the lease goes."""
    return key + "/held"


def outdated_key_of(key):
    """The etcd key that says the shard (of lease key `key`) has a backup
    that missed acknowledged pushes."""
    return key + "/outdated"


def endpoint_urls(text):
    """ENDPOINTS of --lease ("HOST:PORT,..." or URLs) as base URLs."""
    urls = [e if "://" in e else f"http://{e}" for e in text.split(",") if e]
    if not urls:
        raise UserError("--lease", f"expected HOST:PORT[,HOST:PORT...] of etcd members, got {text!r}")
    return urls


class Keeper:
    """One tgtd's lease keeper: holds or watches its shard's key."""

    def __init__(self, folder, endpoints, ttl, part=None):
        self.folder, self.ttl = folder, ttl
        self.etcd = etcd.Etcd(endpoint_urls(endpoints), timeout_s=ttl / 4)
        self.env = state.target(folder, "target lease")
        self.key = key_of(self.env, part)
        self.outdated_key = outdated_key_of(self.key)
        self.held_key = held_key_of(self.key)
        self.watch_from = None  # a backup: etcd's revision when it began to watch (watch())
        self.watched_holder = None  # ... and the key's holder then, if any
        self.lost_before = None  # ... or, after its primary, the holder of a lease lost before it
        self.marked = None  # whether etcd holds the outdated key (None: not known)
        self.me = f"{self.env['URL']} ({folder})"
        self.lease = None
        self.target = tgtd.Target(folder)
        self._control = None

    def log(self, line):
        stamp = datetime.datetime.now().isoformat(sep=" ", timespec="milliseconds")
        with open(os.path.join(self.folder, KEEPER_LOG), "a") as f:
            f.write(f"{stamp} {line}\n")

    def tell(self, command):
        """Writes `command` to the tgtd's control LUN (OSError if it does
        not take it)."""
        if self._control is None:
            self._control = replicas.operator_control(self.folder, "target lease")
        self._control.command(command)

    def acquire(self):
        """Creates the key on a new lease if it is absent; whether it did
        (then the plugin has its first deadline)."""
        sent = time.monotonic()
        lease = self.etcd.grant(self.ttl)
        # Never while the backup is marked outdated: the check and the take
        # are one transaction.
        if not self.etcd.create(self.key, self.me, lease, absent=(self.outdated_key,),
                                also=(self.held_key, self.me)):
            self.etcd.revoke(lease)
            return False
        self.lease = lease
        self.fence(sent)
        return True

    def fence(self, sent):
        """Tells the plugin the deadline of a lease renewed at `sent`."""
        self.tell(f"lease_until={int((sent + self.ttl - self.ttl / 4) * 1000)}")

    def hold(self):
        """Renews the lease every TTL/3 until the tgtd dies (revoked) or
        etcd says it lapsed. Returns the exit status."""
        failing = None
        while True:
            if not self.target.alive():
                return self.release(f"gave up the lease: tgtd ({self.env['PID']}) is not running")
            sent = time.monotonic()
            try:
                ttl = self.etcd.keepalive(self.lease)
            except etcd.Error as e:
                if failing is None:
                    self.log(f"renewal failed ({e}); the plugin refuses writes once its deadline passes")
                failing = str(e)
                ttl = None
            if ttl == 0:
                self.log("lost the lease: etcd let it lapse (this keeper was stopped or cut off for longer than "
                         "the TTL); this primary acknowledges no write from now on")
                return 1
            if ttl:
                if failing is not None:
                    self.log("renewed again")
                    failing = None
                try:
                    self.fence(sent)
                    self.judge_backup()
                except etcd.Error as e:  # the backup's verdict: tried again at the next renewal
                    self.log(f"could not record the lost backup as outdated in etcd ({e}); trying again")
                except OSError as e:
                    return self.release(f"gave up the lease: the plugin's control LUN failed ({e})")
            time.sleep(max(0.0, sent + self.ttl / 3 - time.monotonic()))

    def judge_backup(self):
        """If the plugin says its backup is lost: records in etcd that it
        is outdated (only while this keeper's key names it), then tells the
        plugin, which acknowledges writes alone from then on."""
        lost = self._control.status().get("backup", "")
        if lost == "":
            return self.clear_backup_mark()
        if not lost.startswith("lost: "):
            return
        if not self.etcd.put_if(self.outdated_key, lost.removeprefix("lost: "), self.key, self.me):
            return  # the key is no longer this keeper's: the next renewal says the lease lapsed
        self.marked = True
        self.tell("backup_outdated=1")
        self.log(f"declared the backup outdated ({lost.removeprefix('lost: ')}): it is never promoted; this "
                 f"primary acknowledges writes alone")

    def clear_backup_mark(self):
        """The plugin says its backup is in sync (caught up after it
        returned): deletes the outdated key, only while this keeper's key
        names it, so that the backup may take over again."""
        if self.marked is False:
            return
        if self.marked is None and self.etcd.get(self.outdated_key) is None:
            self.marked = False
            return
        if self.etcd.delete_if(self.outdated_key, self.key, self.me):
            self.marked = False
            self.log("the backup caught up: it is in sync again and may take over (removed the outdated mark "
                     "in etcd)")

    def watch(self, after_primary=False):
        """A backup begins to watch: the lease held now, or taken from now
        on, is followed, even one lost before follow() reads the key
        (unseen_holder()). `after_primary`: this target's primary took the
        key before this keeper started, so a key absent now was held and
        lost, by the holder its mark names."""
        self.watched_holder, _, self.watch_from = self.etcd.get_revisions(self.key)
        if self.watched_holder is None and after_primary:
            self.lost_before = self.etcd.get(self.held_key)

    def unseen_holder(self):
        """The keeper that took the key since watch() and lost it between
        two of follow()'s reads (the mark acquire() leaves), or None."""
        holder, written, _ = self.etcd.get_revisions(self.held_key)
        return holder if holder is not None and written > self.watch_from else None

    def follow(self):
        """A backup's watch, after watch(): once the key is gone, takes it
        and promotes the tgtd. Returns the exit status (of hold(), as the
        primary)."""
        holder, said = self.watched_holder or self.lost_before, None
        seen = None if self.watched_holder is None else time.monotonic()
        while True:
            if not self.target.alive():
                self.log(f"stopped: tgtd ({self.env['PID']}) is not running")
                return 1
            try:
                value = self.etcd.get(self.key)
                if value is None and holder is None:
                    holder = self.unseen_holder()
                if value is not None:
                    holder, seen = value, time.monotonic()
                elif holder is None:
                    pass  # no primary yet (a backup served before it, blkps target serve): wait for one
                else:  # the lease lapsed: take over, unless this backup missed pushes
                    outdated = self.etcd.get(self.outdated_key)
                    if outdated is None and self.acquire():
                        break
                    if outdated is not None and outdated != said:
                        self.log(f"will not take over: the lease of {holder} lapsed, but etcd says this "
                                 f"backup missed acknowledged pushes ({outdated})")
                    said = outdated
            except etcd.Error:
                pass  # etcd is out of reach: so is a new lease; try again
            except OSError as e:
                return self.release(f"gave up the lease: the plugin did not take its deadline ({e})")
            time.sleep(self.ttl / 4)
        try:
            self.tell("promote=1")
        except OSError as e:
            return self.release(f"gave up the lease: promote=1 failed ({e})")
        if seen is not None:
            when = f"{time.monotonic() - seen:.1f} s after this keeper last saw it held"
        elif self.lost_before is not None and holder == self.lost_before:
            when = "it was lost before this keeper began to watch"
        else:
            when = "it was taken and lost between two reads of this keeper"
        self.log(f"became primary: the lease of {holder} lapsed ({when}); this tgtd serves learners at "
                 f"{self.env['URL']}")
        return self.hold()

    def release(self, why):
        """Revokes the lease if held; logs `why`. Returns 1."""
        if self.lease is not None:
            try:
                self.etcd.revoke(self.lease)
            except etcd.Error as e:
                why += f" (revoking it failed: {e}; it lapses after its TTL)"
            self.lease = None
        self.log(why)
        return 1


def command_keep(a):
    """`blkps target lease` (started by start_keeper; not for people). Prints
    one line once it holds the key (primary) or watches it (backup), or
    "error: ..." and exits."""
    folder = os.path.abspath(a.dir)
    os.environ["BLKPS_RECONNECT_SECONDS"] = str(a.ttl)  # a dead tgtd must not hold the keeper
    keeper = Keeper(folder, a.endpoints, a.ttl, a.part)

    def started(line):
        keeper.log(line)
        print(line, flush=True)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())

    try:
        if a.role == "primary":
            try:
                held = keeper.acquire()
            except OSError as e:  # etcd, or the plugin's control LUN
                keeper.release(f"could not take the lease: {e}")
                started(f"error: {e}")
                return 1
            if not held:
                started(f"error: {keeper.key} is held by {keeper.etcd.get(keeper.key)}")
                return 1
            started(f"holds {keeper.key} (TTL {a.ttl} s)")
            return keeper.hold()
        try:
            keeper.watch(a.after_primary)
        except OSError as e:  # etcd
            started(f"error: could not watch {keeper.key}: {e}")
            return 1
        started(f"watches {keeper.key} (TTL {a.ttl} s)")
        return keeper.follow()
    except KeyboardInterrupt:  # SIGTERM: blkps target stop
        return keeper.release("stopped")


def start_keeper(folder, a, role, after_primary=False):
    """Starts the lease keeper of the tgtd in `folder` as `role` (primary:
    returns once it holds the key; backup: once it watches it;
    `after_primary`: its target's primary took the key before, Keeper.watch()).
    A UserError if it could not."""
    with open(os.path.join(folder, KEEPER_LOG), "a") as log:
        extra = ["--part", a.lease_part] if getattr(a, "lease_part", None) else []
        extra += ["--after-primary"] if after_primary else []
        keeper = subprocess.Popen([tools.script("blkps"), "target", "lease", "--dir", folder, "--endpoints",
                                   a.lease, "--ttl", str(a.lease_ttl), "--role", role, *extra], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=log, start_new_session=True, text=True)
    with open(os.path.join(folder, KEEPER_PID), "w") as f:
        f.write(f"{keeper.pid}\n")
    line = keeper.stdout.readline().strip()
    keeper.stdout.close()
    if not line or line.startswith("error: "):
        keeper.wait()
        why = line.removeprefix("error: ") or f"it exited; {os.path.join(folder, KEEPER_LOG)} says why"
        raise UserError("--lease", f"the {role}'s lease keeper: {why}",
                        "check the etcd endpoints, or stop the target that holds the key")


def stop_keeper(folder):
    """Ends the lease keeper of the tgtd in `folder`, if it runs (it
    revokes its lease)."""
    processes.stop_recorded(os.path.join(folder, KEEPER_PID), "lease", folder)


def start(a):
    """The keepers of a target started with --replicas 2 --lease: the
    primary's (it takes the key), then the backup's (it watches); of a
    `target serve --replica ROLE` task, its own (a.replica, a.lease_part).
    Both replicas start from one state: the primary deletes an outdated
    mark left by an earlier run first."""
    folder = os.path.abspath(a.dir)
    role = getattr(a, "replica", None)
    if role != "backup":
        key = key_of(state.target(folder, "target start"), getattr(a, "lease_part", None))
        try:
            etcd.Etcd(endpoint_urls(a.lease), timeout_s=a.lease_ttl).delete(outdated_key_of(key))
        except etcd.Error as e:
            raise UserError("--lease", f"etcd: {e}", "check the etcd endpoints") from None
    if role:
        start_keeper(folder, a, role)
        return
    with open(os.path.join(folder, LEASE_OPTIONS), "w") as f:
        json.dump({"lease": a.lease, "lease_ttl": a.lease_ttl}, f)
    start_keeper(folder, a, "primary")
    start_keeper(replicas.backup_dir(folder), a, "backup", after_primary=True)


def restart_keeper(folder, backup, caught_up):
    """Starts the keeper of `backup` (the target in `folder` or its backup
    folder, a backup now) again, as `blkps target start` did (the
    target's lease.json), if it had one. Whether it did. `caught_up`: the
    backup is in sync with its primary, so it may take over from a lease
    lost before its keeper began to watch (Keeper.watch()); one still to
    be caught up never does."""
    try:
        with open(os.path.join(os.path.abspath(folder), LEASE_OPTIONS)) as f:
            options = types.SimpleNamespace(**json.load(f))
    except FileNotFoundError:
        return False
    start_keeper(backup, options, "backup", after_primary=caught_up)
    return True


def stop(folder):
    """Ends both keepers of the target in `folder`, the backup's first (so
    that it does not take over from a primary being stopped)."""
    folder = os.path.abspath(folder)
    stop_keeper(replicas.backup_dir(folder))
    stop_keeper(folder)


def check_options(a):
    if getattr(a, "lease", None) and getattr(a, "replicas", 1) < 2 and not getattr(a, "replica", None):
        raise UserError("--lease", "decides which of a primary and its backup serves", "give --replicas 2 with it")


def add_start_arguments(parser):
    """--lease and --lease-ttl (on `blkps target start` and `serve`)."""
    parser.add_argument("--lease", metavar="HOST:PORT[,...]",
                        help="with --replicas 2: etcd members (client URLs); a lease there decides which "
                        "replica is primary, and the backup takes over when the primary's lapses "
                        '(doc/replicas.md "Failover by a lease")')
    parser.add_argument("--lease-ttl", type=lease_ttl, default=2, metavar="S",
                        help="the lease's TTL in whole seconds, 2 or more (default 2): a primary that "
                        "stops renewing refuses writes after 3/4 of it, its backup takes over after it")


def add_arguments(start_parser, cmds):
    """--lease and --lease-ttl on `blkps target start`; the keeper's own
    command on target's subparsers `cmds` (not for people)."""
    add_start_arguments(start_parser)
    k = cmds.add_parser("lease")
    k.add_argument("--dir", required=True)
    k.add_argument("--endpoints", required=True)
    k.add_argument("--ttl", type=lease_ttl, required=True)
    k.add_argument("--role", choices=("primary", "backup"), required=True)
    k.add_argument("--part", help="K/S: the key of part K of S (blkps target serve --part)")
    k.add_argument("--after-primary", action="store_true",
                   help="a backup started after its target's primary took the key: a key absent was lost")
    k.set_defaults(run=command_keep)
