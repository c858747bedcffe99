#!/usr/bin/python3
"""A real Slurm cluster out of network namespaces (bench/cluster/slurm.py).

  slurm_cluster_test.py TOP CASE
    batch-job-completes-and-nodes-are-clean  (vm label, root) a batch job over
        two nodes whose step runs `hostname` on each ends COMPLETED, printed
        both node names, and leaves no process but slurmd on any node; after
        the with-block no namespace of the cluster remains
    example-job-trains-and-nodes-are-clean  (vm label, root) the example job
        examples/slurm/fashion.sbatch (2 server nodes, 2 learner nodes, plain
        srun, a small subset) ends COMPLETED, its rank 0 printed the held-out
        accuracy, and no process but slurmd is left on any node
    scancel-mid-job-leaves-nodes-clean  (vm label, root) the example job,
        cancelled with `scancel` once its learners have trained an epoch,
        ends CANCELLED and leaves no process but slurmd on any node (the
        servers' tgtds included)
    bsp-over-two-servers-equals-the-reference  (vm label, root) a job of 2
        `blkps target serve --part slurm` server nodes (the model in two
        parts, the layout assembled from what they publish) and 2 bsp
        learner tasks pushing known gradients (tests/slurm_bsp_learner.py)
        ends COMPLETED with the weights a one-process reference computes,
        exactly, and leaves no process but slurmd on any node
    killed-server-is-named  (vm label, root) the example job whose server
        node's tgtd is killed (kill -9) once its learners have trained an
        epoch ends FAILED; the server task says its tgtd died, each learner
        gives up reconnecting (BLKPS_RECONNECT_SECONDS=5) in a line naming
        the server's address, and no process but slurmd is left on any node
"""
import os
import signal
import subprocess
import sys
import tempfile

import numpy as np

top, case = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(top, "bench", "cluster"))
import slurm  # noqa: E402


def batch_job_completes_and_nodes_are_clean():
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)  # munged (user munge) reaches its folder inside
        with slurm.SlurmCluster(nodes=2, folder=tmp) as cluster:
            namespaces = list(cluster.net.namespaces)
            job = cluster.sbatch(["-N2", f"--chdir={tmp}", f"--output={tmp}/job.out", "--wrap", "srun hostname"])
            state = cluster.wait_job(job, timeout=60)
            assert state == "COMPLETED", f"job {job} ended {state}"
            with open(os.path.join(tmp, "job.out")) as f:
                assert sorted(f.read().split()) == ["n1", "n2"], "each node's step prints its own name"
            assert cluster.leftovers() == {}, f"processes left on nodes: {cluster.leftovers()}"
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert not [ns for ns in namespaces if ns in listed], "the cluster's namespaces are deleted"
    print("ok")


def submit_example(cluster, tmp, epochs, **more):
    """The example job on 2 server and 2 learner nodes (plain srun, bsp, a
    small subset) for `epochs`, with `more` variables; its job id."""
    variables = {"S": 2, "L": 2, "MODE": "bsp", "LAUNCHER": "srun", "EPOCHS": epochs, "TRAIN_SUBSET": 512,
                 "TEST_SUBSET": 500, "BLKPS_TOP": top, "PYTHON": "/usr/bin/python3", "WAIT_S": 60,
                 "JOBDIR": f"{tmp}/job", "SERVER_DIR": f"{tmp}/serve", **more}
    export = ",".join(f"{k}={v}" for k, v in variables.items()) + ",ALL"
    return cluster.sbatch(["-N4", f"--export={export}", f"--chdir={top}", f"--output={tmp}/job.out",
                           os.path.join(top, "examples", "slurm", "fashion.sbatch")])


def example_job_trains_and_nodes_are_clean():
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)  # munged (user munge) reaches its folder inside
        with slurm.SlurmCluster(nodes=4, folder=tmp) as cluster:
            job = submit_example(cluster, tmp, epochs=1)
            state = cluster.wait_job(job, timeout=240)
            with open(os.path.join(tmp, "job.out")) as f:
                out = f.read()
            assert state == "COMPLETED", f"job {job} ended {state}:\n{out[-3000:]}"
            assert "learner 0: held-out accuracy" in out, f"rank 0 reports the held-out accuracy:\n{out[-3000:]}"
            serving = [line for line in out.splitlines() if line.startswith("serving ")]
            assert len(serving) == 2, f"each of the 2 server nodes serves a part:\n{out[-3000:]}"
            assert cluster.leftovers() == {}, f"processes left on nodes: {cluster.leftovers()}"
    print("ok")


def wait_for_an_epoch(cluster, job, out):
    """Returns once a learner of `job` (output file `out`) has trained an epoch."""
    def trained_an_epoch():
        with open(out) if os.path.exists(out) else open(os.devnull) as f:
            text = f.read()
        assert cluster.job_state(job) in ("PENDING", "RUNNING"), f"job {job} ended early:\n{text[-3000:]}"
        return "epoch 1/" in text
    slurm.until(trained_an_epoch, 240, "no learner finished an epoch")


def scancel_mid_job_leaves_nodes_clean():
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)  # munged (user munge) reaches its folder inside
        with slurm.SlurmCluster(nodes=4, folder=tmp) as cluster:
            job = submit_example(cluster, tmp, epochs=10_000)  # far longer than the test waits
            wait_for_an_epoch(cluster, job, os.path.join(tmp, "job.out"))
            cluster.client(["scancel", job])
            state = cluster.wait_job(job, timeout=120)
            assert state == "CANCELLED", f"job {job} ended {state}"
            # Slurm ends the steps' processes after the job's state changes.
            cluster.wait_clean(120)
    print("ok")


