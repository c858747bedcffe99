#!/usr/bin/env bash
# Formats the C and C++ sources with clang-format and .clang-format.
# Usage: scripts/format.sh            rewrite the files in place
#        scripts/format.sh --check    change nothing; list the files that
#                                     would change and exit 1 if any would
# Files: every *.c, *.cc, *.h, *.hpp of the tree (scripts/tree-files.sh),
# except target-plugin/bs_blkps.c, which follows tgt's style.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
check=0
case "${1:-}" in
  "") ;;
  --check) check=1 ;;
  *) echo "format: unknown option '$1' (use --check, or nothing to format)" >&2; exit 2 ;;
esac
command -v clang-format >/dev/null || { echo "format: clang-format not found; apt-get install clang-format" >&2; exit 1; }

cd "$top"
listing=$("$top/scripts/tree-files.sh")
files=()
while IFS= read -r f; do
  case "$f" in
    target-plugin/bs_blkps.c) ;;
    *.c | *.cc | *.h | *.hpp) [ -f "$f" ] && files+=("$f") ;;
  esac
done <<<"$listing"

if [ "$check" = 0 ]; then
  clang-format -i --style=file "${files[@]}"
  exit 0
fi
unformatted=()
for f in "${files[@]}"; do
  clang-format --style=file "$f" | cmp -s - "$f" || unformatted+=("$f")
done
if [ "${#unformatted[@]}" -gt 0 ]; then
  printf '%s\n' "${unformatted[@]}"
  echo "format: ${#unformatted[@]} of ${#files[@]} files differ from .clang-format; run scripts/format.sh" >&2
  exit 1
fi
echo "format: ${#files[@]} files match .clang-format"
