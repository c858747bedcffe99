"""blkps.collectives: synchronous rounds between a job's learners through the
server: every rank hands in bytes, every rank gets every rank's bytes.
blkps.torch builds allreduce, allgather, broadcast and broadcast_object on
it (doc/pytorch.md "PyTorch", "Horovod's API").

The bytes travel through the exchange region of the model's control LUN
(wire/include/blkps/control_lun.h: the LUN's last ``exchange_bytes``,
plain bytes the server keeps in memory and gives no meaning). They never
touch the model, its clocks or its rule, so a round works the same in
async, bsp and ssp, and its result is exact: each rank reduces the same
bytes in rank order.

Layout of the region, for a job of ``size`` ranks (every rank computes it
from ``size`` alone)::

    [0, 2 * size * CELL)           headers: cell (parity p, rank r) at
                                   (p * size + r) * CELL
    [2 * size * CELL, ...)         payloads: (p, r) at
                                   2 * size * CELL + (p * size + r) * chunk

A header cell (CELL = 4 KiB, little-endian): magic ``blkpsxc1``, the run's
session (8 bytes), the round's sequence number (uint64, 1, 2, ...), the
rank's total bytes for this call (uint64), this round's piece length
(uint64), the label's length (uint32), the label (what was called, e.g.
``allreduce:loss:float32:(1,)``), then the piece itself when it fits the
cell, else the piece is at the rank's payload slot. Round s uses parity
s % 2. A rank writes its payload, then its header (each write returns once
the server has it), then reads the headers of parity s % 2 until every
rank's shows (session, s); then it reads the payloads. A rank reaches
round s + 2 (the same parity) only after every rank has written its
header of round s + 1, which each wrote after reading all of round s: no
cell is overwritten before everyone has read it. A call longer than one
chunk takes several rounds; the first round's totals tell every rank how
many.

A dead rank and a slow one. Every rank heartbeats while its job is open
(Heartbeat: a thread that writes the control command
``rank=<rank>:<run>`` every second or so, whatever the rank is doing:
evaluating, checkpointing, waiting), and the server shows each rank's last
heartbeat in its status (``ranks``: rank, run, idle_s). A rank waiting in
a round reads that status about once a second while ranks are missing: a
missing rank whose heartbeat of this run is older than ``dead_after_s``,
or that has none after this rank has waited that long, is dead, and the
round fails with RankDied naming it. A missing rank that heartbeats is
only slow, and is waited for as long as it beats, or until the call's
``timeout_s``, if it gives one: then the call fails with CollectiveTimeout
naming the ranks still missing. Either failure leaves this rank's
collectives out of step with the others': the job cannot go on.

The session names one run of the job (hashed from the launcher's variables:
$BLKPS_RUN_ID, torchrun's run id and master address, Open MPI's job id,
Slurm's job and step), so that a later run on the same server never takes
an earlier run's cells for its own. Two runs with the same variables on one
server without a restart: set BLKPS_RUN_ID.
"""

import hashlib
import struct
import threading
import time

__all__ = ["CollectiveTimeout", "Exchange", "Heartbeat", "RankDied", "session_of"]

