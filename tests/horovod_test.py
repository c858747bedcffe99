#!/usr/bin/python3
"""blkps.torch as Horovod's documented API (issue 23), against a real tgtd:
each case starts its own server (tests/testbed.py) and learner
processes with a launcher's variables, and checks exact results.

  horovod_test.py <repo> <build dir> <case>

Cases: ranks (no server), collectives, any-order, options, compression,
early-stop, dead-rank, slow-rank.
"""
import json
import os
import subprocess
import tempfile
import threading
import time

import numpy as np

import testbed
from testbed import check, fail, finish, with_server

top, build, _ = testbed.setup("horovod_test")
import torch  # noqa: E402
import torch_fashion_job as job  # noqa: E402  (its blkps command and mount)

import blkps  # noqa: E402
import blkps.torch as hvd  # noqa: E402  (the import a Horovod script changes)
from blkps.torch import session  # noqa: E402  (the collectives' rounds)
from blkps.control import Control  # noqa: E402

torch.set_num_threads(1)
LR = 0.1


def refused(call, words, kind=(ValueError, NotImplementedError)):
    """call() must raise `kind` with one line containing every word."""
    try:
        call()
    except kind as e:
        text = str(e)
        check(all(w in text for w in words) and "\n" not in text, f"unclear refusal: {text}")
        return text
    fail(f"accepted, expected a refusal naming {words}")


def model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def batch(step, rank):
    rng = np.random.default_rng(100 * step + rank)
    return (torch.from_numpy(rng.normal(size=(8, 8)).astype(np.float32)),
            torch.from_numpy(rng.integers(0, 4, 8)))


def flat(m):
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()]).numpy().copy()


def gradient(m, step, rank):
    m.zero_grad()
    x, y = batch(step, rank)
    torch.nn.functional.cross_entropy(m(x), y).backward()
    return [p.grad.detach().clone() for p in m.parameters()]


# ---- learners (run as subprocesses with RANK/WORLD_SIZE) ----

