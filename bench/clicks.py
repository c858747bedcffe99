#!/usr/bin/python3
"""A DLRM-shaped click model (doc/embeddings.md "Click model"): one embedding
table much larger than the dense part, trained by N learners through blkps
(blkps.torch.EmbeddingBag on a table LUN, rule adagrad, plus the dense
DistributedOptimizer, rule adam, both async) beside one process with a local
torch.nn.EmbeddingBag (sparse gradients, torch.optim.Adagrad) and
torch.optim.Adam. Same data, same batches, same rules and learning rates.
Reports time per epoch and the held-out AUC and log-loss of each, and
(--check TOL) exits 1 unless blkps's AUC and log-loss are within TOL
(relative) of the local run's.

The data is synthetic and has a planted signal: each row r of the table has
a hidden value h[r] ~ N(0, 1); an example is a bag of --bag ids drawn from
Zipf(1.05) over the rows and --dense dense features x ~ N(0, 1); it is a
click with probability sigmoid(2·mean(h[bag]) + w·x - 1) for a fixed w. A
model learns h of the rows it sees often (the Zipf head) and w.

Time per epoch counts, for each side, making its table: blkps's server
makes a row (its init=normal values and its adagrad state) when a push
first touches it, inside the first epoch; the local table's rows and its
Adagrad's state are made before its first step, and that time
(table_seconds) is counted in its first epoch, so that both sides start
from nothing.

  bench/clicks.py [--rows 1000000] [--width 32] [--bag 4] [--examples 200000]
      [--test 20000] [--batch 512] [--epochs 1] [--learners 2] [--lr 0.01]
      [--overlap 0] [--cache-rows 0] [--max-staleness 0]
      [--out DIR] [--build DIR] [--check 0.005] [--min-auc 0.6] [--machine TEXT]
Writes OUT/clicks.json and OUT/clicks.md (default bench/results/clicks).
Needs root (it starts tgtd); bench/embeddings.sh --clicks runs it.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLKPS = os.path.join(TOP, "scripts", "blkps")
HIDDEN = 64  # the dense part's hidden layer
INIT_STD = 0.01


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--bag", type=int, default=4)
    p.add_argument("--dense", type=int, default=8, help="dense features per example")
    p.add_argument("--examples", type=int, default=200_000, help="training examples")
    p.add_argument("--test", type=int, default=20_000, help="held-out examples")
    p.add_argument("--batch", type=int, default=512, help="examples per step and learner")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--learners", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.01, help="adagrad's lr (the table)")
    p.add_argument("--dense-lr", type=float, default=0.003, help="adam's lr (the dense part)")
    p.add_argument("--overlap", type=int, default=0, help="blkps.torch.EmbeddingBag's overlap (queued pushes)")
    p.add_argument("--cache-rows", type=int, default=0, help="its cache_rows (0: no cache)")
    p.add_argument("--max-staleness", type=int, default=0, help="its max_staleness (steps)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default=os.path.join(TOP, "bench", "results", "clicks"))
    p.add_argument("--build", default=os.path.join(TOP, "build", "cmake"))
    p.add_argument("--check", type=float, default=None,
                   help="exit 1 unless AUC and log-loss are within this relative tolerance of the local run")
    p.add_argument("--min-auc", type=float, default=None,
                   help="with --check: exit 1 unless both runs reach this held-out AUC (something was learned)")
    p.add_argument("--machine", default="", help="a line naming the machine, for the result file")
    p.add_argument("--learner", action="store_true", help=argparse.SUPPRESS)  # internal: one learner
    return p.parse_args(argv)


def data(a):
    """(ids (n, bag) int64, x (n, dense) float32, y (n,) float32) for the
    training set and the held-out set, from --seed."""
    rng = np.random.default_rng(a.seed)
    hidden = rng.standard_normal(a.rows).astype(np.float32)
    w = rng.standard_normal(a.dense).astype(np.float32) / np.sqrt(a.dense)

    def examples(n):
        ids = ((rng.zipf(1.05, (n, a.bag)) - 1) % a.rows).astype(np.int64)
        x = rng.standard_normal((n, a.dense)).astype(np.float32)
        logit = 2.0 * hidden[ids].mean(axis=1) + x @ w - 1.0
        y = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
        return ids, x, y
    return examples(a.examples), examples(a.test)


def dense_part(a):
    import torch
    torch.manual_seed(a.seed)
    return torch.nn.Sequential(torch.nn.Linear(a.width + a.dense, HIDDEN), torch.nn.ReLU(),
                               torch.nn.Linear(HIDDEN, 1))


class Clicks:
    """The model: the bag's mean row beside the dense features, then the
    dense part. `emb` is a torch.nn.EmbeddingBag or a blkps.torch one."""

    def __init__(self, emb, dense):
        self.emb, self.dense = emb, dense

    def __call__(self, ids, x):
        import torch
        return self.dense(torch.cat([self.emb(ids), x], dim=1)).squeeze(1)


def batches(a, n, rank, size):
    """The steps of one epoch: batch k of the training set goes to learner
    k mod size (one process takes them all, in order)."""
    starts = range(0, n - a.batch + 1, a.batch)
    return [s for k, s in enumerate(starts) if k % size == rank]


def train(a, model, train_set, rank, size, step_fn, barrier=None):
    """Runs the epochs; returns each epoch's seconds."""
    import torch
    ids, x, y = (torch.from_numpy(t) for t in train_set)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    seconds = []
    for _ in range(a.epochs):
        if barrier is not None:
            barrier()
        start = time.perf_counter()
        for s in batches(a, len(y), rank, size):
            e = slice(s, s + a.batch)
            step_fn(lambda: loss_fn(model(ids[e], x[e]), y[e]))
        seconds.append(time.perf_counter() - start)
    return seconds


