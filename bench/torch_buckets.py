#!/usr/bin/python3
"""How blkps.torch's bucket size (DistributedOptimizer bucket_bytes) changes
training speed: one learner in gradient mode trains an MLP on random data
through a private server (async, rule sgd), for each bucket size in turn,
interleaved over rounds; prints a table of medians.

  bench/torch_buckets.py [--build DIR] [--hidden 1024] [--steps 40] [--rounds 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

TOP = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
SIZES = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 64 << 20]


def learner(args, bucket_bytes):
    """Runs in the child: steps/s of gradient-mode training."""
    import torch
    import blkps.torch as bps
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, 10))
    bps.init()
    opt = bps.DistributedOptimizer(None, named_parameters=model.named_parameters(), bucket_bytes=bucket_bytes)
    x, y = torch.randn(64, 784), torch.randint(0, 10, (64,))
    for t in range(args.steps + 5):
        if t == 5:
            start = time.monotonic()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    print(json.dumps({"steps_per_s": args.steps / (time.monotonic() - start),
                      "buckets": len(opt.buckets), "overlapped": opt.overlapped, "pushes": opt.pushes}))
    opt.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(TOP, "build", "cmake"))
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, os.path.join(TOP, "learner", "python"))
    os.environ["BLKPS_LIB"] = os.path.join(args.build, "learner", "libblkps.so")
    if args.child is not None:
        learner(args, args.child)
        return
    params = 784 * args.hidden + args.hidden + args.hidden * args.hidden + args.hidden + args.hidden * 10 + 10
    sys.path.insert(0, os.path.join(TOP, "learner", "examples"))
    import torch_fashion_job as job
    state = tempfile.mkdtemp(prefix="blkps-torch-buckets-")
    try:
        env = job.start_server(state, f"params={params};rule=sgd;lr=0.001;mode=async", 1, args.build)
        runs = {size: [] for size in SIZES}
        for _ in range(args.rounds):
            for size in SIZES:
                out = subprocess.run([sys.executable, __file__, "--build", args.build, "--hidden", str(args.hidden),
                                      "--steps", str(args.steps), "--child", str(size)], check=True,
                                     capture_output=True, text=True,
                                     env=dict(os.environ, BLKPS_TARGET=env["URL"], BLKPS_CONTROL=env["CONTROL_URL"]))
                runs[size].append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"MLP 784-{args.hidden}-{args.hidden}-10, {params} parameters ({params * 4 / 1e6:.1f} MB), "
              f"batch 64, 1 learner, async, {args.steps} steps x {args.rounds} rounds, medians\n")
        print("| bucket_bytes | buckets | steps/s | pushes started during backward |")
        print("|---|---|---|---|")
        for size in SIZES:
            r = runs[size]
            print(f"| {size >> 10} KiB | {r[0]['buckets']} | {statistics.median(x['steps_per_s'] for x in r):.1f} | "
                  f"{statistics.median(x['overlapped'] / x['pushes'] for x in r):.0%} |")
    finally:
        job.stop_server(state)


if __name__ == "__main__":
    main()
