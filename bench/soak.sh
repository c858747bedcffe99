#!/usr/bin/env bash
# Soak: a blkps target under 4 learners for M minutes, with learners killed
# and restarted, periodic checkpoints, and an exact check at the end.
#
# Usage: sudo bench/soak.sh --minutes M [--out DIR] [--kill-every S]
#                           [--learners N] [--params P] [--build DIR]
#   --minutes M      how long the learners run (fractions allowed: 0.5)
#   --out DIR        soak.md, soak.json, soak.png and raw/ (learner logs,
#                    tgtd.log); default bench/results/soak
#   --kill-every S   seconds between SIGKILLs of a random learner, which is
#                    then started again under a new initiator name (180)
#   --learners N     learner processes, one learner LUN each (4)
#   --params P       model parameters (8388608: a 32 MiB model)
#   --build DIR      cmake build folder with bs_blkps.so and libblkps.so
#                    (default: build/cmake, or $BLKPS_BUILD)
# The target is private (its own folder, a free port on loopback), rule=sum,
# mode=async, checkpoint_every=10. Each learner (bench/soak.py learner,
# blkps.Model over iSCSI) pauses at random (up to 0.2 s), pulls a random
# range and pushes an integer gradient over a random range, logging each push
# before it starts and after it is acknowledged (fsync). Every 10 s the soak
# samples tgtd's RSS (VmRSS), errors (learners that failed, the status's
# rejected_writes, hold_timeouts, failed, checkpoint and control errors,
# unexpected tgtd.log lines) and push/pull MB/s. At the end every parameter
# must equal the sum of the acknowledged pushes plus the requests of a killed
# learner's unacknowledged push that its receipt (control LUN) shows applied,
# and every receipt must equal its learner's log.
# Exit status: 0 if that holds, no error was seen and tgtd's RSS stayed
# within the bound (the last third's maximum at most 16 MiB over the first
# third's, judged in runs of 3 minutes or more); 1 otherwise; 2 on bad usage. The target and every learner are
# stopped on exit, also on Ctrl-C or failure.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
py=/usr/bin/python3
minutes="" out="$top/bench/results/soak" kill_every=180 learners=4 params=8388608
# shellcheck disable=SC1091  # bench/lib.sh
. "$top/bench/lib.sh"
build=$(default_build)
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes=${2:?--minutes needs a number}; shift 2 ;;
    --out) out=${2:?--out needs a folder}; shift 2 ;;
    --kill-every) kill_every=${2:?--kill-every needs seconds}; shift 2 ;;
    --learners) learners=${2:?--learners needs a number}; shift 2 ;;
    --params) params=${2:?--params needs a number}; shift 2 ;;
    --build) build=${2:?--build needs a folder}; shift 2 ;;
    -h|--help) awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; exit 0 ;;
    *) echo "soak: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$minutes" ] || { echo "soak: --minutes M is required" >&2; exit 2; }
plugin="$build/target-plugin/bs_blkps.so"
export BLKPS_LIB="$build/learner/libblkps.so"
need_built soak "$plugin" "$BLKPS_LIB"

mkdir -p "$out/raw"
out=$(cd "$out" && pwd)
rm -f "$out"/raw/learner*.log "$out"/raw/learner*.err
state=$(mktemp -d /tmp/blkps-soak-XXXXXX)
runner=""
# On any exit: tell the learners to stop, end the runner (it kills its
# learners by pid), then stop the target.
cleanup() {
  touch "$out/raw/stop"
  if [ -n "$runner" ]; then
    kill "$runner" 2>/dev/null || true
    wait "$runner" 2>/dev/null || true
  fi
  [ -f "$state/tgtd.log" ] && cp "$state/tgtd.log" "$out/raw/tgtd.log"
  "$top/scripts/blkps" target stop --dir "$state" 2>/dev/null || true
  rm -rf "$state"
}
trap cleanup EXIT

bsopts="params=$params;rule=sum;mode=async;checkpoint=$state/model.ckpt;checkpoint_every=10"
"$top/scripts/blkps" target start --dir "$state" --plugin "$plugin" --luns "$learners" --bsopts "$bsopts" \
  --owner-pid $$ >/dev/null
echo "soak: $learners learners for $minutes min, a kill every $kill_every s; target: $bsopts"
"$py" "$top/bench/soak.py" run --target-dir "$state" --out "$out" --minutes "$minutes" \
  --kill-every "$kill_every" --bsopts "$bsopts" &
runner=$!
# The runner's exit status is the soak's (the EXIT trap keeps it).
wait "$runner"