def quality(logits, y):
    """(AUC, log-loss) of logits for labels y (numpy)."""
    p = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
    eps = 1e-7
    logloss = float(-np.mean(y * np.log(p + eps) + (1 - y) * np.log(1 - p + eps)))
    order = np.argsort(logits, kind="mergesort")
    ranks = np.empty(len(y))
    ranks[order] = np.arange(1, len(y) + 1)
    # ties share their mean rank
    sorted_logits = logits[order]
    _, first, counts = np.unique(sorted_logits, return_index=True, return_counts=True)
    for f, c in zip(first, counts):
        if c > 1:
            ranks[order[f:f + c]] = f + (c + 1) / 2.0
    positives = y.sum()
    negatives = len(y) - positives
    auc = float((ranks[y == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives))
    return auc, logloss


def evaluate(a, rows_of, dense, test_set):
    """Held-out (AUC, log-loss) with the table rows given by rows_of(unique
    ids) and the dense part `dense`."""
    import torch
    ids, x, y = test_set
    unique, inverse = np.unique(ids, return_inverse=True)
    rows = torch.from_numpy(rows_of(unique))
    with torch.no_grad():
        bag = torch.nn.functional.embedding_bag(torch.from_numpy(inverse.reshape(ids.shape)), rows, mode="mean")
        logits = dense(torch.cat([bag, torch.from_numpy(x)], dim=1)).squeeze(1).numpy()
    return quality(logits, y)


def run_local(a, train_set, test_set):
    import torch
    torch.manual_seed(a.seed + 1)
    made = time.perf_counter()
    emb = torch.nn.EmbeddingBag(a.rows, a.width, mode="mean", sparse=True)
    with torch.no_grad():
        emb.weight.normal_(0.0, INIT_STD)
    table_opt = torch.optim.Adagrad(emb.parameters(), lr=a.lr)  # makes its state for every row
    made = time.perf_counter() - made
    dense = dense_part(a)
    model = Clicks(emb, dense)
    dense_opt = torch.optim.Adam(dense.parameters(), lr=a.dense_lr)

    def step(loss):
        table_opt.zero_grad()
        dense_opt.zero_grad()
        loss().backward()
        table_opt.step()
        dense_opt.step()
    seconds = train(a, model, train_set, 0, 1, step)
    auc, logloss = evaluate(a, lambda u: emb.weight.detach()[torch.from_numpy(u)].numpy(), dense, test_set)
    return {"epoch_seconds": seconds, "table_seconds": made, "auc": auc, "logloss": logloss}


def from_new_table(r):
    """A side's epoch seconds, the first with the making of its table (the
    local side's table_seconds; blkps makes rows within its epochs)."""
    return [s + (r.get("table_seconds", 0.0) if k == 0 else 0.0) for k, s in enumerate(r["epoch_seconds"])]


def learner(a):
    """One learner (a subprocess of run_blkps): trains its share of every
    epoch, prints "result: {json}" with its epoch seconds."""
    import torch
    torch.set_num_threads(1)
    sys.path.insert(0, os.path.join(TOP, "learner", "python"))
    import blkps
    import blkps.torch as bps
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    train_set, _ = data(a)
    bps.init()
    with blkps.Model(os.environ["CLICKS_TABLE"].split()[rank], queue_depth=32) as table:
        dense = dense_part(a)
        emb = bps.EmbeddingBag(table, a.rows, a.width, mode="mean", overlap=a.overlap,
                               cache_rows=a.cache_rows, max_staleness=a.max_staleness)
        model = Clicks(emb, dense)
        opt = bps.DistributedOptimizer(None, named_parameters=dense.named_parameters())
        bps.broadcast_parameters(dense.state_dict(), root_rank=0)

        def step(loss):
            opt.zero_grad()
            loss().backward()  # pushes the table rows' gradients
            opt.step()         # the dense part
        seconds = train(a, model, train_set, rank, size, step, barrier=bps.barrier)
        emb.flush()
        opt.close()
        bps.barrier()
    print("result: " + json.dumps({"rank": rank, "epoch_seconds": seconds,
                                   "rows_pulled": emb.rows_pulled, "rows_cached": emb.rows_cached,
                                   "pulls": emb.pulls}), flush=True)
    bps.shutdown()


def start_server(state, bsopts, luns, build):
    subprocess.run([BLKPS, "target", "start", "--dir", state, "--luns", str(luns), "--owner-pid", str(os.getpid()),
                    "--plugin", os.path.join(build, "target-plugin", "bs_blkps.so"),
                    "--bsopts", bsopts + ";dead_after=120"], check=True, stdout=subprocess.DEVNULL)
    return json.loads(subprocess.run([BLKPS, "target", "show", "--dir", state, "--json"], check=True,
                                     capture_output=True, text=True).stdout)


def stop_server(state):
    subprocess.run([BLKPS, "target", "stop", "--dir", state], stdout=subprocess.DEVNULL)
    subprocess.run(["rm", "-rf", state])


def run_blkps(a, test_set, argv):
    import blkps
    dense_count = sum(p.numel() for p in dense_part(a).parameters())
    states = [tempfile.mkdtemp(prefix="blkps-clicks-") for _ in range(2)]
    procs = []
    try:
        table = start_server(states[0], f"table={a.rows}:{a.width};rule=adagrad;lr={a.lr};"
                             f"init=normal:{INIT_STD};seed={a.seed}", a.learners, a.build)
        dense = start_server(states[1], f"params={dense_count};rule=adam;lr={a.dense_lr};mode=async",
                             a.learners, a.build)
        for rank in range(a.learners):
            # One BLAS thread a learner, as one torch thread: idle OpenBLAS
            # threads wait in sched_yield, which perf found taking a tenth
            # of the cores the learners and tgtd share (doc/embeddings.md
            # "Click model").
            env = dict(os.environ, OPENBLAS_NUM_THREADS="1", RANK=str(rank), WORLD_SIZE=str(a.learners),
                       LOCAL_RANK=str(rank),
                       BLKPS_TARGET=dense["URL"].rsplit("/", 1)[0] + "/{slot}",
                       BLKPS_CONTROL=dense["CONTROL_URL"], CLICKS_TABLE=table["URLS"])
            procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--learner", *argv],
                                          env=env, stdout=subprocess.PIPE, text=True))
        outs = [p.communicate()[0] for p in procs]
        if any(p.returncode != 0 for p in procs):
            raise SystemExit(f"clicks: a learner failed: {[p.returncode for p in procs]}")
        results = [json.loads(next(line for line in out.splitlines() if line.startswith("result: "))[8:])
                   for out in outs]
        with blkps.Model(table["URL"]) as t, blkps.Model(dense["URL"]) as d:
            model = dense_part(a)
            flat = d.pull(0, dense_count)
            import torch
            at = 0
            with torch.no_grad():
                for p in model.parameters():
                    p.copy_(torch.from_numpy(np.asarray(flat[at:at + p.numel()], dtype=np.float32)).reshape(p.shape))
                    at += p.numel()
            auc, logloss = evaluate(a, lambda u: t.pull_rows(u.astype(np.uint64), a.width), model, test_set)
        seconds = [max(r["epoch_seconds"][k] for r in results) for k in range(a.epochs)]
        return {"epoch_seconds": seconds, "auc": auc, "logloss": logloss,
                "rows_pulled": sum(r["rows_pulled"] for r in results),
                "rows_cached": sum(r["rows_cached"] for r in results), "pulls": sum(r["pulls"] for r in results)}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for state in states:
            stop_server(state)


