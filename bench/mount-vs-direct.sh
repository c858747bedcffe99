#!/usr/bin/env bash
# mount-vs-direct: the same transfers through the blkps FUSE mount (fio, stock
# libaio engine, direct=1) and through libiscsi directly (blkps-iobench, which
# drives libblkps's iSCSI device), against one blkps LUN in one run. Rounds
# interleave the two paths; the table shows medians and mount/direct.
#
# Usage: bench/mount-vs-direct.sh [--build DIR] [--bs 1M] [--qd 16]
#          [--rounds 5] [--seconds 4] [--params 16777216]
#          [--mount-options "--sessions 16 --threads 32 ..."]
# Needs root (tgtd), a build with blkps-mount, bs_blkps.so and blkps-iobench.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck disable=SC1091  # bench/lib.sh
. "$top/bench/lib.sh"
build=$(default_build)
bs=1M qd=16 rounds=5 seconds=4 params=16777216 mount_options=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --bs) bs=$2; shift 2 ;;
    --qd) qd=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --params) params=$2; shift 2 ;;
    --mount-options) mount_options=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "mount-vs-direct: unknown option '$1'; see --help" >&2; exit 2 ;;
  esac
done
mount_bin="$build/learner/mount/blkps-mount"
iobench="$build/bench/blkps-iobench"
plugin="$build/target-plugin/bs_blkps.so"
for f in "$mount_bin" "$iobench" "$plugin"; do
  [ -x "$f" ] || [ -f "$f" ] || { echo "mount-vs-direct: $f is missing; build targets blkps-mount blkps-iobench bs_blkps in $build" >&2; exit 2; }
done
command -v fio >/dev/null || { echo "mount-vs-direct: fio is not installed" >&2; exit 2; }

work=$(mktemp -d /tmp/blkps-mount-bench-XXXXXX)
mnt="$work/mnt"
mkdir -p "$mnt"
mount_pid=""
cleanup() {
  if [ -n "$mount_pid" ]; then kill -TERM "$mount_pid" 2>/dev/null || true; wait "$mount_pid" 2>/dev/null || true; fi
  if grep -qs " $mnt " /proc/mounts; then fusermount3 -u "$mnt" || true; fi
  "$top/scripts/blkps" target stop --dir "$work/ps" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# A tiny lr: the zero gradients both tools send change nothing anyway.
"$top/scripts/blkps" target start --dir "$work/ps" --owner-pid $$ --plugin "$plugin" \
  --bsopts "params=$params;lr=1e-9" >/dev/null
url=$("$top/scripts/blkps" target show --dir "$work/ps" --get URL)
span=$(( params * 4 < 64 * 1048576 ? params * 4 : 64 * 1048576 ))
# shellcheck disable=SC2086  # the options are words
"$mount_bin" -f "$mnt" $mount_options "model=$url" 2>"$work/mount.log" &
mount_pid=$!
for _ in $(seq 100); do grep -qs " $mnt fuse" /proc/mounts && break; sleep 0.1; done
grep -qs " $mnt fuse" /proc/mounts || { cat "$work/mount.log" >&2; exit 1; }

mount_mbps() {  # mount_mbps read|write: MB/s (1e6 B/s) of one fio run
  fio --output-format=json --name=m --filename="$mnt/model" --ioengine=libaio \
    --direct=1 --iodepth="$qd" --bs="$bs" --rw="$1" --size="$span" \
    --time_based --runtime="$seconds" --zero_buffers=1 --scramble_buffers=0 \
    >"$work/fio.json"
  /usr/bin/python3 -c 'import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
if j["error"] or j[sys.argv[2]]["total_ios"] == 0:
    sys.exit("fio failed: error %d" % j["error"])
print("%.1f" % (j[sys.argv[2]]["io_bytes"] / 1e6 / (j[sys.argv[2]]["runtime"] / 1e3)))' "$work/fio.json" "$1"
}
direct_mbps() {  # direct_mbps read|write
  "$iobench" --target "$url" --op "$1" --bs "$bs" --qd "$qd" --span "$span" \
    --seconds "$seconds" | sed 's/.*MBps=//'
}

declare -A results
echo "mount-vs-direct: $rounds rounds of ${seconds}s, $bs x QD$qd, span $span bytes" >&2
for round in $(seq "$rounds"); do
  for op in write read; do
    # Alternate which path goes first, so drift favours neither.
    if [ $((round % 2)) = 1 ]; then order="mount direct"; else order="direct mount"; fi
    for path in $order; do
      mbps=$("${path}_mbps" "$op")
      results[$path.$op]+="$mbps "
      echo "round $round $op $path: $mbps MB/s" >&2
    done
  done
done

median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
echo
echo "| requests | op | mount MB/s | direct MB/s | mount/direct |"
echo "|---|---|---|---|---|"
for op in write read; do
  m=$(median <<<"${results[mount.$op]}")
  d=$(median <<<"${results[direct.$op]}")
  awk -v bs="$bs" -v qd="$qd" -v op="$op" -v m="$m" -v d="$d" \
    'BEGIN {printf "| %s x QD%s | %s | %.0f | %.0f | %.2f |\n", bs, qd, op, m, d, m / d}'
done
