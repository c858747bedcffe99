#!/usr/bin/env bash
# Embedding tables (doc/embeddings.md "Bench"): distinct rows per second
# pulled and pushed through libblkps's pull_rows / push_rows (the server's
# row windows) at row widths 32, 128 and 512 float32, batches of Zipf(1.05)
# ids scattered over the table by a fixed permutation (--no-permute: not),
# against the same bytes moved as one contiguous range on the same LUN in
# the same run, batch by batch in turn (the ratio the issue's bar is set
# on), and against a local torch.nn.EmbeddingBag with sparse gradients (the
# learner's own limit), with tgtd's CPU and bytes per row. Writes
# embeddings.md and embeddings.json to --out DIR (default
# bench/results/embeddings).
# --clicks instead runs the click model (bench/clicks.py: 2 learners through
# blkps vs one process with a local table; its options follow).
#
# Usage: sudo bench/embeddings.sh [--rows N] [--batch N] [--qd N] [--widths 32,128,512]
#            [--seconds S] [--rounds R] [--no-permute] [--out DIR] [--build DIR]
#        sudo bench/embeddings.sh --clicks [bench/clicks.py options]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
[ "$(id -u)" = 0 ] || { echo "embeddings: needs root (tgtd): sudo $0" >&2; exit 1; }
if [ "${1:-}" = --clicks ]; then
  shift
  exec /usr/bin/python3 "$top/bench/clicks.py" "$@"
fi
exec /usr/bin/python3 "$top/bench/embeddings_bench.py" "$@"
