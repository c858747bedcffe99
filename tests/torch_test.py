#!/usr/bin/python3
"""blkps.torch against a real tgtd: each case starts its own server and
learner processes (tests/testbed.py: RANK/WORLD_SIZE set as a launcher
would) and compares the result with a single-process PyTorch reference.

  torch_test.py <repo> <build dir> <case>

Cases: init (no server), gradient-mode, delta-mode, delta-async, delta-async-leaver,
gradient-async-leaver, look-ahead, buckets,
mismatch, broadcast, buffers, tied-parts, tied-early, tied-rows-first, tied-rows-order,
tied-refusals, tied-max-norm, fashion-lib, fashion-mount.
"""
import json
import subprocess
import sys
import time

import numpy as np

import testbed
from testbed import check, fail, with_server

top, build, _ = testbed.setup("torch_test")
import torch  # noqa: E402
import torch_fashion_job as job  # noqa: E402  (the fashion cases' job)

import blkps.torch as bps  # noqa: E402
import blkps.torch.optimizer as core  # noqa: E402
import torch_transports  # noqa: E402

torch.set_num_threads(1)
STEPS = 8
BATCH = 16
SMALL_BUCKET = 4096  # bytes: the MLP's 6,154 parameters make 7 buckets
TOLERANCE = 1e-6


# ---- models and data, the same in learners and reference ----

def mlp(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                               torch.nn.ReLU(), torch.nn.Linear(64, 10))


def bn_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.BatchNorm1d(20), torch.nn.Linear(20, 10))


class TinyGpt(torch.nn.Module):
    """A GPT-like model with a tied input/output embedding: position rows
    [0, 384), the token rows (the tied weight) [384, 1344), one mixing
    layer [1344, 1944); the output head reads the token rows again."""
    VOCAB, WIDTH, CONTEXT = 40, 24, 16

    def __init__(self):
        super().__init__()
        self.pos = torch.nn.Embedding(self.CONTEXT, self.WIDTH)
        self.tok = torch.nn.Embedding(self.VOCAB, self.WIDTH)
        self.mix = torch.nn.Linear(self.WIDTH, self.WIDTH)
        self.head = torch.nn.Linear(self.WIDTH, self.VOCAB, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, ids):
        h = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        return self.head(torch.tanh(self.mix(h)))


def tiny_gpt(seed):
    torch.manual_seed(seed)
    return TinyGpt()


MODELS = {"mlp": mlp, "bn": bn_model, "gpt": tiny_gpt}
# The tied model's server: blocks of 256 parameters; parts= the blocks of
# the token rows [384, 1344) and their neighbours (position rows, the mixing
# layer's first weights), as the refusal of a server without parts names them.
GPT_PARTS = "parts=256:1280:2"


def batch(step, rank, model_name="mlp"):
    rng = np.random.default_rng(1000 * step + rank)
    if model_name == "gpt":  # 4 sequences of 8 tokens, each predicting the next
        ids = torch.from_numpy(rng.integers(0, TinyGpt.VOCAB, (4, 9)))
        return ids[:, :-1], ids[:, 1:]
    x = torch.from_numpy(rng.normal(size=(BATCH, 20)).astype(np.float32))
    y = torch.from_numpy(rng.integers(0, 10, BATCH))
    return x, y


def loss_of(model, x, y):
    out = model(x)
    return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


def reference(model_name, learners, steps, lr):
    """Root's initial model trained in one process: each step, SGD on the
    mean of the learners' gradients (what a bsp round applies)."""
    model = MODELS[model_name](0)
    for t in range(steps):
        grads = []
        for r in range(learners):
            model.zero_grad()
            loss_of(model, *batch(t, r, model_name)).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        with torch.no_grad():
            for k, p in enumerate(model.parameters()):
                p -= lr * (sum(g[k] for g in grads) / learners)
    return flat(model)


# ---- the learner process ----

def late_stamps():
    """The learners start together; root builds its optimizer half a second
    later, and the others, which have read the model's tag before that (none
    yet), stamp it two seconds after: after root's broadcast mark, unless
    root waits for every learner before it marks."""
    bps.barrier()
    if bps.rank() == 0:
        time.sleep(0.5)
        return
    check_device = core.check_device

    def stamp_late(layout, device, ctl, *args):
        command = ctl.command

        def slow(*lines):
            time.sleep(2.0)
            return command(*lines)
        ctl.command = slow
        try:
            return check_device(layout, device, ctl, *args)
        finally:
            del ctl.command
    core.check_device = stamp_late


