#!/usr/bin/env bash
# Runs one libFuzzer harness for SECONDS on a work corpus (WORK/corpus, new
# inputs go there) seeded from the tree's SEEDS; findings go to WORK/findings
# (kept across runs; only this run's count).
# Prints one line: "<harness>: <executions> executions, <n> findings".
# Exits 1 if the harness found anything (a crash, leak, timeout or OOM).
# Usage: run-harness.sh HARNESS SEEDS WORK SECONDS
set -euo pipefail
[ "$#" -eq 4 ] || { echo "usage: $0 HARNESS SEEDS WORK SECONDS" >&2; exit 2; }
harness=$1 seeds=$2 work=$3 seconds=$4
name=$(basename "$harness")
mkdir -p "$work/corpus" "$work/findings"
log="$work/last-run.log"
started="$work/.started"
touch "$started"
status=0
"$harness" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=1024 -malloc_limit_mb=512 \
  -print_final_stats=1 -artifact_prefix="$work/findings/" "$work/corpus" "$seeds" > "$log" 2>&1 || status=$?
executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
findings=$(find "$work/findings" -type f -newer "$started" | wc -l)
echo "$name: ${executions:-0} executions, $findings findings (log: $log)"
if [ "$status" -ne 0 ] || [ "$findings" -ne 0 ]; then
  grep -E "ERROR|SUMMARY|runtime error|Test unit written" "$log" | head -n 5 >&2 || tail -n 5 "$log" >&2
  exit 1
fi
