#!/usr/bin/python3
"""The cluster bench's readers (bench/cluster/results.py) over what each of
its processes really writes: the ranks' own writers run here, small and
alone (one rank, a plain file for a model, gloo on loopback), so that a
writer and its reader cannot drift apart unseen (the DDP ranks once wrote
no push_times and `bench/cluster.sh --quick` died reading them).

  cluster_results_test.py TOP BUILD CASE     (label unit)
    exchanges-of-blkps-ranks   bench/peers/blkps_exchange.py, plain,
        pipelined and blkps.torch's steps (with and without its pipeline):
        every timed exchange, CPU, push and pull medians where timed apart
    exchanges-of-gloo-ranks    bench/peers/gloo_allreduce.py, all_reduce and
        DDP (with and without fp16): times and CPU, no phases
    mpi-rank-line              rank 0's line as bench/peers/mpi_allreduce.c
        prints it (its format, copied: no MPI compiler here): every rank's times
    training-of-learners       bench/train_synthetic.py on a plain file:
        samples in time order and the run's seconds
    rows-of-learners           bench/peers/blkps_rows.py's result, as it
        writes it (it needs a table server): the summed rates
"""
import json
import os
import socket
import subprocess
import sys
import tempfile

top, build, case = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, os.path.join(top, "bench", "cluster"))
import results  # noqa: E402

PYTHON = "/usr/bin/python3"
PEERS = os.path.join(top, "bench", "peers")
ITERATIONS, WARMUP, PARAMS = 3, 1, 4096
os.environ["BLKPS_LIB"] = os.path.join(build, "learner", "libblkps.so")


def fail(why):
    sys.exit(f"cluster_results_test {case}: FAIL: {why}")


def run(argv, what):
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        fail(f"{what} exited {out.returncode}: {out.stderr.strip()[-500:]}")


def model_file(folder, params):
    """A plain file of `params` float32 zeros: a model device for libblkps."""
    path = os.path.join(folder, "model.f32")
    with open(path, "wb") as f:
        f.truncate(4 * params)
    return path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def exchanges_of_blkps_ranks(tmp):
    device = model_file(tmp, PARAMS)
    for k, extra in enumerate(([], ["--pipelined"], ["--torch"], ["--torch", "--pipelined"])):
        path = os.path.join(tmp, f"blkps{k}.json")
        run([PYTHON, os.path.join(PEERS, "blkps_exchange.py"), "--target", device, "--params", str(PARAMS),
             "--iterations", str(ITERATIONS), "--warmup", str(WARMUP), "--result", path, *extra],
            f"blkps_exchange.py {' '.join(extra)}")
        times, figures = results.exchanges([results.load(path)], ITERATIONS)
        if len(times) != ITERATIONS or "cpu_ms_per_exchange" not in figures:
            fail(f"{extra}: {len(times)} times, figures {figures}")
        timed_apart = not extra  # pipelined: push and pull are one call; torch: a step
        if timed_apart != ("ms_per_push" in figures and "ms_per_pull" in figures):
            fail(f"{extra}: push and pull medians {'missing' if timed_apart else 'present'}: {figures}")


def exchanges_of_gloo_ranks(tmp):
    for extra in ([], ["--ddp"], ["--ddp", "--compress", "fp16"]):
        path = os.path.join(tmp, f"gloo{len(extra)}.json")
        run([PYTHON, os.path.join(PEERS, "gloo_allreduce.py"), "--rank", "0", "--world", "1",
             "--init", f"tcp://127.0.0.1:{free_port()}", "--params", str(PARAMS), "--iterations", str(ITERATIONS),
             "--warmup", str(WARMUP), "--result", path, *extra], f"gloo_allreduce.py {' '.join(extra)}")
        times, figures = results.exchanges([results.load(path)], ITERATIONS)
        if len(times) != ITERATIONS or set(figures) != {"cpu_ms_per_exchange"}:
            fail(f"{extra}: {len(times)} times, figures {figures}")


def mpi_rank_line(tmp):
    # mpi_allreduce.c's printf, two ranks.
    line = ('{"peer": "mpi", "procs": 2, "params": 4096, "dtype": "float32", "times": [[0.001, 0.002, 0.003], '
            '[0.004, 0.005, 0.006]], "cpu": [0.01, 0.03]}')
    times, figures = results.mpi(json.loads(line), ITERATIONS)
    if times != [0.001, 0.002, 0.003, 0.004, 0.005, 0.006] or abs(figures["cpu_ms_per_exchange"] - 20 / 3) > 1e-9:
        fail(f"got {times}, {figures}")


def training_of_learners(tmp):
    device = model_file(tmp, 1 << 20)
    paths = []
    for learner in range(2):
        paths.append(os.path.join(tmp, f"train{learner}.json"))
        run([PYTHON, os.path.join(top, "bench", "train_synthetic.py"), "--target", device, "--params", str(1 << 20),
             "--learner", str(learner), "--learners", "2", "--iterations", str(ITERATIONS), "--batch", "4",
             "--result", paths[-1]], f"train_synthetic.py --learner {learner}")
    samples, seconds = results.training([results.load(p) for p in paths])
    if len(samples) != 2 * ITERATIONS or samples != sorted(samples) or not seconds >= samples[-1][0]:
        fail(f"samples {samples}, seconds {seconds}")


def rows_of_learners(tmp):
    # blkps_rows.py's json.dump, two learners (it runs only against a table server).
    written = [{"learner": k, "pull_s": 2.0, "push_s": 4.0, "late_s": 0.0, "ids": 8192, "distinct": 1000}
               for k in range(2)]
    rates = results.rows(written)
    if rates != {"pull_ids_per_s": 8192.0, "push_ids_per_s": 4096.0, "pull_rows_per_s": 1000.0,
                 "push_rows_per_s": 500.0}:
        fail(f"got {rates}")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="blkps-cluster-results-") as tmp:
        {"exchanges-of-blkps-ranks": exchanges_of_blkps_ranks, "exchanges-of-gloo-ranks": exchanges_of_gloo_ranks,
         "mpi-rank-line": mpi_rank_line, "training-of-learners": training_of_learners,
         "rows-of-learners": rows_of_learners}[case](tmp)
    print(f"cluster_results_test {case}: ok")