def learner(config):
    """Trains as rank $RANK; prints one JSON line of what it saw."""
    bps.init()
    model = MODELS[config["model"]](config["seed"] + bps.rank())  # root's seed is config's
    local = (torch.optim.SGD(model.parameters(), lr=config["lr"])
             if config["optimizer"] == "delta" else None)
    if config.get("late_stamps"):
        late_stamps()
    # slow_exchanges: each exchange, or push, takes 0.2 s longer to start,
    # so the buckets that backward finishes meanwhile queue up behind it.
    # late_pull_rank: that learner pulls the broadcast weights (and each
    # delta step's) a second late: a learner that stepped before everyone
    # had pulled would move them first.
    delays = {"push": 0.2} if config.get("slow_exchanges") else {}
    if config.get("late_pull_rank") == bps.rank():
        delays["pull"] = 1.0
    transport = torch_transports.Transport(delays)
    opt = bps.DistributedOptimizer(local, named_parameters=model.named_parameters(),
                                   tied_head=model.head if config.get("tied_head") else None,
                                   bucket_bytes=config.get("bucket_bytes", SMALL_BUCKET),
                                   look_ahead=config.get("look_ahead"),
                                   pull_during_backward=config.get("pull_during_backward"),
                                   overlap_pull=config.get("overlap_pull"), transport=transport)
    out = {"initial": flat(model).tolist() if config.get("report_initial") else None}
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    out["after_broadcast"] = flat(model).tolist() if config.get("report_initial") else None
    # overlap_probe: the first layer's gradient comes last in backward: wait
    # there until the communication thread has pushed a bucket, so a push
    # that only happened in step() would time out here. tied_probe: the
    # same for the head's part of the tied weight, waited for where the
    # weight's gradient is complete (its rows' part still to push).
    probe = ((model[0].weight, lambda: opt.pushes) if config.get("overlap_probe") else
             (model.tok.weight, lambda: opt.part_pushes) if config.get("tied_probe") else None)
    if probe:
        seen = []
        counted = probe[1]

        def wait_for_push(grad):
            if pushes_before[0] is None:
                return
            deadline = time.monotonic() + 20
            while counted() == pushes_before[0] and time.monotonic() < deadline:
                time.sleep(0.001)
            seen.append(counted() - pushes_before[0])
        probe[0].register_hook(wait_for_push)
        pushes_before = [None]
    for t in range(config["steps"]):
        if probe:
            pushes_before[0] = counted() if t < 2 else None  # probe the first two steps
        opt.zero_grad()
        loss_of(model, *batch(t, bps.rank(), config["model"])).backward()
        opt.step()
    if config.get("overlap_pull"):
        opt.drain()  # step() returned before the weights arrived
    out.update(pushes=opt.pushes, part_pushes=opt.part_pushes, transfers=opt.transfers, steps=opt.steps,
               buckets=len(getattr(opt, "buckets", [])), weights=flat(model).tolist(), look_ahead=opt.look_ahead)
    if probe:
        out["pushed_during_backward"] = seen
    if opt.rows_first is not None:
        out["rows_first"] = {"order": list(opt.rows_first.order), "rows": opt.rows_first.rows}
    if config["model"] == "bn":
        out["running_mean"] = model[0].running_mean.tolist()
    if config.get("double_backward"):
        opt.zero_grad()
        x, y = batch(0, 0)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        first = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        torch.nn.functional.cross_entropy(model(x), y).backward()
        second = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        out["second_gradient_kept_out"] = bool(torch.equal(first, second))
        try:
            opt.step()
            out["double_backward"] = "accepted"
        except RuntimeError as e:
            out["double_backward"] = str(e)
    opt.close()
    print(json.dumps(out), flush=True)


