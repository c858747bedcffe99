# shellcheck shell=bash
# Sourced by bench/*.sh: what several benchmarks share.

# need_built WHO FILE...: exits 1 with one line, named WHO, if a FILE (a
# part of blkps's build) is missing.
need_built() {
  local who=$1 f
  shift
  for f in "$@"; do
    [ -f "$f" ] || { echo "$who: $f not built: run scripts/build.sh (or pass --build)" >&2; exit 1; }
  done
}
