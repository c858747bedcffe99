#!/usr/bin/env bash
# Every Python file of the tree (scripts/tree-files.sh: *.py, and any file
# whose #! names python) passes pyflakes: no unused import or variable, no
# undefined name, no redefinition. One line per finding, exit 1 if any.
#   pyflakes_check.sh <repo>
set -euo pipefail
top=$1
cd "$top"
files=()
while IFS= read -r f; do
  [ -f "$f" ] || continue
  case "$f" in
    *.py) ;;
    *) head -n 1 "$f" | grep -qE '^#!.*python' || continue ;;
  esac
  files+=("$f")
done < <(scripts/tree-files.sh)
[ "${#files[@]}" -gt 50 ] || { echo "pyflakes_check: found only ${#files[@]} Python files" >&2; exit 1; }
/usr/bin/python3 -m pyflakes --version >/dev/null 2>&1 ||
  { echo "pyflakes_check: pyflakes not found: install python3-pyflakes (scripts/setup.sh does)" >&2; exit 1; }
/usr/bin/python3 -m pyflakes "${files[@]}"
echo "pyflakes: ${#files[@]} Python files, nothing found"
