#!/usr/bin/python3
"""How much of a step's transfers blkps.torch hides behind compute, measured
without a GPU. The model has the parameters of bench/gpu_bench.py's
ResNet-50 or GPT-2-shaped transformer, layer by layer in forward order, but
its layers sleep for their share of a step's compute instead of computing:
the forward a third, the backward two thirds, each layer's share by its
multiply-adds (convolutions and matrix products, attention's scores; norms
and lookups count as none; GPT-2's tied head is a layer that reads the
embedding's weight). Sleeping leaves the CPU to the transfers, as a GPU
would; the Python thread is free too, which a GPU's kernel launches are not.

  bench/overlap.py --out DIR [--models resnet50,gpt2] [--compute 2.0]
                   [--steps 20] [--warmup 3] [--build DIR]

Per model, through a private server (one tgtd on loopback, async, rule sgd,
one per LUN dtype):
  exchange     one Model.exchange of the whole model after another, on a
               float32 and a bfloat16 LUN: the transfers alone, per step
  alone        the sleeping model's step with nothing sent; its compute is
               --compute times the float32 exchange (ResNet-50 on the H100
               through 8 shards computes about twice as long as its push
               and pull take by hand: ../doc/gpu.md)
  blkps.torch  gradient mode (overlap_pull, as for a CUDA model), float32
               and bfloat16 LUNs, 1 and 2 learners, each learner sleeping
               the whole compute (one GPU each)
  ddp          DistributedDataParallel (gloo, 2 learners, loopback) on the
               same model
No run takes an optimizer step on the learner (blkps's server applies the
gradient; DDP's step is left out alike). Writes DIR/overlap.json (a record
per run: model, params, system, wire_dtype, learners, step_ms, alone_ms,
exchange_ms, ratio = alone / step, rank 0's ms per step by the optimizer's
seconds, transfers and forward waits) and DIR/overlap.md.
"""
import argparse
import json
import os
import signal
import socket
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.abspath(os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(TOP, "learner", "python"))
sys.path.insert(0, os.path.join(TOP, "learner", "examples"))
GPT2_SEQ = 1024  # gpu_bench's sequence
GRAD = 1e-7      # every gradient value: finite, small


# ---- the layers and their compute, from gpu_bench's real models ----

def profile(torch, name):
    """[(parameter shapes, multiply-adds per sample, index of the layer
    whose weight it reads or None)] in forward order: the modules that own
    parameters, as one forward of the real model at batch 1 runs them."""
    import gpu_bench
    model = gpu_bench.build_model(torch, name)
    layers, seen = [], set()

    def hook(module, inputs, output):
        own = list(module.parameters(recurse=False))
        if not own or id(module) in seen:
            return
        seen.add(id(module))
        shapes = [tuple(p.shape) for p in own]
        if isinstance(module, torch.nn.MultiheadAttention):
            out_proj = [tuple(p.shape) for p in module.out_proj.parameters()]
            width = module.embed_dim
            macs = 4 * width * width * GPT2_SEQ + 2 * GPT2_SEQ * GPT2_SEQ * width
            shapes += out_proj
        elif isinstance(module, torch.nn.Conv2d):
            macs = module.weight.numel() * output.shape[-1] * output.shape[-2]
        elif isinstance(module, torch.nn.Linear):
            tokens = output.numel() // module.out_features
            macs = module.weight.numel() * (GPT2_SEQ if name == "gpt2" else tokens)
        else:
            macs = 0  # norms, embeddings: no matrix products
        layers.append((shapes, macs, None))

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    with torch.no_grad():
        if name == "resnet50":
            model(torch.zeros(1, 3, 224, 224))
        else:
            model(torch.zeros(1, 8, dtype=torch.long))  # shapes only: the compute counts GPT2_SEQ tokens
    for h in handles:
        h.remove()
    if name == "gpt2":  # the tied head reads the token embedding's weight (the first layer)
        vocab, width = layers[0][0][0]
        layers.append(([], vocab * width * GPT2_SEQ, 0))
    return layers