def learner_leaver(config):
    """A constant gradient, rank+1 on every weight (delta mode: SGD with lr
    1; gradient mode: pushed as it is): every rank steps once from zeros;
    then the last rank leaves, and the others push empty steps (which keep
    them counted) until the server no longer counts it, then step once
    more. Reports the look-ahead of each phase."""
    bps.init()
    model = torch.nn.Linear(32, 32, bias=False)
    torch.nn.init.zeros_(model.weight)
    local = torch.optim.SGD(model.parameters(), lr=1.0) if config["optimizer"] == "delta" else None
    opt = bps.DistributedOptimizer(local, named_parameters=model.named_parameters())
    bps.broadcast_parameters(model.state_dict(), root_rank=0)

    def step(gradient):
        opt.zero_grad()
        if gradient:
            (model.weight.sum() * (bps.rank() + 1)).backward()
        opt.step()
    step(True)
    bps.barrier()  # every first push has landed
    out = {"look_ahead_all": opt.look_ahead}
    if bps.rank() < bps.size() - 1:
        from blkps.control import Control
        with Control(bps.control()) as control:
            deadline = time.monotonic() + config["wait_s"]
            while control.counters()["pushing_learners"] != bps.size() - 1:
                check(time.monotonic() < deadline, "the server still counts the learner that left")
                step(False)
        step(True)
        out["look_ahead_after"] = opt.look_ahead
    opt.close()
    print(json.dumps(out), flush=True)


LEARNERS = {"leaver": learner_leaver}


def run_learner(*kind_and_config):
    """A learner process: `learner`, or the LEARNERS kind named first."""
    *kind, config = kind_and_config
    (LEARNERS[kind[0]] if kind else learner)(config)


# ---- the test side ----

def params_of(model_name):
    return bps.param_count(MODELS[model_name](0))


def check_close(got, want, what):
    diff = float(np.max(np.abs(np.asarray(got, np.float32) - want)))
    check(diff <= TOLERANCE, f"{what}: max difference {diff:g} from the single-process reference")
    return diff


def case_init():
    env = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
           "BLKPS_TARGET": "iscsi://h:3260/iqn.x:m/{slot}", "BLKPS_CONTROL": "/mnt/model/control"}
    bps.init(env=env)
    check((bps.rank(), bps.size(), bps.local_rank()) == (2, 4, 0), "mpirun's rank and size")
    check(bps.target() == "iscsi://h:3260/iqn.x:m/3", f"{{slot}} gave {bps.target()}")
    check(bps.control() == "/mnt/model/control", "the control LUN")
    bps.init(target="layout:/d/slot-{slot}.layout", env={"RANK": "1", "WORLD_SIZE": "2"})
    check(bps.target() == "layout:/d/slot-2.layout" and bps.local_rank() == 1, "torchrun's rank")
    bps.init(target="/m/r{rank}", env={"SLURM_PROCID": "3", "SLURM_NTASKS": "5"})
    check((bps.target(), bps.size()) == ("/m/r3", 5), "Slurm's rank")
    bps.init(target="/m/slot{slot}", env={})
    check((bps.rank(), bps.size(), bps.target()) == (0, 1, "/m/slot1"), "no launcher: rank 0 of 1")
    for env, words in (({}, "BLKPS_TARGET"), ({"RANK": "x", "BLKPS_TARGET": "t"}, "RANK='x'"),
                       ({"RANK": "2", "WORLD_SIZE": "2", "BLKPS_TARGET": "t"}, "not below")):
        try:
            bps.init(env=env)
            fail(f"init accepted {env}")
        except ValueError as e:
            check(words in str(e), f"unclear error: {e}")
    model = bn_model(0)
    check(bps.param_count(model) == 20 + 20 + 20 * 10 + 10, "param_count counts buffers")
    check(bps.fingerprint(model) != bps.fingerprint(mlp(0)), "fingerprints of two models agree")


def exact_case(optimizer, rule):
    lr = 0.1
    count = params_of("mlp")

    def body(server):
        config = {"model": "mlp", "optimizer": optimizer, "lr": lr, "steps": STEPS, "seed": 0,
                  "report_initial": True}
        reports = server.run_learners(config, 2)
        check(all(r["look_ahead"] == 0.0 for r in reports), "bsp: a learner took a look-ahead step")
        status = server.status()
        check(all(lun["deaths"] == 0 for lun in status["learners"]),
              "a learner was declared dead (a round went on without it): the comparison is void")
        want = reference("mlp", 2, STEPS, lr)
        for rank, r in enumerate(reports):
            check_close(r["weights"], want, f"learner {rank}'s final weights")
        diff = check_close(server.weights(count), want, "the server's weights")
        check(status["global_step"] == STEPS, f"{status['global_step']} bsp rounds, expected {STEPS}")
        for lun in status["learners"]:  # every parameter once per step, whole blocks
            check(lun["bytes_written"] == STEPS * status["device_bytes"],
                  f"LUN {lun['lun']} wrote {lun['bytes_written']} bytes in {STEPS} steps "
                  f"of {status['device_bytes']}")
        print(f"{optimizer} mode: 2 learners, bsp, {STEPS} steps: max difference {diff:g}")
    with_server(f"params={count};rule={rule};lr={lr};mode=bsp", 2, body)


