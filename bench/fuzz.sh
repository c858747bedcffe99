#!/usr/bin/env bash
# Long fuzzing runs: every libFuzzer harness (tests/fuzz/) for N seconds,
# then the live CDB fuzzer for M commands against a real tgtd. Prints one
# line per harness with its executions and findings; findings stay in
# build/fuzz/tests/fuzz/work/<harness>/findings/ (replay one with
# build/fuzz/tests/fuzz/<harness>_fuzz FILE). Exits 1 if anything was found.
# Usage: sudo bench/fuzz.sh [--seconds N] [--commands M] [--seed S]
#        (defaults: 300 s per harness, 100000 commands, seed from the clock)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
seconds=300 commands=100000 seed=$(date +%s)
while [ "$#" -gt 0 ]; do
  case "$1" in
    --seconds) seconds=${2:?--seconds needs a value}; shift 2 ;;
    --commands) commands=${2:?--commands needs a value}; shift 2 ;;
    --seed) seed=${2:?--seed needs a value}; shift 2 ;;
    *) echo "fuzz: error: unknown option '$1' (use --seconds, --commands, --seed)" >&2; exit 2 ;;
  esac
done
"$top/scripts/build.sh"
"$top/scripts/checked-tests.sh" --build-only fuzz
status=0
for harness in "$top"/build/fuzz/tests/fuzz/*_fuzz; do
  name=$(basename "$harness" _fuzz)
  "$top/tests/fuzz/run-harness.sh" "$harness" "$top/tests/fuzz/corpus/$name" \
    "$top/build/fuzz/tests/fuzz/work/$name" "$seconds" || status=1
done
"$top/build/cmake/tests/fuzz/live_cdb_fuzz" --commands "$commands" --seed "$seed" || status=1
exit "$status"
