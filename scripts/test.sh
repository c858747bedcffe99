#!/usr/bin/env bash
# README's test command: sets up, builds with warnings as errors
# (-DBLKPS_WERROR=ON, as CI does) and runs every test in stages: the unit
# tests (no daemon, seconds), then the rest (integration tests start their own
# tgtd on loopback; vm tests boot a guest), then scripts/checked-tests.sh
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
"${ctest[@]}" -LE unit
exec "$top/scripts/checked-tests.sh"