def case_delta_async():
    """Delta mode in async pushes 1/size of each local step (the server's
    sum stays exact): two learners' first steps, taken from the same
    weights, move the server by their average, as one process on both
    batches would (even when one pulls the broadcast weights late: nobody
    steps before all have pulled); one learner pushes its whole step,
    exactly as before."""
    lr = 0.1
    count = params_of("mlp")

    def two_learners(server):
        config = {"model": "mlp", "optimizer": "delta", "lr": lr, "steps": 1, "seed": 0,
                  "late_pull_rank": 1}
        reports = server.run_learners(config, 2)
        check(all(r["look_ahead"] == 0.5 for r in reports), "2 async learners: look_ahead is not 1/2 by default")
        diff = check_close(server.weights(count), reference("mlp", 2, 1, lr), "2 learners, async: the server")
        print(f"delta mode, async, 2 learners: one step each moves the server by their average "
              f"(max difference {diff:g})")

    def one_learner(server):
        config = {"model": "mlp", "optimizer": "delta", "lr": lr, "steps": STEPS, "seed": 0}
        r = server.run_learners(config, 1)[0]
        check(r["look_ahead"] == 0.0, "1 learner: a look-ahead step by default")
        want = reference("mlp", 1, STEPS, lr)
        check_close(r["weights"], want, "1 learner, async: its weights")
        diff = check_close(server.weights(count), want, "1 learner, async: the server")
        print(f"delta mode, async, 1 learner: {STEPS} whole steps (max difference {diff:g})")
    with_server(f"params={count};rule=sum;mode=async", 2, two_learners)
    with_server(f"params={count};rule=sum;mode=async", 1, one_learner)


def case_async_leaver(optimizer):
    """Async learners take the server's N (pushing_learners), not the
    launcher's size: 3 learners' first steps are 1/3 of a round each (the
    launcher's size while the server has not counted them all); once one
    has stopped pushing for dead_after, the other two look ahead by 1/2, not
    2/3, and in delta mode push 1/2 of their steps. Gradient mode pushes
    gradients unscaled (the server's rule scales them; here sum)."""
    count, dead_after = 32 * 32, 3

    def body(server):
        reports = server.run_learners({"wait_s": 20 * dead_after, "optimizer": optimizer}, 3, kind="leaver")
        check(all(r["look_ahead_all"] == 2 / 3 for r in reports),
              f"first steps of 3 learners: look-ahead {[r['look_ahead_all'] for r in reports]}, not 2/3")
        check(all(r["look_ahead_after"] == 0.5 for r in reports[:2]),
              f"2 learners pushing: look-ahead {[r['look_ahead_after'] for r in reports[:2]]}, not 1/2")
        # Delta: -(1+2+3)/3 in the first round, then -(1+2)/2 by the two
        # that push. Gradient: the gradients, summed.
        want = np.full(count, -(6 / 3 + 3 / 2) if optimizer == "delta" else 6 + 3, np.float32)
        diff = check_close(server.weights(count), want, f"{optimizer} mode: the server after 3 learners, then 2")
        check(server.status()["pushing_learners"] <= 2, "the learner that left is counted")
        print(f"{optimizer} mode, async: 3 learners take 1/3 of a round, then 2 take 1/2 (max difference {diff:g})")
    with_server(f"params={count};rule=sum;mode=async;dead_after={dead_after}", 3, body)


