#!/usr/bin/env bash
# Sets up the machine (scripts/setup.sh) and builds blkps into build/cmake,
# printing the build's progress; then shows the compiler warnings of what it
# compiled (errors too, if it failed).
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
{ cmake -S "$top" -B "$top/build/cmake" -DCMAKE_BUILD_TYPE=RelWithDebInfo ${options[@]+"${options[@]}"} &&
  cmake --build "$top/build/cmake" -j "$(nproc)" ${targets[@]+"${targets[@]}"}; } 2>&1 | progress && status=0 || status=$?
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
