#!/usr/bin/python3
"""The `blkps` command as a user meets it: one-line errors that say what
happened first, labelled output, and the trips a new user reported (issue
11, item 5), each kept fixed here.

Usage: cli_test.py <repo> <build dir> <case>
Cases without a server (ctest label unit): unknown-command, help, bsopts,
demo-options, progress-lines, device-larger-warning, layout, mount-point-missing,
no-numpy, no-python3, scaled-error-names-option, tgtd-above-stripe-units-refused,
build-folder-from-environment, layouts-written-at-once-by-two-parts. Cases that start their own tgtd (label
integration): start-labels-urls, set-shows-reason, model-too-large,
owner-pid-watchdog, start-after-tgtd-killed, folder-with-space, status-shows-stale-pushes,
concurrent-starts-one-serves, concurrent-scaled-starts-one-serves,
concurrent-shards-starts-one-serves, colocated-shards-share-memory, tgtd-above-cores-refused, scaled-operator-keys,
replicas-start-promote-stop.
"""
import io
import os
import re
import signal
import stat
import subprocess
import sys
import tempfile
import time

top, build, case = sys.argv[1], sys.argv[2], sys.argv[3]
BLKPS = os.path.join(top, "scripts", "blkps")
PLUGIN = os.path.join(build, "target-plugin", "bs_blkps.so")
PYTHON = "/usr/bin/python3"
os.environ["BLKPS_LIB"] = os.path.join(build, "learner", "libblkps.so")
# Folders no target uses, for options refused before any tgtd starts (a
# start may still take its folder's lock): removed when the test ends.
_SCRATCH = tempfile.TemporaryDirectory(prefix="blkps-cli-test-")
NO_TARGET, NO_JOB = os.path.join(_SCRATCH.name, "no-target"), os.path.join(_SCRATCH.name, "no-job")


def fail(message):
    sys.exit(f"cli_test {case}: FAIL: {message}")


def blkps(*args, **kwargs):
    """Runs `blkps ARGS`: (exit status, stdout, stderr)."""
    out = subprocess.run([BLKPS, *args], capture_output=True, text=True, **kwargs)
    return out.returncode, out.stdout, out.stderr


def expect_one_line_error(args, starts, status=None):
    """`blkps ARGS` must fail with exactly one stderr line starting `starts`."""
    rc, _, err = blkps(*args)
    lines = err.splitlines()
    if rc == 0:
        fail(f"blkps {' '.join(args)} succeeded")
    if status is not None and rc != status:
        fail(f"blkps {' '.join(args)}: exit {rc}, expected {status}")
    if len(lines) != 1 or not lines[0].startswith(starts):
        fail(f"blkps {' '.join(args)}: expected one line starting {starts!r}, got {err!r}")
    return lines[0]