def learner_collectives(config):
    """Every collective, checked here against what each rank handed in."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    out = {}
    ints = torch.arange(5, dtype=torch.int64) * (r + 1)
    out["sum_int"] = hvd.allreduce(ints, op=hvd.Sum, name="ints").tolist()
    out["avg_int"] = hvd.allreduce(ints, name="ints.avg").tolist()
    floats = torch.tensor([0.1, 1e-8, 3.0], dtype=torch.float32) * (r + 1)
    out["avg"] = hvd.allreduce(floats, name="floats").tolist()
    out["avg_old_spelling"] = hvd.allreduce(floats, average=True, name="floats.2").tolist()
    out["min"] = hvd.allreduce(floats, op=hvd.Min, name="min").tolist()
    out["max"] = hvd.allreduce(floats, op=hvd.Max, name="max").tolist()
    out["scaled"] = hvd.allreduce(floats, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5,
                                  name="scaled").tolist()
    out["fp16"] = hvd.allreduce(floats, compression=hvd.Compression.fp16, name="fp16").tolist()
    inplace = torch.full((3,), float(r))
    hvd.allreduce_(inplace, op=hvd.Sum, name="inplace")
    out["inplace"] = inplace.tolist()
    handle = hvd.allreduce_async(torch.tensor([float(r)]), op=hvd.Sum, name="async")
    out["async"] = hvd.synchronize(handle).tolist() if hvd.poll(handle) else None
    big = torch.from_numpy(np.random.default_rng(r).normal(size=config["big"]).astype(np.float32))
    out["big_sum_digest"] = float(hvd.allreduce(big, op=hvd.Sum, name="big").double().sum())
    out["big_bf16"] = str(hvd.allreduce(big.to(torch.bfloat16)[:4], op=hvd.Sum, name="bf16").dtype)
    out["gather"] = hvd.allgather(torch.full((r + 1, 2), r, dtype=torch.int32), name="gather").tolist()
    out["gather_big_rows"] = hvd.allgather(big.reshape(-1, 1)[: 1000 * (r + 1)], name="gb").shape[0]
    out["bcast"] = hvd.broadcast(torch.tensor([r, 10 * r]), root_rank=1, name="b").tolist()
    t = torch.tensor([float(r)] * 3)
    hvd.broadcast_(t, root_rank=n - 1, name="b_")
    out["bcast_"] = t.tolist()
    out["object"] = hvd.broadcast_object({"from": r, "list": [r] * 3}, root_rank=1)
    out["objects"] = hvd.allgather_object(("rank", r))
    hvd.barrier()
    rounds = session.exchange().rounds
    start = time.perf_counter()
    calls = config["timed_calls"]
    for k in range(calls):
        hvd.allreduce(torch.tensor([float(k)]), name="timed")
    out["seconds_per_small_allreduce"] = (time.perf_counter() - start) / calls
    out["rounds_per_small_allreduce"] = (session.exchange().rounds - rounds) / calls
    start = time.perf_counter()
    hvd.allreduce(big, name="timed.big")
    out["seconds_big_allreduce"] = time.perf_counter() - start
    # Different calls on different ranks: both named, one line.
    try:
        if r == 0:
            hvd.allreduce(torch.ones(2), name="left")
        else:
            hvd.allgather(torch.ones(2), name="right")
        out["mismatch"] = "accepted"
    except ValueError as e:
        out["mismatch"] = str(e)
    print(json.dumps(out), flush=True)


def learner_train(config):
    """Horovod's order (broadcast first) or blkps's (optimizer first), with
    the options in config; reports weights, the optimizer's state, pushes."""
    hvd.init()
    r = hvd.rank()
    m = model(10 + r)  # different on every rank: broadcast must fix that
    local = None
    if config["optimizer"] == "delta":
        local = torch.optim.SGD(m.parameters(), lr=LR, momentum=0.5)
        if r == 0:  # root has optimizer state the others must take
            for p in m.parameters():
                local.state[p]["momentum_buffer"] = torch.full_like(p, 0.25)
    kwargs = dict(named_parameters=m.named_parameters(), op=getattr(hvd, config.get("op", "Average")),
                  backward_passes_per_step=config.get("passes", 1),
                  gradient_predivide_factor=config.get("predivide", 1.0),
                  compression=getattr(hvd.Compression, config.get("compression", "none")))
    out = {"initial": flat(m).tolist()}
    if config["order"] == "horovod":
        hvd.broadcast_parameters(m.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(local, root_rank=0)
        out["after_broadcast"] = flat(m).tolist()
        opt = hvd.DistributedOptimizer(local, **kwargs)
    else:
        opt = hvd.DistributedOptimizer(local, **kwargs)
        hvd.broadcast_parameters(m.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        out["after_broadcast"] = flat(m).tolist()
    if local is not None:
        out["momentum"] = [float(local.state[p]["momentum_buffer"].sum()) for p in m.parameters()]
    for step in range(config["steps"]):
        opt.zero_grad()
        for k in range(config.get("passes", 1)):
            x, y = batch(step * 10 + k, r)
            torch.nn.functional.cross_entropy(m(x), y).backward()
        if config.get("synchronize"):
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1e9)  # acts on the final gradients
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
    out.update(weights=flat(m).tolist(), pushes=opt.pushes, buckets=len(getattr(opt, "buckets", [])))
    hvd.shutdown()
    print(json.dumps(out), flush=True)


def learner_early_stop(config):
    """EarlyStopping over a fixed series; then trains until stop_requested()."""
    hvd.init()
    r = hvd.rank()
    m = model(0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=LR), named_parameters=m.named_parameters())
    hvd.broadcast_parameters(m.state_dict(), root_rank=0)
    out = {}
    # First the helper over a fixed series (the job's stop is not asked yet).
    stopper = hvd.EarlyStopping(patience=config["patience"], min_delta=config["min_delta"])
    for k, loss in enumerate(config["losses"][r]):
        if stopper.step(loss):
            out["early_stop_at"] = k
            break
    out["best"] = stopper.best
    for step in range(1, 10000):
        opt.zero_grad()
        x, y = batch(step, r)
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
        if hvd.stop_requested():
            out["stopped_after_step"] = step
            break
    out["stopper_after_stop"] = hvd.EarlyStopping(patience=100).step(1.0)  # the job's stop counts
    print(json.dumps(out), flush=True)


