#!/usr/bin/env bash
# The learner engine's benchmark (bench/engine_bench.cc) against a private
# target on loopback: stall fraction with and without double buffering and
# staleness with and without adaptive pulling, for compute 0.5x, 1x and 2x
# the communication time, with N learners; then the push+pull rate of the
# model through the engine against tgt's null store (same tgtd, same request
# size and queue depth, interleaved rounds, medians). Prints markdown tables.
#
# Usage: sudo bench/engine-bench.sh [--learners 2] [--params 16777216]
#          [--build DIR] [-- blkps-engine-bench options, see its --help]
# --params 16777216 is a 64 MiB model. Needs a build (scripts/build.sh, or
# --build DIR of a cmake build with blkps-engine-bench and bs_blkps).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck disable=SC1091  # bench/lib.sh
. "$top/bench/lib.sh"
learners=2 params=16777216 build=$(default_build)
while [ $# -gt 0 ]; do
  case "$1" in
    --learners) learners=${2:?}; shift 2 ;;
    --params) params=${2:?}; shift 2 ;;
    --build) build=${2:?}; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "engine-bench: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
bench="$build/bench/blkps-engine-bench"
plugin="$build/target-plugin/bs_blkps.so"
[ -x "$bench" ] || { echo "engine-bench: $bench not built: run scripts/build.sh" >&2; exit 1; }
[ -f "$plugin" ] || { echo "engine-bench: $plugin not built: run scripts/build.sh" >&2; exit 1; }
state=$(mktemp -d /tmp/blkps-engine-bench-XXXXXX)
blkps="$top/scripts/blkps"
trap '"$blkps" target stop --dir "$state" >/dev/null 2>&1; rm -rf "$state"' EXIT
"$blkps" target start --dir "$state" --luns "$learners" --null-lun \
  --plugin "$plugin" --bsopts "params=$params;lr=1e-9" --owner-pid $$ >/dev/null
{ read -r URLS; read -r CONTROL_URL; read -r NULL_URL; } \
  < <("$blkps" target show --dir "$state" --get URLS --get CONTROL_URL --get NULL_URL)
"$bench" --urls "$URLS" --control "$CONTROL_URL" --null "$NULL_URL" "$@"