def shown_argv(argv):
    """argv without --out, --build, --machine and their values."""
    shown, skip = [], False
    for x in argv:
        if skip:
            skip = False
        elif x in ("--out", "--build", "--machine"):
            skip = True
        elif not x.startswith(("--out=", "--build=", "--machine=")):
            shown.append(x)
    return shown


def main():
    argv = sys.argv[1:]
    a = parse(argv)
    os.environ.setdefault("BLKPS_LIB", os.path.join(a.build, "learner", "libblkps.so"))
    if a.learner:
        return learner(a)
    import torch
    torch.set_num_threads(1)
    sys.path.insert(0, os.path.join(TOP, "learner", "python"))
    train_set, test_set = data(a)
    local = run_local(a, train_set, test_set)
    print(f"clicks: local {json.dumps(local)}", file=sys.stderr, flush=True)
    served = run_blkps(a, test_set, argv)
    print(f"clicks: blkps {json.dumps(served)}", file=sys.stderr, flush=True)
    dense_count = sum(p.numel() for p in dense_part(a).parameters())
    result = {"rows": a.rows, "width": a.width, "bag": a.bag, "dense_features": a.dense,
              "dense_params": dense_count, "table_params": a.rows * a.width, "examples": a.examples,
              "test": a.test, "batch": a.batch, "epochs": a.epochs, "learners": a.learners,
              "machine": a.machine, "local": local, "blkps": served,
              "command": "bench/clicks.py " + " ".join(shown_argv(argv))}
    auc_gap = (served["auc"] - local["auc"]) / local["auc"]
    loss_gap = (served["logloss"] - local["logloss"]) / local["logloss"]
    result["auc_relative"], result["logloss_relative"] = auc_gap, loss_gap
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "clicks.json"), "w") as f:
        json.dump(result, f, indent=2)
    mean = lambda v: sum(v) / len(v)  # noqa: E731
    lines = ["# Click model: 2 learners through blkps vs one process with a local table", "",
             f"{a.rows:,} rows × {a.width} (table: {a.rows * a.width:,} parameters), dense part "
             f"{dense_count:,} parameters; {a.examples:,} training examples (bags of {a.bag} Zipf(1.05) ids, "
             f"{a.dense} dense features), {a.test:,} held out; batch {a.batch} per learner, {a.epochs} epoch(s). "
             f"Machine: {a.machine or 'not named'}. Command: `{result['command']}`.", "",
             "Seconds per epoch: the first with the making of the table (the local table's rows and Adagrad state, "
             f"{local['table_seconds']:.2f} s before its first step; blkps makes rows as pushes first touch them).",
             "", "| run | seconds per epoch | AUC | log-loss |", "|---|---:|---:|---:|",
             f"| one process, local table | {mean(from_new_table(local)):.2f} | {local['auc']:.4f} | "
             f"{local['logloss']:.4f} |",
             f"| {a.learners} learners, blkps | {mean(from_new_table(served)):.2f} | {served['auc']:.4f} | "
             f"{served['logloss']:.4f} |", "",
             f"blkps vs local: time {mean(from_new_table(served)) / mean(from_new_table(local)):.2f}x, "
             f"AUC {100 * auc_gap:+.2f}%, log-loss {100 * loss_gap:+.2f}%."]
    with open(os.path.join(a.out, "clicks.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    if a.check is not None and (abs(auc_gap) > a.check or abs(loss_gap) > a.check):
        print(f"clicks: blkps's AUC ({served['auc']:.4f}) or log-loss ({served['logloss']:.4f}) is not within "
              f"{100 * a.check:g}% of the local run's ({local['auc']:.4f}, {local['logloss']:.4f})", file=sys.stderr)
        return 1
    if a.min_auc is not None and min(local["auc"], served["auc"]) < a.min_auc:
        print(f"clicks: an AUC is below {a.min_auc}: local {local['auc']:.4f}, blkps {served['auc']:.4f}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