def learner_heartbeat(config):
    """One allreduce; then rank 1 hangs until it is killed (config "rank1":
    "dies") or is busy for config "slow_s" seconds, alive (its heartbeat
    thread goes on); then a second allreduce. Reports what each got, or the
    RankDied error."""
    hvd.init()
    out = {"first": hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum, name="first").tolist()}
    if hvd.rank() == 1:
        if config["rank1"] == "dies":
            print("joined", flush=True)
            threading.Event().wait()  # until the test's kill -9
        time.sleep(config["slow_s"])  # evaluating, say: longer than the bound
    try:
        out["second"] = hvd.allreduce(torch.tensor([2.0]), op=hvd.Sum, name="second").tolist()
    except hvd.RankDied as e:
        out["died"], out["error"] = e.ranks, str(e)
    print(json.dumps(out))
    hvd.shutdown()


def learner_late_broadcast(config):
    """Rank 0 calls broadcast_parameters with config "timeout_s", before
    DistributedOptimizer (config "order": "horovod") or after it; rank 1,
    alive (it heartbeats), calls nothing for config "late_s" seconds and
    ends. Reports rank 0's CollectiveTimeout, or what it got instead."""
    hvd.init()
    m = model(10 + hvd.rank())
    opt = None
    if config["order"] != "horovod":
        opt = hvd.DistributedOptimizer(None, named_parameters=m.named_parameters())
    out = {}
    if hvd.rank() == 0:
        try:
            hvd.broadcast_parameters(m.state_dict(), root_rank=0, timeout_s=config["timeout_s"])
            out["broadcast"] = "returned"
        except hvd.CollectiveTimeout as e:
            out["timeout"], out["error"] = e.ranks, str(e)
        except hvd.RankDied as e:
            out["died"], out["error"] = e.ranks, str(e)
    else:
        time.sleep(config["late_s"])
    if opt is not None:
        opt.close()
    print(json.dumps(out))
    hvd.shutdown()


LEARNERS = {"collectives": learner_collectives, "train": learner_train, "early-stop": learner_early_stop,
            "heartbeat": learner_heartbeat, "late-broadcast": learner_late_broadcast}


# ---- the test side ----

def start_learners(server, kind, config, learners, launcher="torchrun"):
    """Starts the learners with a launcher's variables (torchrun or mpirun);
    each start is a new run (its own run id, as a launcher gives)."""
    server.runs = getattr(server, "runs", 0) + 1
    base = {k: v for k, v in os.environ.items()
            if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT")
            and not k.startswith(("OMPI_", "SLURM_", "BLKPS_RUN_ID"))}

    def env_of(rank):
        if launcher == "torchrun":
            env = dict(RANK=str(rank), WORLD_SIZE=str(learners), LOCAL_RANK=str(rank),
                       LOCAL_WORLD_SIZE=str(learners), MASTER_PORT=str(20000 + server.runs))
        else:
            env = dict(OMPI_COMM_WORLD_RANK=str(rank), OMPI_COMM_WORLD_SIZE=str(learners),
                       OMPI_COMM_WORLD_LOCAL_RANK=str(rank), OMPI_COMM_WORLD_LOCAL_SIZE=str(learners),
                       OMPI_MCA_ess_base_jobid=str(server.runs))
        return dict(base, BLKPS_TARGET=server.target, BLKPS_CONTROL=server.control, **env)
    return server.start_learners(config, learners, kind=kind, env_of=env_of)


def run_learners(server, kind, config, learners, launcher="torchrun"):
    return finish(start_learners(server, kind, config, learners, launcher))


def params():
    return hvd.param_count(model(0))


# ---- cases ----

