#!/usr/bin/python3
"""A real Slurm cluster out of network namespaces (bench/cluster/slurm.py).

  slurm_cluster_test.py TOP CASE
    batch-job-completes-and-nodes-are-clean  (vm label, root) a batch job over
        two nodes whose step runs `hostname` on each ends COMPLETED, printed
        both node names, and leaves no process but slurmd on any node; after
        the with-block no namespace of the cluster remains
"""
import os
import subprocess
import sys
import tempfile

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


{"batch-job-completes-and-nodes-are-clean": batch_job_completes_and_nodes_are_clean}[case]()