def sleeping_model(torch, layers, compute_s):
    """A model of `layers` (profile()) whose step sleeps compute_s seconds.
    The gradients cost no memory traffic beyond autograd's accumulation:
    each is one value broadcast over its parameter's shape, and a weight
    that a later layer reads (a tied embedding) gets its gradient from that
    layer alone (its own layer's backward still runs first, so the weight's
    gradient is complete only at the end of backward, as when tied)."""
    total = sum(macs for _, macs, _ in layers)
    read_later = {reads for _, _, reads in layers if reads is not None}

    class Sleep(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, layer, *params):
            ctx.layer = layer
            time.sleep(layer.seconds / 3)
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            layer = ctx.layer
            time.sleep(2 * layer.seconds / 3)
            return (grad, None, *layer.grads)

    def constant(shape):
        return torch.full((), GRAD).expand(shape)

    class Layer(torch.nn.Module):
        def __init__(self, shapes, seconds, reads, tied):
            super().__init__()
            for k, shape in enumerate(shapes):
                self.register_parameter(f"w{k}", torch.nn.Parameter(torch.zeros(shape)))
            self.seconds, self.reads = seconds, reads  # reads: a list holding another Layer, or empty
            self.grads = ([None if tied else constant(s) for s in shapes] +
                          [constant(p.shape) for r in reads for p in r.parameters()])

        def forward(self, x):
            return Sleep.apply(x, self, *self.parameters(), *(p for r in self.reads for p in r.parameters()))

    built = []
    for k, (shapes, macs, reads) in enumerate(layers):
        built.append(Layer(shapes, compute_s * macs / total, [] if reads is None else [built[reads]],
                           k in read_later))
    return torch.nn.Sequential(*built)


# ---- one process: a learner, a DDP rank, the exchange alone ----

def child(cfg):
    import torch
    torch.set_num_threads(1)
    steps, warmup = cfg["steps"], cfg["warmup"]
    if cfg["system"] == "exchange":
        import blkps
        import numpy as np
        with blkps.Model(os.environ["BLKPS_TARGET"].replace("{slot}", "1"),
                         dtype=None if cfg["wire"] == "float32" else cfg["wire"]) as model:
            grad = np.full(cfg["params"], GRAD, np.float32)
            out = np.empty_like(grad)
            for t in range(warmup + steps):
                if t == warmup:
                    start = time.perf_counter()
                model.exchange(0, grad, out)
        print(json.dumps({"step_ms": 1000 * (time.perf_counter() - start) / steps}), flush=True)
        return
    model = sleeping_model(torch, [tuple(x) for x in cfg["layers"]], cfg["compute_s"])
    opt, extra = None, {}
    if cfg["system"] == "blkps":
        import blkps.torch as bps
        bps.init()
        compression = bps.Compression.bf16 if cfg["wire"] == "bfloat16" else bps.Compression.none
        opt = bps.DistributedOptimizer(None, named_parameters=model.named_parameters(), compression=compression,
                                       overlap_pull=True)
        bps.broadcast_parameters(model.state_dict(), root_rank=0)
    elif cfg["system"] == "ddp":
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=cfg["init"], rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]))
        model = torch.nn.parallel.DistributedDataParallel(model)
    x = torch.zeros(1)
    for t in range(warmup + steps):
        if t == warmup:
            start = time.perf_counter()
        model.zero_grad(set_to_none=False) if opt is None else opt.zero_grad()
        model(x).sum().backward()
        if opt is not None:
            opt.step()
    if opt is not None:
        opt.wait_weights()
    wall = time.perf_counter() - start
    if opt is not None:
        extra = {"ms_per_step": {k: round(1000 * v / (steps + warmup), 2) for k, v in opt.seconds.items()},
                 "transfers": opt.transfers, "forward_waits": opt.forward_waits}
        opt.close()
    print(json.dumps({"step_ms": 1000 * wall / steps, **extra}), flush=True)
    if cfg["system"] == "ddp":
        os._exit(0)  # gloo's teardown can hang in torch 1.13 (bench/peers/gloo_allreduce.py)


def run(cfg, learners=1, env=None, timeout=600):
    """Runs `learners` child processes of cfg; their results by rank."""
    import gpu_bench
    envs = [dict(env or os.environ, RANK=str(rank), WORLD_SIZE=str(learners)) for rank in range(learners)]
    try:
        return gpu_bench.run_ranks([sys.executable, __file__, "--child", json.dumps(cfg)], envs, timeout)
    except RuntimeError as e:
        raise RuntimeError(f"overlap: {cfg['system']}: {e}") from None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- the bench ----

