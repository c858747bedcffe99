#!/usr/bin/env python3
"""The soak's learners, sampler and exact end check (bench/soak.sh runs it).

  soak.py learner --url URL --lun K --initiator IQN --log FILE --stop-file F --seed S
      One learner: until F exists, random pauses, pulls of random ranges and
      pushes of integer gradients (one value per push) over random ranges.
      Before each push it appends "P seq start count value" to FILE and
      fsyncs; after the push returns (acknowledged), "A seq". So at a SIGKILL
      at most one push is unacknowledged, and the receipt resolves it.

  soak.py run --target-dir DIR --out DIR --minutes M [--kill-every S] ...
      Starts the learners (one per learner LUN), kills one with SIGKILL (by
      its pid) every --kill-every seconds and starts it again under a new
      initiator name, samples tgtd's RSS, errors and throughput every
      --sample-every seconds, then stops the learners and checks exactly:
      every parameter equals the sum of the acknowledged pushes plus the
      requests of killed learners' unacknowledged pushes that their receipt
      shows applied; every receipt equals what its learner's log says.
      Writes soak.json, soak.md (and soak.png with matplotlib).
      Exit status 1 if the check fails, errors > 0 or RSS grew beyond the bound.

Gradients are small integers and the sums stay far below 2^24, so float32
addition on the server is exact.
"""

import argparse
import collections
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import numpy as np

TOP = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(TOP, "learner", "python"))
import blkps  # noqa: E402
from blkps.control import Control, layout  # noqa: E402

MIB = 1 << 20
REQUEST_BYTES = MIB  # the learners' request size: a push of n bytes is ceil(n / 1 MiB) writes
START_ALIGN = 16384  # parameters: push starts on 64 KiB, so a receipt has at most size/64 KiB units
MAX_PUSH = 4 * REQUEST_BYTES // 4  # parameters per push at most (4 requests)
VALUES = [-3, -2, -1, 1, 2, 3, 4]
QUEUE_DEPTH = 16  # the learners' requests in flight (libblkps's default, named so the bound below holds)
# tgtd log lines that are events of a soak, not errors: checkpoints, a slot
# declared dead (no I/O for dead_after, e.g. a slow restart) and back
# (aggregator/job*.cc), and tgt's own lines when a connection closes with
# commands in flight (usr/iscsi/conn.c conn_close), which a learner killed
# mid-push or mid-pull causes: the command whose PDU was half received
# ("rx task": dropped before it reaches the backing store, at most one per
# kill) and the commands waiting for their CmdSN or whose response was
# queued ("pending" and "tx" tasks: at most QUEUE_DEPTH per kill; a write
# among them was applied and its receipt says so). tgtd's start-up lines come
# before the soak and are not read; every other line is an error.
EXPECTED_LOG = re.compile(r"blkps: model '[^']*': (checkpoint of step \d+ (\(generation \d+\) )?written|"
                          r"learner at lun \d+ "
                          r"(?P<slot>is dead|is back))|conn_close\(\d+\) (?P<kill>Forcing release of "
                          r"(rx|tx|pending) task|Add current tx task to the tx list for removal)")
# RSS bound: the largest RSS in the last third of the run may exceed the
# largest of the first third (tgt's command buffers and malloc's kept heap
# have grown by then) by at most this much. A leak of one 1 MiB request
# buffer per push would pass it within seconds; the legitimate growth is the
# receipts of new initiator names (one per restart, at most size/64 KiB
# units of ~64 B each) and heap fragmentation. A run shorter than
# RSS_JUDGED_AFTER_S is all warm-up: its RSS is reported, not judged.
RSS_BOUND_MIB = 16
RSS_JUDGED_AFTER_S = 180


def write_line(fd, text):
    os.write(fd, text.encode())
    os.fsync(fd)


