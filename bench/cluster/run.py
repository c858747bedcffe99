#!/usr/bin/python3
"""The cluster benchmark: blkps against MPI_Allreduce and PyTorch DDP on a
cluster of H hosts made on this machine (network namespaces on a bridge,
each host's link shaped to --link; bench/cluster/net.py).

  run.py --out DIR [--quick] [--hosts 2,4] [--params 25000000,100000000]
         [--link 1gbit] [--delay 0.1ms] [--servers K] [--iterations I]
         [--systems NAME,...] [--drop-ratio 0.99]

For every host count H and model size P, each system in turn on a fresh
cluster, one process per host (cases, below):
  blkps       co-located: every host runs one shard's tgtd and one learner;
              the model is striped over the H shards (layout: files, 1 MiB
              stripes); an exchange is one push of a gradient for the whole
              model and one pull of the whole model (bench/peers/
              blkps_exchange.py), mode async (and bsp in the full run);
              also with bfloat16 LUNs (dtype=bfloat16: 2 bytes a value
              each way) and with gradient dropping (--drop-ratio, the
              engine pushes the largest runs, the whole model is pulled).
              blkps-async-engine: blkps.Engine's double buffering, the
              push and the pull of the next weights at once.
              dedicated (full run): K server hosts hold the shards, H other
              hosts run the learners.
  mpi         OpenMPI MPI_Allreduce over TCP between the namespaces, ring
              algorithm; float32 and bfloat16 (a 2-byte type with a user sum:
              OpenMPI 4.1 has no 16-bit float type). mpirun runs in host 0
              and starts its daemons in the other hosts' namespaces through
              bench/cluster/netns_rsh.sh (its remote-shell agent).
  ddp         PyTorch DistributedDataParallel, gloo; float32 and DDP's
              fp16_compress_hook (bench/peers/gloo_allreduce.py --ddp).
Per case: the median time per exchange over hosts and timed exchanges, and
the bytes each host's link carried per exchange (the kernel's counters of
its eth0 over the whole run, warm-up included, divided by the exchanges;
for blkps from the learners' common start, after their logins and the
engine's first pull).
--table hash:CAPACITY:WIDTH runs the hashed-table case (hashed_table.py).
--table ROWS:WIDTH runs, instead, the table case (doc/embeddings.md "Tables
over shards"): a table (rule sgd, lr 1, init zeros) with --bsopts
memory=--table-memory on every server, which one server alone must refuse,
striped over --servers server hosts (a stripe unit of whole rows: the
least multiple of 512 and the row's bytes); the first of --hosts learner
hosts' learners (bench/peers/blkps_rows.py) pull and push batches of
Zipf(1.05) ids through layout: at once, and the rows are then checked
against the sum of every learner's gradients. Writes DIR/table.json and
DIR/table.md.

Writes DIR/cluster.json (a list of records), DIR/cluster.md, DIR/cluster.png
and DIR/raw/. A case that fails (a process exits non-zero, or the case runs
past --case-timeout) is a result: a record with "failed": the reason, listed
under "Failed cases" in cluster.md; the other cases still run and the exit
status is 0 (non-zero only when the bench itself cannot run). Needs root and a build (bs_blkps, libblkps, blkps-layout,
blkps-bsopts).
"""
import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(TOP, "scripts"))
sys.path.insert(0, HERE)
from blkps_cli import shards, state, tools  # noqa: E402
from net import Cluster, link_bits_per_s  # noqa: E402

import hashed_table  # noqa: E402
import report  # noqa: E402
import results  # noqa: E402

PYTHON = "/usr/bin/python3"
BLKPS = os.path.join(TOP, "scripts", "blkps")
PEERS = os.path.join(TOP, "bench", "peers")
STRIPE_UNIT = "1M"
ISCSI_PORT = "3260"
DDP_PORT = 29500
TRAIN_LR = 50  # bench/training.sh's step for the synthetic model
# The training comparison: blkps's modes against the peers' all-reduce;
# "-engine": the learner uses blkps.Engine (pull and push overlap compute).
# "-exchange": one Model.exchange per exchange (each request's pull follows
# its push on the same connection: doc/data-path.md "Phases at link rate").
# "-bf16": the shards' LUNs are bfloat16 (dtype=bfloat16); "-drop": the
# engine with gradient dropping (--drop-ratio). Exchange cases only:
# "-torch": a step of blkps.torch's DistributedOptimizer, its own buckets
# ("-torch-pipelined": with its one-step pipeline).
TRAIN_SYSTEMS = ["blkps-async", "blkps-async-engine", "blkps-async-bf16", "blkps-async-drop", "blkps-ssp:2",
                 "allreduce-gloo"]