def case_ranks():
    torchrun = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
                "BLKPS_TARGET": "/m/slot{slot}"}
    mpirun = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "6", "OMPI_COMM_WORLD_LOCAL_RANK": "2",
              "OMPI_COMM_WORLD_LOCAL_SIZE": "3", "BLKPS_TARGET": "/m/slot{slot}"}
    slurm = {"SLURM_PROCID": "4", "SLURM_NTASKS": "5", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
             "SLURM_NNODES": "2", "SLURM_TASKS_PER_NODE": "3,2", "BLKPS_TARGET": "/m/slot{slot}"}
    check(not hvd.is_initialized(), "is_initialized before init")
    for name, env, want in (("torchrun", torchrun, (5, 8, 1, 4, 1, 2)), ("mpirun", mpirun, (5, 6, 2, 3, 1, 2)),
                            ("slurm", slurm, (4, 5, 1, 2, 1, 2)), ("none", {"BLKPS_TARGET": "t"}, (0, 1, 0, 1, 0, 1))):
        hvd.init(env=env)
        got = (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size())
        check(got == want, f"{name}: (rank, size, local_rank, local_size, cross_rank, cross_size) = {got}, "
                           f"expected {want}")
    check(hvd.is_initialized(), "is_initialized after init")
    check(hvd.nccl_built() is False and hvd.mpi_threads_supported() is False and hvd.gloo_built() is False,
          "blkps has no NCCL, MPI or Gloo")
    # One learner: the collectives are the identity, no server needed.
    check(hvd.allreduce(torch.tensor([3.0])).tolist() == [3.0], "allreduce of one rank")
    check(hvd.broadcast_object([1, "a"], 0) == [1, "a"], "broadcast_object of one rank")
    compressed, ctx = hvd.Compression.fp16.compress(torch.tensor([1.5]))
    check(compressed.dtype == torch.float16 and hvd.Compression.fp16.decompress(compressed, ctx).dtype
          == torch.float32, "Compression.fp16's compress/decompress")
    check(hvd.Compression.bf16.compress(torch.tensor([1.5]))[0].dtype == torch.bfloat16, "Compression.bf16")
    sgd = torch.optim.SGD(model(0).parameters(), lr=LR)
    refused(lambda: hvd.DistributedOptimizer(sgd, op=hvd.Adasum), ["Adasum"])
    refused(lambda: hvd.DistributedOptimizer(sgd, op=hvd.Sum, gradient_predivide_factor=2.0), ["Average"])
    refused(lambda: hvd.DistributedOptimizer(sgd, backward_passes_per_step=0), ["backward_passes_per_step"])
    refused(lambda: hvd.DistributedOptimizer(sgd, process_set=object()), ["process sets"])
    refused(lambda: hvd.allreduce(torch.ones(1), op=hvd.Adasum), ["Adasum"])
    refused(lambda: hvd.SyncBatchNorm(4), ["SyncBatchNorm", "BatchNorm"])
    refused(lambda: hvd.join(), ["join"])
    refused(lambda: hvd.elastic.run, ["elastic"])
    refused(lambda: hvd.elastic.TorchState, ["elastic"])
    refused(lambda: hvd.EarlyStopping(patience=0), ["patience"])
    hvd.shutdown()
    check(not hvd.is_initialized(), "is_initialized after shutdown")
    print("ranks: torchrun, mpirun, Slurm; flags; refusals in one line")