def running(pid):
    """Whether process `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def target_dir():
    return tempfile.mkdtemp(prefix="blkps-cli-test-")


class Target:
    """A target started by `blkps target start` for one case, stopped at exit."""

    def __init__(self, bsopts, *extra):
        self.dir = target_dir()
        self.rc, self.out, self.err = blkps("target", "start", "--dir", self.dir, "--plugin", PLUGIN,
                                            "--owner-pid", str(os.getpid()), "--bsopts", bsopts, *extra)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        blkps("target", "stop", "--dir", self.dir)
        subprocess.run(["rm", "-rf", self.dir])


# --- no server ---------------------------------------------------------------

def test_unknown_command():
    # A misspelt subcommand is named as such before any option is checked
    # (it once said "no such folder" for the --dir it lacked).
    line = expect_one_line_error(["target", "stat"], "blkps: target: unknown command 'stat'", 2)
    if "start, stop, restart, show" not in line or "watch" in line:
        fail(f"the line should list start, stop, restart, show (and not the watchdog): {line}")
    expect_one_line_error(["bogus"], "blkps: unknown command 'bogus'", 2)
    expect_one_line_error(["target", "start", "--bsopts", "params=1"], "blkps: target start: the following "
                          "arguments are required: --dir", 2)


def test_help():
    for args in (["--help"], ["target", "--help"], ["target", "start", "--help"], ["target", "stop", "--help"],
                 ["target", "show", "--help"], ["shards", "start", "--help"], ["shards", "stop", "--help"],
                 ["status", "--help"], ["set", "--help"], ["demo", "--help"], ["login", "--help"],
                 ["logout", "--help"], ["node-status", "--help"], ["layout", "--help"], ["mount", "--help"]):
        rc, out, err = blkps(*args)
        # layout and mount show their program's own text.
        if rc != 0 or not re.search(r"usage", out, re.I):
            fail(f"blkps {' '.join(args)}: exit {rc}, no help on stdout: {out[:200]!r} {err[:200]!r}")


def test_bsopts():
    # tgtadm cuts --bsopts at ',': lr would be silently dropped. Refused with
    # one line, the reason first, before any tgtd starts.
    folder = target_dir()
    try:
        line = expect_one_line_error(["target", "start", "--dir", folder, "--plugin", PLUGIN,
                                      "--bsopts", "params=1000,lr=0.1"], "blkps: --bsopts: ',' is not an option "
                                     "separator")
        if line.count("params=1000,lr=0.1") != 0:
            fail(f"the line repeats the option string: {line}")
        line = expect_one_line_error(["target", "start", "--dir", folder, "--plugin", PLUGIN,
                                      "--bsopts", "params=10;lr=x"], "blkps: --bsopts: lr: expected a finite number")
        if os.path.exists(os.path.join(folder, "tgtd.pid")):
            fail("a tgtd was started for refused --bsopts")
        expect_one_line_error(["shards", "start", "--dir", folder, "--shards", "2", "--stripe-unit", "4096",
                               "--bsopts", "params=1000,lr=0.1"], "blkps: --bsopts: ',' is not")
    finally:
        subprocess.run(["rm", "-rf", folder])


def test_demo_options():
    # Checked before anything is built or started.
    expect_one_line_error(["demo", "--epochs", "-1"], "blkps: demo: argument --epochs: invalid", 2)
    expect_one_line_error(["demo", "--epochs"], "blkps: demo: argument --epochs: expected one argument", 2)
    expect_one_line_error(["demo", "--learners", "0"], "blkps: demo: argument --learners: invalid", 2)
    learner = subprocess.run([PYTHON, os.path.join(top, "learner", "examples", "train_digits.py"),
                              "--epochs", "-1", "--target", "/dev/null"], capture_output=True, text=True)
    if learner.returncode == 0 or "--epochs" not in learner.stderr:
        fail(f"train_digits.py --epochs -1: exit {learner.returncode}, {learner.stderr!r}")


def test_progress_lines():
    # Two learners share the demo's stdout: each progress line must reach it
    # in one write, or lines run together.
    sys.path.insert(0, os.path.join(top, "learner", "examples"))
    import digits_mlp

    class Recorder(io.StringIO):
        writes = []

        def write(self, text):
            self.writes.append(text)
            return len(text)

    meter = digits_mlp.EpochMeter(3)
    meter.timed_pull(lambda: None, 100)
    meter.timed_push(lambda: None, 100)
    meter.add_batch(0.5, 3, 4)
    real, sys.stdout = sys.stdout, Recorder()
    try:
        meter.end_epoch()
    finally:
        recorder, sys.stdout = sys.stdout, real
    if len(recorder.writes) != 1 or not re.match(r"learner 3: epoch +1 .*\n$", recorder.writes[0]):
        fail(f"the progress line took {len(recorder.writes)} writes: {recorder.writes!r}")


def test_device_larger_warning():
    # doc/server.md's sharding recipe once served 10M parameters to a 9,610-parameter
    # learner, which trained to 0.49 without a word.
    with tempfile.NamedTemporaryFile(suffix=".f32") as device:
        device.truncate(40_000_000)
        out = subprocess.run([PYTHON, os.path.join(top, "learner", "examples", "train_digits.py"),
                              "--target", device.name, "--epochs", "1"], capture_output=True, text=True)
    if out.returncode != 0:
        fail(f"train_digits.py on a file failed: {out.stderr}")
    if "warning: the device holds 10000000 parameters but this model uses 9610" not in out.stderr:
        fail(f"no warning about the unused parameters: {out.stderr!r}")


def test_mount_point_missing():
    # doc/learner-nodes.md's "Any language" recipe once lacked the mkdir; the error says it.
    missing = os.path.join(tempfile.gettempdir(), "blkps-cli-test-no-such-folder")
    line = expect_one_line_error(["mount", missing, "m=/dev/null"], f"blkps-mount: {missing}: ")
    if f"mkdir -p {missing}" not in line:
        fail(f"the line does not say how to make the mount point: {line}")


def test_layout():
    # blkps layout is StripeMap as a command: shard sizes, and split puts
    # stripe unit k of a file on shard k mod S at (k div S) * unit.
    rc, out, err = blkps("layout", "sizes", "--stripe-unit", "1M", "--shards", "2", "--params", "1000000")
    if rc != 0 or out.split() != ["2097152", "1902848"]:
        fail(f"sizes: exit {rc}, {out!r} {err!r}")
    expect_one_line_error(["layout", "sizes", "--stripe-unit", "1M", "--shards", "5", "--params", "1000000"],
                          "blkps: layout sizes: a model of 1000000 parameters has only 4 stripe unit(s)")
    with tempfile.TemporaryDirectory() as d:
        params, unit, shards = 10_000, 4096, 3
        model = bytes(range(256)) * (4 * params // 256) + bytes(4 * params % 256)
        with open(os.path.join(d, "model.f32"), "wb") as f:
            f.write(model)
        outs = [os.path.join(d, f"shard-{k}") for k in range(shards)]
        rc, _, err = blkps("layout", "split", "--stripe-unit", str(unit), "--shards", str(shards), "--params",
                           str(params), os.path.join(d, "model.f32"), *outs)
        if rc != 0:
            fail(f"split: {err}")
        parts = [open(o, "rb").read() for o in outs]
        for k in range((len(model) + unit - 1) // unit):
            at = k // shards * unit
            if parts[k % shards][at:at + unit] != model[k * unit:(k + 1) * unit]:
                fail(f"split: stripe unit {k} is not at shard {k % shards} byte {at}")
        if sum(map(len, parts)) != len(model):
            fail(f"split wrote {sum(map(len, parts))} bytes of a {len(model)}-byte model")


# --- against a real tgtd -------------------------------------------------------

def test_start_labels_urls():
    with Target("params=1000;lr=0.1", "--luns", "2") as t:
        if t.rc != 0:
            fail(f"start failed: {t.err}")
        lines = t.out.splitlines()
        labels = [line.split(": ", 1)[0] for line in lines]
        if labels != ["learner 1", "learner 2", "control", "admits"] or lines[3] != "admits: 127.0.0.1 (--allow)":
            fail(f"start printed {lines}")
        lines = lines[:3]
        if not all(re.match(r"iscsi://127\.0\.0\.1:\d+/iqn\.2026-11\.io\.blkps:model/\d$", line.split(": ", 1)[1])
                   for line in lines):
            fail(f"not URLs: {lines}")
        _, shown, _ = blkps("target", "show", "--dir", t.dir, "--get", "URL", "--get", "CONTROL_URL")
        if shown.split() != [lines[0].split(": ", 1)[1], lines[2].split(": ", 1)[1]]:
            fail(f"show --get gives {shown.split()}, start printed {lines}")


def test_set_shows_reason():
    # The writer of a refused control command sees only a SCSI error; the
    # command shows the server's reason instead.
    with Target("params=1000;lr=0.1") as t:
        if t.rc != 0:
            fail(f"start failed: {t.err}")
        line = expect_one_line_error(["set", "--dir", t.dir, "foo=1"], "blkps: set: the server refused 'foo=1': ")
        if "no parameter 'foo'" not in line:
            fail(f"the server's reason is missing: {line}")
        rc, out, _ = blkps("status", "--dir", t.dir)
        if "last control write refused: control: foo" not in out:
            fail(f"status does not show the refused write: {out}")
        rc, out, err = blkps("set", "--dir", t.dir, "lr=0.5")
        if rc != 0 or "lr=0.5" not in out:
            fail(f"a good set after a refused one: {rc} {out} {err}")


def test_wildcard_address_needs_allow():
    # D9: a wildcard portal names no initiator; --allow must say who may log
    # in, and a value it cannot take is refused in one line (before tgtd).
    for args, starts in ((["--address", "0.0.0.0"], "blkps: --address: 0.0.0.0 listens on every interface"),
                         (["--address", "::"], "blkps: --address: :: listens on every interface"),
                         (["--allow", "10.0.0.0/33"], "blkps: --allow: expected an address, a subnet"),
                         (["--allow", "host.example"], "blkps: --allow: expected an address, a subnet")):
        expect_one_line_error(["target", "start", "--dir", NO_TARGET, "--bsopts", "params=10", *args],
                              starts)


def test_lease_options_refused():
    # --lease decides between a primary and its backup (doc/replicas.md
    # "Failover by a lease"): without --replicas 2, or with a TTL under
    # etcd's shortest, one line before any tgtd starts.
    expect_one_line_error(["target", "start", "--dir", NO_TARGET, "--bsopts", "params=10", "--lease",
                           "127.0.0.1:2379"], "blkps: --lease: decides which of a primary and its backup serves")
    expect_one_line_error(["target", "start", "--dir", NO_TARGET, "--bsopts", "params=10", "--replicas",
                           "2", "--lease", "127.0.0.1:2379", "--lease-ttl", "1"],
                          "blkps: target start: argument --lease-ttl: invalid lease TTL in whole seconds")


def test_serve_replica_options_refused():
    # A part's replicas on two hosts meet in the job's folder and each task
    # says which it is (doc/replicas.md "Replicas on several hosts"): one
    # line before any tgtd starts.
    serve = ["target", "serve", "--dir", NO_TARGET, "--address", "127.0.0.1", "--bsopts", "params=10"]
    expect_one_line_error([*serve, "--replicas", "2", "--replica", "primary"],
                          "blkps: --replicas: 2: a primary and its backup meet in the job's folder")
    expect_one_line_error([*serve, "--replicas", "2", "--publish", NO_JOB],
                          "blkps: --replicas: 2: which replica this task is must be said")
    expect_one_line_error([*serve, "--replica", "backup"], "blkps: --replica: names a replica's role")
    expect_one_line_error([*serve, "--replication-address", "127.0.0.2"],
                          "blkps: --replication-address: is where a backup listens")
    replicated = [*serve, "--replicas", "2", "--replica", "backup", "--publish", NO_JOB]
    expect_one_line_error([*replicated, "--replication-address", "10.0.0.300"],
                          "blkps: --replication-address: expected an address or NETWORK/BITS, got '10.0.0.300'")
    shown = subprocess.run(["ip", "-4", "-br", "addr"], capture_output=True, text=True).stdout
    elsewhere = next(n for n in ("198.51.100", "203.0.113", "192.0.2") if f" {n}." not in shown) + ".0/24"
    expect_one_line_error([*replicated, "--replication-address", elsewhere],
                          f"blkps: --replication-address: this host has no address on {elsewhere} (it has ")
    expect_one_line_error([*serve[:-1], "params=1000000", "--replicas", "2", "--replica", "backup", "--publish",
                           NO_JOB, "--tgtd", "2"],
                          "blkps: --replicas: a backup for each of 2 tgtds is not done yet")
    # Under Slurm two tasks serve each part: an odd count cannot pair them.
    os.environ.update(SLURM_PROCID="0", SLURM_NTASKS="3")
    try:
        expect_one_line_error([*serve, "--part", "slurm", "--replicas", "2", "--publish", NO_JOB],
                              "blkps: --replicas: 2 with --part slurm needs an even number of tasks, got 3")
    finally:
        del os.environ["SLURM_PROCID"], os.environ["SLURM_NTASKS"]


def test_set_needs_operator():
    # D3: with --operator, set and status --dir log in to the operator target
    # with DIR/operator.chap; the learners' control LUN refuses set whatever
    # initiator name is given; --operator IQN is refused in one line.
    expect_one_line_error(["target", "start", "--dir", NO_TARGET, "--bsopts", "params=10", "--operator",
                           "iqn.2026-11.io.blkps:cli-operator"], "blkps: --operator: takes no initiator name")
    with Target("params=1000;lr=0.1", "--operator") as t:
        if t.rc != 0:
            fail(f"start failed: {t.err}")
        chap_file = os.path.join(t.dir, "operator.chap")
        if stat.S_IMODE(os.stat(chap_file).st_mode) != 0o600:
            fail(f"{chap_file} is not mode 0600")
        _, control, _ = blkps("target", "show", "--dir", t.dir, "--get", "CONTROL_URL")
        for name in ("iqn.2026-11.io.blkps:cli-operator", "iqn.2026-11.io.blkps:cli-other"):
            line = expect_one_line_error(["set", "--control", control.strip(), "--initiator", name, "lr=0.5"],
                                         "blkps: set: the server refused 'lr=0.5': ")
            if "the learners' control LUN" not in line:
                fail(f"the server's reason is missing: {line}")
        rc, out, err = blkps("set", "--dir", t.dir, "lr=0.5")
        if rc != 0 or "lr=0.5" not in out:
            fail(f"the operator's set: {rc} {out} {err}")
        rc, out, err = blkps("status", "--dir", t.dir)
        if rc != 0 or "lr=0.5" not in out:
            fail(f"status through the operator target: {rc} {out} {err}")
    if os.path.exists(chap_file):
        fail(f"{chap_file} outlived its target")


def test_model_too_large():
    # doc/server.md quotes the line a user sees for a model larger than memory.
    with Target("params=100000000000;rule=adam") as t:
        lines = t.err.splitlines()
        if t.rc == 0 or len(lines) != 1:
            fail(f"expected one line, got exit {t.rc}: {t.err}")
        shape = re.sub(r"\d+ MiB", "N MiB", lines[0])
        want = ("blkps: target start: params: a model of 100000000000 parameters with rule adam needs N MiB but "
                "only N MiB of memory is available; use fewer parameters or shard the model")
        if shape != want:
            fail(f"got {lines[0]!r}, expected the shape {want!r}")
        with open(os.path.join(top, "doc", "server.md")) as f:
            documented = re.sub(r"\d+ MiB", "N MiB", f.read().replace("\n", " "))
        if want not in documented:
            fail("doc/server.md does not quote this line")
        if os.path.exists(os.path.join(t.dir, "tgtd.pid")):
            fail("a tgtd was left running")


def test_owner_pid_watchdog():
    # When the --owner-pid process exits (here: SIGKILL), the target stops.
    owner = subprocess.Popen(["sleep", "600"])
    folder = target_dir()
    try:
        rc, _, err = blkps("target", "start", "--dir", folder, "--plugin", PLUGIN, "--owner-pid", str(owner.pid),
                           "--bsopts", "params=1000")
        if rc != 0:
            fail(f"start failed: {err}")
        with open(os.path.join(folder, "tgtd.pid")) as f:
            tgtd = int(f.read())
        owner.kill()
        owner.wait()
        deadline = time.monotonic() + 60  # a bound on waiting, not a timing assertion
        while os.path.exists(os.path.join(folder, "tgtd.pid")) and time.monotonic() < deadline:
            time.sleep(0.1)
        if os.path.exists(os.path.join(folder, "tgtd.pid")) or running(tgtd):
            fail("the target still runs after its owner died")
    finally:
        blkps("target", "stop", "--dir", folder)
        subprocess.run(["rm", "-rf", folder])


def test_start_after_tgtd_killed():
    # kill -9 of a target's tgtd leaves its --owner-pid watchdog, which stops
    # whatever tgtd its folder names once it notices the death: a start in
    # that folder ends it first, or the tgtd just started (a restart on the
    # same port, with learners waiting to log in again) could be stopped.
    # The old watchdog is held (SIGSTOP) so that it cannot notice first.
    owner = subprocess.Popen(["sleep", "600"])
    folder = target_dir()
    def recorded(name):
        with open(os.path.join(folder, name)) as f:
            return int(f.read())
    start = ["target", "start", "--dir", folder, "--plugin", PLUGIN, "--owner-pid", str(owner.pid), "--bsopts",
             "params=1000"]
    watchdog = None
    try:
        rc, _, err = blkps(*start)
        if rc != 0:
            fail(f"start failed: {err}")
        tgtd, watchdog = recorded("tgtd.pid"), recorded("watchdog.pid")
        os.kill(watchdog, signal.SIGSTOP)
        os.kill(tgtd, signal.SIGKILL)
        deadline = time.monotonic() + 60  # a bound on waiting, not a timing assertion
        while running(tgtd) and time.monotonic() < deadline:
            time.sleep(0.05)
        rc, _, err = blkps(*start)
        if rc != 0:
            fail(f"the start after kill -9 failed: {err}")
        if running(watchdog):
            fail(f"the dead tgtd's watchdog {watchdog} still runs after a new start in its folder")
        if not running(recorded("tgtd.pid")) or recorded("watchdog.pid") == watchdog:
            fail("the new start has no tgtd or no watchdog of its own")
    finally:
        if watchdog and running(watchdog):
            os.kill(watchdog, signal.SIGKILL)
        owner.kill()
        owner.wait()
        blkps("target", "stop", "--dir", folder)
        subprocess.run(["rm", "-rf", folder])



def test_stop_during_start():
    # A start stopped half-way (SIGTERM: kill, timeout(1), the end of its
    # process group) stops the tgtd it started: none is left running.
    owner = subprocess.Popen(["sleep", "600"])
    folder = target_dir()
    pid_file = os.path.join(folder, "tgtd.pid")
    try:
        start = subprocess.Popen([BLKPS, "target", "start", "--dir", folder, "--plugin", PLUGIN,
                                  "--owner-pid", str(owner.pid), "--bsopts", "params=1000"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60  # a bound on waiting, not a timing assertion
        def written_pid():
            try:
                with open(pid_file) as f:
                    return int(f.read())
            except (OSError, ValueError):  # not there yet, or not written out yet
                return None
        while written_pid() is None and start.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)
        tgtd = written_pid()
        if start.poll() is not None or tgtd is None:
            fail(f"the start ended before tgtd's pid was written (exit {start.returncode}); nothing to stop")
        start.terminate()
        rc = start.wait()
        if rc != 143:
            fail(f"the start exited {rc} after SIGTERM, not 143 (128 + SIGTERM)")
        if running(tgtd) or os.path.exists(pid_file):
            fail(f"tgtd {tgtd} still runs after its start was stopped (exit {rc}: {start.stderr.read()!r})")
    finally:
        owner.kill()
        owner.wait()
        blkps("target", "stop", "--dir", folder)
        subprocess.run(["rm", "-rf", folder])


def test_no_numpy():
    """Before scripts/setup.sh ran (issue 20): a python3 without numpy runs
    the command's help and one-line errors, and a command that needs the
    learner's package says to set up, never a traceback."""
    bare = [PYTHON, "-I", "-S"]  # no site-packages: no numpy, no blkps
    if subprocess.run([*bare, "-c", "import numpy"], capture_output=True).returncode == 0:
        fail("python3 -I -S imports numpy: the case would test nothing")
    entry = os.path.join(top, "scripts", "blkps_cli", "__main__.py")
    missing = os.path.join(tempfile.gettempdir(), "blkps-cli-test-no-such-folder")

    def run(*args):
        out = subprocess.run([*bare, entry, *args], capture_output=True, text=True, env={})
        if "Traceback" in out.stderr:
            fail(f"blkps {' '.join(args)} without numpy: a traceback:\n{out.stderr}")
        return out

    for args in (["--help"], ["demo", "--help"], ["target", "start", "--help"]):
        out = run(*args)
        if out.returncode != 0 or not out.stdout.startswith("usage: blkps"):
            fail(f"blkps {' '.join(args)} without numpy: exit {out.returncode}, {out.stdout[:80]!r} {out.stderr!r}")
    for args, starts in ((["target", "show", "--dir", missing], "blkps: target show: no target running"),
                         (["demo", "--epochs", "0"], "blkps: demo: argument --epochs: invalid positive integer"),
                         (["status", "--control", "iscsi://127.0.0.1:9/iqn.x:y/0"],
                          "blkps: cannot load the blkps Python package")):
        out = run(*args)
        if out.returncode == 0 or len(out.stderr.splitlines()) != 1 or not out.stderr.startswith(starts):
            fail(f"blkps {' '.join(args)} without numpy: exit {out.returncode}, expected one line "
                 f"starting {starts!r}, got {out.stderr!r}")



