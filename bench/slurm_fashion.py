#!/usr/bin/python3
"""The Fashion-MNIST CNN through blkps on a Slurm cluster against the same
job on one host (issue 39: within 1 point of the one-host run).

Slurm: examples/slurm/fashion.sbatch on a cluster of 3 namespace nodes
(bench/cluster/slurm.py: 2 server nodes, 2 learner nodes, plain srun). One
host: learner/examples/torch_fashion_job.py with 2 learners against a
private server on this host. Same mode, server rule and lr, epochs and
data; the two run one after the other. Prints both held-out accuracies and
writes slurm-fashion.json and slurm-fashion.md to --out.

  sudo bench/slurm_fashion.py [--epochs 2] [--train-subset 30000] [--mode bsp]
      [--out bench/results/slurm]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(TOP, "bench", "cluster"))
import slurm  # noqa: E402

ACCURACY = re.compile(r"learner 0: held-out accuracy ([0-9.]+)")
RULE, LR = "adam", "0.002"  # the example's defaults


def accuracy_of(text, what):
    found = ACCURACY.findall(text)
    if not found:
        sys.exit(f"slurm_fashion: the {what} run printed no held-out accuracy:\n{text[-3000:]}")
    return float(found[-1])


def one_host(a):
    run = subprocess.run(["/usr/bin/python3", os.path.join(TOP, "learner", "examples", "torch_fashion_job.py"),
                          "--learners", "2", "--mode", a.mode, "--rule", RULE, "--server-lr", LR,
                          "--epochs", str(a.epochs), "--train-subset", str(a.train_subset)],
                         capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"slurm_fashion: the one-host run failed:\n{run.stdout[-2000:]}{run.stderr[-2000:]}")
    return accuracy_of(run.stdout, "one-host")


def on_slurm(a):
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)  # munged (user munge) reaches its folder inside
        with slurm.SlurmCluster(nodes=4, folder=tmp) as cluster:
            variables = {"S": 2, "L": 2, "MODE": a.mode, "LAUNCHER": "srun", "EPOCHS": a.epochs,
                         "TRAIN_SUBSET": a.train_subset, "TEST_SUBSET": 0, "SERVER_RULE": RULE, "SERVER_LR": LR,
                         "BLKPS_TOP": TOP, "PYTHON": "/usr/bin/python3", "JOBDIR": f"{tmp}/job",
                         "SERVER_DIR": f"{tmp}/serve"}
            export = ",".join(f"{k}={v}" for k, v in variables.items()) + ",ALL"
            job = cluster.sbatch(["-N4", f"--export={export}", f"--chdir={TOP}", f"--output={tmp}/job.out",
                                  os.path.join(TOP, "examples", "slurm", "fashion.sbatch")])
            print(f"slurm_fashion: job {job} submitted to the namespace cluster", file=sys.stderr)
            state = cluster.wait_job(job, timeout=3600)
            with open(os.path.join(tmp, "job.out")) as f:
                out = f.read()
            if state != "COMPLETED":
                sys.exit(f"slurm_fashion: job {job} ended {state}:\n{out[-3000:]}")
            return state, accuracy_of(out, "Slurm")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--train-subset", type=int, default=30000)
    p.add_argument("--mode", default="bsp")
    p.add_argument("--out", default=os.path.join(TOP, "bench", "results", "slurm"))
    a = p.parse_args()
    print("slurm_fashion: the one-host run", file=sys.stderr)
    local = one_host(a)
    print(f"slurm_fashion: one host: held-out accuracy {local:.4f}; now the Slurm job", file=sys.stderr)
    state, clustered = on_slurm(a)
    load = os.getloadavg()[0]
    result = {"mode": a.mode, "epochs": a.epochs, "train_subset": a.train_subset, "rule": RULE, "lr": float(LR),
              "one_host_accuracy": local, "slurm_accuracy": clustered, "slurm_state": state,
              "difference_points": round(100 * (clustered - local), 2), "load_average_at_end": round(load, 1)}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "slurm-fashion.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(a.out, "slurm-fashion.md"), "w") as f:
        f.write("# The Fashion-MNIST CNN on Slurm against one host\n\n"
                f"`sudo bench/slurm_fashion.py --epochs {a.epochs} --train-subset {a.train_subset} "
                f"--mode {a.mode}`: 2 learners, server rule {RULE} lr {LR}, all 10,000 held-out images; "
                f"load average {load:.1f} at the end.\n\n"
                "| run | Slurm state | held-out accuracy |\n|---|---|---:|\n"
                f"| one host (torch_fashion_job.py) | - | {local:.4f} |\n"
                f"| Slurm, 2 server + 2 learner nodes (examples/slurm) | {state} | {clustered:.4f} |\n\n"
                f"Difference: {100 * (clustered - local):+.2f} points.\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
