#!/usr/bin/python3
"""blkps.torch's device data path (doc/gpu.md), run on CPU tensors: the
same code a CUDA model takes, less the streams. Cases without a server use
a plain file as the model device (a push writes the values, a pull reads
them back); the others start their own tgtd (tests/testbed.py).

  gpu_test.py <repo> <build dir> <case>

Cases:
  wire-patterns  libblkps's 16-bit conversion (blkps/wire_dtype.hpp) equals
                 torch's for all 65,536 bfloat16 and float16 patterns
                 (widening) and a float32 set with ties, NaN, Inf and
                 denormals (narrowing); push16/pull16 move them as is.
  staging        the flat buffers and host staging: allocated once, the
                 parameters stay views, a 16-bit wire narrows with torch.
  look-ahead-switched
                 a look-ahead turned on between steps (the server's count of
                 pushing learners grew) steps from the second pull after it.
  pipeline       overlap_pull gives the same weights as waiting in step();
                 each module's forward waits for its own buckets only, and
                 nn.MultiheadAttention for its out_proj's too, which it reads
                 without calling out_proj (with slow pulls: same outputs).
  overlap-server overlap_pull against a tgtd: bsp (2 learners) and async (1)
                 equal the single-process reference.
  skipped        a step with inf gradients, or one GradScaler skipped, is
                 not pushed; bsp still counts a write of every parameter.
  layout         a channels_last convolution keeps its layout in the flat
                 buffers (and the fingerprint says so); 2 learners equal the
                 single-process reference.
  cuda           gradient and delta mode on a CUDA model equal a CPU
                 single-process reference (2 learners, bsp); exits 77
                 (skipped) without a CUDA device.
  cuda-async     async with 1 learner on CUDA, pulling during backward or
                 after step(), equals the reference; pipelined (the
                 default there), the one-step-delayed reference, on both
                 wires; 77 without CUDA.
  pipelined      pipeline=True on the CPU, async, 1 learner: the
                 one-step-delayed reference exactly, with skipped steps
                 too; bsp and delta mode refuse it.
  pipeline-depth a pipelined learner alone: the server counts its own
                 previous push as stale to it (τ = 1, applied at 1/2);
                 unpipelined, τ = 0 (status pipeline_depth 1 and 0).
  bench          bench/gpu.sh's measurement on the CPU (--device cpu,
                 ResNet-50 at batch 2, 2 shards), async and bsp: a record
                 per run with every field, rank 0's waits by module, no
                 shard left; and a run past --run-timeout is a failed record.
  bench-all      bench/gpu.sh --all on the CPU with a budget of 0 s: the
                 check's log, then every run in its order, each "not run
                 (budget)", in the folder named for the device and in $OUT.
  check-cases    bench/gpu.sh --check runs every case here but the bench's.
"""
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

import testbed
from testbed import check, fail, with_server

top, build, _ = testbed.setup("gpu_test")
import torch  # noqa: E402

import blkps  # noqa: E402
import blkps.torch as bps  # noqa: E402
import torch_transports  # noqa: E402

torch.set_num_threads(1)
SKIP = 77  # ctest's SKIP_RETURN_CODE
BATCH = 16
SMALL_BUCKET = 4096  # bytes: the MLP's 6,154 parameters make 7 buckets


def mlp(seed, device="cpu"):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                               torch.nn.ReLU(), torch.nn.Linear(64, 10)).to(device)


def cnn(seed, device="cpu"):
    """A convolution kept channels_last (its weight's channels innermost)."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(20, 18), torch.nn.Unflatten(1, (2, 3, 3)), torch.nn.Conv2d(2, 4, 3),
                               torch.nn.Flatten(), torch.nn.ReLU(), torch.nn.Linear(4, 10)).to(
        device, memory_format=torch.channels_last)


MODELS = {"mlp": mlp, "cnn": cnn}


def batch(step, rank, device="cpu"):
    rng = np.random.default_rng(1000 * step + rank)
    x = torch.from_numpy(rng.normal(size=(BATCH, 20)).astype(np.float32))
    y = torch.from_numpy(rng.integers(0, 10, BATCH))
    return x.to(device), y.to(device)


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu().numpy().copy()


def file_device(params, bytes_per_param=4):
    """A zeroed file the size of a device holding `params` parameters."""
    fd, path = tempfile.mkstemp(prefix="blkps-gpu-test-")
    os.write(fd, b"\0" * ((params * bytes_per_param + 511) // 512 * 512))
    os.close(fd)
    return path


def bits16(tensor):
    return tensor.view(torch.int16).numpy().view(np.uint16)


# ---- wire-patterns ----

def narrowing_inputs():
    """float32 values around every 16-bit value of both types: the values,
    the ties between neighbours and one float32 ulp either side of them,
    NaN, Inf, float32 denormals and float16's overflow edge."""
    patterns = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    values = []
    for t in (torch.bfloat16, torch.float16):
        wide = patterns.view(t).float()
        wide = wide[torch.isfinite(wide)]
        wide = torch.sort(wide).values
        values += [wide, (wide[:-1].double() + wide[1:].double()).div(2).float()]
    base = torch.cat(values)
    ints = base.view(torch.int32)
    near = torch.cat([base, (ints + 1).view(torch.float32), (ints - 1).view(torch.float32)])
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 65504.0, 65519.996, 65520.0, 65536.0,
                            1e-45, -1e-45, 1e-40, 1.1754942e-38, 2.0 ** -25, 2.0 ** -24, 3e38, -3e38,
                            3.4028235e38, -3.4028235e38],
                           dtype=torch.float32)
    return torch.cat([near[torch.isfinite(near)], special])


