#!/usr/bin/env bash
# GPU learners through blkps (doc/gpu.md): ResNet-50 and a GPT-2-shaped
# transformer on one GPU, alone and through co-located shards (float32 and
# bfloat16 LUNs, 1 and 2 learners), written to --out DIR as gpu.json and
# gpu.md; --check runs tests/gpu_test.py's cases (the CUDA one needs a GPU).
# Without a CUDA device the measurement says so and exits 1.
#
# Usage: sudo bench/gpu.sh --out DIR [--models resnet50,gpt2] [--shards 8] [--steps 30] [--build DIR]
#        bench/gpu.sh --check [--build DIR]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
for py in "${BLKPS_PYTHON:-}" /usr/bin/python3 python3; do
  if [ -n "$py" ] && "$py" -c 'import torch' 2>/dev/null; then
    exec "$py" "$top/bench/gpu_bench.py" "$@"
  fi
done
echo "gpu bench: no python3 with torch found (set BLKPS_PYTHON)" >&2
exit 1
