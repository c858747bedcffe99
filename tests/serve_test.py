#!/usr/bin/python3
"""`blkps target serve`, the server in the foreground, as a scheduler runs it
(doc/server.md "Serving in the foreground"): this test is its parent, sends
the signals and reads its one stdout line. Every case starts its own tgtds
on loopback and stops them even on failure.

Usage: serve_test.py <repo> <build dir> <case>
Case without a server (ctest label unit): bad-part-refused. Cases that
start their own tgtds (integration): sigterm-keeps-pushes, two-parts-assemble-layout, layout-wait-names-missing-part,
tgtd-death-exits-nonzero, two-level-parts-serve-a-flat-stripe,
two-level-parts-restart-from-final-generation,
restart-with-other-tgtd-count-refused, parts-with-other-tgtd-counts-refused,
chap-file-in-job-folder, hashed-table-over-parts.
"""
import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import numpy as np

top, build, case = sys.argv[1], sys.argv[2], sys.argv[3]
BLKPS = os.path.join(top, "scripts", "blkps")
PLUGIN = os.path.join(build, "target-plugin", "bs_blkps.so")
os.environ["BLKPS_LIB"] = os.path.join(build, "learner", "libblkps.so")
os.environ["BLKPS_BUILD"] = build
sys.path.insert(0, os.path.join(top, "learner", "python"))
sys.path.insert(0, os.path.join(top, "scripts"))
import blkps  # noqa: E402 (after its path)
import blkps.feature_ids  # noqa: E402
from blkps.control import open_control  # noqa: E402
from blkps_cli.processes import running  # noqa: E402 (a zombie counts as ended)

UNIT = 262144  # parameters in one 1 MiB stripe unit


def fail(message):
    sys.exit(f"serve_test {case}: FAIL: {message}")