def test_no_python3():
    """A minimal Debian 12 has no python3: scripts/blkps installs it with
    apt-get, saying so, then runs. Here a copy of scripts/blkps whose
    python3 is missing, and an apt-get on PATH that records its arguments
    and "installs" python3 as a link to the real one."""
    work = tempfile.mkdtemp(prefix="blkps-cli-test-")
    try:
        fake_python = os.path.join(work, "usr-bin", "python3")
        with open(BLKPS) as f:
            launcher = f.read()
        if "python=/usr/bin/python3\n" not in launcher:
            fail("scripts/blkps does not set python=/usr/bin/python3")
        os.makedirs(os.path.join(work, "scripts"))
        os.makedirs(os.path.join(work, "bin"))
        with open(os.path.join(work, "scripts", "blkps"), "w") as f:
            f.write(launcher.replace("python=/usr/bin/python3\n", f"python={fake_python}\n"))
        os.chmod(os.path.join(work, "scripts", "blkps"), 0o755)
        os.symlink(os.path.join(top, "scripts", "blkps_cli"), os.path.join(work, "scripts", "blkps_cli"))
        log = os.path.join(work, "apt-get.log")
        with open(os.path.join(work, "bin", "apt-get"), "w") as f:
            f.write(f"#!/bin/sh\necho \"$*\" >> '{log}'\n"
                    f"case \"$*\" in *install*) mkdir -p '{os.path.dirname(fake_python)}' && "
                    f"ln -s {PYTHON} '{fake_python}' ;; esac\n")
        os.chmod(os.path.join(work, "bin", "apt-get"), 0o755)
        env = dict(os.environ, PATH=os.path.join(work, "bin") + ":" + os.environ["PATH"])
        out = subprocess.run([os.path.join(work, "scripts", "blkps"), "--help"], capture_output=True, text=True,
                             env=env)
        if out.returncode != 0 or not out.stdout.startswith("usage: blkps"):
            fail(f"blkps --help without python3: exit {out.returncode}, {out.stdout[:80]!r} {out.stderr!r}")
        if not out.stderr.startswith("blkps: installing python3"):
            fail(f"blkps did not say it installs python3: {out.stderr!r}")
        with open(log) as f:
            calls = f.read().splitlines()
        if len(calls) != 2 or not calls[0].startswith("update") or "install" not in calls[1] \
                or not calls[1].rstrip().endswith("python3"):
            fail(f"apt-get was run as {calls}, expected update, then install ... python3")
    finally:
        subprocess.run(["rm", "-rf", work])



