#!/usr/bin/env bash
# Sets up the machine (scripts/setup.sh) and builds blkps into build/cmake.
# Usage: scripts/build.sh   (as root; quick when nothing changed)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
"$top/scripts/setup.sh" --quiet
log="$top/build/build.log"
echo "build: compiling into build/cmake (log: build/build.log)"
if ! { cmake -S "$top" -B "$top/build/cmake" -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
       cmake --build "$top/build/cmake" -j "$(nproc)"; } > "$log" 2>&1; then
  grep -E "error|Error" "$log" | head -n 20 >&2 || tail -n 20 "$log" >&2
  echo "build: failed; full log in $log" >&2
  exit 1
fi
