#!/usr/bin/env bash
# Embedding tables (doc/embeddings.md): rows per second pulled and pushed
# through libblkps's pull_rows / push_rows at row widths 32, 128 and 512
# float32, batches of Zipf(1.05) ids, against tgt's null store at the same
# requests and queue depth in the same tgtd and run (the IOPS ceiling), and
# against a local torch.nn.EmbeddingBag with sparse gradients (the learner's
# own limit). Writes embeddings.md and embeddings.json to --out DIR
# (default bench/results/embeddings).
#
# Usage: sudo bench/embeddings.sh [--rows N] [--batch N] [--qd N] [--widths 32,128,512]
#            [--seconds S] [--rounds R] [--out DIR] [--build DIR]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
[ "$(id -u)" = 0 ] || { echo "embeddings: needs root (tgtd): sudo $0" >&2; exit 1; }
exec /usr/bin/python3 "$top/bench/embeddings_bench.py" "$@"