def measure(args, name, record):
    import torch
    import torch_fashion_job as job
    layers = profile(torch, name)
    params = sum(torch.Size(s).numel() for shapes, _, _ in layers for s in shapes)
    base = {"steps": args.steps, "warmup": args.warmup, "params": params, "layers": layers}
    servers, exchange = {}, {}
    try:
        for wire in ("float32", "bfloat16"):
            state = tempfile.mkdtemp(prefix="blkps-overlap-")
            bsopts = f"params={params};rule=sgd;lr=0.001;mode=async" + ("" if wire == "float32" else f";dtype={wire}")
            shown = job.start_server(state, bsopts, 2, args.build)
            servers[wire] = (state, dict(os.environ, BLKPS_TARGET=job.slot_target(shown),
                                         BLKPS_CONTROL=shown["CONTROL_URL"]))
            exchange[wire] = run(dict(base, system="exchange", wire=wire), env=servers[wire][1])[0]["step_ms"]
        compute_s = args.compute * exchange["float32"] / 1000
        base["compute_s"] = compute_s
        alone = run(dict(base, system="alone", wire="float32"))[0]["step_ms"]
        row = {"model": name, "params": params, "compute_ms": round(1000 * compute_s, 1), "alone_ms": round(alone, 1)}
        record(dict(row, system="alone", wire_dtype="", learners=1, step_ms=round(alone, 1), ratio=1.0))
        for wire in ("float32", "bfloat16"):
            for learners in (1, 2):
                outs = run(dict(base, system="blkps", wire=wire), learners, env=servers[wire][1])
                step = max(o["step_ms"] for o in outs)
                record(dict(row, system="blkps.torch", wire_dtype=wire, learners=learners, step_ms=round(step, 1),
                            exchange_ms=round(exchange[wire], 1), ratio=round(alone / step, 3),
                            rank0_ms_per_step=outs[0]["ms_per_step"], rank0_transfers=outs[0]["transfers"],
                            rank0_forward_waits=outs[0]["forward_waits"]))
        outs = run(dict(base, system="ddp", wire="float32", init=f"tcp://127.0.0.1:{free_port()}"), 2)
        step = max(o["step_ms"] for o in outs)
        record(dict(row, system="ddp (gloo)", wire_dtype="float32", learners=2, step_ms=round(step, 1),
                    ratio=round(alone / step, 3)))
    finally:
        for state, _ in servers.values():
            job.stop_server(state)


def write(out, rows):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "overlap.json"), "w") as f:
        json.dump(rows, f, indent=1)
    with open(os.path.join(out, "overlap.md"), "w") as f:
        f.write("# Transfers hidden behind compute (bench/overlap.py)\n\nLayers sleep for their share of the "
                "step's compute (no GPU); ratio = the step alone / the step with its transfers (1: all hidden). "
                "Rank 0's ms per step: the optimizer's `seconds`.\n\n"
                "| model | params | system | wire | learners | compute ms | step ms | ratio | exchange alone ms | "
                "rank 0 ms: copy out, exchange, step wait, weights wait; transfers; forward waits |\n"
                "|---|---|---|---|---|---|---|---|---|---|\n")
        for r in rows:
            t = r.get("rank0_ms_per_step")
            spent = (f"{t['copy_out']}, {t['exchange']}, {t['step_wait']}, {t['weights_wait']}; "
                     f"{r['rank0_transfers']}; {r['rank0_forward_waits']}" if t else "")
            f.write(f"| {r['model']} | {r['params']:,} | {r['system']} | {r['wire_dtype']} | {r['learners']} | "
                    f"{r['compute_ms']} | {r['step_ms']} | {r['ratio']} | {r.get('exchange_ms', '')} | {spent} |\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--out", help="folder for overlap.json and overlap.md")
    ap.add_argument("--models", default="resnet50,gpt2")
    ap.add_argument("--compute", type=float, default=2.0, help="compute per step / the float32 exchange alone")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--build", default=os.path.join(TOP, "build", "cmake"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    # A stop (kill PID) ends the runs and the servers as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.environ.setdefault("BLKPS_LIB", os.path.join(args.build, "learner", "libblkps.so"))
    if args.child:
        child(json.loads(args.child))
        return 0
    if not args.out:
        ap.error("give --out DIR")
    rows = []

    def record(row):
        rows.append(row)
        print(json.dumps(row), flush=True)
        write(args.out, rows)

    for name in args.models.split(","):
        measure(args, name, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
