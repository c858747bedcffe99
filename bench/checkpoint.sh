#!/usr/bin/env bash
# Checkpoint bench (doc/server.md "Checkpoints"; doc/performance.md
# "Checkpoints"): for each model size, the start (allocation and
# init=normal), a checkpoint's duration and the longest wait of a learner
# pushing during it, and the restart from the file, measured in process on
# the aggregator by bench/checkpoint_bench.cc.
# Usage: bench/checkpoint.sh [--tree DIR] [--dir DIR] PARAMS...
#   --tree DIR  whose aggregator/ to build the bench against (default: this
#               checkout); give another worktree (e.g. main's) to compare
#   --dir DIR   where the checkpoint file goes (default: a fresh folder
#               under /var/tmp, on disk, removed afterwards)
# Prints one JSON line per size. Needs memory for the model twice over (the
# copies writes make during a checkpoint) and its file's size on disk.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
tree=$top dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --tree) tree=$(cd "$2" && pwd); shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    -*) echo "checkpoint.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "usage: bench/checkpoint.sh [--tree DIR] [--dir DIR] PARAMS..." >&2; exit 2; }
work=$(mktemp -d /var/tmp/blkps-checkpoint-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT
[ -n "$dir" ] || dir=$work
arch=$(gcc -print-multiarch)
# The aggregator's own flags (aggregator/CMakeLists.txt).
g++ -std=c++17 -O3 -fno-math-errno -o "$work/bench" "$top/bench/checkpoint_bench.cc" "$tree"/aggregator/*.cc \
  -I"$tree/aggregator" -I"$tree/wire/include" -I"/usr/include/$arch/openblas-serial" \
  -L"/usr/lib/$arch/openblas-serial" -Wl,-rpath,"/usr/lib/$arch/openblas-serial" -lopenblas -pthread
for params in "$@"; do
  "$work/bench" "$params" "$dir"
done