def test_folder_with_space():
    # A checkout anywhere (issue 20): the plugin and the state in folders
    # whose names hold a space (ld.so splits LD_PRELOAD at spaces).
    folder = os.path.join(target_dir(), "a folder")
    try:
        os.makedirs(folder)
        plugin = os.path.join(folder, "bs_blkps.so")
        subprocess.run(["cp", PLUGIN, plugin], check=True)
        rc, _, err = blkps("target", "start", "--dir", os.path.join(folder, "state"), "--plugin", plugin,
                           "--owner-pid", str(os.getpid()), "--bsopts", "params=1000;lr=0.1")
        if rc != 0:
            fail(f"start with the plugin in '{folder}': {err}")
        rc, out, err = blkps("status", "--dir", os.path.join(folder, "state"), "--json")
        if rc != 0 or '"params": 1000' not in out:
            fail(f"status of a target in '{folder}': {rc} {err}")
    finally:
        blkps("target", "stop", "--dir", os.path.join(folder, "state"))
        subprocess.run(["rm", "-rf", os.path.dirname(folder)])


def test_status_shows_stale_pushes():
    # Guard rail (issue 22): a push more than stale_bound updates stale is
    # counted in the learner's row and told in one line naming its LUN. LUN 1
    # pulls, LUN 2 pushes three times, LUN 1 pushes: 3 updates stale, bound 2.
    sys.path.insert(0, os.path.join(top, "learner", "python"))
    import json
    import numpy as np
    import blkps as lib
    with Target("params=1000;rule=sgd;lr=0.01;mode=async;stale_bound=2", "--luns", "2") as t:
        if t.rc != 0:
            fail(f"start failed: {t.err}")
        _, shown, _ = blkps("target", "show", "--dir", t.dir, "--json")
        first, second = json.loads(shown)["URLS"].split()[:2]
        grad = np.full(1000, 0.5, np.float32)
        with lib.Model(first) as a, lib.Model(second) as b:
            a.pull(0, 1000)
            for _ in range(3):
                b.pull(0, 1000)
                b.push(0, grad)
            a.push(0, grad)
        rc, out, err = blkps("status", "--dir", t.dir)
        if rc != 0:
            fail(f"status: {rc} {err}")
        rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("  ")}
        header = rows.get("LUN")
        if not header or header[-3:] != ["PUSH_MAX", "PUSH_MEAN", "BEYOND_BOUND"]:
            fail(f"no push staleness columns:\n{out}")
        if rows["1"][-3] != "3" or rows["1"][-1] != "1" or rows["2"][-1] != "0":
            fail(f"LUN 1 should show 1 push 3 updates stale, LUN 2 none:\n{out}")
        told = [line for line in out.splitlines() if line.startswith("learner at LUN")]
        if len(told) != 1 or not told[0].startswith("learner at LUN 1: 1 pushes more than the stale bound of 2"):
            fail(f"expected one line about LUN 1:\n{out}")