def case_look_ahead():
    """The look-ahead (doc/async.md "Look-ahead"): after each pull the
    parameters are the server's weights plus look_ahead times the server's
    move since the previous pull, and the next gradient is taken there; the
    server applies the push as usual. One async learner with look_ahead 1/2,
    in delta mode (server sum, the local SGD step pushed) and in gradient
    mode (server sgd, the gradient pushed in 1024-float buckets, pulled
    during backward), against the same in one process: both take
    w -= lr·(gradient at the look-ahead point). Gradient mode once more
    with slow exchanges: the buckets queued meanwhile go in one exchange
    (fewer exchanges than pushes, which need not hold without), with the
    same result; and once with slow pushes, pulling after step(): the
    pushes queued meanwhile go in one, and a step's pulls in batches that
    double from one bucket (fewer transfers than a push and a pull per
    bucket), with the same result."""
    lr, k = 0.1, 0.5
    count = params_of("mlp")
    model = MODELS["mlp"](0)
    server_w = flat(model)
    last = torch.from_numpy(server_w)  # broadcast_parameters' pull: no move, the first pull's baseline
    for t in range(STEPS):
        model.zero_grad()
        x, y = batch(t, 0)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        with torch.no_grad():
            before = torch.nn.utils.parameters_to_vector(model.parameters())
            for p in model.parameters():
                p -= lr * p.grad
            server_w = server_w + (torch.nn.utils.parameters_to_vector(model.parameters()) - before).numpy()
            pulled = torch.from_numpy(server_w)
            ahead = pulled + k * (pulled - last)
            last = pulled
            torch.nn.utils.vector_to_parameters(ahead.clone(), model.parameters())
    want_learner = flat(model)

    for optimizer, rule, slow, during in (("delta", "sum", False, None), ("gradient", f"sgd;lr={lr}", False, None),
                                          ("gradient", f"sgd;lr={lr}", True, None),
                                          ("gradient", f"sgd;lr={lr}", True, False)):
        def body(server):
            config = {"model": "mlp", "optimizer": optimizer, "lr": lr, "steps": STEPS, "seed": 0,
                      "look_ahead": k, "slow_exchanges": slow, "pull_during_backward": during}
            r = server.run_learners(config, 1)[0]
            check(r["look_ahead"] == k, f"{optimizer} mode: look_ahead {r['look_ahead']}, asked for {k}")
            if optimizer == "gradient":
                check(r["pushes"] == STEPS * r["buckets"], f"{r['pushes']} pushes of {r['buckets']} buckets")
                unmerged = r["pushes"] * (1 if during is None else 2)  # a call per bucket and direction
                check(r["transfers"] < unmerged or not slow,
                      f"slow transfers: {r['transfers']} device calls for {r['pushes']} pushes, none merged")
            diff = check_close(server.weights(count), server_w, f"{optimizer} mode: the server's weights")
            check_close(r["weights"], want_learner,
                        f"{optimizer} mode: the learner's parameters (the look-ahead point)")
            moved = float(np.max(np.abs(want_learner - server_w)))
            check(moved > 100 * TOLERANCE, f"the look-ahead point is the server's weights (moved {moved:g})")
            schedule = "" if during is None else ", pulled after step()"
            print(f"{optimizer} mode{schedule}, look-ahead {k}: {STEPS} steps, server and parameters as in one "
                  f"process (max difference {diff:g})")
        with_server(f"params={count};rule={rule};mode=async", 1, body)


def case_buckets():
    lr = 0.1
    count = params_of("mlp")

    def body(server):
        config = {"model": "mlp", "optimizer": "gradient", "lr": lr, "steps": STEPS, "seed": 0,
                  "overlap_probe": True, "double_backward": True}
        r = server.run_learners(config, 1)[0]
        check(r["buckets"] == 7, f"{r['buckets']} buckets, expected 7 of 1024 floats")
        check(r["pushes"] == STEPS * r["buckets"],
              f"{r['pushes']} bucket pushes in {STEPS} steps of {r['buckets']} buckets")
        check(all(n >= 1 for n in r["pushed_during_backward"]),
              f"no bucket pushed while backward ran: {r['pushed_during_backward']}")
        check("second gradient" in r["double_backward"], f"a second backward: {r['double_backward']}")
        check(r["second_gradient_kept_out"], "a second backward's gradient reached the pushed buffer")
        # async: each bucket's weights were pulled during backward; still exact.
        check_close(r["weights"], reference("mlp", 1, STEPS, lr), "async weights")
        print(f"buckets: {r['pushes']} pushes in {STEPS} steps, during backward: "
              f"{r['pushed_during_backward']}")
    with_server(f"params={count};rule=sgd;lr={lr};mode=async", 1, body)


