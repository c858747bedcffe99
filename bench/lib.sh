# shellcheck shell=bash
# Sourced by bench/*.sh: what several benchmarks share.

# need_blkps_build WHO BUILD: sets $plugin (tgt's blkps backing store) and
# exports BLKPS_LIB (libblkps, for the Python learners) from the build
# folder BUILD; exits 1 with one line, named WHO, if either is not built.
need_blkps_build() {
  # shellcheck disable=SC2034  # plugin is the caller's
  plugin="$2/target-plugin/bs_blkps.so"
  export BLKPS_LIB="$2/learner/libblkps.so"
  local f
  for f in "$plugin" "$BLKPS_LIB"; do
    [ -f "$f" ] || { echo "$1: $f not built: run scripts/build.sh (or pass --build)" >&2; exit 1; }
  done
}
