#!/usr/bin/env bash
# README's test command: sets up, builds and runs every test (unit and
# integration; integration tests start their own tgtd on loopback), then,
# without ctest arguments, scripts/checked-tests.sh (fuzz, ASan+UBSan, TSan).
# Usage: sudo scripts/test.sh [ctest arguments, e.g. -R Target]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
"$top/scripts/build.sh"
cd "$top/build/cmake"
ctest --output-on-failure --timeout 300 "$@"
# The whole suite (no ctest arguments) goes on with the checked builds: the
# fuzzers' short runs, unit tests under ASan+UBSan, the aggregator under TSan.
[ "$#" -gt 0 ] || "$top/scripts/checked-tests.sh"
