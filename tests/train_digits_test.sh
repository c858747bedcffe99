#!/usr/bin/env bash
# The main job in small: a blkps server on loopback and 2 Python learner
# processes (libblkps over iSCSI) train the digits MLP; the held-out test
# accuracy must reach 0.90. Usage: train_digits_test.sh <repo> <build dir>
set -euo pipefail
top=$1 build=$2
py=/usr/bin/python3
train="$top/learner/examples/train_digits.py"
export BLKPS_LIB="$build/learner/libblkps.so"
state=$(mktemp -d /tmp/blkps-test-XXXXXX)
trap '"$top/scripts/blkps-target" stop --dir "$state"; rm -rf "$state"' EXIT
params=$("$py" "$train" --params)
url=$("$top/scripts/blkps-target" start --dir "$state" --owner-pid $$ \
        --plugin "$build/target-plugin/bs_blkps.so" \
        --bsopts "params=$params;lr=0.2;init=normal:0.1;seed=1")
"$py" "$train" --target "$url" --learner 0 --learners 2 --epochs 15 & a=$!
"$py" "$train" --target "$url" --learner 1 --learners 2 --epochs 15 & b=$!
wait $a
wait $b
"$py" "$train" --target "$url" --evaluate --min-accuracy 0.90