def case_wire_patterns():
    patterns = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    inputs = narrowing_inputs()
    for name, t in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        count = 65536
        path = file_device(max(count, inputs.numel()), 2)
        try:
            with blkps.Model(path, dtype=name) as dev:
                # Widening: the device holds every pattern; pull widens with wire_dtype.hpp.
                raw = bits16(patterns.view(t).clone())
                dev.push16(0, np.where(np.isfinite(patterns.view(t).float().numpy()), raw, 0).astype(np.uint16))
                dev.write_bytes(0, raw.tobytes())  # the non-finite ones too (push16 refuses them)
                got = torch.from_numpy(dev.pull(0, count))
                want = patterns.view(t).float()
                nan = torch.isnan(want)
                check(torch.equal(torch.isnan(got), nan), f"{name}: NaN patterns widen differently")
                check(torch.equal(got[~nan].view(torch.int32), want[~nan].view(torch.int32)),
                      f"{name}: {int((got[~nan].view(torch.int32) != want[~nan].view(torch.int32)).sum())} "
                      "patterns widen differently from torch")
                back = dev.pull16_into(0, np.empty(count, np.uint16))
                check(np.array_equal(back, raw), f"{name}: pull16 did not return the patterns as is")
                # Narrowing: push float32 (wire_dtype.hpp narrows) vs torch's .to(t).
                theirs = inputs.to(t)
                finite = torch.isfinite(theirs)
                ok = inputs[finite]
                dev.push(0, ok.numpy())
                mine = dev.pull16_into(0, np.empty(ok.numel(), np.uint16))
                diff = int((mine != bits16(theirs[finite].clone())).sum())
                check(diff == 0, f"{name}: {diff} of {ok.numel()} float32 values narrow differently from torch")
                for v in inputs[~finite][:64]:  # torch gives NaN/Inf: libblkps refuses to send it
                    try:
                        dev.push(0, np.array([v.item()], np.float32))
                        fail(f"{name}: push of {v.item()!r} (non-finite in {name}) was accepted")
                    except OSError as e:
                        check("nothing was sent" in str(e), f"unclear refusal: {e}")
                try:
                    dev.push16(0, bits16(torch.tensor([float("inf")]).to(t)))
                    fail(f"{name}: push16 of Inf was accepted")
                except OSError as e:
                    check("infinite" in str(e) and "nothing was sent" in str(e), f"unclear refusal: {e}")
                print(f"{name}: 65,536 patterns widen and {ok.numel()} float32 values narrow as torch does; "
                      f"{int((~finite).sum())} non-finite results refused")
        finally:
            os.unlink(path)
    path = file_device(1024)
    try:
        with blkps.Model(path) as dev:
            try:
                dev.push16(0, np.zeros(4, np.uint16))
                fail("push16 to a float32 device was accepted")
            except OSError as e:
                check("float32" in str(e), f"unclear refusal: {e}")
    finally:
        os.unlink(path)


# ---- staging ----

def case_staging():
    for wire, compression in (("float32", bps.Compression.none), ("bfloat16", bps.Compression.bf16),
                              ("float16", bps.Compression.fp16)):
        model = mlp(0)
        n = bps.param_count(model)
        path = file_device(n, 4 if wire == "float32" else 2)
        try:
            bps.init(target=path, env={})
            opt = bps.DistributedOptimizer(None, named_parameters=model.named_parameters(),
                                           compression=compression, bucket_bytes=SMALL_BUCKET)
            staging = opt.flat.host_bytes()
            want_staging = 0 if wire == "float32" else 2 * n * 2
            check(staging == want_staging, f"{wire}: {staging} host staging bytes, expected {want_staging}")
            pointers = (opt.weights.data_ptr(), opt.gradient.data_ptr(),
                        opt.flat.host_weights_all.data_ptr(), opt.flat.host_gradient_all.data_ptr())
            for t in range(3):
                opt.zero_grad()
                x, y = batch(t, 0)
                torch.nn.functional.cross_entropy(model(x), y).backward()
                grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).clone()
                opt.step()
                # The file holds what was pushed: the gradient in the wire's type, by torch's rounding.
                with blkps.Model(path, dtype=None if wire == "float32" else wire) as dev:
                    if wire == "float32":
                        on_device = torch.from_numpy(dev.pull(0, n))
                        check(torch.equal(on_device, grad), f"{wire}: the device does not hold the gradient")
                    else:
                        on_device = dev.pull16_into(0, np.empty(n, np.uint16))
                        check(np.array_equal(on_device, bits16(grad.to(compression.torch_dtype))),
                              f"{wire}: the pushed gradient is not torch's {wire} rounding")
                check(np.array_equal(flat(model), grad.to(compression.torch_dtype or torch.float32).float().numpy()),
                      f"{wire}: the parameters are not the pulled weights (widened)")
                now = (opt.weights.data_ptr(), opt.gradient.data_ptr(),
                       opt.flat.host_weights_all.data_ptr(), opt.flat.host_gradient_all.data_ptr())
                check(now == pointers, f"{wire}: a buffer was allocated again in step {t}")
                for (_, p), w, g in zip(opt.layout.named, opt.layout.views(opt.weights),
                                        opt.layout.views(opt.gradient)):
                    check(p.data_ptr() == w.data_ptr() and p.grad.data_ptr() == g.data_ptr(),
                          f"{wire}: a parameter or gradient left the flat buffers")
            print(f"staging {wire}: {staging} host bytes for {n} parameters, buffers kept for 3 steps")
            opt.close()
        finally:
            os.unlink(path)
    # The look-ahead step, formed a chunk at a time in a small scratch (so
    # that it costs one copy of the weights, not two), equals it in one piece.
    import blkps.torch.staging as staging_module
    results = []
    for chunk in (staging_module.LOOK_AHEAD_CHUNK, staging_module.CPU_LOOK_AHEAD_CHUNK, 3):
        saved, staging_module.CPU_LOOK_AHEAD_CHUNK = staging_module.CPU_LOOK_AHEAD_CHUNK, chunk
        try:
            fm = staging_module.FlatModel(10, "cpu", "float32", (), 0.75)
            check(fm._moved.numel() == min(10, chunk), f"a look-ahead scratch of {fm._moved.numel()} values")
            pulls = torch.Generator().manual_seed(1)
            for _ in range(3):
                fm.host_weights(0, 10)[:] = torch.randn(10, generator=pulls).numpy()
                fm.weights_arrived(0, 10)
            results.append(fm.weights.clone())
        finally:
            staging_module.CPU_LOOK_AHEAD_CHUNK = saved
    check(all(torch.equal(results[0], r) for r in results[1:]),
          "the chunked look-ahead step differs from the one-piece step")
    # On a 16-bit wire the last pull is kept in the wire's type (half the
    # memory): the pulled values came in it, so the steps are float32's.
    fm = staging_module.FlatModel(10, "cpu", "bfloat16", (), 0.75)
    check(fm._last_pull.dtype == torch.bfloat16, f"a bfloat16 wire keeps the last pull in {fm._last_pull.dtype}")
    pulls, last = torch.Generator().manual_seed(2), None
    for _ in range(3):
        pulled = torch.randn(10, generator=pulls).to(torch.bfloat16)
        fm.host_weights(0, 10)[:] = bits16(pulled)
        fm.weights_arrived(0, 10)
        now = pulled.float()
        want = now if last is None else now.clone().add_(now - last, alpha=0.75)
        check(torch.equal(fm.weights, want), "a bfloat16 wire's look-ahead step differs from float32's")
        last = now
    try:
        bad = torch.nn.Linear(2, 2).to(torch.float64)
        bps.DistributedOptimizer(None, named_parameters=bad.named_parameters())
        fail("a float64 model was accepted")
    except ValueError as e:
        check("float32 on one device" in str(e), f"unclear refusal: {e}")


