#!/usr/bin/env bash
# The checked builds, in folders beside build/cmake, and the tests each
# stage runs (doc/development.md, "Fuzzing and sanitizers"):
#   fuzz  build/fuzz, clang, -DBLKPS_FUZZ=ON (ASan+UBSan): every libFuzzer
#         harness for a short time (ctest -L fuzz)
#   asan  the same build/fuzz (its libraries are compiled once for both
#         stages): the unit tests under ASan+UBSan
#         (not the node scripts' shell checks: nothing of ours to instrument;
#         not the Python ones that load libblkps.so: an ASan library does
#         not load into an uninstrumented python3)
#   tsan  build/tsan, -DBLKPS_SANITIZE=thread: the aggregator's tests, its
#         concurrency tests among them
# scripts/test.sh runs all three after the normal suite.
# Usage: scripts/checked-tests.sh [--build-only] [fuzz|asan|tsan]...  (default: all)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build_only=0
stages=()
for arg in "$@"; do
  case "$arg" in
    --build-only) build_only=1 ;;
    fuzz|asan|tsan) stages+=("$arg") ;;
    *) echo "checked-tests: error: unknown argument '$arg' (use --build-only, fuzz, asan, tsan)" >&2; exit 2 ;;
  esac
done
[ "${#stages[@]}" -gt 0 ] || stages=(fuzz asan tsan)

unit_targets=(aggregator_test update_rule_test checkpoint_file_test crc32c_test learner_unit_test
              stripe_map_test engine_test mount_test gradient_dropper_test wire_dtype_test
              wire_convert_test chap_file_check)
# Unit tests that run no code of this build, left to the normal unit stage:
# the Python and shell ones (an ASan libblkps.so does not load into python3).
uninstrumented="NodeScripts|Cli\\.|Serve\\.|Labels\\.|PythonBinding\\.|Gpu\\.|Format\\.|Docs\\.|ClusterNet\\.|ClusterResults\\.|Monitoring\\.|Torch\\.|Horovod\\.|Overlap\\.|Lease\\."
fuzz_options=(-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DBLKPS_FUZZ=ON)
for stage in "${stages[@]}"; do
  case "$stage" in
    fuzz) folder=fuzz options=("${fuzz_options[@]}")
          targets=(fuzz_harnesses) tests=(-L fuzz) ;;
    asan) folder=fuzz options=("${fuzz_options[@]}")
          targets=("${unit_targets[@]}") tests=(-L unit -E "_NOT_BUILT|$uninstrumented") ;;
    tsan) folder=tsan options=(-DBLKPS_SANITIZE=thread)
          targets=(aggregator_test) tests=(-R "^(Rules/)?(Model|Job|JobCheckpoint|JobSnapshot|LearnerClocks|LuOptions)\.") ;;
  esac
  dir="$top/build/$folder"
  log="$top/build/$stage.log"
  echo "checked-tests: $stage: building into build/$folder (log: build/$stage.log)"
  if ! { cmake -S "$top" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "${options[@]}" &&
         cmake --build "$dir" -j "$(nproc)" --target "${targets[@]}"; } > "$log" 2>&1; then
    grep -E "error|Error" "$log" | head -n 20 >&2 || tail -n 20 "$log" >&2
    echo "checked-tests: $stage: build failed; full log in $log" >&2
    exit 1
  fi
  [ "$build_only" = 1 ] && continue
  # Two at a time: a fuzzer or a test is one thread (a fuzzer still runs its
  # full time on its own core).
  (cd "$dir" && UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure --timeout 300 -j 2 "${tests[@]}")
done
