# shellcheck shell=bash
# Sourced by bench/*.sh, after `set -euo pipefail` and `top=` (the checkout):
# what the benchmarks share.
#   . "$top/bench/lib.sh"

# default_build: prints the build a benchmark uses unless given --build:
# $BLKPS_BUILD, or the checkout's build/cmake.
default_build() { echo "${BLKPS_BUILD:-$top/build/cmake}"; }

# need_root WHO WHAT: exits 1 with one line, named WHO, unless run as root;
# WHAT says what needs it (tgtd, network namespaces, packages).
need_root() {
  [ "$(id -u)" = 0 ] || { echo "$1: needs root ($2): run it as root, or with sudo" >&2; exit 1; }
}

# need_built WHO FILE...: exits 1 with one line, named WHO, if a FILE (a
# part of blkps's build) is missing.
need_built() {
  local who=$1 f
  shift
  for f in "$@"; do
    [ -f "$f" ] || { echo "$who: $f not built: run scripts/build.sh (or pass --build)" >&2; exit 1; }
  done
}