def case_collectives():
    big = 700_000  # floats: 2.8 MB, several rounds of the 3 ranks' 1.3 MB chunks
    n = 3

    def body(server):
        for launcher in ("torchrun", "mpirun"):
            reports = run_learners(server, "collectives", {"big": big, "timed_calls": 50}, n, launcher)
            ints = np.arange(5) * sum(range(1, n + 1))
            floats = np.array([0.1, 1e-8, 3.0], np.float32)
            # float64 sums of the float32 inputs, in rank order, cast back.
            f64 = [floats.astype(np.float64) * np.float32(k + 1) for k in range(n)]
            avg = ((f64[0] + f64[1] + f64[2]) / n).astype(np.float32)
            for r, rep in enumerate(reports):
                check(rep["sum_int"] == ints.tolist(), f"rank {r}: int sum {rep['sum_int']}")
                check(rep["avg_int"] == (ints // n).tolist(), f"rank {r}: int average {rep['avg_int']}")
                check(np.array_equal(np.float32(rep["avg"]), avg), f"rank {r}: average {rep['avg']} != {avg}")
                check(rep["avg"] == rep["avg_old_spelling"], f"rank {r}: average=True differs")
                check(np.array_equal(np.float32(rep["min"]), floats * 1), f"rank {r}: min {rep['min']}")
                check(np.array_equal(np.float32(rep["max"]), floats * np.float32(n)), f"rank {r}: max")
                want_scaled = ((f64[0] * 2 + f64[1] * 2 + f64[2] * 2) * 0.5).astype(np.float32)
                check(np.array_equal(np.float32(rep["scaled"]), want_scaled), f"rank {r}: pre/postscale")
                check(rep["fp16"] == reports[0]["fp16"] and abs(rep["fp16"][2] - 6.0) < 1e-2,
                      f"rank {r}: fp16 allreduce {rep['fp16']}")
                check(rep["inplace"] == [float(sum(range(n)))] * 3, f"rank {r}: allreduce_ {rep['inplace']}")
                check(rep["async"] == [float(sum(range(n)))], f"rank {r}: allreduce_async {rep['async']}")
                check(rep["big_sum_digest"] == reports[0]["big_sum_digest"], f"rank {r}: big allreduce differs")
                check(rep["big_bf16"] == "torch.bfloat16", f"rank {r}: bf16 allreduce gave {rep['big_bf16']}")
                want_gather = [[k, k] for k in range(n) for _ in range(k + 1)]
                check(rep["gather"] == want_gather, f"rank {r}: allgather {rep['gather']}")
                check(rep["gather_big_rows"] == 1000 * sum(range(1, n + 1)), f"rank {r}: big allgather rows")
                check(rep["bcast"] == [1, 10], f"rank {r}: broadcast from 1 gave {rep['bcast']}")
                check(rep["bcast_"] == [float(n - 1)] * 3, f"rank {r}: broadcast_ gave {rep['bcast_']}")
                check(rep["object"] == {"from": 1, "list": [1, 1, 1]}, f"rank {r}: broadcast_object")
                check(rep["objects"] == [["rank", k] for k in range(n)], f"rank {r}: allgather_object")
                check("rank 0 called" in rep["mismatch"] or "called 'allreduce:left" in rep["mismatch"],
                      f"rank {r}: mismatched calls: {rep['mismatch']}")
                check("allgather:right" in rep["mismatch"] and "allreduce:left" in rep["mismatch"],
                      f"rank {r}: a mismatch must name both calls: {rep['mismatch']}")
            # The big sum, exactly: float64 in rank order, cast to float32.
            data = [np.random.default_rng(k).normal(size=big).astype(np.float32).astype(np.float64) for k in range(n)]
            want = ((data[0] + data[1]) + data[2]).astype(np.float32).astype(np.float64).sum()
            check(reports[0]["big_sum_digest"] == want, "the big allreduce is not the exact rank-order sum")
            mode = server.status()["mode"]
            print(f"collectives ({launcher}, {mode}, {n} ranks): exact; a small allreduce "
                  f"{1e3 * reports[0]['seconds_per_small_allreduce']:.2f} ms "
                  f"({reports[0]['rounds_per_small_allreduce']:g} round), {big * 4 / 1e6:.1f} MB allreduce "
                  f"{reports[0]['seconds_big_allreduce']:.3f} s")
    for mode in ("bsp", "async", "ssp:1"):
        with_server(f"params={params()};rule=sum;mode={mode}", n, body)


def single_process(steps, learners, optimizer, op_scale=1.0, passes=1):
    """Root's model trained in one process as Horovod would: each step the
    learners' gradients (summed over `passes` backward passes) averaged
    (times op_scale: op=Sum gives the sum), then SGD (momentum 0.5 from
    root's buffers of 0.25 in delta mode: with op=Sum the learners' buffers
    add up, so op_scale times that), or plain sgd for gradient mode."""
    m = model(10)
    sgd = torch.optim.SGD(m.parameters(), lr=LR, momentum=0.5 if optimizer == "delta" else 0.0)
    if optimizer == "delta":
        for p in m.parameters():
            sgd.state[p]["momentum_buffer"] = torch.full_like(p, 0.25 * op_scale)
    for step in range(steps):
        total = [torch.zeros_like(p) for p in m.parameters()]
        for r in range(learners):
            for k in range(passes):
                for t, g in zip(total, gradient(m, step * 10 + k, r)):
                    t += g
        for p, t in zip(m.parameters(), total):
            p.grad = t / learners * op_scale
        sgd.step()
    return flat(m)


def case_any_order():
    steps, n = 4, 2

    def body(server):
        for order in ("horovod", "blkps"):
            reports = run_learners(server, "train", {"order": order, "optimizer": "delta", "steps": steps}, n)
            root = np.float32(reports[0]["initial"])
            for r, rep in enumerate(reports):
                check(np.array_equal(np.float32(rep["after_broadcast"]), root),
                      f"{order} order: rank {r} does not hold root's weights after broadcast_parameters")
                check(rep["momentum"] == reports[0]["momentum"] and rep["momentum"][0] != 0,
                      f"{order} order: rank {r}'s momentum is not root's: {rep['momentum']}")
            want = single_process(steps, n, "delta")
            for r, rep in enumerate(reports):
                diff = float(np.max(np.abs(np.float32(rep["weights"]) - want)))
                check(diff < 1e-5, f"{order} order: rank {r} differs from Horovod's result by {diff:g}")
            print(f"{order} order: broadcast_parameters and broadcast_optimizer_state; {steps} steps "
                  f"match one process averaging the gradients (max difference {diff:g})")
            server_weights = server.weights(params())
            check(np.array_equal(server_weights, np.float32(reports[0]["weights"])), "the server's weights differ")
    # A fresh server each order would hide a stale broadcast: one server, two runs.
    with_server(f"params={params()};rule=sum;mode=bsp", n, body)


def case_options():
    steps, n = 3, 2

    def run(bsopts, config, want, what):
        def body(server):
            reports = run_learners(server, "train", dict(config, steps=steps, order="horovod"), n)
            for r, rep in enumerate(reports):
                diff = float(np.max(np.abs(np.float32(rep["weights"]) - want)))
                check(diff < 1e-5, f"{what}: rank {r} differs by {diff:g}")
            if config["optimizer"] == "gradient":
                buckets = reports[0]["buckets"]
                check(reports[0]["pushes"] == steps * buckets,
                      f"{what}: {reports[0]['pushes']} pushes in {steps} steps of {buckets} buckets")
            print(f"{what}: max difference {diff:g} from one process")
        with_server(bsopts, n, body)

    count = params()
    run(f"params={count};rule=sum;mode=bsp", {"optimizer": "delta", "op": "Sum"},
        single_process(steps, n, "delta", op_scale=n), "op=Sum, bsp: the learners' sum")
    run(f"params={count};rule=sum;mode=bsp", {"optimizer": "delta", "predivide": 4.0},
        single_process(steps, n, "delta"), "gradient_predivide_factor=4: still the average")
    run(f"params={count};rule=sgd;lr={LR};mode=bsp", {"optimizer": "gradient", "passes": 2},
        single_process(steps, n, "gradient", passes=2), "backward_passes_per_step=2: one push per step")
    run(f"params={count};rule=sgd;lr={LR};mode=bsp", {"optimizer": "gradient", "synchronize": True},
        single_process(steps, n, "gradient"), "synchronize() and skip_synchronize(): each bucket once")

    def one_async_step(server):  # each push scaled by 1/size: one step moves by the average
        reports = run_learners(server, "train", {"optimizer": "gradient", "steps": 1, "order": "horovod",
                                                 "op": "Average"}, n)
        want = single_process(1, n, "gradient")
        diff = float(np.max(np.abs(server.weights(count) - want)))
        check(diff < 1e-6, f"op=Average, async: the server moved {diff:g} away from the average")
        check(reports[0]["pushes"] == reports[0]["buckets"], "async: one push per bucket")
        print(f"op=Average, async: one step of 2 learners moves by their average (difference {diff:g})")
    # staleness_aware=0: the second push is one update stale, and the server's
    # staleness-aware step (doc/server.md "Asynchronous training") would halve it
    # again; this case checks op=Average's own scaling.
    with_server(f"params={count};rule=sgd;lr={LR};mode=async;staleness_aware=0", n, one_async_step)


def case_compression():
    count = params()

    def bf16(server):
        reports = run_learners(server, "train", {"optimizer": "delta", "steps": 2, "order": "horovod",
                                                 "compression": "bf16"}, 2)
        check(reports[0]["weights"] == reports[1]["weights"], "bf16: the learners differ")
        hvd.init(target=server.target, control=server.control, env={})
        m = model(0)
        words = ["Compression.fp16", "float16", "bfloat16"]
        print("refused:", refused(lambda: hvd.DistributedOptimizer(
            torch.optim.SGD(m.parameters(), lr=LR), named_parameters=m.named_parameters(),
            compression=hvd.Compression.fp16), words))
        refused(lambda: hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=LR),
                                                 named_parameters=m.named_parameters()),
                ["Compression.none", "float32", "bfloat16"])
        hvd.init(target=server.target, env={})  # no control LUN: the device size tells 16-bit
        refused(lambda: hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=LR),
                                                 named_parameters=m.named_parameters()),
                ["Compression.none", "float32", "16-bit"])
        hvd.shutdown()
        print("compression=Compression.bf16 trains through a bfloat16 LUN; mismatches refused")
    with_server(f"params={count};rule=sum;mode=bsp;dtype=bfloat16", 2, bf16)

    def float32(server):
        hvd.init(target=server.target, control=server.control, env={})
        m = model(0)
        print("refused:", refused(lambda: hvd.DistributedOptimizer(
            torch.optim.SGD(m.parameters(), lr=LR), named_parameters=m.named_parameters(),
            compression=hvd.Compression.fp16), ["Compression.fp16", "float16", "float32"]))
        hvd.shutdown()
    with_server(f"params={count};rule=sum;mode=bsp", 1, float32)


