#!/usr/bin/env bash
# The fixed cost of a libblkps call (bench/call_cost_bench.cc) on co-located
# shards on loopback (one tgtd each, blkps shards start): push, pull and
# exchange of --total bytes in one call against the same bytes in buckets,
# interleaved rounds, medians. Prints a markdown table.
#
# Usage: sudo bench/call-cost.sh [--shards 4] [--params 16777216]
#          [--build DIR] [-- blkps-call-cost-bench options, see its --help]
# --params 16777216 is a 64 MiB model. Needs a build (scripts/build.sh).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck disable=SC1091  # bench/lib.sh
. "$top/bench/lib.sh"
shards=4 params=16777216 build=$(default_build)
while [ $# -gt 0 ]; do
  case "$1" in
    --shards) shards=${2:?}; shift 2 ;;
    --params) params=${2:?}; shift 2 ;;
    --build) build=${2:?}; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "call-cost: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
bench="$build/bench/blkps-call-cost-bench"
plugin="$build/target-plugin/bs_blkps.so"
[ -x "$bench" ] || { echo "call-cost: $bench not built: run scripts/build.sh" >&2; exit 1; }
[ -f "$plugin" ] || { echo "call-cost: $plugin not built: run scripts/build.sh" >&2; exit 1; }
state=$(mktemp -d /tmp/blkps-call-cost-XXXXXX)
blkps="$top/scripts/blkps"
trap '"$blkps" shards stop --dir "$state" >/dev/null 2>&1; rm -rf "$state"' EXIT
"$blkps" shards start --dir "$state" --shards "$shards" --stripe-unit 1M \
  --plugin "$plugin" --bsopts "params=$params;lr=1e-9" --owner-pid $$ >/dev/null
"$bench" --target "layout:$state/slot-1.layout" "$@"
