#!/usr/bin/env bash
# Training scaling through a blkps parameter server on loopback: 1, 2 and 4
# learner processes in each consistency mode (async, bsp, ssp:2), on two jobs:
#   digits     the MLP of learner/examples/train_digits.py (9,610 parameters):
#              samples/s, seconds to a held-out accuracy, accuracy over time
#              (bench/eval_digits.py watches the control LUN);
#   synthetic  bench/train_synthetic.py, softmax regression with 25M
#              parameters and a nearly free gradient (communication-bound):
#              iterations/s, samples/s, model bytes moved per second, loss.
# Writes DIR/training.md (tables), DIR/training-*.png and DIR/raw/.
#
# Usage: sudo bench/training.sh --out DIR [--quick] [--build DIR]
#   --quick   learners 1 and 4, async and bsp, fewer epochs, 10M parameters
#   --build   cmake build folder with bs_blkps.so and libblkps.so
#             (default: build/cmake, or $BLKPS_BUILD)
# Environment: TRAINING_LEARNERS ("1 2 4") and TRAINING_MODES ("async bsp
# ssp:2") replace the lists. Every tgtd it starts is stopped on exit, also on
# failure.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
py=/usr/bin/python3
# shellcheck disable=SC1091  # bench/lib.sh
. "$top/bench/lib.sh"
out="" quick=0 build=$(default_build)
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=${2:?--out needs a folder}; shift 2 ;;
    --quick) quick=1; shift ;;
    --build) build=${2:?--build needs a folder}; shift 2 ;;
    -h|--help) awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; exit 0 ;;
    *) echo "training: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || { echo "training: --out DIR is required" >&2; exit 2; }
plugin="$build/target-plugin/bs_blkps.so"
export BLKPS_LIB="$build/learner/libblkps.so"
need_built training "$plugin" "$BLKPS_LIB"

learner_counts=${TRAINING_LEARNERS:-"1 2 4"} modes=${TRAINING_MODES:-"async bsp ssp:2"} epochs=20 params=25000000 iterations=10
if [ "$quick" = 1 ]; then
  learner_counts=${TRAINING_LEARNERS:-"1 4"} modes=${TRAINING_MODES:-"async bsp"} epochs=6 params=10000000 iterations=5
fi
digits_lr=0.2 synthetic_lr=50 batch=32

mkdir -p "$out/raw"
out=$(cd "$out" && pwd)
state=$(mktemp -d /tmp/blkps-training-XXXXXX)
stop_target() { "$top/scripts/blkps" target stop --dir "$state"; }
evaluator="" pids=()
# On any exit: end the processes this script started that still run, then
# the target.
cleanup() {
  local p
  for p in $evaluator "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  stop_target 2>/dev/null || true
  rm -rf "$state"
}
trap cleanup EXIT
begin=$SECONDS

start_target() {  # LUNS BSOPTS: a fresh model on LUNs 1..LUNS
  stop_target 2>/dev/null
  "$top/scripts/blkps" target start --dir "$state" --plugin "$plugin" --luns "$1" --bsopts "$2" \
    --owner-pid $$ >/dev/null
  read -r -a urls <<<"$("$top/scripts/blkps" target show --dir "$state" --get URLS)"
}

wait_all() {  # PID...: waits for each; fails if any failed
  local failed=0 p
  for p in "$@"; do wait "$p" || failed=1; done
  return "$failed"
}

# Digits: the evaluator polls the control LUN from before the first gradient
# until after the last, so the time axis starts at the first update.
digits_params=$("$py" "$top/learner/examples/train_digits.py" --params)
# python3 -c "$start_together" EXAMPLES START_AT ARGS...: train_digits.py ARGS
# from START_AT (seconds since the epoch) on.
start_together='
import sys, time
sys.path.insert(0, sys.argv[1])
import train_digits
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
sys.argv = ["train_digits.py"] + sys.argv[3:]
train_digits.main()'