def temp_dir(prefix):
    """A folder of this test's, removed when it ends, passed or failed (its
    servers are stopped by then)."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


class Serve:
    """`blkps target serve ARGS` in a folder of its own, as this process's
    child; stopped (SIGTERM, then the folder's stop) at the end."""

    def __init__(self, bsopts, *extra, folder=None, refused=False):
        self.dir = folder or temp_dir("blkps-serve-test-")
        self.proc = subprocess.Popen([BLKPS, "target", "serve", "--dir", self.dir, "--plugin", PLUGIN,
                                      "--address", "127.0.0.1", "--bsopts", bsopts, *extra],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.line = self.proc.stdout.readline().strip()  # the serving line, or "" when it failed
        if refused:
            return  # the caller checks that it failed
        if not self.line.startswith("serving "):
            self.proc.wait()
            fail(f"serve printed {self.line!r}, exit {self.proc.returncode}: {self.proc.stderr.read()}")
        self.portals, self.url = self.line.split()[1:]

    def tgtd_pid(self):
        with open(os.path.join(self.dir, "tgtd.pid")) as f:
            return int(f.read())

    def terminate(self):
        """SIGTERM; (exit status, stdout, stderr) once it has exited."""
        self.proc.send_signal(signal.SIGTERM)
        out, err = self.proc.communicate(timeout=120)
        return self.proc.returncode, out, err

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.communicate(timeout=120)
        subprocess.run([BLKPS, "target", "stop", "--dir", self.dir, "--no-checkpoint"])


def sigterm_keeps_pushes():
    """SIGTERM writes a final checkpoint generation holding every push, stops
    tgtd and exits 0; a start over the checkpoint serves the pushed weights."""
    folder = temp_dir("blkps-serve-test-")
    bsopts = f"params={UNIT};lr=1;checkpoint={folder}/model.ckpt"
    grad = np.arange(UNIT, dtype=np.float32)
    with Serve(bsopts) as s:
        with blkps.Model(s.url) as m:
            m.push(0, grad)
        tgtd = s.tgtd_pid()
        rc, out, err = s.terminate()
        if rc != 0:
            fail(f"serve exited {rc} after SIGTERM: {err}")
        if "final checkpoint: generation" not in err:
            fail(f"no final checkpoint line after SIGTERM: {err!r}")
        if running(tgtd):
            fail(f"tgtd {tgtd} still runs after serve exited")
        if out.strip():
            fail(f"stdout after the serving line: {out!r}")
    restarted = temp_dir("blkps-serve-test-")
    try:
        started = subprocess.run([BLKPS, "target", "start", "--dir", restarted, "--plugin", PLUGIN, "--tgtd", "1",
                                  "--owner-pid", str(os.getpid()), "--bsopts", bsopts], capture_output=True, text=True)
        if started.returncode != 0:
            fail(f"start over the checkpoint: {started.stderr}")
        url = subprocess.run([BLKPS, "target", "show", "--dir", restarted, "--get", "URL"],
                             capture_output=True, text=True).stdout.strip()
        with blkps.Model(url) as m:
            if not np.array_equal(m.pull(0, UNIT), -grad):
                fail("the weights loaded from the final checkpoint are not the pushed ones")
    finally:
        subprocess.run([BLKPS, "target", "stop", "--dir", restarted, "--no-checkpoint"])


def two_parts_assemble_layout():
    """Two `serve --part K/2 --publish D` assemble D/slot-1.layout; a learner
    through it reaches the whole model, both parts."""
    jobdir = temp_dir("blkps-serve-job-")
    params = 3 * UNIT  # part 0: units 0 and 2; part 1: unit 1
    grad = np.arange(params, dtype=np.float32)
    with Serve(f"params={params};lr=1", "--part", "0/2", "--publish", jobdir) as s0, \
            Serve(f"params={params};lr=1", "--part", "1/2", "--publish", jobdir) as s1:
        waited = subprocess.run([BLKPS, "layout", "wait", jobdir, "--timeout", "60"], capture_output=True, text=True)
        layout = waited.stdout.strip()
        if waited.returncode != 0 or layout != os.path.join(jobdir, "slot-1.layout"):
            fail(f"layout wait: exit {waited.returncode}, {waited.stdout!r} {waited.stderr!r}")
        with blkps.Model("layout:" + layout) as m:
            if m.param_capacity < params:
                fail(f"the layout holds {m.param_capacity} parameters, not the model's {params}")
            m.push(0, grad)
            if not np.array_equal(m.pull(0, params), -grad):
                fail("pull through the layout is not minus the push")
        for k, s in enumerate((s0, s1)):
            with open(os.path.join(jobdir, "servers", f"part-{k}-of-2.json")) as f:
                part = json.load(f)
            if ",".join(part["portals"]) != s.portals or part["params"] != params:
                fail(f"part {k}'s file says {part}, serve said {s.line}")
            with blkps.Model(s.url) as m:  # each part alone serves its stripe units only
                if m.param_capacity != (2 if k == 0 else 1) * UNIT:
                    fail(f"part {k} serves {m.param_capacity} parameters")
        for s in (s0, s1):
            rc, _, err = s.terminate()
            if rc != 0:
                fail(f"serve exited {rc}: {err}")
    if os.path.exists(os.path.join(jobdir, "slot-1.layout")):
        fail("the layout outlived its servers")


def hashed_table_over_parts():
    """A hashed table served as 2 parts x 2 tgtds: the layout says kind =
    hashed over the 4 shards of the flat order, and rows pushed through it
    (push_rows) land on the shard of their id's hash, which made exactly
    those rows, and read back (pull_rows) as the rule made them."""
    jobdir = temp_dir("blkps-serve-job-")
    rng = np.random.default_rng(38)
    ids = rng.integers(0, 2**64, 200, dtype=np.uint64)
    grads = rng.standard_normal((ids.size, 8)).astype(np.float32)
    bsopts = "table=hash:4000:8;rule=sgd;lr=1;init=zeros"
    with Serve(bsopts, "--part", "0/2", "--tgtd", "2", "--publish", jobdir) as s0, \
            Serve(bsopts, "--part", "1/2", "--tgtd", "2", "--publish", jobdir) as s1:
        layout = wait_for_layout(jobdir)
        with open(layout) as f:
            text = f.read()
        if "kind = hashed" not in text or text.count("shard = ") != 4:
            fail(f"the layout is not a hashed table over 4 shards: {text!r}")
        with blkps.Model("layout:" + layout) as m:
            m.push_rows(ids, grads)
            if not np.array_equal(m.pull_rows(ids, 8), -grads):
                fail("rows pulled through the layout are not minus their push")
        with open_control("layout:" + layout) as control:
            made = [shard["table"]["rows_made"] for shard in control.status()["shards"]]
        want = np.bincount(blkps.feature_ids.shards(ids, 4), minlength=4).tolist()
        if made != want:
            fail(f"the shards made {made} rows, not the {want} of their ids' hashes")
        for s in (s0, s1):
            rc, _, err = s.terminate()
            if rc != 0:
                fail(f"serve exited {rc}: {err}")


def wait_for_layout(jobdir):
    """`blkps layout wait JOBDIR`'s layout path; fails the test without one."""
    waited = subprocess.run([BLKPS, "layout", "wait", jobdir, "--timeout", "60"], capture_output=True, text=True)
    layout = waited.stdout.strip()
    if waited.returncode != 0 or layout != os.path.join(jobdir, "slot-1.layout"):
        fail(f"layout wait: exit {waited.returncode}, {waited.stdout!r} {waited.stderr!r}")
    return layout


def two_level_units(values, shard):
    """The stripe units of `values` (the whole model) that shard `shard` of
    the flat stripe of 2 parts x 2 tgtds holds, in order."""
    return np.concatenate([values[u:u + UNIT] for u in range(shard * UNIT, len(values), 4 * UNIT)])


def two_level_parts_serve_a_flat_stripe():
    """Two `serve --part K/2 --tgtd 2` serve one flat stripe of 4 shards:
    part K's tgtd t holds exactly the stripe units of shard K + 2t, and the
    layout lists the shards in that order, each labelled with its part and
    tgtd."""
    jobdir = temp_dir("blkps-serve-job-")
    params = 6 * UNIT  # shards 0 and 1 hold two units, shards 2 and 3 one
    grad = np.random.default_rng(39).standard_normal(params).astype(np.float32)
    bsopts = f"params={params};lr=1"
    with Serve(bsopts, "--part", "0/2", "--tgtd", "2", "--publish", jobdir) as s0, \
            Serve(bsopts, "--part", "1/2", "--tgtd", "2", "--publish", jobdir) as s1:
        layout = wait_for_layout(jobdir)
        with blkps.Model("layout:" + layout) as m:
            m.push(0, grad)
            if not np.array_equal(m.pull(0, params), -grad):
                fail("pull through the layout is not minus the push")
        parts = []
        for k in range(2):
            with open(os.path.join(jobdir, "servers", f"part-{k}-of-2.json")) as f:
                parts.append(json.load(f))
        with open(layout) as f:
            shard_lines = [line for line in f if line.startswith("shard = ")]
        for shard in range(4):
            part, t = shard % 2, shard // 2
            url = parts[part]["urls"][t][0]
            if shard_lines[shard].split()[2] != url or f"# part {part} tgtd {t} on " not in shard_lines[shard]:
                fail(f"layout shard {shard} is {shard_lines[shard]!r}, not part {part}'s tgtd {t} ({url})")
            with blkps.Model(url) as m:
                held = m.pull(0, m.param_capacity)
            if not np.array_equal(held, -two_level_units(grad, shard)):
                fail(f"part {part}'s tgtd {t} does not hold exactly the stripe units of shard {shard}")
        for s in (s0, s1):
            rc, _, err = s.terminate()
            if rc != 0:
                fail(f"serve exited {rc}: {err}")


def serve_two_level_job(jobdir, bsopts, grad):
    """Serves `bsopts` as 2 parts x 2 tgtds publishing to `jobdir`, pushes
    `grad` through the layout, then SIGTERMs both parts at once; fails the
    test unless both write their part of a final generation and exit 0."""
    with Serve(bsopts, "--part", "0/2", "--tgtd", "2", "--publish", jobdir) as s0, \
            Serve(bsopts, "--part", "1/2", "--tgtd", "2", "--publish", jobdir) as s1:
        with blkps.Model("layout:" + wait_for_layout(jobdir)) as m:
            m.push(0, grad)
        for s in (s0, s1):  # both at once, as scancel does
            s.proc.send_signal(signal.SIGTERM)
        for s in (s0, s1):
            _, err = s.proc.communicate(timeout=120)
            rc = s.proc.returncode
            if rc != 0 or "final checkpoint: generation" not in err or "written by 2 tgtd(s)" not in err:
                fail(f"serve after SIGTERM: exit {rc}, {err!r}")


def two_level_parts_restart_from_final_generation():
    """Parts of 2 tgtds each, SIGTERMed, commit one final generation of 4
    shards; the same parts started again serve exactly the pushed weights."""
    jobdir, folder = temp_dir("blkps-serve-job-"), temp_dir("blkps-serve-ckpt-")
    params = 6 * UNIT
    grad = np.random.default_rng(39).standard_normal(params).astype(np.float32)
    bsopts = f"params={params};lr=1;checkpoint={folder}/model.ckpt;job=two-level"
    serve_two_level_job(jobdir, bsopts, grad)
    with Serve(bsopts, "--part", "0/2", "--tgtd", "2", "--publish", jobdir) as s0, \
            Serve(bsopts, "--part", "1/2", "--tgtd", "2", "--publish", jobdir) as s1:
        with blkps.Model("layout:" + wait_for_layout(jobdir)) as m:
            if not np.array_equal(m.pull(0, params), -grad):
                fail("the restarted parts do not serve the weights of the final generation")
        for s in (s0, s1):
            s.terminate()


def restart_with_other_tgtd_count_refused():
    """A part restarted over a checkpoint set of 2 parts x 2 tgtds with
    --tgtd 1 is refused in one line naming both counts, before any tgtd
    starts."""
    jobdir, folder = temp_dir("blkps-serve-job-"), temp_dir("blkps-serve-ckpt-")
    bsopts = f"params={4 * UNIT};lr=1;checkpoint={folder}/model.ckpt;job=two-level"
    serve_two_level_job(jobdir, bsopts, np.ones(4 * UNIT, dtype=np.float32))
    again = temp_dir("blkps-serve-test-")
    out = subprocess.run([BLKPS, "target", "serve", "--dir", again, "--plugin", PLUGIN, "--address", "127.0.0.1",
                          "--part", "0/2", "--tgtd", "1", "--publish", jobdir, "--bsopts", bsopts],
                         capture_output=True, text=True)
    lines = out.stderr.splitlines()
    says = "blkps: --tgtd: the checkpoint " + folder + "/model.ckpt was written by 4 tgtd(s), not 2 parts of 1"
    if out.returncode != 1 or len(lines) != 1 or not lines[0].startswith(says) or "--tgtd 2" not in lines[0]:
        fail(f"--tgtd 1 over a set of 2 x 2: exit {out.returncode}, {out.stderr!r}")
    if os.path.exists(os.path.join(again, "tgtd.pid")) or os.path.exists(os.path.join(again, "shard-0")):
        fail("the refused part started a tgtd")


def parts_with_other_tgtd_counts_refused():
    """The part that completes a set whose parts serve through different
    numbers of tgtds exits 1 with one line naming each part's count; no
    layout is written."""
    jobdir = temp_dir("blkps-serve-job-")
    bsopts = f"params={4 * UNIT};lr=1"
    with Serve(bsopts, "--part", "0/2", "--tgtd", "2", "--publish", jobdir):
        with Serve(bsopts, "--part", "1/2", "--tgtd", "1", "--publish", jobdir, refused=True) as other:
            if other.line:
                fail(f"part 1 of --tgtd 1 beside part 0 of 2 serves: {other.line!r}")
            _, err = other.proc.communicate(timeout=120)
        out = subprocess.CompletedProcess(other.proc.args, other.proc.returncode, "", err)
        lines = out.stderr.splitlines()
        if (out.returncode != 1 or not lines
                or not lines[-1].startswith("blkps: --tgtd: the parts of one model serve through different numbers "
                                            "of tgtds (part 0 on ") or ": 2, part 1 on " not in lines[-1]
                or not lines[-1].endswith(": 1); each part serves its 1/S through as many; give every part the "
                                          "same --tgtd N")):
            fail(f"part 1 of --tgtd 1 beside part 0 of 2: exit {out.returncode}, {out.stderr!r}")
        if os.path.exists(os.path.join(jobdir, "slot-1.layout")):
            fail("a layout was written for parts of different tgtd counts")
        if os.path.exists(os.path.join(other.dir, "tgtd.pid")):
            fail("the refused part left its tgtd")


def layout_wait_names_missing_part():
    """`layout wait` gives up after --timeout with one line naming the part
    that never published."""
    jobdir = temp_dir("blkps-serve-job-")
    with Serve(f"params={2 * UNIT};lr=1", "--part", "0/2", "--publish", jobdir):
        waited = subprocess.run([BLKPS, "layout", "wait", jobdir, "--timeout", "1"], capture_output=True, text=True)
    lines = waited.stderr.splitlines()
    if waited.returncode != 1 or len(lines) != 1 or "part(s) 1 of 2 not published" not in lines[0]:
        fail(f"layout wait: exit {waited.returncode}, {waited.stderr!r}")


def tgtd_death_exits_nonzero():
    """A serve whose tgtd dies says so in one line naming it and exits 1."""
    with Serve(f"params={UNIT};lr=1") as s:
        tgtd = s.tgtd_pid()
        os.kill(tgtd, signal.SIGKILL)  # serve's child, started by this test
        out, err = s.proc.communicate(timeout=120)
        lines = err.splitlines()
        if s.proc.returncode != 1 or not lines or f"tgtd {tgtd} exited (killed by signal 9)" not in lines[-1]:
            fail(f"serve after its tgtd's death: exit {s.proc.returncode}, {err!r}")


def chap_file_in_job_folder():
    """A CHAP file in the job's shared folder: one readable by others is
    refused in one line before any tgtd starts; at mode 0600 the part
    serves, a learner through the published layout without the credentials
    is refused, and with them (BLKPS_CHAP_FILE) pushes and pulls."""
    jobdir = temp_dir("blkps-serve-job-")
    chap_file = os.path.join(jobdir, "learner.chap")
    with open(chap_file, "w") as f:
        f.write("user=learner\nsecret=job-secret-01\n")
    os.chmod(chap_file, 0o644)
    bsopts = f"params={UNIT};lr=1"
    with Serve(bsopts, "--publish", jobdir, "--chap-file", chap_file, refused=True) as s:
        if s.line:
            fail(f"a CHAP file of mode 0644 was taken: serve printed {s.line!r}")
        _, err = s.proc.communicate(timeout=120)
        lines = err.splitlines()
        if s.proc.returncode != 1 or len(lines) != 1 or f"chmod 600 {chap_file}" not in lines[0]:
            fail(f"a CHAP file of mode 0644: exit {s.proc.returncode}, {err!r}")
        if os.path.exists(os.path.join(s.dir, "tgtd.pid")):
            fail("the refused serve started a tgtd")
    os.chmod(chap_file, 0o600)
    grad = np.arange(UNIT, dtype=np.float32)
    with Serve(bsopts, "--publish", jobdir, "--chap-file", chap_file):
        layout = wait_for_layout(jobdir)
        os.environ.pop("BLKPS_CHAP_FILE", None)
        try:
            with blkps.Model("layout:" + layout) as m:
                m.push(0, grad)
            fail("a learner without the job's CHAP file reached the model")
        except OSError:
            pass
        os.environ["BLKPS_CHAP_FILE"] = chap_file
        try:
            with blkps.Model("layout:" + layout) as m:
                m.push(0, grad)
                if not np.array_equal(m.pull(0, UNIT), -grad):
                    fail("pull with the job's credentials is not minus the push")
        finally:
            del os.environ["BLKPS_CHAP_FILE"]


def bad_part_refused():
    """A --part that names no part, and --part slurm outside srun, are
    refused in one line each, before any tgtd starts."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    for part, says in (("2/2", "blkps: --part: expected K/S with 0 <= K < S"),
                       ("slurm", "blkps: --part: slurm: SLURM_PROCID and SLURM_NTASKS are not set")):
        folder = temp_dir("blkps-serve-test-")
        out = subprocess.run([BLKPS, "target", "serve", "--dir", folder, "--address", "127.0.0.1", "--part", part,
                              "--bsopts", f"params={UNIT}"], capture_output=True, text=True, env=env)
        lines = out.stderr.splitlines()
        if out.returncode != 1 or len(lines) != 1 or not lines[0].startswith(says) or out.stdout:
            fail(f"--part {part}: exit {out.returncode}, {out.stderr!r}, stdout {out.stdout!r}")
        if os.path.exists(os.path.join(folder, "tgtd.pid")):
            fail(f"--part {part} started a tgtd")


CASES = {"bad-part-refused": bad_part_refused, "sigterm-keeps-pushes": sigterm_keeps_pushes, "two-parts-assemble-layout": two_parts_assemble_layout,
         "layout-wait-names-missing-part": layout_wait_names_missing_part,
         "tgtd-death-exits-nonzero": tgtd_death_exits_nonzero,
         "two-level-parts-serve-a-flat-stripe": two_level_parts_serve_a_flat_stripe,
         "two-level-parts-restart-from-final-generation": two_level_parts_restart_from_final_generation,
         "restart-with-other-tgtd-count-refused": restart_with_other_tgtd_count_refused,
         "parts-with-other-tgtd-counts-refused": parts_with_other_tgtd_counts_refused,
         "chap-file-in-job-folder": chap_file_in_job_folder, "hashed-table-over-parts": hashed_table_over_parts}
CASES[case]()
print(f"serve_test {case}: ok")