# Two server nodes each serve half of the model, two learner nodes push;
# then the server step gets SIGTERM as in examples/slurm/fashion.sbatch.
BSP_JOB = """#!/bin/bash
set -euo pipefail
mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
# Each part's state in a folder of its own: the namespace nodes share /tmp.
srun --nodes=2 --ntasks=2 --nodelist="${nodes[0]},${nodes[1]}" bash -c 'exec "$0" "$@" --dir "$JOBDIR/serve-$SLURMD_NODENAME"' \\
  "$TOP/scripts/blkps" target serve --part slurm --publish "$JOBDIR" --luns 2 --allow slurm \\
  --bsopts "params=$PARAMS;rule=sum;mode=bsp" &
servers=$!
"$TOP/scripts/blkps" layout wait "$JOBDIR" --timeout 60
status=0
srun --nodes=2 --ntasks=2 --nodelist="${nodes[2]},${nodes[3]}" \\
  /usr/bin/python3 "$TOP/tests/slurm_bsp_learner.py" "$JOBDIR" "$PARAMS" "$ROUNDS" "$OUT" || status=$?
scancel --signal=TERM "$SLURM_JOB_ID.0" || true
wait "$servers" || true
exit "$status"
"""


def bsp_over_two_servers_equals_the_reference():
    params, rounds = 600_000, 5  # more than two 1 MiB stripe units: a part on each server
    sys.path[:0] = [os.path.join(top, "tests"), os.path.join(top, "learner", "python")]
    from slurm_bsp_learner import gradient
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)  # munged (user munge) reaches its folder inside
        script, out = os.path.join(tmp, "bsp.sbatch"), os.path.join(tmp, "weights.f32")
        with open(script, "w") as f:
            f.write(BSP_JOB)
        with slurm.SlurmCluster(nodes=4, folder=tmp) as cluster:
            variables = {"TOP": top, "JOBDIR": f"{tmp}/job", "PARAMS": params, "ROUNDS": rounds, "OUT": out,
                         "PYTHONPATH": os.path.join(top, "learner", "python")}
            export = ",".join(f"{k}={v}" for k, v in variables.items()) + ",ALL"
            job = cluster.sbatch(["-N4", "--ntasks-per-node=1", f"--export={export}", f"--chdir={tmp}",
                                  f"--output={tmp}/job.out", script])
            state = cluster.wait_job(job, timeout=240)
            with open(os.path.join(tmp, "job.out")) as f:
                text = f.read()
            assert state == "COMPLETED", f"job {job} ended {state}:\n{text[-3000:]}"
            published = os.path.join(tmp, "job", "servers")
            parts = sorted(os.listdir(published)) if os.path.isdir(published) else []
            assert parts == [], f"the parts' published files outlive their servers: {parts}"
            cluster.wait_clean(120)
        weights = np.fromfile(out, dtype=np.float32)
        reference = np.zeros(params, dtype=np.float32)
        for r in range(1, rounds + 1):  # bsp with rule sum: each round adds the learners' mean
            reference += (gradient(0, r, params) + gradient(1, r, params)) / np.float32(2)
        assert np.array_equal(weights, reference), \
            f"{int((weights != reference).sum())} of {params} weights differ from the one-process reference"
    print("ok")


def killed_server_is_named():
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)  # munged (user munge) reaches its folder inside
        with slurm.SlurmCluster(nodes=4, folder=tmp) as cluster:
            job = submit_example(cluster, tmp, epochs=10_000, BLKPS_RECONNECT_SECONDS=5)
            out = os.path.join(tmp, "job.out")
            wait_for_an_epoch(cluster, job, out)
            server = cluster.node_names()[0]  # the job's first node serves part 0
            tgtds = cluster.pids(server, "tgtd")
            assert len(tgtds) == 1, f"{server} runs tgtds {tgtds}"
            os.kill(tgtds[0], signal.SIGKILL)  # the job's, which this test started
            state = cluster.wait_job(job, timeout=180)
            with open(out) as f:
                text = f.read()
            assert state == "FAILED", f"job {job} ended {state}:\n{text[-3000:]}"
            address = cluster.net.address(cluster.node_host(server))
            gave_up = [line for line in text.splitlines() if "gave up reconnecting" in line]
            assert len(gave_up) == 2 and all(address in line for line in gave_up), \
                f"each learner names the server {address} in one line:\n{text[-3000:]}"
            assert f"target serve: tgtd {tgtds[0]} exited (killed by signal 9)" in text, \
                f"the server task says its tgtd died:\n{text[-3000:]}"
            cluster.wait_clean(120)
    print("ok")


{
    "batch-job-completes-and-nodes-are-clean": batch_job_completes_and_nodes_are_clean,
    "scancel-mid-job-leaves-nodes-clean": scancel_mid_job_leaves_nodes_clean,
    "killed-server-is-named": killed_server_is_named,
    "bsp-over-two-servers-equals-the-reference": bsp_over_two_servers_equals_the_reference,
    "example-job-trains-and-nodes-are-clean": example_job_trains_and_nodes_are_clean,
}[case]()
