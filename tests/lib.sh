# shellcheck shell=bash disable=SC2034,SC2154  # top and build are the test's; py and plugin are for it
# Sourced by the shell tests that start servers (tests/*.sh,
# tests/vm/vm_test.sh), after `set -euo pipefail` and `top=` (the checkout)
# `build=` (its build dir): what they share (doc/development.md "Writing a
# test"). A test begins
#   . "$top/tests/lib.sh"
#   scratch NAME           # $state: the test's private folder
#   trap stop_started EXIT # or a trap of its own that ends with it
# and starts its servers with target_start / shards_start, which stop_started
# stops, whatever the test's end; the test's exit status is kept.

py=/usr/bin/python3 # Debian's, with numpy and torch
blkps="$top/scripts/blkps"
plugin="$build/target-plugin/bs_blkps.so"
# BLKPS_BUILD: the checkout's blkps runs this build's programs, wherever it is.
export BLKPS_LIB="$build/learner/libblkps.so" BLKPS_PY="$top/learner/python" BLKPS_BUILD="$build"
targets=() shard_sets=()

# scratch NAME: makes the test's private folder, $state
# (/tmp/blkps-NAME-XXXXXX); stop_started removes it.
scratch() { state=$(mktemp -d "/tmp/blkps-$1-XXXXXX"); }

# target_start DIR BSOPTS [blkps target start options...]: a private target
# (its own tgtd, socket and free port) with state folder DIR; it also stops
# if this shell dies without its trap (--owner-pid).
target_start() {
  local dir=$1 bsopts=$2
  shift 2
  targets+=("$dir")
  "$blkps" target start --dir "$dir" --owner-pid $$ --plugin "$plugin" --bsopts "$bsopts" "$@" >/dev/null
}

# shards_start DIR BSOPTS [blkps shards start options...]: the same for a
# model striped over shards.
shards_start() {
  local dir=$1 bsopts=$2
  shift 2
  shard_sets+=("$dir")
  "$blkps" shards start --dir "$dir" --owner-pid $$ --plugin "$plugin" --bsopts "$bsopts" "$@" >/dev/null
}

# load_state target|shards DIR KEY...: sets the shell variables KEY... from a
# running target's or shards' state, through `blkps target|shards show
# --get` (the one reader of target.env and shards.env).
load_state() {
  local kind=$1 dir=$2 key
  shift 2
  for key in "$@"; do
    printf -v "$key" '%s' "$("$blkps" "$kind" show --dir "$dir" --get "$key")"
  done
}

# stop_started: stops every target and shard set started above and removes
# $state. The --owner-pid watchdogs wake within a second of their tgtd's end
# and run a stop of their own, which may create a file in the folder being
# removed: the removal is tried again.
stop_started() {
  local dir
  for dir in "${targets[@]}"; do "$blkps" target stop --dir "$dir" >/dev/null 2>&1 || true; done
  for dir in "${shard_sets[@]}"; do "$blkps" shards stop --dir "$dir" >/dev/null 2>&1 || true; done
  for _ in 1 2 3 4 5; do rm -rf "$state" 2>/dev/null && break; sleep 1; done
}
