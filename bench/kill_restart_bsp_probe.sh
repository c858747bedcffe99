#!/usr/bin/env bash
# The probe of issue 35 (doc/server.md "One round on every shard"), run by
# hand, not in CI: ScaleOut.kill-restart-bsp (2 bsp learners through
# `blkps target start --tgtd 2`, kill -9 of one shard's tgtd, `blkps target
# restart`) N times, each killing a random shard once both learners have
# paused after a random round. Each run checks that the restarted shards are at one
# round with every learner at it, and that in the end every shard's weights
# are the rounds' averages of the gradients it holds and each learner's
# pushes minus those its shards hold are what libblkps told it was lost.
# Prints one line per run and a tally; exits 1 if any run failed.
#
# usage: bench/kill_restart_bsp_probe.sh [RUNS (20)] [SEED (1)]   (as root,
# after scripts/build.sh)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${BLKPS_BUILD:-$top/build/cmake}
runs=${1:-20}
RANDOM=${2:-1}
passed=0
for run in $(seq "$runs"); do
  at=$((5 + RANDOM % 9)) shard=$((RANDOM % 2))  # after the first generation (round 4)
  if out=$(BLKPS_KILL_AT_ROUND=$at BLKPS_KILL_SHARD=$shard \
    "$top/tests/scaleout_test.sh" "$top" "$build" kill-restart-bsp 2>&1); then
    passed=$((passed + 1))
    echo "run $run: kill shard $shard after round $at: ok: $(grep '^restarted at round' <<< "$out");" \
      "$(grep '^lost ' <<< "$out")"
  else
    echo "run $run: kill shard $shard after round $at: FAILED: $(tail -2 <<< "$out" | tr '\n' ' ')"
  fi
done
echo "$passed of $runs runs exact"
[ "$passed" = "$runs" ]
