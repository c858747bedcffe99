#!/usr/bin/env bash
# One model served by 1 tgtd and by N co-located tgtds (`blkps target start
# --tgtd`), side by side in one run: push and pull of float32 parameters
# through libblkps (blkps-iobench --op push|pull) by 1 and by L concurrent
# learners, over loopback iSCSI. What `--tgtd auto` is decided from
# (doc/data-path.md "Scale-out").
#
# Usage: bench/scaleout.sh [--tgtds 2] [--learners 2] [--rounds 3] [--seconds 3] [--params 16777216]
# Rounds interleave the two targets so that machine noise hits both; the
# figures are medians over rounds (MB/s, aggregate over the learners), the
# ratio N tgtds / 1 tgtd, and the CPU seconds per GB of learners and tgtds
# together (getrusage of blkps-iobench, /proc/PID/stat of the tgtds). Needs a
# build (scripts/build.sh).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
tgtds=2 learners=2 rounds=3 seconds=3 params=16777216
while [ $# -gt 0 ]; do
  case "$1" in
    --tgtds) tgtds=${2:?}; shift 2 ;;
    --learners) learners=${2:?}; shift 2 ;;
    --rounds) rounds=${2:?}; shift 2 ;;
    --seconds) seconds=${2:?}; shift 2 ;;
    --params) params=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "scaleout: unknown option '$1'" >&2; exit 2 ;;
  esac
done
iobench="$top/build/cmake/bench/blkps-iobench"
[ -x "$iobench" ] || { echo "scaleout: $iobench not built: run scripts/build.sh" >&2; exit 1; }
state=$(mktemp -d /tmp/blkps-bench-XXXXXX)
blkps="$top/scripts/blkps"
trap '"$blkps" target stop --dir "$state/one"; "$blkps" target stop --dir "$state/many"; rm -rf "$state"' EXIT
bsopts="params=$params;lr=1e-9"
"$blkps" target start --dir "$state/one" --tgtd 1 --luns "$learners" --bsopts "$bsopts" --owner-pid $$ >/dev/null
"$blkps" target start --dir "$state/many" --tgtd "$tgtds" --luns "$learners" --bsopts "$bsopts" \
  --owner-pid $$ >/dev/null
read -r -a one_urls < <("$blkps" target show --dir "$state/one" --get URLS)
read -r -a many_urls < <("$blkps" target show --dir "$state/many" --get URLS)
read -r -a one_pids < <("$blkps" target show --dir "$state/one" --get PID)
read -r -a many_pids < <("$blkps" target show --dir "$state/many" --get PIDS)
tick=$(getconf CLK_TCK)
# CPU seconds (user + system) the tgtds <pids...> have used so far.
tgtd_cpu() { local p; for p in "$@"; do cut -d' ' -f14,15 "/proc/$p/stat"; done | awk -v t="$tick" '{s += $1 + $2} END {print s / t}'; }

median() { sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
# "MB/s CPU": the aggregate MB/s of <n> learners, each on its own slot of
# <urls...>, and the CPU seconds per GB of the learners and tgtds <pids...>
# together (after "--").
run() {
  local op=$1 n=$2; shift 2
  local k out="$state/out" urls=() before after
  while [ "$1" != -- ]; do urls+=("$1"); shift; done
  shift
  : > "$out"
  before=$(tgtd_cpu "$@")
  for ((k = 0; k < n; k++)); do
    "$iobench" --target "${urls[$k]}" --op "$op" --bs 1M --qd 16 --span 64M --seconds "$seconds" >> "$out" &
  done
  wait
  after=$(tgtd_cpu "$@")
  sed 's/[A-Za-z_]*=//g' "$out" | awk -v t="$after - $before" '
    { split($0, f, " ") } { mbps += f[6]; bytes += f[4]; cpu += f[7] + f[8] }
    END { split(t, d, " - "); printf "%.1f %.3f\n", mbps, (cpu + d[1] - d[2]) / (bytes / 1e9) }'
}
counts=(1)
[ "$learners" -gt 1 ] && counts+=("$learners")
declare -A runs cpus
for ((r = 1; r <= rounds; r++)); do
  for n in "${counts[@]}"; do
    for op in push pull; do
      for served in one many; do
        if [ "$served" = one ]; then
          read -r mbps cpu < <(run "$op" "$n" "${one_urls[@]}" -- "${one_pids[@]}")
        else
          read -r mbps cpu < <(run "$op" "$n" "${many_urls[@]}" -- "${many_pids[@]}")
        fi
        echo "round $r/$rounds: $served $op, $n learner(s): $mbps MB/s, $cpu CPU s/GB" >&2
        runs[$served.$op.$n]+="$mbps "
        cpus[$served.$op.$n]+="$cpu "
      done
    done
  done
done
echo "cores $(nproc), load $(cut -d' ' -f1-3 /proc/loadavg), model $params float32 parameters"
printf '%-10s %-6s %12s %14s %7s %16s %18s\n' learners op "1 tgtd MB/s" "$tgtds tgtds MB/s" ratio \
  "1 tgtd CPU s/GB" "$tgtds tgtds CPU s/GB"
for n in "${counts[@]}"; do
  for op in push pull; do
    a=$(tr ' ' '\n' <<< "${runs[one.$op.$n]}" | grep . | median)
    b=$(tr ' ' '\n' <<< "${runs[many.$op.$n]}" | grep . | median)
    ca=$(tr ' ' '\n' <<< "${cpus[one.$op.$n]}" | grep . | median)
    cb=$(tr ' ' '\n' <<< "${cpus[many.$op.$n]}" | grep . | median)
    printf '%-10s %-6s %12.0f %14.0f %7.2f %16.2f %18.2f\n' "$n" "$op" "$a" "$b" "$(echo "$b / $a" | bc -l)" "$ca" "$cb"
  done
done
