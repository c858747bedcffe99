#!/usr/bin/env bash
# Sets up the machine (scripts/setup.sh) and builds blkps into build/cmake.
# Usage: scripts/build.sh [TARGET...]   (as root; quick when nothing changed)
# With TARGETs (e.g. bs_blkps blkps) builds only those; prints the build's
# progress as it goes.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
"$top/scripts/setup.sh" --quiet
log="$top/build/build.log"
targets=()
for t in "$@"; do targets+=(--target "$t"); done
echo "build: compiling ${*:-everything} into build/cmake (log: build/build.log)"
# The build's percentage, one line per tenth, from cmake's "[ 42%]" lines.
progress() {
  local last=-10 p
  while IFS= read -r line; do
    echo "$line" >>"$log"
    [[ "$line" =~ ^\[\ *([0-9]+)%\] ]] || continue
    p=${BASH_REMATCH[1]}
    if [ "$p" -ge $((last + 10)) ]; then echo "build: $p%"; last=$p; fi
  done
}
: >"$log"
if ! { cmake -S "$top" -B "$top/build/cmake" -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
       cmake --build "$top/build/cmake" -j "$(nproc)" ${targets[@]+"${targets[@]}"}; } 2>&1 | progress; then
  grep -E "error|Error" "$log" | head -n 20 >&2 || tail -n 20 "$log" >&2
  echo "build: failed; full log in $log" >&2
  exit 1
fi
