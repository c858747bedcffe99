#!/usr/bin/env bash
# Prints the tree's files, one path a line, relative to the top: git's list
# (tracked and new files, not ignored ones) when the tree is a checkout, else
# every file outside build/. Used by the checks that cover "every file of a
# kind" (scripts/format.sh, the shellcheck test), so a new file is never
# forgotten.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
if listing=$(git ls-files --cached --others --exclude-standard 2>/dev/null) && [ -n "$listing" ]; then
  printf '%s\n' "$listing"
else
  find . -path ./build -prune -o -type f -print | sed 's|^\./||'
fi
