#!/usr/bin/env bash
# Throughput of a blkps model LUN as a ratio to tgt's own "null" backing
# store in the same tgtd (same transport, same request stream; null moves the
# bytes and does nothing with them), through libblkps over iSCSI on loopback.
#
# Usage: sudo bench/null-ratio.sh [--bs 1M] [--qd 16] [--rounds 3] [--seconds 3] [--bsopts OPTS]
# Rounds interleave blkps and null so that machine noise hits both; the
# figures are medians over rounds. Needs a build (scripts/build.sh).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
bs=1M qd=16 rounds=3 seconds=3 bsopts="params=16777216;lr=1e-9"
while [ $# -gt 0 ]; do
  case "$1" in
    --bs) bs=${2:?}; shift 2 ;;
    --qd) qd=${2:?}; shift 2 ;;
    --rounds) rounds=${2:?}; shift 2 ;;
    --seconds) seconds=${2:?}; shift 2 ;;
    --bsopts) bsopts=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "null-ratio: unknown option '$1'" >&2; exit 2 ;;
  esac
done
iobench="$top/build/cmake/bench/blkps-iobench"
[ -x "$iobench" ] || { echo "null-ratio: $iobench not built: run scripts/build.sh" >&2; exit 1; }
state=$(mktemp -d /tmp/blkps-bench-XXXXXX)
trap '"$top/scripts/blkps-target" stop --dir "$state"; rm -rf "$state"' EXIT
"$top/scripts/blkps-target" start --dir "$state" --null-lun --bsopts "$bsopts" --owner-pid $$ >/dev/null
# shellcheck disable=SC1091
. "$state/target.env"

median() { sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
declare -A runs
for ((r = 1; r <= rounds; r++)); do
  for op in write read; do
    for store in blkps null; do
      url=$URL; [ "$store" = null ] && url=$NULL_URL
      mbps=$("$iobench" --target "$url" --op "$op" --bs "$bs" --qd "$qd" --span 64M --seconds "$seconds" |
             sed -n 's/.*MBps=\([0-9.]*\).*/\1/p')
      echo "round $r/$rounds: $store $op ${mbps} MB/s" >&2
      runs[$store.$op]+="$mbps "
    done
  done
done
printf '%-6s %6s %4s %12s %12s %7s\n' op bs qd "blkps MB/s" "null MB/s" ratio
for op in write read; do
  b=$(echo "${runs[blkps.$op]}" | tr ' ' '\n' | median)
  n=$(echo "${runs[null.$op]}" | tr ' ' '\n' | median)
  printf '%-6s %6s %4s %12.0f %12.0f %7.2f\n' "$op" "$bs" "$qd" "$b" "$n" "$(echo "$b $n" | awk '{print $1/$2}')"
done
