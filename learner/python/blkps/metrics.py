"""blkps.metrics: a learner's own Prometheus metrics (doc/monitoring.md
"Learner metrics"), served when the environment asks for them:

  BLKPS_METRICS_PORT      base port: the learner of local rank L serves
                          GET /metrics on BASE + L (several ranks on one
                          host never collide); unset: nothing is served
  BLKPS_METRICS_ADDRESS   address to bind (default 127.0.0.1)
  BLKPS_METRICS_SD_DIR    a folder (shared by the job's hosts, or one per
                          host) where each learner writes rank-R.json, its
                          entry of a Prometheus file-discovery list:
                          file_sd_configs: [{files: [DIR/*.json]}]

blkps.torch's DistributedOptimizer serves its counters this way
(serve_optimizer), with the decisions of the latest EarlyStopping; a
program on blkps.Engine serves the engine's with serve_engine and
EngineCounters, and anything else with serve(page) and an Exposition. The serving thread only reads the counters
(plain numbers the training threads add to), so a scrape never waits for
training nor training for a scrape. python3-prometheus-client is not used.
"""

import json
import os
import socket
import weakref

from .exposition import Exposition, MetricsServer, listening_socket

__all__ = ["serve", "serve_optimizer", "serve_engine", "endpoint", "write_discovery_entry", "watch_early_stopping",
           "SessionFaults", "EngineCounters"]

PORT_ENV, ADDRESS_ENV, SD_DIR_ENV = "BLKPS_METRICS_PORT", "BLKPS_METRICS_ADDRESS", "BLKPS_METRICS_SD_DIR"

# blkps.torch's seconds (where a step's time goes), by part.
_SECONDS_HELP = ("Seconds spent, summed: copy_out (device to host), push, pull, exchange (a push and the pull "
                 "after it) on the communication thread; step_wait and weights_wait on the training thread.")


def endpoint(local_rank, env=None):
    """(address, port) this learner serves on, or None when
    BLKPS_METRICS_PORT is unset. A ValueError names a bad setting."""
    env = os.environ if env is None else env
    base = env.get(PORT_ENV, "")
    if not base:
        return None
    if not base.isdigit() or not 0 < int(base) + local_rank < 65536:
        raise ValueError(f"blkps: {PORT_ENV}={base!r}: expected a port number (the base; local rank "
                         f"{local_rank} serves on base + {local_rank})")
    return env.get(ADDRESS_ENV) or "127.0.0.1", int(base) + local_rank


def serve(page, rank, local_rank, env=None):
    """Serves page() (the exposition text) on endpoint(local_rank) from a
    daemon thread and writes the discovery entry; returns the
    MetricsServer (shutdown() and server_close() end it), or None when
    nothing is asked for. An OSError names a taken port."""
    where = endpoint(local_rank, env)
    if where is None:
        return None
    try:
        sock = listening_socket(*where)
    except OSError as e:
        raise OSError(e.errno, f"blkps: {PORT_ENV}: cannot listen on {where[0]}:{where[1]} (rank {rank}, local "
                      f"rank {local_rank}): {e.strerror}; choose another base port") from None
    server = MetricsServer(sock, page)
    server.serve_in_thread()
    folder = (os.environ if env is None else env).get(SD_DIR_ENV)
    if folder:
        write_discovery_entry(folder, rank, where)
    return server


def write_discovery_entry(folder, rank, where):
    """Writes FOLDER/rank-RANK.json, one target group of Prometheus's file
    discovery: this learner's HOST:PORT with labels rank and job_role.
    A wildcard address is written as this host's name. Atomic: Prometheus
    never reads half a file."""
    address, port = where
    host = socket.gethostname() if address in ("0.0.0.0", "::") else address
    host = f"[{host}]" if ":" in host else host
    group = [{"targets": [f"{host}:{port}"], "labels": {"rank": str(rank), "job_role": "learner"}}]
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"rank-{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(group, f)
    os.replace(path + ".tmp", path)
    return path


class SessionFaults:
    """A learner's reconnects, the seconds they took and the bytes of its
    pushes lost at server restarts, summed over its blkps.Models. A Model
    is one thread's (libblkps reads and writes these counts on the thread
    making the calls), so that thread copies them after its calls with
    note(); the serving thread reads only the copies, each a tuple replaced
    whole, and never touches a Model."""

    def __init__(self):
        self._copies = {}  # a Model's name -> (reconnects, seconds, bytes lost)

    def note(self, name, model):
        """Copies the counts of `model` under `name` (one name per Model).
        REQUIRES: the caller is the thread using `model`, between calls."""
        self._copies[name] = (model.reconnects, model.reconnect_seconds, model.pushed_bytes_lost)

    def totals(self):
        """(reconnects, seconds, bytes lost) over the Models noted."""
        copies = list(self._copies.values())
        return sum(c[0] for c in copies), sum(c[1] for c in copies), sum(c[2] for c in copies)


_early_stopping = None  # weakref to the latest blkps.torch.EarlyStopping


def watch_early_stopping(early_stopping):
    """Exports the decisions of `early_stopping` (blkps.torch.EarlyStopping,
    which calls this when made; the latest one made is exported) with the
    optimizer's counters."""
    global _early_stopping
    _early_stopping = weakref.ref(early_stopping)