CELL = 4096
_MAGIC = b"blkpsxc1"
_HEADER = struct.Struct("<8s8sQQQI")
_LABEL_MAX = 512
_INLINE_MAX = CELL - _HEADER.size - _LABEL_MAX
_SESSION_KEYS = ("BLKPS_RUN_ID", "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT",
                 "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "SLURM_JOB_ID", "SLURM_STEP_ID")


class RankDied(RuntimeError):
    """A collective cannot complete: ranks it waits for stopped
    heartbeating (their process died or hangs without its threads)."""

    def __init__(self, message, ranks):
        super().__init__(message)
        self.ranks = ranks


class CollectiveTimeout(TimeoutError):
    """A collective cannot complete within the time its caller gave: ranks
    it waits for are alive (they heartbeat) but have not joined it."""

    def __init__(self, message, ranks):
        super().__init__(message)
        self.ranks = ranks


def heartbeat_period(dead_after_s):
    """Seconds between a rank's heartbeats for a bound of `dead_after_s`:
    several beats within the bound, at most one a second."""
    return min(1.0, dead_after_s / 4)


class Heartbeat:
    """This rank's heartbeat: a daemon thread that opens a control LUN with
    `open_control()` (a blkps.control.Control, owned, used by this thread
    alone) and writes ``rank=<rank>:<run>`` (run: `session` in hex) every
    `period_s`. An open or write that fails is tried again next period (the
    server may be restarting); the last error is in `error`. The
    constructor returns after the first beat was tried (at most
    `first_beat_s`): a rank that goes on to a collective is then already in
    the server's "ranks", so the others can tell it dead if it dies at once.
    close() stops the thread and closes its control."""

    def __init__(self, open_control, rank, session, period_s, first_beat_s=5.0):
        self._open, self._period = open_control, period_s
        self._command = f"rank={rank}:{session.hex()}"
        self._stop = threading.Event()
        self._first_tried = threading.Event()
        self.error = None
        self._thread = threading.Thread(target=self._run, name="blkps-heartbeat", daemon=True)
        self._thread.start()
        self._first_tried.wait(first_beat_s)

    def _run(self):
        control = None
        try:
            while True:
                try:
                    if control is None:
                        control = self._open()
                    control.command(self._command)
                    self.error = None
                except Exception as e:  # noqa: BLE001: kept for error; beat again next period
                    self.error = e
                    if control is not None:
                        control.close()
                        control = None
                self._first_tried.set()
                if self._stop.wait(self._period):
                    return
        finally:
            if control is not None:
                control.close()

    def close(self):
        self._stop.set()
        # An open that hangs on an unreachable server must not hang the
        # caller: the thread (a daemon) then ends on its own.
        self._thread.join(timeout=5 * self._period + 5)


def session_of(env, size):
    """The 8-byte session of the run that `env` (a launcher's environment)
    and `size` (its rank count) describe; the same on every rank."""
    text = ";".join(f"{key}={env.get(key, '')}" for key in _SESSION_KEYS) + f";size={size}"
    return hashlib.sha256(text.encode()).digest()[:8]


class Exchange:
    """The rounds of one rank (`rank` of `size`) through the control LUN
    `control` (a blkps.control.Control, owned from now on). exchange() is
    called by every rank with the same labels in the same order; one call
    at a time (a lock serializes threads). A missing rank is waited for as
    long as it heartbeats (Heartbeat, with the same `session`). Errors:
    ValueError when the ranks called different things (both named),
    RankDied when a missing rank has not heartbeat for dead_after_s (named),
    OSError from the device."""

    def __init__(self, control, rank, size, session, dead_after_s):
        self._control = control
        self._device = control.device
        self.rank, self.size, self._session = rank, size, session
        self.dead_after_s = dead_after_s
        region = control.layout.exchange_bytes
        self._base = self._device.size_bytes - region
        # The weights window ends before this; a server without the region
        # (an older blkps) must not have its weights written.
        mib = 1 << 20
        weights_end = control.layout.weights_offset + -(-control.status()["device_bytes"] // mib) * mib
        if self._base < weights_end:
            raise ValueError("blkps: this control LUN has no exchange region (a server older than the "
                             "collectives?); update the server")
        headers = 2 * size * CELL
        self.chunk = (region - headers) // (2 * size) // CELL * CELL if region > headers else 0
        if self.chunk < CELL:
            raise ValueError(f"blkps: {size} ranks do not fit the control LUN's exchange region "
                             f"({region} bytes): at most {region // (4 * CELL)}")
        self._seq = 0
        self._lock = threading.Lock()
        self.rounds = 0  # for the cost figures: rounds taken so far

    def close(self):
        self._control.close()

    def _header_at(self, parity, rank):
        return self._base + (parity * self.size + rank) * CELL

    def _payload_at(self, parity, rank):
        return self._base + 2 * self.size * CELL + (parity * self.size + rank) * self.chunk

    def exchange(self, label, data, timeout_s=None):
        """Every rank's `data` (bytes) of this call, as a list in rank order.
        `timeout_s` (None: no bound): the longest this call waits for the
        other ranks, whether or not they heartbeat (CollectiveTimeout)."""
        if self.size == 1:
            return [bytes(data)]
        label_bytes = label.encode()[:_LABEL_MAX]
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            out = [bytearray() for _ in range(self.size)]
            sent = 0
            while True:
                totals, pieces = self._round(label_bytes, len(data), data[sent:sent + self.chunk], deadline,
                                             timeout_s)
                for k, piece in enumerate(pieces):
                    out[k] += piece
                sent += self.chunk
                if sent >= max(totals):
                    return [bytes(b) for b in out]

    def _round(self, label, total, piece, deadline=None, timeout_s=None):
        """One round: this rank's `piece` of a call of `total` bytes in,
        every rank's (totals, pieces) out; CollectiveTimeout after
        `deadline` (time.monotonic()'s; None: none), the call's
        `timeout_s` from its start."""
        self._seq += 1
        self.rounds += 1
        parity = self._seq % 2
        block = self._device.logical_block_size
        inline = len(piece) <= _INLINE_MAX
        if not inline:
            self._device.write_bytes(self._payload_at(parity, self.rank),
                                     bytes(piece) + b"\0" * (-len(piece) % block))
        cell = _HEADER.pack(_MAGIC, self._session, self._seq, total, len(piece), len(label))
        cell += label.ljust(_LABEL_MAX, b"\0") + (bytes(piece) if inline else b"")
        self._device.write_bytes(self._header_at(parity, self.rank), cell.ljust(CELL, b"\0"))
        waiting_since = time.monotonic()
        next_look = waiting_since + heartbeat_period(self.dead_after_s)
        pause = 0.0002
        while True:
            raw = self._device.read_bytes(self._header_at(parity, 0), self.size * CELL)
            heads = [self._parse(raw[k * CELL:(k + 1) * CELL]) for k in range(self.size)]
            missing = [k for k, h in enumerate(heads) if h is None]
            for k, h in enumerate(heads):
                if h is not None and h[3] != label:
                    raise ValueError(f"blkps: collective mismatch in call {self._seq}: rank {k} called "
                                     f"{h[3].decode(errors='replace')!r}, rank {self.rank} called "
                                     f"{label.decode(errors='replace')!r}; every rank must make the "
                                     "same calls in the same order")
            if not missing:
                break
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise CollectiveTimeout(
                    f"blkps: rank(s) {missing} did not join {label.decode(errors='replace')!r} (round "
                    f"{self._seq}) within its timeout of {timeout_s:g} s; the job's collectives cannot "
                    "complete without them: restart the job", missing)
            if now >= next_look:
                next_look = now + heartbeat_period(self.dead_after_s)
                self._fail_if_dead(missing, now - waiting_since, label)
            time.sleep(pause)
            pause = min(pause * 2, 0.01)
        pieces = []
        for k, (_, total_k, length, _, cell_k) in enumerate(heads):
            if k == self.rank:
                pieces.append(bytes(piece))
            elif length <= _INLINE_MAX:
                start = _HEADER.size + _LABEL_MAX
                pieces.append(cell_k[start:start + length])
            else:
                raw = self._device.read_bytes(self._payload_at(parity, k), length + (-length % block))
                pieces.append(raw[:length])
        return [h[1] for h in heads], pieces

    def _fail_if_dead(self, missing, waited, label):
        """Raises RankDied if any of the `missing` ranks is dead by the
        server's status "ranks": its heartbeat of this run is older than
        dead_after_s, or it has none and this rank has waited that long."""
        beats = {r["rank"]: r for r in self._control.status().get("ranks", [])
                 if r["run"] == self._session.hex()}
        why = {}
        for k in missing:
            if k in beats and beats[k]["idle_s"] > self.dead_after_s:
                why[k] = f"no heartbeat for {beats[k]['idle_s']:.1f} s"
            elif k not in beats and waited > self.dead_after_s:
                why[k] = f"no heartbeat in this run while rank {self.rank} waited {waited:.1f} s"
        if why:
            raise RankDied(f"blkps: rank(s) {sorted(why)} died in {label.decode(errors='replace')!r} "
                           f"(round {self._seq}): " + "; ".join(f"rank {k}: {w}" for k, w in sorted(why.items())) +
                           f" (bound {self.dead_after_s:g} s, BLKPS_COLLECTIVE_DEAD_S); the job's collectives "
                           "cannot complete without them: restart the job", sorted(why))

    def _parse(self, cell):
        """(seq, total, length, label, cell) of a header cell of this
        session and round, else None."""
        magic, session, seq, total, length, label_len = _HEADER.unpack_from(cell)
        if magic != _MAGIC or session != self._session or seq != self._seq:
            return None
        label = cell[_HEADER.size:_HEADER.size + label_len]
        return seq, total, length, label, cell
