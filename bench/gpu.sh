#!/usr/bin/env bash
# GPU learners through blkps (doc/gpu.md "bench/gpu.sh"): ResNet-50 and a
# GPT-2-shaped transformer on one GPU, alone and through co-located shards
# (async and bsp, pipeline on and off, float32 and bfloat16 LUNs, 1 and 2
# learners, and the ceiling: plain processes sharing the GPU, MPS off and on),
# written to --out DIR as gpu.json and gpu.md; --check runs
# tests/gpu_test.py's cases (the CUDA ones need a GPU); --all runs both,
# most telling runs first, within --budget-s (330 s).
# Without a CUDA device the measurement says so and exits 1.
#
# Usage: sudo bench/gpu.sh --out DIR [--mode async,bsp] [--pipeline default,on,off] [--models resnet50,gpt2] ...
#        bench/gpu.sh --check [--build DIR]
#        bash .gpu-host/env.sh bash bench/gpu.sh --all --out 'bench/results/{gpu}'   # on a GPU host
# The first python3 that has both torch and numpy runs it (BLKPS_PYTHON first).
# With OUT set (a lent GPU host's folder), results and output are copied there too.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
for py in "${BLKPS_PYTHON:-}" /usr/bin/python3 python3; do
  if [ -n "$py" ] && "$py" -c 'import torch, numpy' 2>/dev/null; then
    exec "$py" "$top/bench/gpu_bench.py" "$@"
  fi
done
echo "gpu bench: no python3 with torch and numpy found (set BLKPS_PYTHON to one)" >&2
exit 1