# ---- pipeline ----

class Attention(torch.nn.Module):
    """nn.MultiheadAttention reads its out_proj's parameters in its own
    forward: out_proj's forward never runs."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inp, self.out = torch.nn.Linear(20, 32), torch.nn.Linear(32, 10)
        self.attn = torch.nn.MultiheadAttention(32, 4)

    def forward(self, x):
        h = self.inp(x).unsqueeze(0)  # a sequence of 1 per sample
        return self.out(self.attn(h, h, h, need_weights=False)[0].squeeze(0))


def train_on_file(overlap, steps=4, log=False, model_fn=lambda: mlp(0), slow_pulls=0.0):
    """slow_pulls: seconds each pull waits first, so that the next forward
    reaches layers whose weights are still arriving."""
    model = model_fn()
    n = bps.param_count(model)
    path = file_device(n)
    try:
        bps.init(target=path, env={})
        # A file keeps what was pushed: the weights after step t are step t's
        # gradient, so the next forward must see exactly them.
        opt = bps.DistributedOptimizer(None, named_parameters=model.named_parameters(),
                                       bucket_bytes=SMALL_BUCKET, overlap_pull=overlap,
                                       transport=torch_transports.Transport({"pull": slow_pulls}))
        if log:
            opt.forwards.log = True
        outputs = []
        for t in range(steps):
            opt.zero_grad()
            x, y = batch(t, 0)
            out = model(x)
            outputs.append(out.detach().clone())
            torch.nn.functional.cross_entropy(out, y).backward()
            opt.step()
        opt.wait_weights()
        waited = list(opt.forwards.waited) if opt.forwards is not None else []
        result = (outputs, flat(model), opt, waited)
        opt.close()
        return result
    finally:
        os.unlink(path)


def case_pipeline():
    plain, plain_w, _, _ = train_on_file(False)
    piped, piped_w, opt, waited = train_on_file(True, log=True)
    check(all(torch.equal(a, b) for a, b in zip(plain, piped)),
          "forward outputs differ between overlap_pull and waiting in step()")
    check(np.array_equal(plain_w, piped_w), "final weights differ with overlap_pull")
    # Each Linear waited for the buckets its own parameters lie in, no others.
    layers = [m for m in opt.layout.named]
    check(waited, "no forward pre-hook ran")
    for module, indices in waited:
        ids = {id(p) for p in module.parameters(recurse=False)}
        want = sorted({i for _, p in layers if id(p) in ids
                       for i, b in enumerate(opt.buckets) if b in opt.forwards.buckets_of_params([p])})
        check(sorted(indices) == want, f"{module} waited for buckets {indices}, its own are {want}")
        check(len(indices) < len(opt.buckets), f"{module} waited for the whole model")
    print(f"pipeline: same outputs and weights; per-module waits {[i for _, i in waited[:3]]}, "
          f"{opt.forward_waits} forward waits")
    # A module that reads a child's parameters in its own forward (nn.MultiheadAttention
    # and its out_proj) waits for the child's buckets too, even while they arrive slowly.
    plain, plain_w, _, _ = train_on_file(False, model_fn=Attention)
    piped, piped_w, opt, waited = train_on_file(True, log=True, model_fn=Attention, slow_pulls=0.05)
    check(all(torch.equal(a, b) for a, b in zip(plain, piped)),
          "attention: forward outputs differ between overlap_pull and waiting in step()")
    check(np.array_equal(plain_w, piped_w), "attention: final weights differ with overlap_pull")
    attn = [set(i) for m, i in waited if isinstance(m, torch.nn.MultiheadAttention)]
    out_proj = {opt.buckets.index(b) for name, p in opt.layout.named if "out_proj" in name
                for b in opt.forwards.buckets_of_params([p])}
    check(attn and all(out_proj <= i for i in attn), f"attention waited for {attn}, out_proj lies in {out_proj}")
    print(f"pipeline attention: same outputs with slow pulls; attention waits for out_proj's buckets {out_proj}")


# ---- with a server ----

def learner(config):
    """Trains as rank $RANK; prints one JSON line."""
    bps.init()
    device = config.get("device", "cpu")
    model = MODELS[config.get("model", "mlp")](config["seed"] + bps.rank(), device)
    local = torch.optim.SGD(model.parameters(), lr=config["lr"]) if config["optimizer"] == "delta" else None
    if config.get("wire_chunk"):  # a 16-bit wire's pieces on a GPU: several per bucket
        import blkps.torch.staging
        blkps.torch.staging.WIRE_CHUNK = config["wire_chunk"]
    compression = bps.Compression.bf16 if config.get("wire") == "bfloat16" else bps.Compression.none
    opt = bps.DistributedOptimizer(local, named_parameters=model.named_parameters(), bucket_bytes=SMALL_BUCKET,
                                   skip_nonfinite=config.get("skip_nonfinite", False),
                                   overlap_pull=config.get("overlap_pull"), compression=compression,
                                   pull_during_backward=config.get("pull_during_backward"),
                                   pipeline=config.get("pipeline"), look_ahead=config.get("look_ahead"))
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    grads_moved = 0.0  # config "synchronize": how far synchronize() moved a gradient, at most
    for t in range(config["steps"]):
        opt.zero_grad()
        x, y = batch(t, bps.rank(), device)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        what = config.get("faults", {}).get(f"{bps.rank()}:{t}")
        if what == "inf":
            loss = loss * float("inf")  # every gradient inf or NaN: GradScaler would skip
        loss.backward()
        if config.get("synchronize"):  # Horovod's point to clip or log the step's final gradients
            before = [p.grad.clone() for p in model.parameters()]
            opt.synchronize()
            grads_moved = max([grads_moved] + [float((p.grad - b).abs().max())
                                               for p, b in zip(model.parameters(), before)])
            with opt.skip_synchronize():
                opt.step()
        elif what != "scaler-skips":  # GradScaler.step() skips: no step(); the next zero_grad() sees it
            opt.step()
    if config.get("faults"):
        opt.zero_grad()  # ends a skipped last step
    opt.wait_weights()
    print(json.dumps({"weights": flat(model).tolist(), "skipped": opt.skipped_steps, "steps": opt.steps,
                      "forward_waits": opt.forward_waits, "grads_moved": grads_moved}), flush=True)
    opt.close()


def reference(learners, steps, lr, skipped=(), model_fn=mlp):
    """One process: each step SGD on the mean of the learners' gradients,
    a skipped (rank, step) counting as a zero gradient."""
    model = model_fn(0)
    for t in range(steps):
        grads = []
        for r in range(learners):
            model.zero_grad()
            x, y = batch(t, r)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            scale = 0.0 if (r, t) in skipped else 1.0
            grads.append([scale * p.grad.clone() for p in model.parameters()])
        with torch.no_grad():
            for k, p in enumerate(model.parameters()):
                p -= lr * (sum(g[k] for g in grads) / learners)
    return flat(model)


def delayed_reference(steps, lr, skipped=(), model_fn=mlp, stale_scale=1.0):
    """One process, one learner, updates one step delayed (a pipeline):
    step t's gradient is taken on the weights after update t-2 (steps 0
    and 1 on the initial weights), and SGD applies it to the newest, after
    the first scaled by `stale_scale` (a staleness-aware server's step for
    a push one update stale: 1/2); a skipped step (in `skipped`) updates
    nothing."""
    model = model_fn(0)
    params = list(model.parameters())
    history = [[p.detach().clone() for p in params]]  # the weights after each update
    for t in range(steps):
        with torch.no_grad():
            for p, w in zip(params, history[max(0, t - 1)]):
                p.copy_(w)
        model.zero_grad()
        x, y = batch(t, 0)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        scale = 0.0 if t in skipped else lr if t == 0 else lr * stale_scale
        history.append([w - scale * p.grad for w, p in zip(history[-1], params)])
    with torch.no_grad():
        for p, w in zip(params, history[-1]):
            p.copy_(w)
    return flat(model)


def case_pipelined():
    """pipeline=True, one learner, async, no look-ahead: each step computes
    on the weights the previous step's exchanges brought, so the server
    and the learner (drained) hold exactly the one-step-delayed reference,
    with and without steps skipped for inf gradients or by GradScaler
    (nothing pushed); after synchronize() the step's gradients still read
    as backward made them; bsp and delta mode refuse a pipeline in one
    line."""
    lr, steps = 0.1, 8
    count = bps.param_count(mlp(0))
    for faults in ({}, {"0:2": "inf", "0:5": "scaler-skips"}):
        def body(server):
            config = {"optimizer": "gradient", "lr": lr, "steps": steps, "seed": 0, "pipeline": True,
                      "look_ahead": 0.0, "skip_nonfinite": bool(faults), "faults": faults}
            report = server.run_learners(config, 1)[0]
            skipped = {int(k.split(":")[1]) for k in faults}
            want = delayed_reference(steps, lr, skipped)
            check(float(np.max(np.abs(want - reference(1, steps, lr, {(0, t) for t in skipped})))) > 1e-4,
                  "the test's delay makes no difference")
            check(report["skipped"] == len(skipped), f"{report['skipped']} steps skipped, expected {len(skipped)}")
            for who, got in (("learner", np.asarray(report["weights"], np.float32)),
                             ("server", server.weights(count))):
                diff = float(np.max(np.abs(got - want)))
                check(diff <= 1e-6, f"pipelined, skipped steps {sorted(skipped)}: the {who} differs from the "
                      f"one-step-delayed reference by {diff:g}")
            print(f"pipelined async: 1 learner equals the one-step-delayed reference over {steps} steps "
                  f"(skipped {sorted(skipped)})")
        with_server(f"params={count};rule=sgd;lr={lr};mode=async;staleness_aware=0", 1, body)

    def synchronized(server):
        config = {"optimizer": "gradient", "lr": lr, "steps": 4, "seed": 0, "pipeline": True, "synchronize": True}
        report = server.run_learners(config, 1)[0]
        check(report["grads_moved"] == 0.0, "pipelined: after synchronize() the step's gradients read "
              f"{report['grads_moved']:g} away from backward's: they must stay readable until step()")
        print("pipelined: synchronize() leaves the step's gradients as backward made them")
    with_server(f"params={count};rule=sgd;lr={lr};mode=async", 1, synchronized)

    def refusals(server):
        bps.init(target=server.target, control=server.control, env={})
        for local, want in ((None, "in bsp"), (torch.optim.SGD(mlp(0).parameters(), lr=lr), "needs gradient mode")):
            model = mlp(0)
            try:
                bps.DistributedOptimizer(local, named_parameters=model.named_parameters(), pipeline=True)
                fail(f"pipeline=True was accepted ({want})")
            except ValueError as e:
                check(want in str(e) and "\n" not in str(e), f"refusal: {e}")
        print("pipeline=True refused in bsp and in delta mode")
    with_server(f"params={count};rule=sgd;lr={lr};mode=bsp", 1, refusals)


def case_pipeline_depth():
    """A learner tells the server its pipeline depth (pipeline=<lun>:<d>):
    pipelined, one learner alone, each push after the first is one update
    stale to it (its own previous push), so the staleness-aware server
    applies it at 1/2, and status says depth 1 and τ = 1; unpipelined,
    depth 0 and τ = 0, every push whole."""
    lr, steps = 0.1, 4
    count = bps.param_count(mlp(0))
    for pipeline in (True, False):
        def body(server):
            config = {"optimizer": "gradient", "lr": lr, "steps": steps, "seed": 0, "pipeline": pipeline,
                      "look_ahead": 0.0}
            server.run_learners(config, 1)
            learner = server.status()["learners"][0]
            depth = int(pipeline)
            check(learner["pipeline_depth"] == depth and learner["push_staleness_max"] == depth,
                  f"pipeline={pipeline}: status says depth {learner['pipeline_depth']}, "
                  f"push staleness at most {learner['push_staleness_max']}; expected {depth} and {depth}")
            want = delayed_reference(steps, lr, stale_scale=0.5) if pipeline else reference(1, steps, lr)
            diff = float(np.max(np.abs(server.weights(count) - want)))
            check(diff <= 1e-6, f"pipeline={pipeline}: the server's weights differ from the reference by {diff:g}")
            print(f"pipeline={pipeline}: depth {depth}, pushes {depth} update(s) stale to it, applied as such")
        with_server(f"params={count};rule=sgd;lr={lr};mode=async", 1, body)


def case_skipped():
    lr, steps = 0.1, 6
    count = bps.param_count(mlp(0))

    def body(server):
        faults = {"0:1": "inf", "1:3": "scaler-skips"}
        config = {"optimizer": "gradient", "lr": lr, "steps": steps, "seed": 0, "skip_nonfinite": True,
                  "faults": faults}
        reports = server.run_learners(config, 2)
        status = server.status()
        check([r["skipped"] for r in reports] == [1, 1], f"skipped steps {[r['skipped'] for r in reports]}")
        check([r["steps"] for r in reports] == [steps, steps], f"steps {[r['steps'] for r in reports]}")
        check(status["global_step"] == steps, f"{status['global_step']} bsp rounds, expected {steps}")
        for lun in status["learners"]:
            check(lun["bytes_written"] == steps * status["device_bytes"],
                  f"LUN {lun['lun']} wrote {lun['bytes_written']} bytes in {steps} steps of {status['device_bytes']}")
        want = reference(2, steps, lr, skipped={(0, 1), (1, 3)})
        got = server.weights(count)
        diff = float(np.max(np.abs(got - want)))
        check(np.all(np.isfinite(got)) and diff <= 1e-6, f"server weights differ from the reference by {diff:g}")
        for rank, r in enumerate(reports):
            check(np.max(np.abs(np.asarray(r["weights"], np.float32) - want)) <= 1e-6,
                  f"learner {rank}'s weights differ from the reference")
        print(f"skipped: 2 skipped steps, every parameter written {steps} times per LUN, max difference {diff:g}")
    with_server(f"params={count};rule=sgd;lr={lr};mode=bsp", 2, body)


def case_overlap_server():
    """overlap_pull against a real server: 2 learners in bsp (the pull
    follows the round, bucket by bucket) and 1 in async (each bucket pulled
    after its push) give the weights of the single-process reference, as
    waiting in step() does."""
    lr, steps = 0.1, 6
    count = bps.param_count(mlp(0))
    for mode, learners in (("bsp", 2), ("async", 1)):
        def body(server):
            config = {"optimizer": "gradient", "lr": lr, "steps": steps, "seed": 0, "overlap_pull": True}
            reports = server.run_learners(config, learners)
            want = reference(learners, steps, lr)
            for rank, r in enumerate(reports):
                diff = float(np.max(np.abs(np.asarray(r["weights"], np.float32) - want)))
                check(diff <= 1e-6, f"{mode}: learner {rank} differs from the reference by {diff:g}")
            diff = float(np.max(np.abs(server.weights(count) - want)))
            check(diff <= 1e-6, f"{mode}: the server differs from the reference by {diff:g}")
            print(f"overlap_pull {mode}, {learners} learner(s): equal to the reference "
                  f"(forward waits {[r['forward_waits'] for r in reports]})")
        with_server(f"params={count};rule=sgd;lr={lr};mode={mode}", learners, body)


def case_layout():
    """A channels_last convolution keeps its layout: its weight and gradient
    are channels_last views into the flat buffers, its values there in that
    memory order, which the fingerprint names; 2 learners (bsp, different
    initial weights, broadcast_parameters) equal the single-process
    reference."""
    lr, steps = 0.1, 6
    model = cnn(0)
    conv = model[2].weight
    check(conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous(), "the test's layout")
    check(bps.fingerprint(model) != bps.fingerprint(cnn(0).to(memory_format=torch.contiguous_format)),
          "the fingerprint does not tell channels_last from contiguous")
    n = bps.param_count(model)
    path = file_device(n)
    try:
        bps.init(target=path, env={})
        opt = bps.DistributedOptimizer(None, named_parameters=model.named_parameters())
        at = dict(zip((name for name, _ in opt.layout.named), opt.layout.offsets))["2.weight"]
        check(conv.is_contiguous(memory_format=torch.channels_last), "the conv weight lost channels_last")
        check(conv.data_ptr() == opt.weights.data_ptr() + 4 * at, "the conv weight is not a view of the flat weights")
        torch.nn.functional.cross_entropy(model(batch(0, 0)[0]), batch(0, 0)[1]).backward()
        check(conv.grad.is_contiguous(memory_format=torch.channels_last)
              and conv.grad.data_ptr() == opt.gradient.data_ptr() + 4 * at, "the conv gradient left its place")
        memory_order = conv.detach().permute(0, 2, 3, 1).reshape(-1)  # channels innermost
        check(torch.equal(opt.weights[at:at + conv.numel()], memory_order), "the flat weights are not in memory order")
        opt.close()
    finally:
        os.unlink(path)

    def body(server):
        config = {"optimizer": "gradient", "lr": lr, "steps": steps, "seed": 0, "model": "cnn"}
        reports = server.run_learners(config, 2)
        want = reference(2, steps, lr, model_fn=cnn)
        for rank, r in enumerate(reports):
            diff = float(np.max(np.abs(np.asarray(r["weights"], np.float32) - want)))
            check(diff <= 1e-5, f"learner {rank} differs from the reference by {diff:g}")
        print(f"layout: channels_last kept; 2 learners equal the reference ({diff:g})")
    with_server(f"params={n};rule=sgd;lr={lr};mode=bsp", 2, body)


def needs_cuda():
    if not torch.cuda.is_available():
        print("skipped: no CUDA device (torch.cuda.is_available() is False); bench/gpu.sh --check runs this "
              "on a GPU host")
        sys.exit(SKIP)


def case_cuda():
    needs_cuda()
    lr, steps = 0.1, 6
    count = bps.param_count(mlp(0))
    for optimizer, rule in (("gradient", "sgd"), ("delta", "sum")):
        def body(server):
            config = {"optimizer": optimizer, "lr": lr, "steps": steps, "seed": 0, "device": "cuda"}
            reports = server.run_learners(config, 2)
            want = reference(2, steps, lr)
            for rank, r in enumerate(reports):
                diff = float(np.max(np.abs(np.asarray(r["weights"], np.float32) - want)))
                check(diff <= 1e-5, f"{optimizer} mode on CUDA: learner {rank} differs by {diff:g}")
            print(f"cuda {optimizer} mode: 2 learners, bsp, equal to the CPU reference")
        with_server(f"params={count};rule={rule};lr={lr};mode=bsp", 2, body)
    # A bfloat16 wire: narrowed and widened on the GPU, a piece of 300 values
    # at a time, against the same learners on the CPU (torch's rounding on
    # both; the gradients differ by the devices' arithmetic only).
    runs = {}
    for device in ("cpu", "cuda"):
        def body(server):
            config = {"optimizer": "gradient", "lr": lr, "steps": steps, "seed": 0, "device": device,
                      "wire": "bfloat16", "wire_chunk": 300}
            runs[device] = [np.asarray(r["weights"], np.float32) for r in server.run_learners(config, 2)]
        with_server(f"params={count};rule=sgd;lr={lr};mode=bsp;dtype=bfloat16", 2, body)
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(runs["cpu"], runs["cuda"]))
    check(diff <= 2e-2, f"bfloat16 wire on CUDA differs from the CPU by {diff:g}")
    print(f"cuda bfloat16 wire: 2 learners, bsp, within {diff:g} of the same run on the CPU")


def case_cuda_async():
    """Async, one learner, on CUDA: each bucket's weights come back while
    backward goes on (copied to the GPU behind that bucket's own gradient
    event), or after step(); the next forward waits by layer. Either way
    the weights of the single-process reference."""
    needs_cuda()
    lr, steps = 0.1, 6
    count = bps.param_count(mlp(0))
    for during in (True, False):
        def body(server):
            config = {"optimizer": "gradient", "lr": lr, "steps": steps, "seed": 0, "device": "cuda",
                      "pull_during_backward": during, "pipeline": False}
            diff = float(np.max(np.abs(np.asarray(server.run_learners(config, 1)[0]["weights"], np.float32)
                                       - reference(1, steps, lr))))
            check(diff <= 1e-5, f"async on CUDA, pull_during_backward={during}: differs by {diff:g}")
            print(f"cuda async, pull_during_backward={during}: 1 learner, equal to the CPU reference")
        with_server(f"params={count};rule=sgd;lr={lr};mode=async", 1, body)
    for wire in ("float32", "bfloat16"):  # pipelined (the CUDA default in async): one step delayed
        def body(server):
            config = {"optimizer": "gradient", "lr": lr, "steps": steps, "seed": 0, "device": "cuda",
                      "look_ahead": 0.0, "wire": wire}
            got = np.asarray(server.run_learners(config, 1)[0]["weights"], np.float32)
            diff = float(np.max(np.abs(got - delayed_reference(steps, lr))))
            check(diff <= (1e-5 if wire == "float32" else 2e-2), f"pipelined async on CUDA, {wire} wire: "
                  f"differs from the one-step-delayed reference by {diff:g}")
            print(f"cuda async pipelined, {wire} wire: 1 learner, the one-step-delayed CPU reference ({diff:g})")
        with_server(f"params={count};rule=sgd;lr={lr};mode=async;dtype={wire};staleness_aware=0", 1, body)


def run_bench(out, *options, copy_to=None):
    """bench/gpu.sh --device cpu with ResNet-50 at batch 2 on 2 shards, one
    step after one of warm-up, OUT set to `copy_to` (unset: None); its exit
    status. Its shard folders must all be gone after it (a TMPDIR of their
    own)."""
    tmp = tempfile.mkdtemp(prefix="blkps-gpu-bench-test-")
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    env.update(TMPDIR=tmp, **({"OUT": copy_to} if copy_to else {}))
    rc = subprocess.run([os.path.join(top, "bench", "gpu.sh"), "--out", out, "--build", build, "--device", "cpu",
                         "--models", "resnet50", "--batch", "2", "--shards", "2", "--steps", "1", "--warmup", "1",
                         *options], env=env, stdout=subprocess.DEVNULL).returncode
    left = os.listdir(tmp)
    check(not left, f"the bench left {left} in its TMPDIR")
    os.rmdir(tmp)
    return rc


def bench_records(out):
    """gpu.json's records; gpu.md's first table has a row for each run
    through blkps, its ceiling's table one for each ceiling."""
    with open(os.path.join(out, "gpu.json")) as f:
        rows = json.load(f)
    with open(os.path.join(out, "gpu.md")) as f:
        sections = f.read().split("\n## ")
    ceiling = next((part for part in sections if part.startswith("The ceiling")), "").split("\n### ")[0]
    for text, records in ((sections[0], [r for r in rows if "mps" not in r]),
                          (ceiling, [r for r in rows if "mps" in r])):
        table = [line for line in text.splitlines() if line.startswith("| resnet50 ")]
        check(len(table) == len(records), f"a table of gpu.md has {len(table)} rows for {len(records)} records")
    return rows