def learner(args):
    rng = random.Random(args.seed)
    log = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        model = blkps.Model(args.url, request_bytes=REQUEST_BYTES, queue_depth=QUEUE_DEPTH,
                            initiator_name=args.initiator)
    except OSError as e:
        print(f"soak-learner {args.lun}: {e.strerror}", file=sys.stderr)
        return 1
    params = model.param_capacity
    buf = np.empty(MAX_PUSH, dtype=np.float32)
    seq = 0
    with model:
        try:
            while not os.path.exists(args.stop_file):
                time.sleep(rng.uniform(0, args.max_pause))
                if rng.random() < 0.5:
                    first = rng.randrange(params)
                    count = rng.randint(1, min(params - first, 4 * MIB))
                    w = model.pull(first, count)
                    if not np.all(np.isfinite(w)) or not np.array_equal(w, np.round(w)):
                        print(f"soak-learner {args.lun}: pulled a non-integer weight", file=sys.stderr)
                        return 1
                start = rng.randrange(0, params, START_ALIGN)
                count = min(rng.randint(1, MAX_PUSH // 128) * 128, params - start)
                value = rng.choice(VALUES)
                seq += 1
                write_line(log, f"P {seq} {start} {count} {value}\n")
                buf[:count] = value
                model.push(start, buf[:count])
                write_line(log, f"A {seq}\n")
            lost = model.pushed_bytes_lost
        except OSError as e:
            print(f"soak-learner {args.lun}: {e.strerror}", file=sys.stderr)
            return 1
    if lost:
        print(f"soak-learner {args.lun}: libblkps reports {lost} pushed bytes lost", file=sys.stderr)
        return 1
    return 0


def read_log(path):
    """(acknowledged pushes, the unacknowledged one or None) of one learner
    incarnation's log. A torn last line (killed while writing) is dropped;
    no log (killed before it opened one) is no push."""
    if not os.path.exists(path):
        return [], None
    with open(path) as f:
        lines = [line.split() for line in f.read().split("\n")[:-1]]
    acked, pending = [], None
    for line in lines:
        if line[0] == "P":
            if pending is not None:
                raise ValueError(f"{path}: push {pending[0]} has no acknowledgement but a later push started")
            pending = tuple(int(x) for x in line[1:])
        elif line[0] == "A":
            if pending is None or pending[0] != int(line[1]):
                raise ValueError(f"{path}: acknowledgement {line[1]} of no pending push")
            acked.append(pending)
            pending = None
    return acked, pending


def request_units(start, count):
    """Receipt units at which a push's writes start: libblkps splits a push
    into requests of REQUEST_BYTES from its first byte (doc/libblkps.md)."""
    first, end = start * 4, (start + count) * 4
    unit = layout().receipt_unit  # a receipt counts writes per unit (doc/libblkps.md "Faults")
    return [offset // unit for offset in range(first, end, REQUEST_BYTES)]


def read_receipt(control_url, initiator, lun, device_bytes):
    """(writes_applied, counts per unit) of `initiator`'s receipt for learner
    LUN `lun`, read as that initiator (a reader sees its own) once none of
    its writes is in progress."""
    with Control(control_url, initiator_name=initiator) as control:
        for _ in range(600):
            header, counts = control.receipt(lun, device_bytes)
            if header["writes_in_progress"] == 0:
                return header["writes_applied"], counts
            time.sleep(0.1)
    raise TimeoutError(f"{initiator}: writes still in progress on LUN {lun} after 60 s")


def check(incarnations, control_url, params):
    """The exact end check; returns its figures."""
    device_bytes = params * 4
    diff = np.zeros(params + 1, dtype=np.float64)
    result = collections.Counter()
    problems = []
    for inc in incarnations:
        acked, pending = read_log(inc["log"])
        if pending is not None and not inc["killed"]:
            problems.append(f"{inc['initiator']}: exited with push {pending[0]} unacknowledged")
        applied, receipt = inc.get("receipt") or read_receipt(control_url, inc["initiator"], inc["lun"], device_bytes)
        expected = np.zeros(len(receipt), dtype=np.int64)
        for _, start, count, value in acked:
            diff[start] += value
            diff[start + count] -= value
            for u in request_units(start, count):
                expected[u] += 1
        result["pushes_acknowledged"] += len(acked)
        result["bytes_acknowledged"] += sum(4 * c for _, _, c, _ in acked)
        extra = receipt.astype(np.int64) - expected
        if pending is not None:
            _, start, count, value = pending
            result["pushes_in_flight_at_kill"] += 1
            for i, u in enumerate(request_units(start, count)):
                if extra[u] == 1:  # this request of the push was applied
                    lo = start + i * (REQUEST_BYTES // 4)
                    hi = min(start + count, lo + REQUEST_BYTES // 4)
                    diff[lo] += value
                    diff[hi] -= value
                    extra[u] = 0
                    result["requests_in_flight_applied"] += 1
                else:
                    result["requests_in_flight_not_applied"] += 1
        bad = np.flatnonzero(extra)
        if len(bad):
            u = bad[0]
            problems.append(f"{inc['initiator']}: receipt differs from the log at {len(bad)} units, first "
                            f"unit {u}: applied {receipt[u]}, log says {expected[u]}")
        result["receipt_writes_applied"] += applied
    expected_weights = np.cumsum(diff[:-1])
    with Control(control_url) as control:
        weights = np.concatenate([control.read_weights(first, min(4 * MIB, params - first))
                                  for first in range(0, params, 4 * MIB)])
    delta = weights.astype(np.float64) - expected_weights
    result["params_exact"] = int(np.count_nonzero(delta == 0))
    result["params_below"] = int(np.count_nonzero(delta < 0))
    result["params_above"] = int(np.count_nonzero(delta > 0))
    if result["params_below"] or result["params_above"]:
        i = int(np.flatnonzero(delta)[0])
        problems.append(f"{result['params_below']} parameters below and {result['params_above']} above the "
                        f"expected sum; first: parameter {i} is {weights[i]}, expected {expected_weights[i]}")
    result["max_abs_weight"] = float(np.max(np.abs(expected_weights)))
    return dict(result), problems


def last_line(path):
    """The last complete line of a file ("" if none)."""
    if not os.path.exists(path):
        return ""
    with open(path, "rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - 128))
        lines = f.read().decode(errors="replace").split("\n")
    return lines[-2] if len(lines) > 1 else ""


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise ValueError(f"no VmRSS for pid {pid}")


class Soak:
    def __init__(self, args):
        self.args = args
        show = subprocess.run([os.path.join(TOP, "scripts", "blkps"), "target", "show", "--dir", args.target_dir,
                               "--json"], check=True, capture_output=True, text=True)
        env = json.loads(show.stdout)
        self.urls = env["URLS"].split()
        self.control_url = env["CONTROL_URL"]
        self.tgtd_pid = int(env["PID"])
        self.tgtd_log = os.path.join(args.target_dir, "tgtd.log")
        self.raw = os.path.join(args.out, "raw")
        os.makedirs(self.raw, exist_ok=True)
        self.stop_file = os.path.join(self.raw, "stop")
        if os.path.exists(self.stop_file):
            os.unlink(self.stop_file)
        self.rng = random.Random(args.seed)
        self.running = {}  # lun -> (Popen, incarnation)
        self.incarnations = []
        self.errors = []  # one line each
        self.events = collections.Counter()
        self.samples = []
        with open(self.tgtd_log, "rb") as f:
            self.log_pos = f.seek(0, os.SEEK_END)

    def start_learner(self, lun):
        n = sum(1 for inc in self.incarnations if inc["lun"] == lun)
        initiator = f"iqn.2026-11.io.blkps:soak-lun{lun}-{n}"
        inc = {"lun": lun, "initiator": initiator, "log": os.path.join(self.raw, f"learner{lun}-{n}.log"),
               "killed": False}
        err = open(os.path.join(self.raw, f"learner{lun}-{n}.err"), "w")
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "learner", "--url", self.urls[lun - 1],
                                 "--lun", str(lun), "--initiator", initiator, "--log", inc["log"], "--stop-file",
                                 self.stop_file, "--seed", str(self.rng.getrandbits(32)), "--max-pause",
                                 str(self.args.max_pause)], stdout=err, stderr=subprocess.STDOUT)
        err.close()
        inc["pid"] = proc.pid
        self.incarnations.append(inc)
        self.running[lun] = (proc, inc)

    def reap(self):
        """Learners that exited on their own are errors: counted, restarted."""
        for lun, (proc, inc) in list(self.running.items()):
            if proc.poll() is not None:
                with open(inc["log"].replace(".log", ".err")) as f:
                    tail = f.read().strip().splitlines()[-1:] or ["(no message)"]
                self.errors.append(f"learner {inc['initiator']} exited with status {proc.returncode}: {tail[0]}")
                self.start_learner(lun)

    def kill_one(self):
        """SIGKILLs a random learner, by its pid, while a push of it is in
        flight (its log's last line is a push's intent; up to 5 s of
        waiting for one), at a random point up to 10 ms into it; then starts
        it again."""
        lun = self.rng.choice(sorted(self.running))
        proc, inc = self.running.pop(lun)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not last_line(inc["log"]).startswith("P "):
            time.sleep(0.002)
        time.sleep(self.rng.uniform(0, 0.01))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        inc["killed"] = True
        self.events["kills"] += 1
        self.start_learner(lun)
        # Read now, not at the end: a LUN keeps only the receipts of its 8
        # most recently active initiators (doc/libblkps.md "Faults"), and each
        # restart comes under a new name.
        inc["receipt"] = read_receipt(self.control_url, inc["initiator"], lun, self.params * 4)
        self.events["restarts"] += 1
        print(f"soak: killed learner {inc['initiator']} (pid {inc['pid']}) and started it again", flush=True)

    def note_error(self, line):
        """Counts an error once, however many samples see it again."""
        if line not in self.errors:
            self.errors.append(line)

    def read_tgtd_log(self):
        with open(self.tgtd_log, "rb") as f:
            f.seek(self.log_pos)
            text = f.read().decode(errors="replace")
            self.log_pos = f.tell()
        for line in text.splitlines():
            event = EXPECTED_LOG.search(line)
            if event:
                what = event.group("slot") or event.group("kill") or "checkpoint written"
                self.events["tgtd_log: " + what] += 1
            elif line.strip():
                self.errors.append(f"tgtd.log: {line.strip()}")

    def sample(self, control, begin, last):
        status = control.status()
        now = time.monotonic()
        sample = {
            "t_s": round(now - begin, 1),
            "rss_mib": rss_kib(self.tgtd_pid) / 1024,
            "bytes_written": sum(learner["bytes_written"] for learner in status["learners"]),
            "bytes_read": sum(learner["bytes_read"] for learner in status["learners"]),
            "checkpoints": status["checkpoint"]["written"],
            "rejected_writes": status["rejected_writes"],
            "hold_timeouts": sum(learner["hold_timeouts"] for learner in status["learners"]),
            "failed": status["failed"],
            "checkpoint_error": status["checkpoint"]["error"],
            "control_error": status["control_error"],
        }
        span = max(now - last[0], 1e-9)
        sample["push_mb_s"] = (sample["bytes_written"] - last[1]["bytes_written"]) / span / 1e6
        sample["pull_mb_s"] = (sample["bytes_read"] - last[1]["bytes_read"]) / span / 1e6
        self.read_tgtd_log()
        kills = self.events["kills"]
        released = {what: self.events[f"tgtd_log: Forcing release of {what} task"] for what in ("rx", "tx", "pending")}
        if released["rx"] > kills:
            self.note_error("tgtd.log: more half-received commands dropped than learners killed")
        if released["tx"] + released["pending"] > kills * QUEUE_DEPTH:
            self.note_error(f"tgtd.log: more queued commands released than {QUEUE_DEPTH} per learner killed")
        # The server's own error counters and reasons, each once.
        for key in ("rejected_writes", "hold_timeouts", "failed", "checkpoint_error", "control_error"):
            if sample[key]:
                self.note_error(f"status: {key}: {sample[key]}")
        sample["errors"] = len(self.errors)
        self.samples.append(sample)
        print(f"soak: {sample['t_s']:7.1f} s  tgtd RSS {sample['rss_mib']:.1f} MiB  push {sample['push_mb_s']:.0f} "
              f"MB/s  pull {sample['pull_mb_s']:.0f} MB/s  checkpoints {sample['checkpoints']}  kills "
              f"{self.events['kills']}  errors {sample['errors']}", flush=True)
        return now, sample

    def run(self):
        args = self.args
        with Control(self.control_url, initiator_name="iqn.2026-11.io.blkps:soak-monitor") as control:
            params = self.params = control.status()["params"]
            begin = time.monotonic()
            last = (begin, {"bytes_written": 0, "bytes_read": 0})
            last = self.sample(control, begin, last)
            self.samples.clear()
            for lun in range(1, len(self.urls) + 1):
                self.start_learner(lun)
            end = begin + args.minutes * 60
            next_sample, next_kill = begin + args.sample_every, begin + args.kill_every
            try:
                while time.monotonic() < end:
                    time.sleep(max(0.0, min(next_sample, next_kill, end) - time.monotonic()))
                    self.reap()
                    if time.monotonic() >= next_kill:
                        self.kill_one()
                        next_kill += args.kill_every
                    if time.monotonic() >= next_sample:
                        last = self.sample(control, begin, last)
                        next_sample += args.sample_every
                open(self.stop_file, "w").close()
                for lun, (proc, inc) in list(self.running.items()):
                    try:
                        rc = proc.wait(timeout=60)
                    except subprocess.TimeoutExpired:
                        self.errors.append(f"learner {inc['initiator']} did not stop within 60 s (stuck)")
                        proc.kill()
                        proc.wait()
                        inc["killed"] = True
                        continue
                    if rc != 0:
                        self.errors.append(f"learner {inc['initiator']} exited with status {rc}")
                    del self.running[lun]
                last = self.sample(control, begin, last)
            finally:
                for proc, _ in self.running.values():
                    proc.kill()
                    proc.wait()
            duration = time.monotonic() - begin
            final = control.status()
        print("soak: checking every parameter and every receipt", flush=True)
        figures, problems = check(self.incarnations, self.control_url, params)
        return self.report(params, duration, final, figures, problems)

    def report(self, params, duration, final, figures, problems):
        args = self.args
        rss = [s["rss_mib"] for s in self.samples]
        third = max(1, len(rss) // 3)
        first_max, last_max = max(rss[:third]), max(rss[-third:])
        rss_judged = duration >= RSS_JUDGED_AFTER_S
        rss_ok = not rss_judged or last_max - first_max <= RSS_BOUND_MIB
        bytes_pushed = self.samples[-1]["bytes_written"]
        bytes_pulled = self.samples[-1]["bytes_read"]
        summary = {
            "minutes": round(duration / 60, 2),
            "learners": len(self.urls),
            "params": params,
            "bsopts": args.bsopts,
            "kill_every_s": args.kill_every,
            "kills": self.events["kills"],
            "restarts": self.events["restarts"],
            "checkpoints": final["checkpoint"]["written"],
            "rss_mib": {"start": rss[0], "end": rss[-1], "max": max(rss), "first_third_max": first_max,
                        "last_third_max": last_max, "bound_mib": RSS_BOUND_MIB, "judged": rss_judged, "within_bound": rss_ok},
            "errors": len(self.errors),
            "error_lines": self.errors[:50],
            "tgtd_log_events": {k[len("tgtd_log: "):]: v for k, v in self.events.items() if k.startswith("tgtd_log")},
            "bytes_pushed": bytes_pushed,
            "bytes_pulled": bytes_pulled,
            "push_mb_s_mean": bytes_pushed / duration / 1e6,
            "pull_mb_s_mean": bytes_pulled / duration / 1e6,
            "exact_check": {"ok": not problems, "problems": problems, **figures},
            "samples": self.samples,
        }
        ok = not problems and not self.errors and rss_ok
        summary["ok"] = ok
        with open(os.path.join(args.out, "soak.json"), "w") as f:
            json.dump(summary, f, indent=1)
        self.write_markdown(summary)
        self.plot(summary)
        print(f"soak: {'PASS' if ok else 'FAIL'}: {summary['minutes']} min, {summary['kills']} kills, "
              f"{summary['checkpoints']} checkpoints, tgtd RSS {rss[0]:.1f} -> {rss[-1]:.1f} MiB (max {max(rss):.1f}), "
              f"{len(self.errors)} errors, exact check: {figures['params_exact']} of {params} parameters exact",
              flush=True)
        for line in problems + self.errors[:10]:
            print(f"soak: {line}", file=sys.stderr)
        if not rss_ok:
            print(f"soak: tgtd RSS grew {last_max - first_max:.1f} MiB (last third's max over the first's); "
                  f"the bound is {RSS_BOUND_MIB} MiB", file=sys.stderr)
        return 0 if ok else 1

    def write_markdown(self, s):
        e, r = s["exact_check"], s["rss_mib"]
        lines = [
            "# blkps soak",
            "",
            f"`bench/soak.sh --minutes {self.args.minutes} --kill-every {self.args.kill_every}`: "
            f"{s['learners']} learners (blkps.Model over iSCSI on loopback) pushing integer gradients and pulling, "
            f"random pauses up to {self.args.max_pause} s; one learner killed with SIGKILL and restarted every "
            f"{s['kill_every_s']} s. Target: `{s['bsopts']}`.",
            "",
            "| figure | value |",
            "|---|---|",
            f"| duration | {s['minutes']} min |",
            f"| learners / kills / restarts | {s['learners']} / {s['kills']} / {s['restarts']} |",
            f"| checkpoints written | {s['checkpoints']} |",
            f"| tgtd RSS start / end / max | {r['start']:.1f} / {r['end']:.1f} / {r['max']:.1f} MiB |",
            f"| RSS bound: last third's max − first third's max ≤ {r['bound_mib']} MiB | "
            f"{r['last_third_max'] - r['first_third_max']:+.1f} MiB "
            f"({('ok' if r['within_bound'] else 'EXCEEDED') if r['judged'] else 'not judged: a run under 3 min'}) |",
            f"| errors (learner, status counters, tgtd log) | {s['errors']} |",
            "| tgtd log events (not errors) | "
            + (", ".join(f"{k}: {v}" for k, v in sorted(s["tgtd_log_events"].items())) or "none") + " |",
            f"| pushed / pulled | {s['bytes_pushed'] / 1e9:.2f} / {s['bytes_pulled'] / 1e9:.2f} GB "
            f"({s['push_mb_s_mean']:.0f} / {s['pull_mb_s_mean']:.0f} MB/s mean) |",
            f"| pushes acknowledged | {e['pushes_acknowledged']} |",
            f"| pushes in flight at a kill: requests applied / not | {e.get('pushes_in_flight_at_kill', 0)}: "
            f"{e.get('requests_in_flight_applied', 0)} / {e.get('requests_in_flight_not_applied', 0)} |",
            f"| exact-sum check | {e['params_exact']} of {s['params']} parameters exact, {e['params_below']} below "
            f"(lost), {e['params_above']} above (doubled); receipts match the logs: "
            f"{'yes' if not any('receipt' in p for p in e['problems']) else 'NO'} |",
            f"| result | {'PASS' if s['ok'] else 'FAIL'} |",
            "",
        ]
        if e["problems"] or s["error_lines"]:
            lines += ["Problems:", ""] + [f"- {p}" for p in e["problems"] + s["error_lines"]] + [""]
        with open(os.path.join(self.args.out, "soak.md"), "w") as f:
            f.write("\n".join(lines))

    def plot(self, s):
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("soak: no matplotlib (python3-matplotlib): no soak.png", file=sys.stderr)
            return
        t = [x["t_s"] / 60 for x in s["samples"]]
        fig, (a, b) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
        a.plot(t, [x["rss_mib"] for x in s["samples"]])
        a.set_ylabel("tgtd RSS (MiB)")
        b.plot(t, [x["push_mb_s"] for x in s["samples"]], label="push")
        b.plot(t, [x["pull_mb_s"] for x in s["samples"]], label="pull")
        b.set_ylabel("MB/s (per sample window)")
        b.set_xlabel("minutes")
        b.legend()
        fig.suptitle(f"blkps soak: {s['learners']} learners, {s['kills']} kills, {s['checkpoints']} checkpoints")
        fig.tight_layout()
        fig.savefig(os.path.join(self.args.out, "soak.png"), dpi=90)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("learner")
    p.add_argument("--url", required=True)
    p.add_argument("--lun", type=int, required=True)
    p.add_argument("--initiator", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--stop-file", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--max-pause", type=float, default=0.2)
    r = sub.add_parser("run")
    r.add_argument("--target-dir", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--minutes", type=float, required=True)
    r.add_argument("--kill-every", type=float, default=180)
    r.add_argument("--sample-every", type=float, default=10)
    r.add_argument("--max-pause", type=float, default=0.2)
    r.add_argument("--seed", type=int, default=1)
    r.add_argument("--bsopts", default="")
    args = parser.parse_args()
    if args.command == "learner":
        return learner(args)
    soak = Soak(args)

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        return soak.run()
    except KeyboardInterrupt:
        print("soak: interrupted; its learners are stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