def case_mismatch():
    count = params_of("mlp")

    def body(server):
        bps.init(target=server.target, control=server.control, env={})
        before = server.weights(count)
        bigger = torch.nn.Sequential(torch.nn.Linear(20, 65), torch.nn.Linear(65, 10))
        renamed = torch.nn.Sequential()  # the same shapes under other names
        for name, layer in (("a", torch.nn.Linear(20, 64)), ("b", torch.nn.ReLU()), ("c", torch.nn.Linear(64, 64)),
                            ("d", torch.nn.ReLU()), ("e", torch.nn.Linear(64, 10))):
            renamed.add_module(name, layer)
        bps.DistributedOptimizer(None, named_parameters=mlp(0).named_parameters()).close()  # stamps
        for model, words in ((bigger, f"has {bps.param_count(bigger)} parameters but the device holds {count}"),
                             (renamed, "fingerprint")):
            try:
                bps.DistributedOptimizer(None, named_parameters=model.named_parameters())
                fail(f"a mismatched model was accepted ({words})")
            except ValueError as e:
                check(words in str(e) and "\n" not in str(e), f"unclear refusal: {e}")
                print(f"refused: {e}")
        check(np.array_equal(server.weights(count), before), "a refusal changed the weights")
        bps.init(target=server.target, env={})  # no control LUN: the device size decides
        try:
            bps.DistributedOptimizer(None, named_parameters=bigger.named_parameters())
            fail("a bigger model was accepted without a control LUN")
        except ValueError as e:
            check("parameters but the device holds" in str(e), f"unclear refusal: {e}")
    with_server(f"params={count};rule=sgd;lr=0.1;mode=async", 1, body)


def case_broadcast():
    count = params_of("mlp")

    def body(server):
        config = {"model": "mlp", "optimizer": "gradient", "lr": 0.1, "steps": 0, "seed": 5,
                  "report_initial": True, "late_stamps": True}
        reports = server.run_learners(config, 3)
        root = np.asarray(reports[0]["initial"], np.float32)
        check(not np.array_equal(np.asarray(reports[1]["initial"], np.float32), root),
              "the learners started equal: nothing to broadcast")
        for rank, r in enumerate(reports):
            check(np.array_equal(np.asarray(r["after_broadcast"], np.float32), root),
                  f"learner {rank} does not hold root's weights after broadcast_parameters")
        check(np.array_equal(server.weights(count), root), "the server does not hold root's weights")
        check(server.status()["tag"] == f"torch:{bps.fingerprint(mlp(0))}:broadcast",
              f"tag {server.status()['tag']}")
        print("broadcast: 3 learners hold root's weights")
    with_server(f"params={count};rule=sgd;lr=0.1;mode=bsp", 3, body)


def case_buffers():
    count = params_of("bn")

    def body(server):
        config = {"model": "bn", "optimizer": "gradient", "lr": 0.1, "steps": 3, "seed": 0}
        reports = server.run_learners(config, 2)
        for rank, r in enumerate(reports):  # BatchNorm's running mean: this learner's batches only
            want = torch.zeros(20)
            for t in range(3):
                want = 0.9 * want + 0.1 * batch(t, rank)[0].mean(0)
            check(np.allclose(r["running_mean"], want.numpy(), atol=1e-6),
                  f"learner {rank}'s running mean is not its own batches'")
        check(not np.allclose(reports[0]["running_mean"], reports[1]["running_mean"]),
              "the learners' running means agree")
        check(np.array_equal(reports[0]["weights"], reports[1]["weights"]), "the parameters differ")
        print("buffers: each learner keeps its own running statistics; the parameters are shared")
    with_server(f"params={count};rule=sgd;lr=0.1;mode=bsp", 2, body)