class Case:
    """One system measured on one cluster. dtype is what crosses the wire;
    drop_ratio > 0: blkps learners drop that share of each gradient."""

    def __init__(self, system, placement, dtype, option="", drop_ratio=0.0):
        self.system, self.placement, self.dtype, self.option = system, placement, dtype, option
        self.drop_ratio = drop_ratio

    @property
    def name(self):
        return f"{self.system}-{self.placement}-{self.dtype}" + (f"-drop{self.drop_ratio:g}" if self.drop_ratio else "")


def cases(quick, servers, drop_ratio):
    """The systems measured, in order."""
    out = [Case("blkps-async", "co-located", "float32"),
           Case("blkps-async", "co-located", "bfloat16"),
           Case("blkps-async", "co-located", "float32", drop_ratio=drop_ratio),
           Case("blkps-async-engine", "co-located", "float32"),
           Case("mpi", "peer-to-peer", "float32"),
           Case("mpi", "peer-to-peer", "bfloat16"),
           Case("ddp", "peer-to-peer", "float32"),
           Case("ddp", "peer-to-peer", "float16", "fp16")]
    if not quick:
        out += [Case("blkps-bsp", "co-located", "float32"),
                Case("blkps-async-exchange", "co-located", "float32"),
                Case("blkps-bsp-exchange", "co-located", "float32"),
                Case("blkps-async-torch", "co-located", "float32"),
                Case("blkps-async-torch-pipelined", "co-located", "float32"),
                Case("blkps-async", f"dedicated-{servers}", "float32")]
    return out


