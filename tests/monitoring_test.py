#!/usr/bin/python3
"""Watching a job (doc/monitoring.md): the server's Prometheus exporter
(`blkps target start --metrics`, `blkps metrics`) checked with the real
Prometheus and promtool (Debian's prometheus; scripts/setup.sh installs it).

Usage: monitoring_test.py <repo> <build dir> <case>
Cases without a server (label unit): exposition-passes-promtool,
  rules-pass-promtool, top-frame-rates, engine-serves-its-steps (a
  blkps.Engine on a plain file: its summed steps on BLKPS_METRICS_PORT).
Cases that start their own tgtd (label integration):
  prometheus-scrapes-training    server + 2 digits learners, Prometheus
                                 scraping every second: counters only grow,
                                 rate() of updates > 0 while training, the
                                 last values agree with `blkps status --json`,
                                 promtool passes every exposition fetched,
                                 every query of the dashboard returns a series
  metrics-need-basic-auth        --metrics-auth: 401 without, 200 with
  metrics-through-operator       an --operator target's status, read
  metrics-by-hand-for-shards     blkps metrics on a shards folder: every
                                 shard, until the shards stop
  exporter-ends-with-target      target stop ends the exporter
  exporter-follows-a-restart     target restart of a killed tgtd: the
                                 exporter serves the new one, same address
  metrics-port-taken             one line, no tgtd left behind
  top-shows-every-shard          blkps top through a pipe: plain frames
  top-redraws-on-a-terminal      blkps top on a pty: curses
  learner-serves-torch-counters  BLKPS_METRICS_PORT: blkps.torch's counters
                                 on base + local rank, a file-discovery entry
  learner-counts-reconnects      blkps.torch across a kill -9 and restart of
                                 tgtd: reconnects, their seconds, bytes lost
"""
import base64
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

top, build, case = sys.argv[1], sys.argv[2], sys.argv[3]
BLKPS = os.path.join(top, "scripts", "blkps")
PLUGIN = os.path.join(build, "target-plugin", "bs_blkps.so")
PYTHON = "/usr/bin/python3"
TRAIN = os.path.join(top, "learner", "examples", "train_digits.py")
os.environ["BLKPS_LIB"] = os.path.join(build, "learner", "libblkps.so")
sys.path.insert(0, os.path.join(top, "learner", "python"))
sys.path.insert(0, os.path.join(top, "scripts"))
RULES = os.path.join(top, "packaging", "monitoring", "blkps.rules.yml")
DASHBOARD = os.path.join(top, "packaging", "monitoring", "blkps-grafana.json")
DEADLINE_S = 120  # for anything awaited; a loaded 2-core machine is slow, never this slow


def fail(message):
    sys.exit(f"monitoring_test {case}: FAIL: {message}")


def need(program):
    if not shutil.which(program):
        fail(f"{program} not found: run scripts/setup.sh as root (it installs Debian's prometheus)")


def blkps(*args):
    out = subprocess.run([BLKPS, *args], capture_output=True, text=True)
    return out.returncode, out.stdout, out.stderr


def free_port():
    """A port free now, below the kernel's ephemeral range: one the kernel
    hands out for bind(0) or to an outgoing connection (this test's or one
    running beside it) may be taken again before a restart binds it
    (exporter-follows-a-restart once failed: address already in use)."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    for port in random.sample(range(max(1024, low - 12000), low), 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    fail("no free port below the ephemeral range")


def get(url, auth=None):
    """(HTTP status, body) of GET url."""
    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def until(what, condition):
    """Polls condition() (every 0.2 s) until it returns a true value, which
    it returns; fails naming `what` after DEADLINE_S."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    fail(f"no {what} within {DEADLINE_S} s")


def promtool_check_metrics(text):
    need("promtool")
    out = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    if out.returncode != 0:
        fail(f"promtool check metrics refused an exposition: {out.stdout}{out.stderr}\n{text[:2000]}")


