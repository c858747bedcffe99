"""blkps top: a live view of a job for a terminal (doc/monitoring.md "blkps
top"). Every second it reads the same snapshot `blkps status --watch` reads
(every shard's status through its control LUN) and shows one line per
shard and one per learner slot and shard, with rates per second since the
previous snapshot. On a terminal it redraws in place (curses; q quits);
otherwise (a pipe, a log, ssh without a tty) it prints each frame as plain
text, a blank line between frames.

frame(previous, current, seconds) is the one renderer: snapshots are
[(shard label, status)] as control_targets gives them; the first frame has
no previous and shows no rates.
"""

import os
import sys
import time

from . import control
from .errors import UserError

LEARNER_HEADER = ("SHARD", "LUN", "STATE", "ITER", "ITER/S", "PUSH/S", "PULL/S", "PUSH_MB/S", "PULL_MB/S",
                  "STALE_MAX", "PUSH_STALE", "IDLE_S", "HELD", "TIMEOUTS")


def _rate(now, before, key, seconds, scale=1.0):
    if before is None or seconds <= 0:
        return "-"
    return f"{(now[key] - before[key]) / seconds / scale:.1f}"


def frame(previous, current, seconds, title=""):
    """The lines of one frame: a title, a line per shard, a table of
    learner slots. `previous` (or None) and `current` are [(shard label,
    status)]; `seconds` between them."""
    first = current[0][1]
    params = ", ".join(f"{k}={v:g}" for k, v in first["rule_params"].items())
    lines = [f"blkps top {title}  model {first['model']}: {first['mode']}, {first['rule']} ({params})  "
             f"{time.strftime('%H:%M:%S')}"]
    before = dict(previous or [])
    rows = [LEARNER_HEADER]
    for label, s in current:
        shard = label.split()[-1] if label else "0"
        old = before.get(label)
        c = s["checkpoint"]
        stall = f", push stall {c['last_stall_seconds']:.3f} s" if c["path"] else ""
        lines.append(f"shard {shard}: updates {s['updates']} ({_rate(s, old, 'updates', seconds)}/s), "
                     f"step {s['global_step']}, held {s['held_now']}, rejected {s['rejected_writes']}, "
                     f"live {s['live_learners']}/{len(s['learners'])}, checkpoints {c['written']}{stall}"
                     + (f"  FAILED: {s['failure']}" if s["failed"] else ""))
        old_learners = {l["lun"]: l for l in (old or {}).get("learners", [])}
        for l in s["learners"]:
            was = old_learners.get(l["lun"])
            rows.append((shard, str(l["lun"]), l["state"], str(l["iteration"]),
                         _rate(l, was, "iteration", seconds), _rate(l, was, "writes", seconds),
                         _rate(l, was, "reads", seconds), _rate(l, was, "bytes_written", seconds, 1e6),
                         _rate(l, was, "bytes_read", seconds, 1e6), str(l["staleness_max"]),
                         f"{l.get('push_staleness_mean', 0):.1f}", f"{l['idle_s']:.1f}", str(l["held"]),
                         str(l["hold_timeouts"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(LEARNER_HEADER))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in rows]
    return lines


def snapshots(devices):
    return [(label, device.status()) for label, device in devices]


def run_plain(devices, a, out=sys.stdout):
    previous, then, shown = None, None, 0
    while True:
        now = time.monotonic()
        current = snapshots(devices)
        if shown:
            print(file=out)
        print("\n".join(frame(previous, current, now - then if then else 0, a.dir or a.control)), file=out)
        out.flush()
        shown += 1
        if a.count and shown >= a.count:
            return 0
        previous, then = current, now
        time.sleep(max(0.0, a.interval - (time.monotonic() - now)))


def run_curses(devices, a):
    import curses

    def draw(screen):
        curses.curs_set(0)
        screen.timeout(int(a.interval * 1000))
        previous, then, shown = None, None, 0
        while True:
            now = time.monotonic()
            current = snapshots(devices)
            lines = frame(previous, current, now - then if then else 0, a.dir or a.control)
            screen.erase()
            height, width = screen.getmaxyx()
            for y, line in enumerate(lines[:height - 1]):
                screen.addnstr(y, 0, line, width - 1)
            screen.addnstr(min(len(lines), height - 1), 0, "q quits", width - 1)
            screen.refresh()
            shown += 1
            if a.count and shown >= a.count:
                return 0
            previous, then = current, now
            if screen.getch() in (ord("q"), ord("Q")):
                return 0
    return curses.wrapper(draw)


def command_top(a):
    if a.interval <= 0:
        raise UserError("top", f"--interval {a.interval:g}: must be above 0", "e.g. --interval 1")
    devices = [(label, control.open_control(url, chap_file, a.initiator))
               for label, url, chap_file in control.control_targets(a, "top")]
    try:
        if sys.stdout.isatty() and os.environ.get("TERM", "dumb") != "dumb":
            return run_curses(devices, a)
        return run_plain(devices, a)
    finally:
        for _, device in devices:
            device.close()


def add_parser(sub):
    """`blkps top` on the subparsers `sub`."""
    p = sub.add_parser("top", help="a live view of a job: a line per shard and learner, rates per second",
                       description="Shows the job every --interval seconds (default 1): a line per shard and one "
                       "per learner slot, with rates per second since the last look. On a terminal it redraws in "
                       "place (q quits); otherwise it prints each frame, a blank line between them.")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--dir", help="a blkps target or shards folder")
    where.add_argument("--control", metavar="TARGET", help="the control LUN")
    p.add_argument("--initiator", metavar="IQN", help="log in with this initiator name, as blkps status")
    p.add_argument("--interval", type=float, default=1.0, metavar="SECONDS", help="refresh every SECONDS")
    p.add_argument("--count", type=int, default=0, metavar="N", help="stop after N frames (default: never)")
    p.set_defaults(run=command_top)