for mode in $modes; do
  for n in $learner_counts; do
    tag="digits-${mode/:/}-$n"
    t=$SECONDS
    start_target "$n" "params=$digits_params;rule=sgd;lr=$digits_lr;init=normal:0.1;seed=1;mode=$mode"
    rm -f "$state/stop"
    "$py" "$top/bench/eval_digits.py" --control "$CONTROL_URL" --stop-file "$state/stop" \
      --out "$out/raw/$tag.jsonl" --interval 0.025 2>"$out/raw/$tag.eval.err" &
    evaluator=$!
    for _ in $(seq 200); do [ -s "$out/raw/$tag.jsonl" ] && break; sleep 0.05; done
    [ -s "$out/raw/$tag.jsonl" ] || { echo "training: the evaluator did not start: $(cat "$out/raw/$tag.eval.err")" >&2; exit 1; }
    # The learners import train_digits.py (numpy, sklearn: seconds on a busy
    # machine) and then start together, so none runs alone at first.
    start_at=$("$py" -c "import time; print(time.time() + 1.5 + 0.25 * $n)")
    pids=()
    for ((k = 0; k < n; k++)); do
      "$py" -c "$start_together" "$top/learner/examples" "$start_at" --target "${urls[$k]}" --learner "$k" \
        --learners "$n" --epochs "$epochs" --batch "$batch" >"$out/raw/$tag.learner$k.log" 2>&1 &
      pids+=($!)
    done
    if ! wait_all "${pids[@]}"; then
      echo "training: a digits learner failed ($tag); see $out/raw/$tag.learner*.log" >&2; exit 1
    fi
    pids=()
    touch "$state/stop"
    wait "$evaluator" || { echo "training: the evaluator failed: $(tail -1 "$out/raw/$tag.eval.err")" >&2; exit 1; }
    evaluator=""
    stop_target
    echo "training: digits mode=$mode learners=$n: $epochs epochs, held-out accuracy $(tail -1 "$out/raw/$tag.jsonl" |
      sed 's/.*"accuracy": \([0-9.]*\).*/\1/' | awk '{printf "%.3f", $1}') ($((SECONDS - t)) s; $((SECONDS - begin)) s elapsed)"
  done
done

# Synthetic: all learners open their LUN, then start together (--start-at).
synthetic_params=$("$py" "$top/bench/train_synthetic.py" --print-params --params "$params")
variants="plain"
"$py" -c "import sys; sys.path.insert(0, '$top/learner/python'); import blkps; sys.exit(0 if hasattr(blkps, 'Engine') else 1)" 2>/dev/null &&
  variants="plain engine"
for variant in $variants; do
  for mode in $modes; do
    [ "$variant" = engine ] && [ "$mode" != async ] && continue  # engine: async only, to keep the time
    for n in $learner_counts; do
      tag="synthetic-$variant-${mode/:/}-$n"
      t=$SECONDS
      start_target "$n" "params=$synthetic_params;rule=sgd;lr=$synthetic_lr;mode=$mode"
      start_at=$("$py" -c "import time; print(time.time() + 1.0 + 0.25 * $n)")
      engine_flag=()
      [ "$variant" = engine ] && engine_flag=(--engine)
      pids=()
      for ((k = 0; k < n; k++)); do
        "$py" "$top/bench/train_synthetic.py" --target "${urls[$k]}" --learner "$k" --learners "$n" \
          --params "$params" --iterations "$iterations" --start-at "$start_at" \
          "${engine_flag[@]}" \
          --result "$out/raw/$tag.$k.json" >"$out/raw/$tag.learner$k.log" 2>&1 &
        pids+=($!)
      done
      if ! wait_all "${pids[@]}"; then
        echo "training: a synthetic learner failed ($tag); see $out/raw/$tag.learner*.log" >&2; exit 1
      fi
      pids=()
      stop_target
      echo "training: synthetic $variant mode=$mode learners=$n: $iterations iterations each," \
        "$(grep -ho 'in [0-9.]* s' "$out/raw/$tag.learner0.log") ($((SECONDS - t)) s; $((SECONDS - begin)) s elapsed)"
    done
  done
done

"$py" "$top/bench/report.py" training --raw "$out/raw" --out "$out" --target-accuracy 0.90
echo "training: wrote $out/training.md and $out/training-*.png ($((SECONDS - begin)) s)"