def case_bench():
    """bench/gpu.sh on the CPU: the same processes, shards and records as on
    a GPU host, so a GPU host's one run does not fail on the bench itself.
    One run of each server mode (async with the pipeline off where
    blkps.torch takes pipeline=, else its default; bsp); a run past
    --run-timeout, and one asking for a pipeline blkps.torch lacks, are
    failed records."""
    sys.path.insert(0, os.path.join(top, "bench"))
    import gpu_bench
    pipeline = "off" if "pipeline" in inspect.signature(bps.DistributedOptimizer).parameters else "default"
    out = tempfile.mkdtemp(prefix="blkps-gpu-bench-out-")
    try:
        rc = run_bench(out, "--mode", "async,bsp", "--pipeline", pipeline, "--wires", "bfloat16", "--learners", "1",
                       "--pull-during-backward", "no")
        rows = bench_records(out)
        check(rc == 0, f"bench/gpu.sh --device cpu exited with {rc}: {[r.get('failed') for r in rows]}")
        runs = [(r["mode"], r["pipeline_asked"]) for r in rows]
        check(runs == [("async", pipeline), ("bsp", "default")], f"runs {runs}")
        fields = {"model", "params", "batch", "mode", "wire_dtype", "shards", "learners", "step_ms",
                  "standalone_step_ms", "ratio", "learner_cpu_s_per_step", "tgtd_cpu_s_per_step", "gpu",
                  "rank0_ms_per_step", "rank0_transfers_per_step", "rank0_module_waits", "rank0_memory",
                  "memory", "pipeline", "pull_during_backward", "stripe_unit", "run_s", "alone_run_s"}
        for r in rows:
            check(fields <= set(r), f"a record lacks {sorted(fields - set(r))}")
            check(r["gpu"] == "cpu (not a GPU figure)", f"a CPU run is labelled {r['gpu']!r}")
            check(r["params"] == 25557032 and r["step_ms"] > 0, f"record {r}")
            check(abs(r["ratio"] - r["standalone_step_ms"] / r["step_ms"]) < 2e-3, f"ratio of {r}")
            check(r["pipeline"] is (False if r["pipeline_asked"] == "off" else r["pipeline"]),
                  f"pipeline asked {r['pipeline_asked']}, went {r['pipeline']}")
            # Pulled after step(): each step's buckets are pushed, then pulled.
            t = r["rank0_ms_per_step"]
            check(r["pull_during_backward"] is False and t["push"] > 0 and t["pull"] > 0 and t["exchange"] == 0,
                  f"--pull-during-backward no: {r['pull_during_backward']}, {t}")
            calls = r["rank0_transfers_per_step"]
            check(calls >= 2, f"rank 0 made {calls} transfers a step")
            waits = r["rank0_module_waits"]["cpu"]
            check(waits["ms_per_step"] <= t["weights_wait"] + 0.05 and len(waits["top"]) <= 5,
                  f"waits by module {waits} beyond the optimizer's weights_wait {t['weights_wait']}")
            check(r["tgtd_cpu_s_per_step"] > 0, "the shards' tgtd used no CPU")
            staged = 2 * 2 * r["params"]  # a CPU model's staging on a 16-bit wire
            check(round(staged / 1e6, 1) == r["memory"]["host_staging_mb"], f"memory of {r}")
        # The ceiling, measured once per model and wire, on the first one-learner shard set.
        calls = {"push", "pull", "exchange", "bucket_push", "bucket_pull", "bucket_exchange"}
        alone = [r.get("transfers_alone_ms") for r in rows]
        check(alone[1] is None and set(alone[0] or ()) == calls and min(alone[0].values()) > 0,
              f"transfers alone {alone}")
        rc = run_bench(out, "--steps", "1", "--warmup", "0", "--learners", "1", "--wires", "float32",
                       "--run-timeout", "0.5")
        rows = bench_records(out)
        check(rc != 0 and len(rows) == 1 and "--run-timeout" in rows[0].get("failed", ""),
              f"a run past --run-timeout: exit {rc}, records {rows}")
        # The ceiling of two learners: two plain processes at once, each at half the batch; MPS is CUDA's.
        rc = run_bench(out, "--mode", "bsp", "--wires", "float32", "--learners", "2", "--ceiling", "off,on")
        rows = bench_records(out)
        plain = [r for r in rows if r.get("system") == "plain"]
        check(rc != 0 and [(r["learners"], r["mps"]) for r in plain] == [(2, "off"), (2, "on")],
              f"--ceiling off,on: exit {rc}, records {rows}")
        check(plain[0]["batch"] == 2 and plain[0]["step_ms"] > 0 and
              abs(plain[0]["ratio"] - plain[0]["standalone_step_ms"] / plain[0]["step_ms"]) < 2e-3,
              f"the plain processes' record {plain[0]}")
        check("not on --device cpu" in plain[1].get("failed", ""), f"MPS on the CPU: {plain[1]}")
        with open(os.path.join(out, "gpu.md")) as f:
            against = f.read().split("### Learners through blkps against the ceiling")[-1]
        bsp = next(r for r in rows if r.get("mode") == "bsp")
        want = f" | {plain[0]['step_ms'] / bsp['step_ms']:.3f} |"
        check(any(line.startswith("| resnet50 | bsp | float32 | 2 | ") and line.endswith(want)
                  for line in against.splitlines()), f"gpu.md's comparison lacks a bsp row ending {want!r}: {against}")
        if pipeline == "default":  # this blkps.torch has no pipeline=: a run that needs it cannot run
            rc = run_bench(out, "--pipeline", "on", "--learners", "1", "--wires", "float32")
            rows = bench_records(out)
            check(rc != 0 and [r.get("failed") for r in rows] == [gpu_bench.PIPELINE_ABSENT],
                  f"--pipeline on without blkps.torch's pipeline=: exit {rc}, records {rows}")
        print(f"bench: async (pipeline {pipeline}) and bsp on the CPU, the ceiling of two; a run past --run-timeout"
              + (", or one asking for a pipeline blkps.torch lacks," if pipeline == "default" else "")
              + " is a failed record")
    finally:
        shutil.rmtree(out, ignore_errors=True)


