#!/usr/bin/env bash
# The main job in small: a blkps server on loopback and 2 learner processes
# (libblkps over iSCSI) train the digits MLP; the held-out test accuracy must
# reach 0.90. Each learner has its own LUN (learner slot).
#   python: learner/examples/train_digits.py, learner 0 also runs an lr
#           schedule through the control LUN (checked at the end);
#   cpp:    blkps-train-digits (learner/examples/train_digits.cc) on the
#           double-buffered engine, staleness measured through the control LUN.
# Usage: train_digits_test.sh <repo> <build dir> <mode: async|bsp|ssp:S> [python|cpp]
set -euo pipefail
top=$1 build=$2 mode=$3 learner=${4:-python}
# shellcheck source=SCRIPTDIR/lib.sh
. "$top/tests/lib.sh"
train="$top/learner/examples/train_digits.py"
cpp="$build/learner/examples/blkps-train-digits"
scratch test
trap stop_started EXIT
params=$("$py" "$train" --params)
target_start "$state" "params=$params;lr=0.2;init=normal:0.1;seed=1;mode=$mode" --luns 2
load_state target "$state" URL URLS CONTROL_URL
read -r url0 url1 <<<"$URLS"
if [ "$learner" = cpp ]; then
  "$cpp" --target "$url0" --learner 0 --learners 2 --epochs 15 --control "$CONTROL_URL" & a=$!
  "$cpp" --target "$url1" --learner 1 --learners 2 --epochs 15 & b=$!
  wait $a
  wait $b
  "$cpp" --target "$URL" --evaluate --min-accuracy 0.90
  exit 0
fi
# Learner 0 also drives a learning-rate schedule through the control LUN.
"$py" "$train" --target "$url0" --learner 0 --learners 2 --epochs 15 \
  --control "$CONTROL_URL" --lr-decay 0.95 & a=$!
"$py" "$train" --target "$url1" --learner 1 --learners 2 --epochs 15 & b=$!
wait $a
wait $b
"$py" "$train" --target "$URL" --evaluate --min-accuracy 0.90
lr=$("$blkps" status --control "$CONTROL_URL" --json |
     "$py" -c 'import json, sys; print(json.load(sys.stdin)["rule_params"]["lr"])')
"$py" -c "import sys; lr = float(sys.argv[1]); want = 0.2 * 0.95 ** 15
sys.exit(0 if abs(lr - want) < 1e-6 else f'server lr {lr}, expected {want} after the schedule')" "$lr"
