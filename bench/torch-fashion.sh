#!/usr/bin/env bash
# The Fashion-MNIST CNN through blkps (1, 2, 4 learners; async, bsp, ssp:2;
# gradient and delta mode) beside DistributedDataParallel (gloo): final
# held-out accuracy, training time to 85%, samples/s, and a plot, written to
# --out DIR (default build/bench-report): torch-fashion.md, torch-fashion.png.
# About 15 minutes on 2 cores.
#
# Usage: sudo bench/torch-fashion.sh [--out DIR] [--epochs E] [--learners 1,2,4] [--build DIR]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
[ "$(id -u)" = 0 ] || { echo "torch-fashion: needs root (tgtd): sudo $0" >&2; exit 1; }
exec /usr/bin/python3 "$top/bench/torch_fashion_bench.py" "$@"