def case_bench_all():
    """bench/gpu.sh --all: the check first (its log beside the records),
    then every run in the order doc/gpu.md gives, each a record; past
    --budget-s (0 here) a run is a record "not run (budget)"; the folder
    is named for the device ({gpu}) and copied into $OUT, with the whole
    output."""
    sys.path.insert(0, os.path.join(top, "bench"))
    import gpu_plan
    root = tempfile.mkdtemp(prefix="blkps-gpu-bench-all-")
    try:
        rc = run_bench(os.path.join(root, "results", "{gpu}"), "--all", "--check-cases", "look-ahead-switched",
                       "--budget-s", "0", copy_to=os.path.join(root, "out"))
        check(rc == 0, f"bench/gpu.sh --all --budget-s 0 exited with {rc}")
        order = [("async", "on", "float32", 1), ("async", "off", "float32", 1), ("async", "on", "bfloat16", 1),
                 ("async", "off", "bfloat16", 1), ("bsp", "default", "float32", 1), ("bsp", "default", "bfloat16", 1),
                 ("async", "on", "float32", 2), ("async", "on", "bfloat16", 2), ("bsp", "default", "float32", 2),
                 ("bsp", "default", "bfloat16", 2), ("plain", "off", None, 2), ("plain", "on", None, 2),
                 ("async", "off", "float32", 2), ("async", "off", "bfloat16", 2)]
        for folder in (os.path.join(root, "results", "cpu"), os.path.join(root, "out", "cpu")):
            rows = bench_records(folder)
            runs = [(r["mode"], r["pipeline_asked"], r["wire_dtype"], r["learners"]) if "mps" not in r else
                    (r["system"], r["mps"], None, r["learners"]) for r in rows]
            check(runs == order, f"--all's runs in {folder}: {runs}")
            check(all(r.get("not_run") == gpu_plan.NOT_RUN for r in rows), f"runs past the budget: {rows}")
            with open(os.path.join(folder, "check.log")) as f:
                log = f.read()
            check("gpu check look-ahead-switched: passed" in log, f"check.log: {log!r}")
        with open(os.path.join(root, "out", "gpu-bench.log")) as f:
            output = f.read()
        check("gpu bench: 14 runs" in output, f"$OUT/gpu-bench.log lacks the bench's output: {output!r}")
        print(f"bench --all: the check, then {len(order)} runs in order, each not run past a budget of 0 s")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def case_check_cases():
    """bench/gpu.sh --check runs every case of this file but bench's."""
    sys.path.insert(0, os.path.join(top, "bench"))
    import gpu_bench
    cases = set(CASES) - {"bench", "bench-all", "check-cases"}
    check(set(gpu_bench.CHECK_CASES) == cases,
          f"--check lacks {sorted(cases - set(gpu_bench.CHECK_CASES))}, "
          f"has unknown {sorted(set(gpu_bench.CHECK_CASES) - cases)}: bench/gpu_bench.py CHECK_CASES")
    print(f"bench/gpu.sh --check runs all {len(cases)} cases but the bench's")