def case_early_stop():
    n = 2
    # Averaged: 1.0, 0.8, 0.79, 0.81, 0.78, 0.795 -> with min_delta 0.05 the
    # best stays 0.8 from evaluation 1; patience 3 stops at evaluation 4.
    losses = [[1.1, 0.7, 0.78, 0.82, 0.76, 0.8], [0.9, 0.9, 0.8, 0.8, 0.8, 0.79]]
    config = {"patience": 3, "min_delta": 0.05, "losses": losses}

    def body(server):
        procs = start_learners(server, "early-stop", config, n)
        try:
            with Control(server.control) as control:
                while control.status()["global_step"] < 3:
                    check(all(p.poll() is None for p in procs), "a learner ended before the stop")
                    time.sleep(0.05)
                control.command("stop=1")
                at_command = control.status()["global_step"]
                status, counters = control.status(), control.counters()
        except BaseException:
            for p in procs:
                p.kill()
            raise
        reports = finish(procs)
        check(status["stop"] is True and counters["stop"] == 1, "status and counters do not show the stop")
        steps = [rep["stopped_after_step"] for rep in reports]
        check(steps[0] == steps[1], f"the learners stopped after different steps: {steps}")
        check(steps[0] <= at_command + 2, f"stopped after step {steps[0]}; the stop came at global step "
                                          f"{at_command} (bsp: a learner is at most one step ahead)")
        for r, rep in enumerate(reports):
            check(rep.get("early_stop_at") == 4, f"rank {r}: EarlyStopping stopped at {rep.get('early_stop_at')}")
            check(abs(rep["best"] - 0.8) < 1e-12, f"rank {r}: best {rep['best']}")
            check(rep["stopper_after_stop"], f"rank {r}: EarlyStopping ignored the job's stop")
        print(f"early stop: stop=1 at global step {at_command}, both learners stopped after step {steps[0]}; "
              "EarlyStopping(patience=3, min_delta=0.05) stopped both at evaluation 4")
    with_server(f"params={params()};rule=sum;mode=bsp", n, body)

    def other_paths(server):  # the engine and plain file I/O (the mount) see it too
        with blkps.Engine(server.env["URLS"].split()[0], control_target=server.control) as engine:
            engine.step()
            check(not engine.stop_requested, "the engine saw a stop nobody asked for")
            with Control(server.control) as control:
                control.command("stop=1")
                engine.step()
                check(engine.stop_requested, "the engine did not see stop=1 within one step")
                control.command("stop=0")
                engine.step()
                check(not engine.stop_requested, "the engine still sees a withdrawn stop")
                control.command("stop=1")
                refused_write = None
                try:
                    control.command("stop=yes")
                except OSError:
                    refused_write = control.status()["control_error"]
                check(refused_write and "stop=1 or stop=0" in refused_write, f"stop=yes: {refused_write}")
        shown = subprocess.run([job.BLKPS, "status", "--dir", server.state], capture_output=True, text=True).stdout
        check("stop asked (stop=1)" in shown, f"blkps status does not show the stop:\n{shown}")
        mountpoint = tempfile.mkdtemp(prefix="blkps-horovod-mnt-")
        args = type("Args", (), {"build": build})
        mount = job.mount(args, server.env, server.state, mountpoint)
        try:
            with open(os.path.join(mountpoint, "control"), "rb") as f:
                text = f.read(65536).split(b"\0", 1)[0]
            check(json.loads(text)["stop"] is True, "plain file I/O: the status does not show the stop")
        finally:
            subprocess.run(["fusermount3", "-u", mountpoint], check=False)
            mount.wait()
            os.rmdir(mountpoint)
        print("early stop: the engine and plain file I/O (the mount's control file) see stop=1")
    with_server(f"params={params()};rule=sum;mode=async", 1, other_paths)