def case_tied_parts():
    """A tied input/output embedding through a server that takes its blocks
    in two parts (parts=): 2 bsp learners push the head's part as the
    head's backward ends and the rest at the end of backward; the model
    equals the one-process reference (autograd's one sum of both uses'
    gradients) and the server saw each learner write the range twice a
    round."""
    lr = 0.1
    count = params_of("gpt")
    first, span, _ = (int(v) for v in GPT_PARTS.split("=")[1].split(":"))

    def body(server):
        config = {"model": "gpt", "optimizer": "gradient", "lr": lr, "steps": STEPS, "seed": 0, "tied_head": True}
        reports = server.run_learners(config, 2)
        status = server.status()
        check(all(lun["deaths"] == 0 for lun in status["learners"]),
              "a learner was declared dead (a round went on without it): the comparison is void")
        check(all(r["part_pushes"] == STEPS for r in reports),
              f"head parts pushed: {[r['part_pushes'] for r in reports]}, expected {STEPS} each")
        want = reference("gpt", 2, STEPS, lr)
        for rank, r in enumerate(reports):
            check_close(r["weights"], want, f"learner {rank}'s final weights")
        diff = check_close(server.weights(count), want, "the server's weights")
        check(status["global_step"] == STEPS, f"{status['global_step']} bsp rounds, expected {STEPS}")
        for lun in status["learners"]:  # the whole model once and the parts range once more, a round
            check(lun["bytes_written"] == STEPS * (status["device_bytes"] + 4 * span),
                  f"LUN {lun['lun']} wrote {lun['bytes_written']} bytes in {STEPS} steps: expected the model "
                  f"({status['device_bytes']}) and the head's part of [{first}, {first + span}) each step")
        print(f"tied weight in 2 parts: 2 learners, bsp, {STEPS} steps: max difference {diff:g}")
    with_server(f"params={count};rule=sgd;lr={lr};mode=bsp;block=1K;{GPT_PARTS}", 2, body)


def case_tied_rows_first():
    """With overlap_pull, the tied weight's token rows are read first, by
    the embedding's forward pre-hook, from the round's blocks; 2 bsp
    learners still equal the one-process reference (rows left as the
    previous round's, or read from the wrong place, would not)."""
    lr = 0.1
    count = params_of("gpt")

    def body(server):
        config = {"model": "gpt", "optimizer": "gradient", "lr": lr, "steps": STEPS, "seed": 0, "tied_head": True,
                  "overlap_pull": True}
        reports = server.run_learners(config, 2)
        check(all(lun["deaths"] == 0 for lun in server.status()["learners"]),
              "a learner was declared dead (a round went on without it): the comparison is void")
        check(all(r["rows_first"]["rows"] > 0 for r in reports), "no token rows were read first")
        want = reference("gpt", 2, STEPS, lr)
        for rank, r in enumerate(reports):
            check_close(r["weights"], want, f"learner {rank}'s final weights")
        diff = check_close(server.weights(count), want, "the server's weights")
        print(f"tied weight, token rows first: 2 learners, bsp, {STEPS} steps: max difference {diff:g}")
    with_server(f"params={count};rule=sgd;lr={lr};mode=bsp;block=1K;{GPT_PARTS}", 2, body)


def case_tied_rows_order():
    """With overlap_pull, each forward after the second step() (the first
    step() learns which modules read the weight) reads the batch's distinct
    token rows of the tied weight before the whole matrix's pull is even
    queued: the embedding waits for its rows only, the output head for the
    matrix."""
    count = params_of("gpt")

    def body(server):
        config = {"model": "gpt", "optimizer": "gradient", "lr": 0.1, "steps": 4, "seed": 0, "tied_head": True,
                  "overlap_pull": True}
        r = server.run_learners(config, 1)[0]["rows_first"]
        # The last matrix: the one drain() queues before the weights are read.
        check(r["order"] == ["rows", "matrix"] * 2 + ["matrix"],
              f"the tied weight's pulls in order: {r['order']}, expected the rows, then the matrix, each step")
        distinct = sum(len(set(batch(t, 0, "gpt")[0].reshape(-1).tolist())) for t in (2, 3))
        check(r["rows"] == distinct, f"{r['rows']} token rows read first, expected the batches' {distinct} distinct")
        print(f"tied weight: steps 3 and 4 read their {distinct} distinct token rows, then pulled the matrix")
    with_server(f"params={count};rule=sgd;lr=0.1;mode=bsp;block=1K;{GPT_PARTS}", 1, body)