def _early_stopping_samples(out, labels):
    es = _early_stopping() if _early_stopping is not None else None
    if es is None:
        return
    nan = float("nan")
    out.add("blkps_torch_early_stopping_last", "gauge", "EarlyStopping: the last metric averaged over the ranks.",
            nan if es.last is None else es.last, **labels)
    out.add("blkps_torch_early_stopping_best", "gauge", "EarlyStopping: the best averaged metric so far.",
            nan if es.best is None else es.best, **labels)
    out.add("blkps_torch_early_stopping_bad_evaluations", "gauge",
            "EarlyStopping: evaluations in a row without improvement (it stops at patience).", es.bad_evals, **labels)
    out.add("blkps_torch_early_stopping_stopped", "gauge", "EarlyStopping: 1 once it decided to stop.", es.stopped,
            **labels)


def optimizer_page(opt, rank, local_rank):
    """The exposition of a blkps.torch DistributedOptimizer's counters."""
    out = Exposition()
    labels = {"rank": str(rank), "local_rank": str(local_rank)}
    out.add("blkps_torch_steps_total", "counter", "Optimizer steps taken.", opt.steps, **labels)
    out.add("blkps_torch_pushes_total", "counter", "Bucket pushes (gradient mode) or whole-model pushes (delta).",
            opt.pushes, **labels)
    out.add("blkps_torch_requests_total", "counter", "Device calls: a push, pull or exchange of adjacent buckets.",
            opt.transfers, **labels)
    out.add("blkps_torch_overlapped_pushes_total", "counter", "Bucket pushes made while backward still ran.",
            opt.overlapped, **labels)
    out.add("blkps_torch_skipped_steps_total", "counter", "Steps with non-finite gradients, not pushed.",
            opt.skipped_steps, **labels)
    out.add("blkps_torch_forward_waits_total", "counter", "Forwards that found a bucket's weights still arriving.",
            opt.forward_waits, **labels)
    for direction, count in opt.bytes.items():
        out.add("blkps_torch_bytes_total", "counter", "Bytes on the wire (gradient mode): pushed, pulled.", count,
                direction=direction, **labels)
    for part, seconds in opt.seconds.items():
        out.add("blkps_torch_seconds_total", "counter", _SECONDS_HELP, seconds, part=part, **labels)
    reconnects, seconds, lost = opt.faults.totals()
    out.add("blkps_torch_reconnects_total", "counter", "Lost sessions to the server re-established.", reconnects,
            **labels)
    out.add("blkps_torch_reconnect_seconds_total", "counter",
            "Seconds spent reconnecting, a failed attempt included.", seconds, **labels)
    out.add("blkps_torch_pushed_bytes_lost_total", "counter",
            "Bytes of pushes the server acknowledged, then lost: it restarted from an older checkpoint.", lost,
            **labels)
    _early_stopping_samples(out, labels)
    return out.text()


def serve_optimizer(opt, rank, local_rank, env=None):
    """serve() of optimizer_page(opt, ...): what blkps.torch calls."""
    return serve(lambda: optimizer_page(opt, rank, local_rank), rank, local_rank, env)


# blkps.Engine's seconds by part (IterationMetrics, blkps/engine.hpp).
_ENGINE_PARTS = ("compute", "stall", "push", "pull", "bubble")


class EngineCounters:
    """A blkps.Engine's step metrics summed for a scrape. The engine is
    driven by one thread, which calls note(engine) after every step()
    (each step's metrics are the last step's only: a step not noted is
    not counted); the serving thread reads only the copy, a dict replaced
    whole, and never touches the engine."""

    def __init__(self):
        self._totals = {"steps": 0, "staleness": -1, "params_pushed": 0,
                        **{part: 0.0 for part in _ENGINE_PARTS}}

    def note(self, engine):
        """Adds the engine's last step. REQUIRES: the thread driving
        `engine`, once after each step()."""
        m, totals = engine.metrics, dict(self._totals)
        totals["steps"] += 1
        for part in _ENGINE_PARTS:
            totals[part] += m[part + "_s"]
        totals["staleness"] = m["staleness"]
        totals["params_pushed"] = engine.params_pushed
        self._totals = totals

    def totals(self):
        """The sums so far: steps, seconds by part, the last staleness (-1:
        unknown) and the parameters pushed."""
        return self._totals


def engine_page(counters, rank, local_rank):
    """The exposition of EngineCounters `counters`."""
    out, totals = Exposition(), counters.totals()
    labels = {"rank": str(rank), "local_rank": str(local_rank)}
    out.add("blkps_engine_steps_total", "counter", "Engine steps noted.", totals["steps"], **labels)
    for part in _ENGINE_PARTS:
        out.add("blkps_engine_seconds_total", "counter",
                "Seconds by part of the engine's steps: compute (the caller's, between steps), stall (step() "
                "waiting for communication), push, pull (the engine's own transfers), bubble (from a step's "
                "start to its pull's).",
                totals[part], part=part, **labels)
    out.add("blkps_engine_staleness_iterations", "gauge",
            "Age of the last step's weights in model updates (-1: unknown, no control target).", totals["staleness"], **labels)
    out.add("blkps_engine_params_pushed_total", "counter", "Parameters sent to the server (with dropping: the runs "
            "pushed).", totals["params_pushed"], **labels)
    return out.text()


def serve_engine(counters, rank, local_rank, env=None):
    """serve() of engine_page(counters, ...)."""
    return serve(lambda: engine_page(counters, rank, local_rank), rank, local_rank, env)