# The bound of the two cases below: a rank silent this long is dead.
DEAD_AFTER_S = 5


def case_dead_rank():
    """A rank killed (kill -9) after a collective: the other, waiting in the
    next one, fails with RankDied naming it (within the bound: a broken
    check would wait until ctest's timeout), not after 600 s."""
    os.environ["BLKPS_COLLECTIVE_DEAD_S"] = str(DEAD_AFTER_S)

    def body(server):
        procs = start_learners(server, "heartbeat", {"rank1": "dies"}, 2)
        try:
            check(procs[1].stdout.readline().strip() == "joined", "rank 1 did not join the first allreduce")
            procs[1].kill()
            procs[1].wait()
            out = procs[0].communicate()[0]
            check(procs[0].returncode == 0, f"rank 0 exited with {procs[0].returncode}")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        report = json.loads(out.strip().splitlines()[-1])
        check(report["first"] == [2.0], f"the first allreduce gave {report['first']}")
        check(report.get("died") == [1], f"rank 0 did not name rank 1 dead: {report}")
        check("rank 1: no heartbeat for" in report["error"] and "\n" not in report["error"],
              f"unclear error: {report['error']}")
        status = server.status()
        check(any(r["rank"] == 1 for r in status["ranks"]), f"status shows no rank 1: {status['ranks']}")
        print(f"dead rank: {report['error']}")
    with_server(f"params={params()};rule=sum;mode=async", 2, body)