class Runner:
    def __init__(self, args, raw):
        self.args, self.raw = args, raw
        self.state = tempfile.mkdtemp(prefix="blkps-cluster-")
        self.targets = []
        self.mpi_bin = None  # built by the first MPI case

    def close(self):
        self.stop_targets()
        shutil.rmtree(self.state, ignore_errors=True)

    # --- one case ------------------------------------------------------------

    def measure(self, case, hosts, params):
        """Runs `case` on a fresh cluster; returns its record."""
        servers = int(case.placement.split("-")[1]) if case.placement.startswith("dedicated") else 0
        learners = list(range(hosts))
        tag = f"{case.name}-{hosts}h-{params}"
        with Cluster(hosts + servers, self.args.link, self.args.delay) as cluster:
            before = [cluster.wire_bytes(h) for h in range(cluster.hosts)]
            try:
                if case.system.startswith("blkps"):
                    times, cpu, before = self.run_blkps(cluster, case, learners, servers, params, tag)
                elif case.system == "mpi":
                    times, cpu = self.run_mpi(cluster, case, hosts, params, tag)
                else:
                    times, cpu = self.run_ddp(cluster, case, hosts, params, tag)
            finally:
                self.stop_targets()
            after = [cluster.wire_bytes(h) for h in range(cluster.hosts)]
            shaping = cluster.shaping
        exchanges = self.args.iterations + self.args.warmup
        sent = [(a[0] - b[0]) / exchanges for a, b in zip(after, before)]
        received = [(a[1] - b[1]) / exchanges for a, b in zip(after, before)]
        return {"system": case.system, "placement": case.placement, "hosts": hosts, "servers": servers,
                "link": self.args.link, "shaping": shaping, "params": params, "dtype": case.dtype,
                "drop_ratio": case.drop_ratio,
                "ms_per_exchange": 1e3 * statistics.median(times),
                "ms_per_exchange_max": 1e3 * max(times),
                "wire_bytes_per_host": statistics.mean(sent[h] for h in learners),
                "wire_rx_bytes_per_host": statistics.mean(received[h] for h in learners),
                "wire_bytes_busiest_link": max(max(sent), max(received)),
                "wire_bytes_sent": sent, "wire_bytes_received": received,
                "iterations": self.args.iterations, "warmup": self.args.warmup, **cpu}

    def read_results(self, tag, processes):
        """(every timed exchange's seconds, figures) from the ranks' result
        files tag.K.json (results.exchanges)."""
        return results.exchanges([results.load(self.out(tag, f"{k}.json")) for k in range(processes)],
                                 self.args.iterations)

    def common(self, params):
        return ["--params", str(params), "--iterations", str(self.args.iterations),
                "--warmup", str(self.args.warmup)]

    def wait_all(self, procs, what, tag):
        """Waits for the processes of one case; when one fails or the case
        outlives --case-timeout, ends the others (they would wait for it
        forever) and raises a RuntimeError with the processes' last words."""
        deadline = time.monotonic() + self.args.case_timeout
        while any(p.poll() is None for p in procs):
            failed = any(p.poll() not in (None, 0) for p in procs)
            if failed or time.monotonic() > deadline:
                for p in procs:
                    if p.poll() is None:
                        os.killpg(p.pid, signal.SIGTERM)
                        p.wait()
                break
            time.sleep(0.1)
        if any(p.returncode != 0 for p in procs):
            errs = " | ".join(open(f).read().strip()[-300:] for f in self.errs(tag))
            raise RuntimeError(f"{what} failed or timed out after {self.args.case_timeout} s: {errs}")

    def wait_ready(self, procs, files, what, tag):
        """Waits until every process has made its file in `files`; when one
        ends first or the case outlives --case-timeout, ends the others and
        raises a RuntimeError with the processes' last words."""
        deadline = time.monotonic() + self.args.case_timeout
        while not all(os.path.exists(f) for f in files):
            if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                for p in procs:
                    if p.poll() is None:
                        os.killpg(p.pid, signal.SIGTERM)
                        p.wait()
                errs = " | ".join(open(f).read().strip()[-300:] for f in self.errs(tag))
                raise RuntimeError(f"{what}: a learner ended, or the case ran past {self.args.case_timeout} s, "
                                   f"before every learner was ready: {errs}")
            time.sleep(0.01)

    def errs(self, tag):
        return sorted(os.path.join(self.raw, f) for f in os.listdir(self.raw) if f.startswith(tag + ".") and
                      f.endswith(".err"))

    def out(self, tag, suffix):
        return os.path.join(self.raw, f"{tag}.{suffix}")

    # --- blkps -----------------------------------------------------------------

    def start_shards(self, cluster, server_hosts, luns, params, options, dtype="float32"):
        """One blkps target per server host, on its address, each serving its
        stripes of the model on LUNs 1..luns of `dtype` (the stripes count
        float32 bytes, as blkps shards start's); returns the layout files
        (slot L: LUN L of every shard) and the tgtd pids."""
        sizes = [int(n) for n in shards.layout_tool("cluster", [
            "sizes", "--stripe-unit", STRIPE_UNIT, "--shards", str(len(server_hosts)),
            "--params", str(params), "--block", "512"])]
        unit = shards.layout_tool("cluster", ["bytes", STRIPE_UNIT])[0]
        envs = []
        for k, h in enumerate(server_hosts):
            folder = os.path.join(self.state, f"shard-{k}")
            bsopts = f"params={sizes[k] // 4};dtype={dtype};{options}"
            self.targets.append(folder)
            subprocess.run(cluster.exec_argv(h, [
                BLKPS, "target", "start", "--dir", folder, "--name", f"shard-{k}",
                "--address", cluster.address(h), "--port", ISCSI_PORT, "--allow", "ALL",
                "--luns", str(luns), "--bsopts", bsopts, "--owner-pid", str(os.getpid())]),
                check=True, stdout=subprocess.DEVNULL)
            envs.append(state.target(folder))
        layouts = shards.write_layouts(self.state, envs, luns, unit, params, dtype)
        return layouts, [int(env["PID"]) for env in envs]

    def stop_targets(self):
        for folder in self.targets:
            subprocess.run([BLKPS, "target", "stop", "--dir", folder], stdout=subprocess.DEVNULL)
            shutil.rmtree(folder, ignore_errors=True)
        self.targets = []

    def run_blkps(self, cluster, case, learners, servers, params, tag):
        server_hosts = learners if servers == 0 else list(range(len(learners), len(learners) + servers))
        options = f"rule=sgd;lr=1e-9;mode={case.system.split('-')[1]}" + (f";{case.option}" if case.option else "")
        layouts, tgtds = self.start_shards(cluster, server_hosts, len(learners), params, options, case.dtype)
        # The learners log in (and with dropping, the engine pulls the first
        # weights), say they are ready and wait for the go file: they start
        # together however long their logins took, in step, and the counters
        # start just before (doc/data-path.md "Phases at link rate").
        go = self.out(tag, "go")
        ready = [self.out(tag, f"{slot}.ready") for slot in range(len(learners))]
        procs = []
        for slot, h in enumerate(learners):
            procs.append(cluster.popen(h, [
                PYTHON, os.path.join(PEERS, "blkps_exchange.py"), "--target", f"layout:{layouts[slot]}",
                *self.common(params), "--dtype", case.dtype, "--drop-ratio", str(case.drop_ratio),
                *(["--overlap"] if case.system.endswith("-engine") else []),
                *(["--torch"] if "-torch" in case.system else []),
                *(["--pipelined"] if case.system.endswith(("-exchange", "-pipelined")) else []),
                "--ready", ready[slot], "--go", go,
                "--result", self.out(tag, f"{slot}.json")],
                stderr=open(self.out(tag, f"{slot}.err"), "w")))
        self.wait_ready(procs, ready, case.name, tag)
        cpu_before = sum(cpu_seconds(p) for p in tgtds)
        wire_before = [cluster.wire_bytes(h) for h in range(cluster.hosts)]
        with open(go + ".tmp", "w") as f:
            f.write(repr(time.time() + 0.2))  # every learner reads it within 10 ms
        os.replace(go + ".tmp", go)
        self.wait_all(procs, case.name, tag)
        tgtd_cpu = sum(cpu_seconds(p) for p in tgtds) - cpu_before
        times, cpu = self.read_results(tag, len(learners))
        exchanges = (self.args.iterations + self.args.warmup) * len(learners)
        return times, {"tgtd_cpu_ms_per_exchange": 1e3 * tgtd_cpu / exchanges, **cpu}, wire_before

    # --- a table over shards (--table) -----------------------------------------

    def run_table(self, hosts, servers, rows, width):
        """The table case (see the module's doc); returns its record."""
        a = self.args
        unit = math.lcm(512, 4 * width)
        options = [("table", f"{rows}:{width}"), ("rule", "sgd"), ("lr", "1"), ("init", "zeros"),
                   ("memory", a.table_memory)]
        server_hosts = list(range(hosts, hosts + servers))  # learners: hosts 0 .. hosts - 1
        tag = f"table-{hosts}h-{servers}s"
        work = ["--rows", str(rows), "--width", str(width), "--batches", str(a.table_batches),
                "--batch", str(a.table_batch)]
        with Cluster(hosts + servers, a.link, a.delay) as cluster:
            try:
                one = os.path.join(self.state, "one-server")
                self.targets.append(one)
                alone = subprocess.run(cluster.exec_argv(server_hosts[0], [
                    BLKPS, "target", "start", "--dir", one, "--address", cluster.address(server_hosts[0]),
                    "--port", ISCSI_PORT, "--bsopts", ";".join(f"{k}={v}" for k, v in options),
                    "--owner-pid", str(os.getpid())]), capture_output=True, text=True)
                if alone.returncode == 0:
                    raise RuntimeError(f"one server took the whole table with memory={a.table_memory}")
                refusal = (alone.stderr.strip().splitlines() or ["(no message)"])[-1]
                self.stop_targets()
                sizes = [int(n) for n in shards.layout_tool("cluster", [
                    "sizes", "--stripe-unit", str(unit), "--shards", str(servers), "--params",
                    str(rows * width), "--block", str(unit)])]
                envs, folders = [], []
                for k, h in enumerate(server_hosts):
                    folder = os.path.join(self.state, f"shard-{k}")
                    self.targets.append(folder)
                    folders.append(folder)
                    subprocess.run(cluster.exec_argv(h, [
                        BLKPS, "target", "start", "--dir", folder, "--name", f"shard-{k}",
                        "--address", cluster.address(h), "--port", ISCSI_PORT, "--allow", "ALL",
                        "--luns", str(hosts), "--owner-pid", str(os.getpid()),
                        "--bsopts", shards.shard_bsopts(options, k, sizes[k] // 4, folder, width, unit)]),
                        check=True, stdout=subprocess.DEVNULL)
                    envs.append(state.target(folder))
                layouts = shards.write_layouts(self.state, envs, hosts, str(unit), rows * width, "float32")
                checked, learner_results = self.row_learners(cluster, tag, layouts, work)
                made = self.table_status(cluster, zip(server_hosts, folders))
            finally:
                self.stop_targets()
        return {"rows": rows, "width": width, "table_bytes": rows * width * 4, "memory": a.table_memory,
                "servers": servers, "learners": hosts, "stripe_unit": unit, "link": a.link,
                "batches": a.table_batches, "batch": a.table_batch, "one_server_refused": refusal,
                "shard_tables": made, **checked,
                **results.rows(learner_results), "learner_results": learner_results, "load": os.getloadavg()[0]}

    @staticmethod
    def table_status(cluster, placed):
        """The status "table" of each (host, --dir) in `placed`."""
        return [json.loads(subprocess.run(cluster.exec_argv(h, [BLKPS, "status", "--dir", folder, "--json"]),
                                          check=True, capture_output=True, text=True).stdout)["table"]
                for h, folder in placed]

    def row_learners(self, cluster, tag, layouts, work):
        """bench/peers/blkps_rows.py `work` on learner hosts 0.. (slot L on
        host L, through layouts[L]) at once, then its --check from host 0:
        (the check's figures, each learner's results). Raises RuntimeError
        when a learner fails or a row differs from the reference."""
        rows_py = os.path.join(PEERS, "blkps_rows.py")
        start_at = time.time() + 1.0 + 0.3 * len(layouts)
        procs = [cluster.popen(slot, [PYTHON, rows_py, "--target", f"layout:{layout}", *work,
                                      "--learner", str(slot), "--start-at", str(start_at),
                                      "--result", self.out(tag, f"{slot}.json")],
                               stderr=open(self.out(tag, f"{slot}.err"), "w"))
                 for slot, layout in enumerate(layouts)]
        self.wait_all(procs, tag, tag)
        checked = subprocess.run(cluster.exec_argv(0, [
            PYTHON, rows_py, "--target", f"layout:{layouts[0]}", *work, "--learners", str(len(layouts)),
            "--check"]), capture_output=True, text=True)
        if checked.returncode != 0:
            raise RuntimeError(f"the rows do not match the reference: {checked.stderr.strip()[-300:]}")
        return json.loads(checked.stdout), [results.load(self.out(tag, f"{slot}.json")) for slot in range(len(layouts))]

    # --- training -------------------------------------------------------------

    def train(self, system, hosts, params, straggler):
        """bench/train_synthetic.py on every host of a fresh co-located
        cluster, with the last host's learner at half speed if `straggler`;
        returns the record: seconds until the learners' recent mean loss
        reaches --target-loss."""
        a = self.args
        tag = f"train-{system.replace(':', '')}-{hosts}h-{'straggler' if straggler else 'even'}"
        dtype = "bfloat16" if system.endswith("-bf16") else "float32"
        common = ["--params", str(params), "--learners", str(hosts), "--iterations", str(a.train_iterations),
                  "--batch", "32"]
        with Cluster(hosts, a.link, a.delay) as cluster:
            try:
                if system.startswith("blkps"):
                    layouts, _ = self.start_shards(cluster, list(range(hosts)), hosts, params,
                                                   f"rule=sgd;lr={TRAIN_LR};mode={system.split('-')[1]}", dtype)
                    engine = {"-engine": ["--engine"], "-drop": ["--engine", "--drop-ratio", str(a.drop_ratio)],
                              "-bf16": ["--dtype", dtype]}
                    learner = next((v for k, v in engine.items() if system.endswith(k)), [])
                    where = [["--target", f"layout:{layouts[h]}", *learner] for h in range(hosts)]
                else:
                    init = f"tcp://{cluster.address(0)}:{DDP_PORT}"
                    where = [["--allreduce", init, "--lr", str(TRAIN_LR)]] * hosts
                start_at = time.time() + 1.0 + 0.3 * hosts
                procs = [cluster.popen(h, [PYTHON, os.path.join(TOP, "bench", "train_synthetic.py"), *where[h],
                                           *common, "--learner", str(h), "--start-at", str(start_at),
                                           "--result", self.out(tag, f"{h}.json"),
                                           *(["--straggle"] if straggler and h == hosts - 1 else [])],
                                       env=dict(os.environ, GLOO_SOCKET_IFNAME="eth0"), stdout=subprocess.DEVNULL,
                                       stderr=open(self.out(tag, f"{h}.err"), "w")) for h in range(hosts)]
                self.wait_all(procs, tag, tag)
            finally:
                self.stop_targets()
        samples, seconds = results.training([results.load(self.out(tag, f"{h}.json")) for h in range(hosts)])
        return {"system": system, "placement": "co-located" if system.startswith("blkps") else "peer-to-peer",
                "hosts": hosts, "link": a.link, "params": params, "dtype": dtype,
                "drop_ratio": a.drop_ratio if system.endswith("-drop") else 0.0, "straggler": straggler,
                "target_loss": a.target_loss, "seconds_to_target": time_to_loss(samples, a.target_loss, 5 * hosts),
                "seconds": seconds,
                "iterations": a.train_iterations, "final_loss": statistics.mean(l for _, l in samples[-5 * hosts:])}

    # --- peers ---------------------------------------------------------------------

    def run_mpi(self, cluster, case, hosts, params, tag):
        if self.mpi_bin is None:
            mpi_dir = os.path.join(TOP, "build", "cmake", "bench-cluster")
            os.makedirs(mpi_dir, exist_ok=True)
            self.mpi_bin = os.path.join(mpi_dir, "mpi_allreduce")
            subprocess.run(["mpicc", "-O2", "-o", self.mpi_bin, os.path.join(PEERS, "mpi_allreduce.c")], check=True)
        hostmap, hostfile = self.out(tag, "hosts"), self.out(tag, "hostfile")
        with open(hostmap, "w") as f:
            f.writelines(f"{cluster.address(h)} {cluster.netns(h)}\n" for h in range(hosts))
        with open(hostfile, "w") as f:
            f.writelines(f"{cluster.address(h)} slots=1\n" for h in range(hosts))
        env = dict(os.environ, BLKPS_CLUSTER_HOSTS=hostmap, PMIX_MCA_gds="hash")
        # Both of MPI's channels on the hosts' links only, named by subnet
        # (the same on every host, whatever its interfaces are called): the
        # TCP BTL (MPI's data) and the out-of-band channel the daemons use
        # to call mpirun back.
        mca = {"plm_rsh_agent": os.path.join(HERE, "netns_rsh.sh"), "pml": "ob1", "btl": "self,tcp",
               "btl_tcp_if_include": cluster.subnet(), "oob_tcp_if_include": cluster.subnet(),
               "coll_tuned_use_dynamic_rules": "1", "coll_tuned_allreduce_algorithm": "4"}  # 4: ring
        argv = ["mpirun", "--allow-run-as-root", "--hostfile", hostfile, "-np", str(hosts), "--map-by", "node"]
        for key, value in mca.items():
            argv += ["--mca", key, value]
        argv += [self.mpi_bin, str(params), str(self.args.iterations), str(self.args.warmup), case.dtype]
        with open(self.out(tag, "json"), "w") as out:
            p = cluster.popen(0, argv, env=env, stdout=out, stderr=open(self.out(tag, "err"), "w"))
            self.wait_all([p], case.name, tag)
        return results.mpi(results.load(self.out(tag, "json")), self.args.iterations)

    def run_ddp(self, cluster, case, hosts, params, tag):
        init = f"tcp://{cluster.address(0)}:{DDP_PORT}"
        env = dict(os.environ, GLOO_SOCKET_IFNAME="eth0")  # not the loopback this host's name resolves to
        procs = []
        for h in range(hosts):
            procs.append(cluster.popen(h, [
                PYTHON, os.path.join(PEERS, "gloo_allreduce.py"), "--ddp", "--compress", case.option or "none",
                "--rank", str(h), "--world", str(hosts), "--init", init, *self.common(params),
                "--result", self.out(tag, f"{h}.json")], env=env, stderr=open(self.out(tag, f"{h}.err"), "w")))
        self.wait_all(procs, case.name, tag)
        return self.read_results(tag, hosts)


def run_case(args, raw, what, case):
    """case(runner)'s record, on a Runner made and closed here; a failure
    ends the bench with one line naming `what`."""
    runner = Runner(args, raw)
    try:
        return case(runner)
    except (RuntimeError, subprocess.CalledProcessError, OSError) as e:
        sys.exit(f"cluster: the {what} case failed: {e}")
    finally:
        runner.close()


def hashed_table_case(args, out, raw, capacity, width):
    """--table hash:CAPACITY:WIDTH (hashed_table.py); writes DIR/table.json
    and DIR/table.md."""
    hosts = args.hosts[0]
    r = run_case(args, raw, "hashed table", lambda runner: hashed_table.run(runner, hosts, args.servers, capacity,
                                                                            width))
    command = (f"sudo bench/cluster.sh --out DIR --table {args.table} --table-ids {args.table_ids} "
               f"--servers {args.servers} --hosts {hosts} --link {args.link} --table-batches {args.table_batches} "
               f"--table-batch {args.table_batch}")
    print("\n".join(hashed_table.write(out, r, command)))
    return 0


def table_case(args, out, raw):
    """--table: the table case alone; writes DIR/table.json and DIR/table.md."""
    try:
        hashed = hashed_table.parse(args.table)
        if not hashed:
            rows, width = (int(v) for v in args.table.split(":"))
    except ValueError:
        sys.exit(f"cluster: --table: expected ROWS:WIDTH (e.g. 200000:128) or hash:CAPACITY:WIDTH; "
                 f"got '{args.table}'")
    if hashed:
        return hashed_table_case(args, out, raw, *hashed)
    hosts = args.hosts[0]
    r = run_case(args, raw, "table", lambda runner: runner.run_table(hosts, args.servers, rows, width))
    command = (f"sudo bench/cluster.sh --out DIR --table {args.table} --table-memory {args.table_memory} "
               f"--servers {args.servers} --hosts {hosts} --link {args.link} --table-batches {args.table_batches} "
               f"--table-batch {args.table_batch}")
    r["command"] = command
    with open(os.path.join(out, "table.json"), "w") as f:
        json.dump(r, f, indent=1)
    lines = ["# A table larger than one server's memory, over shards, in the netns cluster", "",
             f"table={rows}:{width} ({r['table_bytes'] / 2**20:.0f} MiB), rule sgd, memory={args.table_memory} "
             f"on every server; {args.servers} server hosts, {hosts} learner hosts, links {args.link}, stripe unit "
             f"{r['stripe_unit']} bytes; {args.table_batches} batches of {args.table_batch} Zipf(1.05) ids per "
             f"learner, each pulled then pushed. Load average {r['load']:.1f}. Command: `{command}`.", "",
             f"- One server alone: `{r['one_server_refused']}`",
             "- Shards: " + ", ".join(f"{t['rows']:,} rows ({t['rows_made']:,} made)" for t in r["shard_tables"]),
             *results.rows_lines(r)]
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def time_to_loss(samples, target, window):
    """The first time at which the mean of the last `window` (time, loss)
    samples is at most target, or None."""
    for i in range(window, len(samples) + 1):
        if statistics.mean(loss for _, loss in samples[i - window:i]) <= target:
            return samples[i - 1][0]
    return None


def cpu_seconds(pid):
    """utime + stime of process pid, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def feed_rate(seconds):
    """What this machine's CPU moves through one veth-bridge-veth path,
    unshaped: iperf3, one TCP stream, host 0 -> host 1 (Gbit/s), or None
    without iperf3."""
    if not shutil.which("iperf3"):
        return None
    with Cluster(2, "none") as cluster:
        cluster.popen(1, ["iperf3", "-s", "-1", "-B", cluster.address(1)], stdout=subprocess.DEVNULL)
        time.sleep(0.5)
        out = subprocess.run(cluster.exec_argv(0, ["iperf3", "-c", cluster.address(1), "-t", str(seconds), "-J"]),
                             capture_output=True, text=True)
        if out.returncode != 0:
            return None
        return json.loads(out.stdout)["end"]["sum_received"]["bits_per_second"] / 1e9


def number_list(text):
    try:
        values = [int(float(v)) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got '{text}'")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive numbers, got '{text}'")
    return values


def link_rate(text):
    try:
        link_bits_per_s(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e))
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for cluster.md, cluster.json, cluster.png, raw/")
    ap.add_argument("--quick", action="store_true", help="25M parameters, fewer exchanges and systems; "
                    "without a straggler only blkps-async and the all-reduce train")
    ap.add_argument("--hosts", type=number_list, default=[2, 4], help="host counts (default 2,4)")
    ap.add_argument("--params", type=number_list, help="model sizes in float32 parameters "
                    "(default 25000000,100000000; --quick: 25000000)")
    ap.add_argument("--link", type=link_rate, default="1gbit", help="each host's link rate (default 1gbit)")
    ap.add_argument("--delay", help="netem delay each way, where the kernel has netem (e.g. 0.1ms)")
    ap.add_argument("--servers", type=int, default=2, help="server hosts of the dedicated placement (default 2)")
    ap.add_argument("--iterations", type=int, help="timed exchanges per process (default 5; --quick 3)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed exchanges first (default 1)")
    ap.add_argument("--train-params", type=int, help="the training model's parameters "
                    "(default 25000000; --quick 4000000)")
    ap.add_argument("--train-iterations", type=int, help="iterations per learner (default 60; --quick 40)")
    ap.add_argument("--train-hosts", type=int, default=4, help="hosts of the training comparison (default 4)")
    ap.add_argument("--target-loss", type=float, default=2.5, help="the training target (default 2.5)")
    ap.add_argument("--no-training", action="store_true", help="only the exchange measurements")
    ap.add_argument("--systems", type=lambda t: t.split(","), help="only these exchange cases, by name as the "
                    "progress lines print them (system-placement-dtype[-dropR], e.g. "
                    "blkps-async-co-located-float32,ddp-peer-to-peer-float32), comma-separated (default: all)")
    ap.add_argument("--drop-ratio", type=float, default=0.99, help="blkps's gradient dropping cases: the share "
                    "of gradient runs dropped per push (default 0.99)")
    ap.add_argument("--case-timeout", type=float, help="seconds one case may take (default 900; --quick 180)")
    ap.add_argument("--table", help="instead of the exchanges and training: the table case, ROWS:WIDTH "
                    "(e.g. 200000:128; see above), on --servers server hosts and the first of --hosts learners")
    ap.add_argument("--table-memory", default="64M", help="the table case's memory= per server (default 64M)")
    ap.add_argument("--table-ids", type=int, default=10**8, help="a hashed table case's possible ids (default 10^8)")
    ap.add_argument("--table-batches", type=int, default=20, help="the table case's batches per learner (default 20)")
    ap.add_argument("--table-batch", type=int, default=4096, help="ids per batch of the table case (default 4096)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("cluster: run as root (it makes network namespaces and starts tgtd): sudo bench/cluster.sh ...")
    if min(args.hosts) < 2 or args.train_hosts < 2:
        sys.exit("cluster: --hosts, --train-hosts: every count must be at least 2")
    if args.servers < 1:
        sys.exit("cluster: --servers: at least 1")
    if not 0 < args.drop_ratio < 1:
        sys.exit("cluster: --drop-ratio: expected a ratio in (0, 1)")
    args.case_timeout = args.case_timeout or (180 if args.quick else 900)
    if args.table:
        for name in ("bs_blkps.so", "libblkps.so", "blkps-layout", "blkps-bsopts"):
            tools.built(name)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        out = os.path.abspath(args.out)
        os.makedirs(os.path.join(out, "raw"), exist_ok=True)
        return table_case(args, out, os.path.join(out, "raw"))
    args.params = [p // 128 * 128 for p in (args.params or ([25000000] if args.quick else [25000000, 100000000]))]
    args.iterations = args.iterations or (3 if args.quick else 5)
    args.train_iterations = args.train_iterations or (40 if args.quick else 60)
    served = subprocess.run([PYTHON, os.path.join(TOP, "bench", "train_synthetic.py"), "--print-params", "--params",
                             str(args.train_params or (4000000 if args.quick else 25000000))],
                            check=True, capture_output=True, text=True)
    args.train_params = int(served.stdout)
    for name in ("bs_blkps.so", "libblkps.so", "blkps-layout", "blkps-bsopts"):
        tools.built(name)
    for prog in ("mpicc", "mpirun", "tc", "ip"):
        if not shutil.which(prog):
            sys.exit(f"cluster: {prog} not found: run scripts/setup.sh --bench")
    # Ctrl-C and SIGTERM unwind through every with-block: nothing is left behind.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out = os.path.abspath(args.out)
    raw = os.path.join(out, "raw")
    os.makedirs(raw, exist_ok=True)
    begin = time.monotonic()
    records, trainings, failures = [], [], []
    runner = Runner(args, raw)
    try:
        feed = feed_rate(2)
        print(f"cluster: one unshaped veth-bridge-veth TCP stream moves {feed or 0:.1f} Gbit/s on this machine")
        for params in args.params:
            for hosts in args.hosts:
                for case in cases(args.quick, args.servers, args.drop_ratio):
                    if args.systems and case.name not in args.systems:
                        continue
                    try:
                        record = runner.measure(case, hosts, params)
                    except (RuntimeError, subprocess.CalledProcessError, OSError) as e:
                        failures.append(f"{case.name} H={hosts} P={params}: {e}")
                        print(f"cluster: FAILED {failures[-1]}", file=sys.stderr)
                        records.append({"system": case.system, "placement": case.placement, "hosts": hosts,
                                        "params": params, "dtype": case.dtype, "drop_ratio": case.drop_ratio,
                                        "link": args.link, "failed": str(e)})
                        continue
                    records.append(record)
                    late = (f", a learner opened {record['late_start_s']:.1f} s after the common start: its "
                            "opening is in the wire bytes" if "late_start_s" in record else "")
                    print(f"cluster: {case.name} H={hosts} P={params}: {record['ms_per_exchange']:.0f} ms/exchange, "
                          f"{record['wire_bytes_per_host'] / 1e6:.1f} MB sent per host{late} "
                          f"({time.monotonic() - begin:.0f} s elapsed)", flush=True)
        for straggler in ([] if args.no_training else [False, True]):
            for system in TRAIN_SYSTEMS:
                if args.quick and not straggler and system not in ("blkps-async", "allreduce-gloo"):
                    continue  # the goal is the straggler's; --quick keeps the run under 10 minutes
                try:
                    record = runner.train(system, args.train_hosts, args.train_params, straggler)
                except (RuntimeError, subprocess.CalledProcessError, OSError) as e:
                    failures.append(f"training {system} straggler={straggler}: {e}")
                    print(f"cluster: FAILED {failures[-1]}", file=sys.stderr)
                    continue
                trainings.append(record)
                reached = record["seconds_to_target"]
                print(f"cluster: training {system} H={args.train_hosts} straggler={straggler}: "
                      f"{'never' if reached is None else f'{reached:.1f} s'} to loss {args.target_loss} "
                      f"({time.monotonic() - begin:.0f} s elapsed)", flush=True)
    finally:
        runner.close()
    with open(os.path.join(out, "cluster.json"), "w") as f:
        json.dump(records, f, indent=1)
    with open(os.path.join(out, "cluster-training.json"), "w") as f:
        json.dump(trainings, f, indent=1)
    report.write(out, records, trainings, {"link": args.link, "feed_gbit_s": feed, "quick": args.quick,
                                "failures": failures, "seconds": time.monotonic() - begin,
                                "load": os.getloadavg()[0]})
    print(f"cluster: wrote {out}/cluster.md ({time.monotonic() - begin:.0f} s)"
          + (f"; {len(failures)} case(s) failed, recorded there" if failures else ""))
    return 0  # a failed case is a result (cluster.md, cluster.json's "failed"), not a failed run


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit("cluster: interrupted; the cluster, its processes and targets are gone")