# --- one job on one host (issue 35, item 4) -------------------------------------

def tgtds_of(folder):
    """The pids of the tgtds whose control socket lies under `folder`,
    found by their environment: what is left running, whatever state
    files say."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{entry}/comm") as f:
                comm = f.read().strip()
        except (OSError, ValueError):
            continue
        if comm == "tgtd" and running(int(entry)) and any(
                v.startswith(b"TGT_IPC_SOCKET=" + folder.encode() + b"/") for v in env):
            pids.append(int(entry))
    return pids


def concurrent_starts(command, tgtds, *options, starts=6):
    # Several starts of `blkps COMMAND start` on one --dir at once: one
    # serves, each other is refused in one line, and after stop no tgtd of
    # any is left. (Whether they overlap is up to the scheduler; without the
    # lock they often all passed the "already running" check and each
    # started tgtds.)
    folder = target_dir()
    argv = [BLKPS, command, "start", "--dir", folder, "--plugin", PLUGIN, "--owner-pid", str(os.getpid()), *options,
            "--bsopts", "params=1000000"]
    try:
        procs = [subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for _ in range(starts)]
        results = [(p.wait(), p.stderr.read()) for p in procs]
        for p in procs:
            p.stderr.close()
        refusals = [err for rc, err in results if rc != 0]
        if len(refusals) != starts - 1:
            fail(f"expected one of {starts} starts to serve, got {results}")
        for err in refusals:
            lines = err.splitlines()
            if len(lines) != 1 or not lines[0].startswith(f"blkps: {command} start: "):
                fail(f"a refused start did not say why in one line: {err!r}")
        if len(tgtds_of(folder)) != tgtds:
            fail(f"{len(tgtds_of(folder))} tgtds run for one job of {tgtds}")
    finally:
        blkps(command, "stop", "--dir", folder)
        left = tgtds_of(folder)
        subprocess.run(["rm", "-rf", folder])
    if left:
        fail(f"tgtds {left} outlived {command} stop")


def test_concurrent_starts_one_serves():
    concurrent_starts("target", 1, "--tgtd", "1")


def test_concurrent_scaled_starts_one_serves():
    concurrent_starts("target", 2, "--tgtd", "2")


def test_concurrent_shards_starts_one_serves():
    concurrent_starts("shards", 2, "--shards", "2", "--stripe-unit", "1M")


def available_memory():
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))


def test_colocated_shards_share_memory():
    # A model that one tgtd refuses (1.5 x the available memory) is refused
    # for 2 co-located tgtds too, though each half would fit alone.
    params = available_memory() * 3 // 2 // 4
    with Target(f"params={params};rule=sgd", "--tgtd", "2") as t:
        lines = t.err.splitlines()
        if t.rc == 0 or len(lines) != 1:
            fail(f"expected one line, got exit {t.rc}: {t.err}")
        if not lines[0].startswith("blkps: target start: params: 2 co-located tgtds of a model of "
                                   f"{params} parameters need "):
            fail(f"the line does not say the shards share the host's memory: {lines[0]}")
        if tgtds_of(t.dir):
            fail(f"tgtds {tgtds_of(t.dir)} left running")


def test_tgtd_above_cores_refused():
    cores = len(os.sched_getaffinity(0))
    with Target("params=10000000", "--tgtd", str(cores + 1)) as t:
        lines = t.err.splitlines()
        if t.rc == 0 or len(lines) != 1 or not lines[0].startswith(f"blkps: --tgtd: {cores + 1} tgtds on {cores} "
                                                                     "cores"):
            fail(f"expected one line refusing --tgtd {cores + 1}, got exit {t.rc}: {t.err}")
        if tgtds_of(t.dir):
            fail(f"tgtds {tgtds_of(t.dir)} left running")


def test_tgtd_above_stripe_units_refused():
    # 100 parameters fill one stripe unit of the least size (1024 bytes).
    with Target("params=100", "--tgtd", "2") as t:
        lines = t.err.splitlines()
        if t.rc == 0 or len(lines) != 1 or not lines[0].startswith("blkps: --tgtd: a model of 100 parameters fills "
                                                                     "fewer than 2 stripe units"):
            fail(f"expected one line refusing --tgtd 2, got exit {t.rc}: {t.err}")


def test_tgtds_for_parts_refused():
    # parts= names whole blocks of one server's model (doc/server.md "A
    # gradient in parts"): only one tgtd serves it.
    with Target("params=1000000;mode=bsp;parts=0:262144:2", "--tgtd", "2") as t:
        lines = t.err.splitlines()
        if t.rc == 0 or lines != ["blkps: --tgtd: 2 tgtds cannot serve a gradient in parts (parts=); give --tgtd 1 "
                                  "(or leave --tgtd out)"]:
            fail(f"expected one line refusing --tgtd 2, got exit {t.rc}: {t.err}")


def test_scaled_operator_keys():
    # --operator over 2 tgtds: OPERATOR_URL and OPERATOR_CHAP_FILE name each
    # shard's, shard 0 first, and show labels them by shard.
    with Target("params=1000000", "--tgtd", "2", "--operator") as t:
        if t.rc != 0:
            fail(f"start failed: {t.err}")
        rc, out, err = blkps("target", "show", "--dir", t.dir, "--get", "OPERATOR_URL", "--get", "OPERATOR_CHAP_FILE")
        lines = out.splitlines()
        if rc != 0 or len(lines) != 2:
            fail(f"show --get: exit {rc}: {out!r} {err!r}")
        urls, files = lines[0].split(), lines[1].split()
        if len(urls) != 2 or not all(re.match(r"iscsi://127\.0\.0\.1:\d+/iqn\.\S+\.operator/\d+$", u) for u in urls):
            fail(f"OPERATOR_URL should name 2 operator LUNs: {lines[0]!r}")
        if files != [os.path.join(t.dir, f"shard-{k}", "operator.chap") for k in range(2)] or \
                not all(os.path.isfile(f) for f in files):
            fail(f"OPERATOR_CHAP_FILE should name each shard's file: {lines[1]!r}")
        _, shown, _ = blkps("target", "show", "--dir", t.dir)
        if f"operator shard 1: {urls[1]} (CHAP: {files[1]})" not in shown.splitlines():
            fail(f"show does not label shard 1's operator target:\n{shown}")


def test_scaled_error_names_option():
    # A shard's refusal of an option names the option, as one tgtd's does.
    folder = target_dir()
    try:
        expect_one_line_error(["target", "start", "--dir", folder, "--plugin", PLUGIN, "--tgtd", "2",
                               "--allow", "garbage", "--bsopts", "params=1000000"],
                              "blkps: target start: shard 0: --allow: expected an address")
    finally:
        blkps("target", "stop", "--dir", folder)
        subprocess.run(["rm", "-rf", folder])


# --- where the command finds its programs (issue 35, item 7) ------------------

def test_build_folder_from_environment():
    # BLKPS_BUILD names the build the command runs: here one whose
    # blkps-bsopts refuses everything with its own reason.
    fake = tempfile.mkdtemp(prefix="blkps-cli-build-")
    try:
        os.makedirs(os.path.join(fake, "target-plugin"))
        tool = os.path.join(fake, "target-plugin", "blkps-bsopts")
        with open(tool, "w") as f:
            f.write("#!/bin/sh\necho 'blkps: --bsopts: from the BLKPS_BUILD folder' >&2\nexit 1\n")
        os.chmod(tool, 0o755)
        rc, _, err = blkps("target", "start", "--dir", os.path.join(fake, "state"), "--bsopts", "params=1000",
                           "--owner-pid", str(os.getpid()), env=dict(os.environ, BLKPS_BUILD=fake))
        if rc == 0 or err.strip() != "blkps: --bsopts: from the BLKPS_BUILD folder; see doc/server.md, " \
                                      "\"--bsopts reference\"":
            fail(f"the command did not run BLKPS_BUILD's blkps-bsopts: exit {rc}: {err!r}")
    finally:
        blkps("target", "stop", "--dir", os.path.join(fake, "state"))
        subprocess.run(["rm", "-rf", fake])


def test_layouts_written_at_once_by_two_parts():
    # Two server tasks completing a job's set of parts at once each write
    # its layouts (blkps_cli/publish.py): both must succeed and every
    # layout must be one writer's whole file.
    sys.path.insert(0, os.path.join(top, "scripts"))
    from blkps_cli import shards
    import multiprocessing
    folder = tempfile.mkdtemp(prefix="blkps-cli-layouts-")

    def writer(label):
        envs = [{"URLS": f"iscsi://127.0.0.1:3260/iqn.{label}/1 iscsi://127.0.0.1:3260/iqn.{label}/2",
                 "CONTROL_URL": f"iscsi://127.0.0.1:3260/iqn.{label}/3"}]
        for _ in range(300):
            shards.write_layouts(folder, envs, 2, 65536, 1000, "float32", "", [label])
    try:
        procs = [multiprocessing.Process(target=writer, args=(f"part{k}",)) for k in range(4)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
        if any(proc.exitcode != 0 for proc in procs):
            fail(f"a layout writer failed: exit statuses {[proc.exitcode for proc in procs]}")
        if sorted(os.listdir(folder)) != ["slot-1.layout", "slot-2.layout"]:
            fail(f"the folder holds {sorted(os.listdir(folder))}")
        for lun in (1, 2):
            with open(os.path.join(folder, f"slot-{lun}.layout")) as f:
                text = f.read()
            names = set(re.findall(r"iqn\.(part\d)", text))
            if len(names) != 1 or not text.endswith("/3\n"):
                fail(f"slot-{lun}.layout is not one writer's whole file: {text!r}")
    finally:
        subprocess.run(["rm", "-rf", folder])


def test_replicas_start_promote_stop():
    # --replicas 2 (doc/replicas.md): a backup on standby in DIR/backup,
    # promoted by `blkps target promote`, stopped with its primary.
    import json
    with Target("params=1000;rule=sum", "--tgtd", "1", "--replicas", "2") as t:
        if t.rc != 0:
            fail(f"start failed: {t.err}")
        backup = os.path.join(t.dir, "backup")
        if f"backup: {backup} (serves learners once promoted: blkps target promote --dir {t.dir})" not in t.out:
            fail(f"start does not name the backup: {t.out}")
        pids = [blkps("target", "show", "--dir", d, "--get", "PID")[1].strip() for d in (t.dir, backup)]
        # The layout a learner follows the failover with: LUN 1 of the primary, then the backup's.
        layout = os.path.join(t.dir, "slot-1.layout")
        if f"learner 1, following a failover: layout:{layout}" not in t.out:
            fail(f"start does not name the layout that lists both replicas: {t.out}")
        urls = [blkps("target", "show", "--dir", d, "--get", "URL")[1].strip() for d in (t.dir, backup)]
        with open(layout) as f:
            lines = [line.split("#")[0].strip() for line in f]
        named = [line for line in lines if line.startswith(("shard", "replica"))]
        if named != [f"shard = {urls[0]}", f"replica = {urls[1]}"]:
            fail(f"the layout does not list the primary then the backup {urls}: {lines}")

        def role():
            rc, out, err = blkps("status", "--dir", backup, "--json")
            return json.loads(out)["replica"] if rc == 0 else f"status failed: {err}"
        if role() != "backup":
            fail(f"the backup's status says {role()}")
        rc, out, err = blkps("target", "promote", "--dir", t.dir)
        if rc != 0 or not re.match(r"promoted: learners use iscsi://127\.0\.0\.1:\d+/", out):
            fail(f"promote: exit {rc}: {out} {err}")
        if role() != "primary":
            fail(f"after promote the status says {role()}")
        expect_one_line_error(["target", "promote", "--dir", t.dir],
                              "blkps: target promote: the backup refused: promote: this server is not a backup")
        blkps("target", "stop", "--dir", t.dir)
        if any(running(int(p)) for p in pids):
            fail(f"a tgtd of {pids} still runs after stop")
        if os.path.exists(layout):
            fail("the layout naming the stopped replicas is left after stop")


test = globals().get("test_" + case.replace("-", "_"))
if not test:
    fail("unknown case")
test()
print(f"cli_test {case}: ok")