def case_slow_rank():
    """A rank busy longer than twice the bound between two collectives, but
    alive (its heartbeat goes on), is waited for: both get the sum."""
    os.environ["BLKPS_COLLECTIVE_DEAD_S"] = str(DEAD_AFTER_S)

    def body(server):
        reports = run_learners(server, "heartbeat", {"rank1": "slow", "slow_s": 2.5 * DEAD_AFTER_S}, 2)
        for r, report in enumerate(reports):
            check(report.get("second") == [4.0], f"rank {r}: {report}")
        print(f"slow rank: waited for, {2.5 * DEAD_AFTER_S:g} s busy against a bound of {DEAD_AFTER_S} s")
    with_server(f"params={params()};rule=sum;mode=async", 2, body)


def case_broadcast_timeout():
    """broadcast_parameters(timeout_s=2) waits for a live rank that does not
    join no longer than that, before DistributedOptimizer and after it: it
    raises CollectiveTimeout naming the rank, in one line (ignoring the
    timeout, it would wait until the rank ends and call it dead)."""
    def body(server):
        for order in ("horovod", "blkps"):
            reports = run_learners(server, "late-broadcast", {"order": order, "timeout_s": 2, "late_s": 12}, 2)
            check(reports[0].get("timeout") == [1], f"{order} order: rank 0 did not time out on rank 1: {reports[0]}")
            check("within its timeout of 2 s" in reports[0]["error"] and "\n" not in reports[0]["error"],
                  f"unclear error: {reports[0]['error']}")
            print(f"{order} order: {reports[0]['error']}")
    with_server(f"params={params()};rule=sum;mode=async", 2, body)


CASES = {
    "ranks": case_ranks,
    "collectives": case_collectives,
    "any-order": case_any_order,
    "options": case_options,
    "compression": case_compression,
    "early-stop": case_early_stop,
    "dead-rank": case_dead_rank,
    "slow-rank": case_slow_rank,
    "broadcast-timeout": case_broadcast_timeout,
}

if __name__ == "__main__":
    testbed.run(CASES, lambda kind, config: LEARNERS[kind](config))
