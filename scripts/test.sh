#!/usr/bin/env bash
# README's test command: sets up, builds with warnings as errors
# (-DBLKPS_WERROR=ON, as CI does) and runs every test in stages: the unit
# tests (no daemon, seconds), then the integration tests (each starts its own
# tgtd on loopback), then the vm tests (each boots a guest; two at a time),
# then scripts/checked-tests.sh
# (the fuzzers' short runs, unit tests under ASan+UBSan, the aggregator under
# TSan). With ctest arguments it runs just those.
# Usage: sudo scripts/test.sh [ctest arguments, e.g. -R Target or -L unit]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
"$top/scripts/build.sh" -DBLKPS_WERROR=ON
cd "$top/build/cmake"
ctest=(ctest --output-on-failure --timeout 300)
if [ $# -gt 0 ]; then
  exec "${ctest[@]}" "$@"
fi
"${ctest[@]}" -L unit
"${ctest[@]}" -L integration
# A guest is one TCG thread: two at a time keep both cores busy.
"${ctest[@]}" -L vm -j 2
exec "$top/scripts/checked-tests.sh"