def case_look_ahead_switched():
    """blkps.torch changes the look-ahead between steps as the server's
    count of pushing learners changes (blkps.pushing_learners): turned on,
    from 0 at construction or later, the first pull after it is the
    baseline (no step), and the next moves on by look_ahead times the move
    since that pull; turned off, pulls are the server's weights."""
    from blkps.torch.staging import FlatModel
    fm = FlatModel(4, "cpu", "float32", (), 0.0)

    def pull(value, want, what):
        fm.host_weights(0, 4)[:] = value
        fm.weights_arrived(0, 4)
        check(torch.equal(fm.weights, torch.full((4,), want)), f"{what}: weights {fm.weights.tolist()}, not {want}")
    pull(1.0, 1.0, "look-ahead 0")
    fm.set_look_ahead(0.5)
    pull(3.0, 3.0, "the first pull after turning it on")
    pull(5.0, 6.0, "the second pull")  # 5 + 0.5 * (5 - 3)
    fm.set_look_ahead(0.0)
    pull(10.0, 10.0, "turned off")
    fm.set_look_ahead(0.5)
    pull(12.0, 12.0, "the first pull after turning it on again")
    pull(13.0, 13.5, "the second pull after turning it on again")
    print("look-ahead switched between steps: each time on, it steps from the second pull")


CASES = {
    "wire-patterns": case_wire_patterns,
    "staging": case_staging,
    "look-ahead-switched": case_look_ahead_switched,
    "pipeline": case_pipeline,
    "skipped": case_skipped,
    "overlap-server": case_overlap_server,
    "pipelined": case_pipelined,
    "pipeline-depth": case_pipeline_depth,
    "layout": case_layout,
    "cuda": case_cuda,
    "cuda-async": case_cuda_async,
    "bench": case_bench,
    "bench-all": case_bench_all,
    "check-cases": case_check_cases,
}

if __name__ == "__main__":
    testbed.run(CASES, learner)
