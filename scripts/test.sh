#!/usr/bin/env bash
# README's test command: sets up, builds and runs every test (unit and
# integration; integration tests start their own tgtd on loopback).
# Usage: sudo scripts/test.sh [ctest arguments, e.g. -R Target]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
"$top/scripts/build.sh"
cd "$top/build/cmake"
exec ctest --output-on-failure --timeout 300 "$@"
