#!/usr/bin/env bash
# The Fashion-MNIST CNN through blkps (1, 2, 4 learners; async, bsp, ssp:2;
# gradient and delta mode) beside one process on the total batch and
# DistributedDataParallel (gloo): final held-out accuracy and its difference
# to one process, training time to 85%, samples/s, push staleness, and a
# plot (accuracy over time, loss over updates), written to --out DIR
# (default build/bench-report): torch-fashion.md, torch-fashion.png.
# About 15 minutes on 2 cores. --straggler: the last rank at half speed.
#
# Usage: sudo bench/torch-fashion.sh [--out DIR] [--epochs E] [--learners 1,2,4]
#            [--modes async,ssp:2] [--optimizers gradient,delta] [--no-ddp] [--no-reference]
#            [--server-options staleness_aware=0] [--straggler] [--build DIR]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck disable=SC1091  # bench/lib.sh
. "$top/bench/lib.sh"
need_root torch-fashion tgtd
exec /usr/bin/python3 "$top/bench/torch_fashion_bench.py" "$@"
