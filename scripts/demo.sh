#!/bin/sh
# README's main job; the old name of `blkps demo` (see `blkps demo --help`).
exec "$(dirname "$0")/blkps" demo "$@"
