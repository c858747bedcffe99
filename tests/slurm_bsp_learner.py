#!/usr/bin/python3
"""A bsp learner of SlurmCluster.bsp-over-two-servers-equals-the-reference
(tests/slurm_cluster_test.py), one Slurm task: rank SLURM_PROCID pushes
gradient(rank, round) to the whole model through the layout of its slot
(slot = rank + 1) ROUNDS times, pulling after each; rank 0 then writes the
weights it pulled last to OUT (float32). Small integers: their sums and
halves are exact in float32, so the reference owes nothing to the order of
the server's additions.

usage: slurm_bsp_learner.py LAYOUT_FOLDER PARAMS ROUNDS OUT
"""
import os
import sys

import numpy as np

import blkps


def gradient(rank, r, n):
    """The gradient rank `rank` pushes in round `r` (1-based) of `n` values."""
    return np.random.default_rng(1000 * rank + r).integers(-8, 9, n).astype(np.float32)


def main():
    folder, n, rounds, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    rank = int(os.environ["SLURM_PROCID"])
    with blkps.Model(f"layout:{folder}/slot-{rank + 1}.layout") as m:
        for r in range(1, rounds + 1):
            m.push(0, gradient(rank, r, n))
            w = m.pull(0, n)
    if rank == 0:
        w.astype(np.float32).tofile(out)


if __name__ == "__main__":
    main()
