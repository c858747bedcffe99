#!/usr/bin/env bash
# README's test command: sets up, builds with warnings as errors
# (-DBLKPS_WERROR=ON, as CI does) and runs every test in stages: the unit
# tests (no daemon, seconds), then the integration tests (each starts its own
# tgtd on loopback), then the vm tests (each boots a guest), then
# scripts/checked-tests.sh (the fuzzers' short runs, unit tests under
# ASan+UBSan, the aggregator under TSan). The checked builds compile in the
# background, niced, from the start of the unit stage: they take the CPU the
# tests leave idle (waits on tgtd, guests booting); their tests run last.
# Stages run two tests at a time (doc/development.md, "Test stages").
# With ctest arguments it runs just those.
# Usage: sudo scripts/test.sh [ctest arguments, e.g. -R Target or -L unit]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
"$top/scripts/build.sh" -DBLKPS_WERROR=ON
cd "$top/build/cmake"
ctest=(ctest --output-on-failure --timeout 300)
if [ $# -gt 0 ]; then
  exec "${ctest[@]}" "$@"
fi
# Its own process group (set -m), so that a failed stage stops the whole build.
checked_log="$top/build/checked-build.log"
echo "test: the checked builds compile in the background (log: build/checked-build.log)"
set -m
nice -n 10 "$top/scripts/checked-tests.sh" --build-only >"$checked_log" 2>&1 &
checked_build=$!
set +m
trap 'kill -- "-$checked_build" 2>/dev/null || true' EXIT
# Two at a time: a test often waits (on tgtd, a learner, a guest's boot),
# and a guest is one TCG thread.
"${ctest[@]}" -L unit -j 2
"${ctest[@]}" -L integration -j 2
"${ctest[@]}" -L vm -j 2
if ! wait "$checked_build"; then
  tail -n 20 "$checked_log" >&2
  echo "test: the checked builds failed; full log in $checked_log" >&2
  exit 1
fi
trap - EXIT
exec "$top/scripts/checked-tests.sh"