def case_tied_early():
    """The head's part of the tied weight is pushed while backward still
    runs: before the weight's whole gradient (the rows' part) is complete."""
    count = params_of("gpt")

    def body(server):
        config = {"model": "gpt", "optimizer": "gradient", "lr": 0.1, "steps": 2, "seed": 0, "tied_head": True,
                  "tied_probe": True}
        r = server.run_learners(config, 1)[0]
        check(r["pushed_during_backward"] == [1, 1],
              f"head parts pushed before the end of backward, by step: {r['pushed_during_backward']}, expected [1, 1]")
        print(f"tied weight: the head's part pushed during backward in each step {r['pushed_during_backward']}")
    with_server(f"params={count};rule=sgd;lr=0.1;mode=bsp;block=1K;{GPT_PARTS}", 1, body)


def case_tied_refusals():
    """A server that takes a range in parts and a learner that pushes it
    once (its rounds would wait until hold_limit), and a tied_head for a
    server without parts=, are refused in one line saying what to give."""
    count = params_of("gpt")
    for bsopts, tied, words in ((f"mode=bsp;block=1K;{GPT_PARTS}", False, "give tied_head="),
                                ("mode=bsp;block=1K", True, f"--bsopts \"mode=bsp;{GPT_PARTS}\"")):
        with testbed.Server(f"params={count};rule=sgd;lr=0.1;{bsopts}", 1) as server:
            bps.init(target=server.target, control=server.control, env={})
            model = tiny_gpt(0)
            try:
                bps.DistributedOptimizer(None, named_parameters=model.named_parameters(),
                                         tied_head=model.head if tied else None).close()
                fail(f"tied_head={tied} was accepted by a server with {bsopts}")
            except ValueError as e:
                check(words in str(e) and "\n" not in str(e), f"unclear refusal: {e}")
                print(f"refused: {e}")


def case_tied_max_norm():
    """Token rows first with an nn.Embedding that renormalises its rows in
    place (max_norm: the matrix's pull would overwrite them) is refused at
    the first step, in one line saying what to give."""
    count = params_of("gpt")
    with testbed.Server(f"params={count};rule=sgd;lr=0.1;mode=bsp;block=1K;{GPT_PARTS}", 1) as server:
        bps.init(target=server.target, control=server.control, env={})
        model = tiny_gpt(0)
        model.tok.max_norm = 1.0
        opt = bps.DistributedOptimizer(None, named_parameters=model.named_parameters(), tied_head=model.head,
                                       overlap_pull=True)
        try:
            loss_of(model, *batch(0, 0, "gpt")).backward()
            opt.step()
            fail("an embedding with max_norm was accepted for token rows first")
        except ValueError as e:
            check("max_norm=None" in str(e) and "\n" not in str(e), f"unclear refusal: {e}")
            print(f"refused: {e}")
        finally:
            opt.close()


def case_fashion(via):
    out = subprocess.run([sys.executable, job.__file__, "--learners", "2", "--mode", "bsp", "--via", via,
                          "--build", build, "--epochs", "4", "--train-subset", "6000",
                          "--min-accuracy", "0.80"], stdout=subprocess.PIPE, text=True)
    print(out.stdout, end="")
    check(out.returncode == 0, f"the job failed ({out.returncode})")
    result = json.loads(out.stdout.split("result: ", 1)[1].splitlines()[0])
    check(result["accuracy"] >= 0.80, f"held-out accuracy {result['accuracy']}")


CASES = {
    "init": case_init,
    "gradient-mode": lambda: exact_case("gradient", "sgd"),
    "delta-mode": lambda: exact_case("delta", "sum"),
    "delta-async": case_delta_async,
    "delta-async-leaver": lambda: case_async_leaver("delta"),
    "gradient-async-leaver": lambda: case_async_leaver("gradient"),
    "look-ahead": case_look_ahead,
    "buckets": case_buckets,
    "mismatch": case_mismatch,
    "broadcast": case_broadcast,
    "buffers": case_buffers,
    "tied-parts": case_tied_parts,
    "tied-early": case_tied_early,
    "tied-rows-first": case_tied_rows_first,
    "tied-rows-order": case_tied_rows_order,
    "tied-max-norm": case_tied_max_norm,
    "tied-refusals": case_tied_refusals,
    "fashion-lib": lambda: case_fashion("lib"),
    "fashion-mount": lambda: case_fashion("mount"),
}

if __name__ == "__main__":
    testbed.run(CASES, run_learner)
