#!/usr/bin/env bash
# Sets up the machine (scripts/setup.sh) and builds blkps into build/cmake;
# then shows the compiler warnings of what it compiled (errors too, if it
# failed).
# Usage: scripts/build.sh [-DOPTION=VALUE...] [TARGET...]
#   (as root; quick when nothing changed). -D options go to cmake and stay in
#   build/cmake's cache (e.g. -DBLKPS_WERROR=ON); TARGETs (e.g. bs_blkps
#   blkps) build only those.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
"$top/scripts/setup.sh" --quiet
log="$top/build/build.log"
options=() targets=()
for arg in "$@"; do
  case "$arg" in
    -D*) options+=("$arg") ;;
    *) targets+=(--target "$arg") ;;
  esac
done
echo "build: compiling into build/cmake (log: build/build.log)"
status=0
{ cmake -S "$top" -B "$top/build/cmake" -DCMAKE_BUILD_TYPE=RelWithDebInfo ${options[@]+"${options[@]}"} &&
  cmake --build "$top/build/cmake" -j "$(nproc)" ${targets[@]+"${targets[@]}"}; } > "$log" 2>&1 || status=$?
warnings=$(grep -E ': warning: ' "$log" | sort -u || true)
if [ -n "$warnings" ]; then
  echo "build: $(wc -l <<<"$warnings") compiler warning(s):" >&2
  head -n 20 <<<"$warnings" >&2
fi
if [ "$status" != 0 ]; then
  grep -E "error|Error" "$log" | head -n 20 >&2 || tail -n 20 "$log" >&2
  echo "build: failed; full log in $log" >&2
  exit 1
fi
