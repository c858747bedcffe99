#!/usr/bin/env bash
# Every blkps benchmark in one command: builds (scripts/build.sh), installs
# what the benchmarks need (scripts/setup.sh --bench), then runs, one after
# another with a progress line and the elapsed time per stage:
#   null-ratio  plugin vs tgt's null store, 256 KiB and 1 MiB, read and write
#   fio         bench/fio/sweep.sh: fio sweep of request size x queue depth
#   mount       bench/mount-vs-direct.sh: FUSE mount vs libiscsi directly
#   engine      bench/engine-bench.sh: the learner engine
#   training    bench/training.sh: scaling of 1, 2, 4 learners, async/bsp/ssp
#   peers       bench/peers.sh: blkps vs MPI_Allreduce and gloo all_reduce
# and writes DIR/report.md: machine, date, commit, headline ratios, every
# stage's tables, with the PNGs beside it. A stage whose script does not exist
# is skipped with a note; a stage that fails is reported and the rest still
# run (the exit status is then 1). About 15 minutes on 2 cores.
#
# Usage: sudo bench/run-all.sh [--out DIR] [--quick] [--build DIR]
#   --out DIR    where the report goes (default: build/bench-report)
#   --quick      shorter stages (a smoke run of a few minutes)
#   --build DIR  use this existing cmake build instead of building build/cmake
#                (skips scripts/build.sh and scripts/setup.sh --bench;
#                null-ratio still uses build/cmake's blkps-iobench)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
out="$top/build/bench-report" quick=0 build=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=${2:?--out needs a folder}; shift 2 ;;
    --quick) quick=1; shift ;;
    --build) build=${2:?--build needs a folder}; shift 2 ;;
    -h|--help) awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; exit 0 ;;
    *) echo "run-all: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
# shellcheck disable=SC1091  # bench/lib.sh
. "$top/bench/lib.sh"
need_root run-all "tgtd, packages"
mkdir -p "$out"
out=$(cd "$out" && pwd)
# Only this script's and the stages' own outputs from an earlier run.
rm -f "$out"/{report.md,stages.tsv,fio.md,training.md,peers.md,peers.json,mount-vs-direct.txt,engine-bench.txt} \
  "$out"/null-ratio-*.txt "$out"/training-*.png
begin=$SECONDS
failed=0
quick_flag=() build_flag=()
[ "$quick" = 1 ] && quick_flag=(--quick)
if [ -n "$build" ]; then
  [ -d "$build" ] || { echo "run-all: --build: no such folder: $build" >&2; exit 2; }
  build_flag=(--build "$(cd "$build" && pwd)")
fi

# stage NAME SCRIPT [LOG] -- COMMAND...: runs COMMAND (stdout to LOG when
# given, else to the terminal) unless SCRIPT is missing; records the outcome.
stage() {
  local name=$1 script=$2 log=$3; shift 4
  local t=$SECONDS status
  if [ ! -e "$script" ]; then
    echo "run-all: [$name] skipped: ${script#"$top"/} does not exist (yet)"
    printf '%s\tskipped (no %s)\t0\n' "$name" "${script#"$top"/}" >>"$out/stages.tsv"
    return 0
  fi
  echo "run-all: [$name] ${*/#$top\//} ($((SECONDS - begin)) s elapsed)"
  if if [ -n "$log" ]; then "$@" >"$log"; else "$@"; fi; then
    status=ok
  else
    status="failed (exit $?)"
    failed=1
  fi
  echo "run-all: [$name] $status in $((SECONDS - t)) s"
  printf '%s\t%s\t%s\n' "$name" "$status" "$((SECONDS - t))" >>"$out/stages.tsv"
}

if [ -z "$build" ]; then
  stage build "$top/scripts/build.sh" "" -- "$top/scripts/build.sh"
  stage packages "$top/scripts/setup.sh" "" -- "$top/scripts/setup.sh" --quiet --bench
fi
if [ "$failed" = 1 ]; then
  echo "run-all: the build or the set-up failed; see above" >&2
  exit 1
fi

rounds=2 seconds=3
[ "$quick" = 1 ] && rounds=1 seconds=2
for bs in 256K 1M; do
  stage "null-ratio $bs" "$top/bench/null-ratio.sh" "$out/null-ratio-$bs.txt" -- \
    "$top/bench/null-ratio.sh" --bs "$bs" --rounds "$rounds" --seconds "$seconds"
done
# The full run adds the real link (--netns): veth, tc shaping, 2 shards x 4 learners.
netns_flag=(--netns)
[ "$quick" = 1 ] && netns_flag=()
stage fio "$top/bench/fio/sweep.sh" "" -- "$top/bench/fio/sweep.sh" --out "$out" "${netns_flag[@]}" \
  "${quick_flag[@]}" "${build_flag[@]}"
if [ "$quick" = 1 ]; then
  stage mount "$top/bench/mount-vs-direct.sh" "$out/mount-vs-direct.txt" -- \
    "$top/bench/mount-vs-direct.sh" --rounds 1 --seconds 2 "${build_flag[@]}"
else
  stage mount "$top/bench/mount-vs-direct.sh" "$out/mount-vs-direct.txt" -- \
    "$top/bench/mount-vs-direct.sh" "${build_flag[@]}"
fi
stage engine "$top/bench/engine-bench.sh" "$out/engine-bench.txt" -- \
  "$top/bench/engine-bench.sh" "${build_flag[@]}"
stage training "$top/bench/training.sh" "" -- "$top/bench/training.sh" --out "$out" "${quick_flag[@]}" "${build_flag[@]}"
if [ "$quick" = 1 ]; then
  stage peers "$top/bench/peers.sh" "" -- "$top/bench/peers.sh" --out "$out" --params 10000000 --procs 2 \
    --iterations 4 "${build_flag[@]}"
else
  stage peers "$top/bench/peers.sh" "" -- "$top/bench/peers.sh" --out "$out" "${build_flag[@]}"
fi

/usr/bin/python3 "$top/bench/report.py" run-all --out "$out" "${quick_flag[@]}" || failed=1
echo "run-all: wrote $out/report.md ($((SECONDS - begin)) s in all)"
[ "$failed" = 0 ] || echo "run-all: some stages failed; see the Stages table in the report" >&2
exit "$failed"
