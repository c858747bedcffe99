#!/usr/bin/env bash
# Issue 38's memory bar at its own size: a hashed table with 10^6 rows made
# of ids drawn from 10^8 (adagrad, 64 values a row) on a private tgtd, its
# status table.memory_bytes and tgtd's resident growth as ratios to the
# rows' weights and rule state. The ctest case
# PythonBinding.HashedTableRowsMadeCostAtMostOneAndAHalfTheirPayload runs the
# same at 10^5 rows; this runs tests/hashed_table_serve_test.py's "memory"
# case with ROWS rows and prints its line (it fails above 1.5).
#
# Usage: sudo bench/hashed-table-memory.sh [ROWS]   (default 1000000; needs
# a build, scripts/build.sh, and about 1 GiB of free memory at 10^6)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
case "${1:-}" in
  -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
rows=${1:-1000000}
[[ "$rows" =~ ^[1-9][0-9]*$ ]] || { echo "hashed-table-memory: ROWS must be a positive integer, got '$rows'" >&2; exit 2; }
exec "$top/tests/hashed_table_serve_test.py" "$top" "$top/build/cmake" memory "$rows"