class Target:
    """`blkps target start` for one case, stopped (and its folder removed)
    on leaving the with-block, also on failure."""

    def __init__(self, bsopts, *extra):
        self.dir = tempfile.mkdtemp(prefix="blkps-monitoring-test-")
        self.rc, self.out, self.err = blkps("target", "start", "--dir", self.dir, "--plugin", PLUGIN,
                                            "--owner-pid", str(os.getpid()), "--bsopts", bsopts, *extra)

    def __enter__(self):
        if self.rc != 0:
            self.__exit__()
            fail(f"target start failed: {self.err}")
        return self

    def __exit__(self, *exc):
        blkps("target", "stop", "--dir", self.dir)
        subprocess.run(["rm", "-rf", self.dir])

    def env(self):
        return json.loads(blkps("target", "show", "--dir", self.dir, "--json")[1])

    def status(self):
        rc, out, err = blkps("status", "--dir", self.dir, "--json")
        if rc != 0:
            fail(f"blkps status: {err}")
        return json.loads(out)


class Prometheus:
    """Debian's prometheus on a free loopback port with its own config and
    data folder, scraping `target` (HOST:PORT) every second; stopped (by its
    pid) on leaving the with-block."""

    def __init__(self, target, folder, rules=()):
        need("prometheus")
        self.folder = folder
        self.url = f"http://127.0.0.1:{free_port()}"
        config = os.path.join(folder, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                    f"rule_files: {json.dumps(list(rules))}\n"
                    f"scrape_configs:\n  - job_name: blkps\n    static_configs:\n"
                    f"      - targets: [\"{target}\"]\n")
        self.log = open(os.path.join(folder, "prometheus.log"), "w")
        self.proc = subprocess.Popen(["prometheus", f"--config.file={config}",
                                      f"--storage.tsdb.path={os.path.join(folder, 'data')}",
                                      f"--web.listen-address={self.url[len('http://'):]}"],
                                     stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def __enter__(self):
        def ready():
            if self.proc.poll() is not None:
                fail(f"prometheus exited with {self.proc.returncode}; its log: {self.log.name}")
            return self._ready()
        try:
            until("ready Prometheus", ready)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _ready(self):
        try:
            return get(self.url + "/-/ready")[0] == 200
        except OSError:
            return False

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()

    def query(self, expr):
        """The result of an instant query: a list of {metric, value}."""
        status, body = get(self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        answer = json.loads(body)
        if status != 200 or answer["status"] != "success":
            fail(f"query {expr}: {status} {body}")
        return answer["data"]["result"]

    def scalar(self, expr):
        """The one value of `expr` as a float, or None when it has no series."""
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None


def learner(url, k):
    return subprocess.Popen([PYTHON, TRAIN, "--target", url, "--learner", str(k), "--learners", "2",
                             "--epochs", "100000"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def stop_learners(procs):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


# --- no server ---------------------------------------------------------------

def canned_status(**changes):
    """A status with every key, as the server writes it; `changes` replace
    its learners' values."""
    learner = {"lun": 1, "dtype": "float32", "state": "live", "iteration": 7, "idle_s": 0.5, "held": 0,
               "reads": 10, "writes": 9, "bytes_read": 4096, "bytes_written": 4096, "holds": 1, "hold_timeouts": 0,
               "deaths": 0, "staleness_last": 0, "staleness_max": 1, "staleness_mean": 0.5, "push_staleness_max": 2,
               "push_staleness_mean": 1.0, "stale_pushes": 0, "pipeline_depth": 1}
    return {"model": 'odd "name\\', "params": 1000, "device_bytes": 4096, "block_bytes": 4096, "blocks": 1,
            "table": None, "mode": "async", "rule": "sgd", "tag": "", "rule_params": {"lr": 0.01},
            "global_step": 3, "updates": 9, "rejected_writes": 0, "held_now": 0, "uptime_s": 12.5,
            "dead_after_s": 10, "hold_limit_s": 20, "max_dead": 0, "staleness_aware": True, "stale_bound": 8,
            "live_learners": 1, "pushing_learners": 1, "failed": False, "failure": "", "control_error": "control: no",
            "control_refused": 2, "stop": False, "replica": "primary", "replica_records": 5,
            "backup": "outdated: 127.0.0.1:3270: connection lost", "lease": "held: 1.2 s left",
            "checkpoint": {"path": "", "job": "", "shard": 0, "shards": 1, "generation": 4, "written": 0,
                           "last_seconds": 0.0, "last_stall_seconds": 0.0, "every_s": 0, "error": ""},
            "learners": [dict(learner, **changes), dict(learner, lun=2, state="dead", **changes)],
            "ranks": [{"rank": 0, "run": "9f", "state": "live", "idle_s": 0.4},
                      {"rank": 1, "run": "9f", "state": "dead", "idle_s": 31.0}]}


def test_exposition_passes_promtool():
    # A status with every key, as the server writes it, is an exposition
    # promtool accepts; label values with quotes and backslashes survive.
    from blkps_cli import metrics
    from blkps.exposition import Exposition
    status = canned_status()
    out = Exposition()
    metrics.write_status(out, "0", status)
    metrics.write_status(out, "1", status)
    text = out.text()
    promtool_check_metrics(text)
    for line in ('blkps_updates_total{shard="1"} 9', 'blkps_learner_state{shard="0",lun="2",state="dead"} 1',
                 'blkps_rule_parameter{shard="0",parameter="lr"} 0.01', 'blkps_control_last_refused{shard="0"} 1',
                 'blkps_control_refused_total{shard="0"} 2', 'blkps_pushing_learners{shard="0"} 1',
                 'blkps_checkpoint_generation{shard="1"} 4', 'blkps_rank_state{shard="0",rank="1",state="dead"} 1',
                 'blkps_rank_idle_seconds{shard="0",rank="1"} 31.0',
                 'blkps_learner_pipeline_depth{shard="0",lun="1"} 1',
                 'blkps_replica_role{shard="0",role="primary"} 1', 'blkps_backup_state{shard="0",state="lost"} 0',
                 'blkps_backup_state{shard="0",state="outdated"} 1', 'blkps_lease_lapsed{shard="0"} 0',
                 'model="odd \\"name\\\\"'):
        if line not in text:
            fail(f"expected {line!r} in:\n{text}")
    if text.count("# TYPE blkps_updates_total counter") != 1:
        fail(f"a family's TYPE line once, whatever the shards:\n{text}")


def test_rules_pass_promtool():
    # packaging/monitoring: promtool accepts the recording rules; the
    # dashboard is JSON with a query in every target of every panel.
    need("promtool")
    out = subprocess.run(["promtool", "check", "rules", RULES], capture_output=True, text=True)
    if out.returncode != 0:
        fail(f"promtool check rules {RULES}: {out.stdout}{out.stderr}")
    queries = dashboard_queries()
    if not queries or not all(q.strip() for q in queries):
        fail(f"{DASHBOARD}: a panel's target without a query")


def test_top_frame_rates():
    # A frame has a line per shard and one per learner slot and shard, with
    # rates per second since the previous snapshot; the first shows none.
    from blkps_cli import top
    before = [("shard 0", canned_status()), ("shard 1", canned_status())]
    after = [("shard 0", canned_status(writes=29, reads=20, bytes_written=4096 + 2_000_000, iteration=11)),
             ("shard 1", canned_status())]
    first = top.frame(None, before, 0)
    lines = top.frame(before, after, 2.0)
    if [l.split(":")[0] for l in lines if l.startswith("shard ")] != ["shard 0", "shard 1"]:
        fail("expected a line for each shard:\n" + "\n".join(lines))
    rows = [l.split() for l in lines[lines.index(next(l for l in lines if "ITER/S" in l)) + 1:]]
    if len(rows) != 4:
        fail("expected a row for each of 2 learner slots on each of 2 shards:\n" + "\n".join(lines))
    header = list(top.LEARNER_HEADER)
    row = dict(zip(header, rows[0]))
    if (row["ITER/S"], row["PUSH/S"], row["PULL/S"], row["PUSH_MB/S"]) != ("2.0", "10.0", "5.0", "1.0"):
        fail(f"shard 0 LUN 1 over 2 s: expected 2.0 iterations, 10.0 pushes, 5.0 pulls, 1.0 MB per second: {row}")
    if dict(zip(header, rows[2]))["PUSH/S"] != "0.0" or "10.0" in "\n".join(first):
        fail("an idle shard shows rate 0.0, the first frame no rates:\n" + "\n".join(lines + first))


# --- a server ------------------------------------------------------------------

def test_prometheus_scrapes_training():
    params = subprocess.run([PYTHON, TRAIN, "--params"], capture_output=True, text=True, check=True).stdout.strip()
    port = free_port()
    with Target(f"params={params};lr=0.2;init=normal:0.1;seed=1;mode=async;dead_after=60", "--luns", "2",
                "--metrics", f"127.0.0.1:{port}") as t, \
            Prometheus(f"127.0.0.1:{port}", t.dir, [RULES]) as prom:
        exporter = f"http://127.0.0.1:{port}/metrics"
        procs = [learner(url, k) for k, url in enumerate(t.env()["URLS"].split())]
        try:
            def scraped_enough():
                promtool_check_metrics(get(exporter)[1])  # every exposition this test sees
                if any(p.poll() is not None for p in procs):
                    fail(f"a learner ended: {[p.stderr.read() for p in procs if p.poll() is not None]}")
                n = prom.scalar('count_over_time(blkps_updates_total{job="blkps"}[10m])')
                rate = prom.scalar("rate(blkps_updates_total[5s])")
                return n is not None and n >= 10 and rate and rate > 0
            until("10 scrapes with a positive rate() of updates", scraped_enough)
        finally:
            stop_learners(procs)
        status = t.status()
        after = time.time()
        # The last scrape taken after the status read sees the same (quiet) job.
        until("a scrape after training", lambda: (prom.scalar("timestamp(blkps_updates_total)") or 0) > after)
        want = {"blkps_updates_total": status["updates"]}
        for s in status["learners"]:
            lun = s["lun"]
            want[f'blkps_learner_iteration{{lun="{lun}"}}'] = s["iteration"]
            want[f'blkps_learner_pushed_bytes_total{{lun="{lun}"}}'] = s["bytes_written"]
            want[f'blkps_learner_pulled_bytes_total{{lun="{lun}"}}'] = s["bytes_read"]
        for expr, value in want.items():
            got = prom.scalar(expr)
            if got != value:
                fail(f"Prometheus has {expr} = {got}, blkps status --json {value}")
        if status["updates"] == 0 or any(s["iteration"] == 0 for s in status["learners"]):
            fail(f"the learners did not train: {status}")
        # Counters only increase: no series of a _total metric went down.
        for series in prom.query('{__name__=~"blkps_.*_total"}[10m]'):
            values = [float(v) for _, v in series["values"]]
            if any(b < a for a, b in zip(values, values[1:])):
                fail(f"counter {series['metric']} went down: {values}")
        # The dashboard's every query (through the recording rules) has data.
        for expr in dashboard_queries():
            if not prom.query(expr):
                fail(f"the dashboard's query {expr} returns no series")


def dashboard_queries():
    with open(DASHBOARD) as f:
        return [t["expr"] for panel in json.load(f)["panels"] for t in panel["targets"]]


def test_learner_serves_torch_counters():
    # BLKPS_METRICS_PORT=BASE: the learner of local rank 1 serves its
    # blkps.torch counters on BASE + 1 (the model is one bucket: each push
    # is the model's bytes) and its EarlyStopping's decision,
    # writes its file-discovery entry, and the page passes promtool.
    import torch
    import blkps.torch as bps
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    count = bps.param_count(model)
    with Target(f"params={count};rule=sgd;lr=0.1") as t, \
            tempfile.TemporaryDirectory() as sd:
        base = free_port() - 1  # base + 1 is the free one
        os.environ.update(BLKPS_METRICS_PORT=str(base), BLKPS_METRICS_SD_DIR=sd)
        env = t.env()
        bps.init(target=env["URL"], control=env["CONTROL_URL"],
                 env={"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
        opt = bps.DistributedOptimizer(None, named_parameters=model.named_parameters())
        try:
            for _ in range(3):
                opt.zero_grad()
                model(torch.ones(4, 8)).sum().backward()
                opt.step()
            opt.synchronize()
            early = bps.EarlyStopping(patience=1)
            early.step(1.0)
            early.step(2.0)  # no better: stops at patience 1
            status, text = get(f"http://127.0.0.1:{base + 1}/metrics")
            if status != 200:
                fail(f"the learner's exporter answered {status}: {text}")
            promtool_check_metrics(text)
            if opt.pushes < 3:
                fail(f"3 steps made {opt.pushes} pushes")
            for line in ('blkps_torch_steps_total{rank="0",local_rank="1"} 3',
                         'blkps_torch_seconds_total{part="push",rank="0",local_rank="1"}',
                         f'blkps_torch_bytes_total{{direction="pushed",rank="0",local_rank="1"}} '
                         f'{opt.pushes * 4 * count}',
                         'blkps_torch_early_stopping_stopped{rank="0",local_rank="1"} 1',
                         'blkps_torch_early_stopping_best{rank="0",local_rank="1"} 1.0'):
                if line not in text:
                    fail(f"expected {line!r} in:\n{text}")
            with open(os.path.join(sd, "rank-0.json")) as f:
                entry = json.load(f)
            if entry != [{"targets": [f"127.0.0.1:{base + 1}"], "labels": {"rank": "0", "job_role": "learner"}}]:
                fail(f"file-discovery entry: {entry}")
        finally:
            opt.close()
            bps.shutdown()


def test_learner_counts_reconnects():
    # A learner on blkps.torch while its server's tgtd is killed (kill -9)
    # and started again, with no checkpoint: the learner reconnects, and
    # every byte it pushed before the kill is counted lost (the server
    # restarted from its initial weights).
    import torch
    import blkps.torch as bps
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    count = bps.param_count(model)
    bsopts = f"params={count};rule=sgd;lr=0.1;mode=async"
    port = str(free_port())
    with Target(bsopts, "--port", port) as t:
        base = free_port()
        os.environ["BLKPS_METRICS_PORT"] = str(base)
        env = t.env()
        bps.init(target=env["URL"], control=env["CONTROL_URL"],
                 env={"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"})
        opt = bps.DistributedOptimizer(None, named_parameters=model.named_parameters())

        def step():
            opt.zero_grad()
            model(torch.ones(4, 8)).sum().backward()
            opt.step()  # returns once its pushes are acknowledged

        try:
            for _ in range(3):
                step()
            pushed = opt.bytes["pushed"]
            tgtd = int(env["PID"])
            os.kill(tgtd, signal.SIGKILL)
            until("end of the killed tgtd", lambda: not os.path.exists(f"/proc/{tgtd}"))
            rc, _, err = blkps("target", "start", "--dir", t.dir, "--plugin", PLUGIN, "--owner-pid",
                               str(os.getpid()), "--port", port, "--bsopts", bsopts)
            if rc != 0:
                fail(f"the target did not start again: {err}")
            step()
            status, text = get(f"http://127.0.0.1:{base}/metrics")
            if status != 200:
                fail(f"the learner's exporter answered {status}: {text}")
            promtool_check_metrics(text)
            samples = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith("blkps_torch_") and "{" in line}
            if samples.get("blkps_torch_reconnects_total", 0) < 1:
                fail(f"no reconnect counted across the restart:\n{text}")
            if not samples.get("blkps_torch_reconnect_seconds_total", 0) > 0:
                fail(f"no time spent reconnecting counted:\n{text}")
            if samples.get("blkps_torch_pushed_bytes_lost_total") != pushed:
                fail(f"the {pushed} bytes pushed before the restart are not all counted lost:\n{text}")
        finally:
            opt.close()
            bps.shutdown()


def test_top_shows_every_shard():
    # blkps top on a target of 2 tgtds, its output a pipe: plain frames, a
    # blank line between them, each with both shards and their 2 slots.
    with Target("params=524288", "--tgtd", "2", "--luns", "2") as t:
        out = subprocess.run([BLKPS, "top", "--dir", t.dir, "--count", "2", "--interval", "0.1"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            fail(f"blkps top: {out.returncode} {out.stderr}")
        frames = out.stdout.strip().split("\n\n")
        for text in frames:
            lines = text.splitlines()
            shards = [l.split(":")[0] for l in lines if l.startswith("shard ")]
            rows = [l.split()[:2] for l in lines if l.split()[:1] in (["0"], ["1"])]
            if shards != ["shard 0", "shard 1"] or rows != [["0", "1"], ["0", "2"], ["1", "1"], ["1", "2"]]:
                fail(f"expected both shards and LUNs 1, 2 of each:\n{text}")
        if len(frames) != 2:
            fail(f"--count 2: expected 2 frames:\n{out.stdout}")


def test_metrics_through_operator():
    # On an --operator target the exporter reads the status through the
    # operator's credential (DIR/operator.chap), as blkps status --dir does.
    port = free_port()
    with Target("params=1000", "--operator", "--metrics", str(port)):
        status, body = get(f"http://127.0.0.1:{port}/metrics")
        if status != 200 or 'blkps_updates_total{shard="0"} 0' not in body:
            fail(f"the exporter of an --operator target answered {status}: {body[:500]}")


def test_metrics_by_hand_for_shards():
    # `blkps metrics --dir` of a `blkps shards` folder, run by hand (as to
    # restart an exporter), serves every shard until the shards stop.
    with tempfile.TemporaryDirectory() as d:
        rc, _, err = blkps("shards", "start", "--dir", d, "--shards", "2", "--stripe-unit", "4096", "--plugin",
                           PLUGIN, "--owner-pid", str(os.getpid()), "--bsopts", "params=4096;block=4096")
        exporter = None
        try:
            if rc != 0:
                fail(f"shards start: {err}")
            port = free_port()
            exporter = subprocess.Popen([BLKPS, "metrics", "--dir", d, "--listen", str(port)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

            def page():
                if exporter.poll() is not None:
                    fail(f"blkps metrics exited with {exporter.returncode}: {exporter.stderr.read()}")
                try:
                    return get(f"http://127.0.0.1:{port}/metrics")
                except OSError:
                    return None
            status, body = until("an answer from blkps metrics", page)
            for shard in ("0", "1"):
                if f'blkps_params{{shard="{shard}"}} 2048' not in body:
                    fail(f"expected shard {shard} serving 2048 parameters:\n{body[:2000]}")
            blkps("shards", "stop", "--dir", d)
            until("end of blkps metrics after shards stop", lambda: exporter.poll() is not None)
        finally:
            if exporter is not None and exporter.poll() is None:
                exporter.kill()
                exporter.wait()
            blkps("shards", "stop", "--dir", d)


def test_top_redraws_on_a_terminal():
    # On a terminal (a pty from script(1)) blkps top draws with curses in
    # the alternate screen, which it leaves on its end, and shows the shard.
    with Target("params=1000", "--luns", "2") as t:
        command = f"{BLKPS} top --dir {t.dir} --count 2 --interval 0.1"
        out = subprocess.run(["script", "-qec", command, "/dev/null"], capture_output=True, text=True,
                             env=dict(os.environ, TERM="xterm"))
        if out.returncode != 0:
            fail(f"blkps top on a terminal: {out.returncode} {out.stdout[-2000:]} {out.stderr}")
        if "\x1b[?1049h" not in out.stdout or "\x1b[?1049l" not in out.stdout or "shard 0: updates" not in out.stdout:
            fail(f"expected a curses screen with the shard's line: {out.stdout[-2000:]!r}")


def test_metrics_need_basic_auth():
    folder = tempfile.mkdtemp(prefix="blkps-monitoring-auth-")
    try:
        auth = os.path.join(folder, "metrics.auth")
        fd = os.open(auth, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, b"user=prometheus\nsecret=abcdefgh12345678\n")
        os.close(fd)
        port = free_port()
        with Target("params=1000", "--metrics", str(port), "--metrics-auth", auth):
            url = f"http://127.0.0.1:{port}/metrics"
            if get(url)[0] != 401 or get(url, ("prometheus", "wrong-secret-00"))[0] != 401:
                fail("the exporter answered without the credentials")
            status, body = get(url, ("prometheus", "abcdefgh12345678"))
            if status != 200 or "blkps_updates_total" not in body:
                fail(f"with the credentials: {status} {body[:500]}")
        os.chmod(auth, 0o644)
        with tempfile.TemporaryDirectory() as d:
            rc, _, err = blkps("target", "start", "--dir", d, "--plugin", PLUGIN, "--bsopts", "params=1000",
                               "--metrics", str(free_port()), "--metrics-auth", auth)
            started = os.path.exists(os.path.join(d, "tgtd.log"))  # stop leaves the log
            blkps("target", "stop", "--dir", d)
            if rc == 0 or len(err.splitlines()) != 1 or "chmod 600" not in err:
                fail(f"a credentials file others can read: expected one line saying chmod 600, got {rc} {err!r}")
            if started:
                fail("a bad --metrics-auth should be refused before tgtd starts")
    finally:
        subprocess.run(["rm", "-rf", folder])


def test_exporter_ends_with_target():
    with Target("params=1000", "--metrics", str(free_port())) as t:
        pid = int(t.env()["METRICS_PID"])
        if not os.path.exists(f"/proc/{pid}"):
            fail("no exporter runs after target start --metrics")
        blkps("target", "stop", "--dir", t.dir)

        def gone():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
            except OSError:
                return True
        until("end of the exporter after target stop", gone)


def test_exporter_follows_a_restart():
    # The one tgtd of a target with --metrics dies (kill -9); `blkps target
    # restart` starts it again on its port, and the exporter on the same
    # address serves the new tgtd (its pid's CPU and memory); stop ends it.
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    with Target("params=1000", "--metrics", f"127.0.0.1:{port}") as t:
        tgtd = int(t.env()["PID"])
        os.kill(tgtd, signal.SIGKILL)
        until("end of the killed tgtd", lambda: not os.path.exists(f"/proc/{tgtd}"))
        rc, _, err = blkps("target", "restart", "--dir", t.dir)
        if rc != 0:
            fail(f"target restart failed: {err}")
        restarted = int(t.env()["PID"])

        def serves_the_restarted_tgtd():
            try:
                status, text = get(url)
            except OSError:
                return False
            return status == 200 and 'blkps_tgtd_cpu_seconds_total{shard="0"}' in text and "blkps_updates_total" in text
        until("the exporter serving the restarted tgtd", serves_the_restarted_tgtd)
        if restarted == tgtd or t.env().get("METRICS") != f"127.0.0.1:{port}":
            fail(f"after the restart: tgtd {restarted} (was {tgtd}), METRICS {t.env().get('METRICS')!r}")
        exporter = int(t.env()["METRICS_PID"])
    until("end of the exporter after target stop", lambda: not os.path.exists(f"/proc/{exporter}") or
          open(f"/proc/{exporter}/stat").read().rsplit(")", 1)[1].split()[0] in ("Z", "X"))


def test_metrics_port_taken():
    with socket.socket() as holder, tempfile.TemporaryDirectory() as d:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        rc, _, err = blkps("target", "start", "--dir", d, "--plugin", PLUGIN, "--bsopts", "params=1000",
                           "--metrics", f"127.0.0.1:{port}")
        try:
            if rc == 0 or len(err.splitlines()) != 1 or f"cannot listen on 127.0.0.1:{port}" not in err:
                fail(f"expected one line saying the port is taken, got {rc} {err!r}")
            if os.path.exists(os.path.join(d, "target.env")) or blkps("status", "--dir", d)[0] == 0:
                fail("a tgtd was left running")
        finally:
            blkps("target", "stop", "--dir", d)


def test_engine_serves_its_steps():
    # A blkps.Engine on a plain file (no server): the driving thread notes
    # each step; the page served on BLKPS_METRICS_PORT + local rank counts
    # exactly the steps noted, has every part's seconds and passes promtool.
    import numpy as np
    import blkps
    import blkps.metrics as metrics
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.f32")
        np.zeros(4096, dtype=np.float32).tofile(path)
        port = free_port()
        counters = metrics.EngineCounters()
        server = metrics.serve_engine(counters, rank=0, local_rank=0, env={"BLKPS_METRICS_PORT": str(port)})
        try:
            with blkps.Engine(path) as engine:
                for _ in range(3):
                    engine.gradient[:] = 1.0
                    engine.step()
                    counters.note(engine)
                engine.finish()
            status, text = get(f"http://127.0.0.1:{port}/metrics")
        finally:
            server.shutdown()
            server.server_close()
    if status != 200:
        fail(f"the engine's exporter answered {status}: {text}")
    promtool_check_metrics(text)
    for line in ['blkps_engine_steps_total{rank="0",local_rank="0"} 3',
                 'blkps_engine_staleness_iterations{rank="0",local_rank="0"} -1',
                 *[f'blkps_engine_seconds_total{{part="{part}",rank="0",local_rank="0"}}'
                   for part in ("compute", "stall", "push", "pull", "bubble")]]:
        if line not in text:
            fail(f"expected {line!r} in:\n{text}")
    compute = 'blkps_engine_seconds_total{part="compute",rank="0",local_rank="0"} '
    if not float(text.split(compute, 1)[1].split()[0]) > 0:
        fail(f"three steps' compute (filling the gradient) summed to no time:\n{text}")


test = globals().get("test_" + case.replace("-", "_"))
if not test:
    fail("unknown case")
test()
print(f"monitoring_test {case}: ok")
