#!/usr/bin/env bash
# README's main job: on this machine, set up and build blkps, start a
# parameter server on loopback, train an MLP on the digits data set with
# several learner processes through the model device, print the held-out
# test accuracy, and shut everything down.
#
# Usage: sudo scripts/demo.sh [--learners N] [--epochs E] [--lr X]
#                             [--mode async|bsp|ssp:S] [--transport iscsi|iser]
#                             [--via lib|mount|engine] [--workload digits|fashion-cnn]
# --workload fashion-cnn trains a PyTorch CNN on Fashion-MNIST with blkps.torch
# instead (learner/examples/torch_fashion_job.py; 2 epochs unless --epochs,
# server rule adam lr 0.002, --via lib or mount).
# --via says how the learners reach the model: lib (default) Python learners
# through libblkps over iSCSI; mount: the model mounted as files
# (blkps-mount) and Python learners with plain os.pread/os.pwrite, no
# library; engine: C++ learners on libblkps's double-buffered engine.
# Each learner has its own LUN (learner slot). At the end the model is
# checkpointed (fsync) into build/demo/ and the job's status is printed.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
learners=2 epochs=20 lr=0.2 mode=async transport=iscsi via=lib workload=digits epochs_given=""
while [ $# -gt 0 ]; do
  case "$1" in
    --learners) learners=${2:?}; shift 2 ;;
    --epochs) epochs=${2:?}; epochs_given=1; shift 2 ;;
    --lr) lr=${2:?}; shift 2 ;;
    --mode) mode=${2:?}; shift 2 ;;
    --transport) transport=${2:?}; shift 2 ;;
    --via) via=${2:?}; shift 2 ;;
    --workload) workload=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "demo: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$learners" in ''|*[!0-9]*|0) echo "demo: --learners: expected a positive integer, got '$learners'" >&2; exit 2 ;; esac
case "$via" in lib|mount|engine) ;; *) echo "demo: --via: expected lib, mount or engine, got '$via'" >&2; exit 2 ;; esac
case "$workload" in digits|fashion-cnn) ;; *) echo "demo: --workload: expected digits or fashion-cnn, got '$workload'" >&2; exit 2 ;; esac
[ "$workload" = digits ] || [ "$via" != engine ] || { echo "demo: --workload fashion-cnn runs --via lib or mount" >&2; exit 2; }

"$top/scripts/build.sh"

if [ "$workload" = fashion-cnn ]; then
  [ -n "$epochs_given" ] || epochs=2
  echo "demo: Fashion-MNIST CNN (PyTorch, blkps.torch), $learners learners, mode $mode, via $via"
  exec /usr/bin/python3 "$top/learner/examples/torch_fashion_job.py" --learners "$learners" --mode "$mode" \
    --via "$via" --epochs "$epochs"
fi

py=/usr/bin/python3
train="$top/learner/examples/train_digits.py"
export BLKPS_LIB="$top/build/cmake/learner/libblkps.so"
state="$top/build/demo"
params=$("$py" "$train" --params)

mnt="$state/mnt"
cleanup() {
  if mountpoint -q "$mnt" 2>/dev/null; then fusermount3 -u "$mnt" || true; fi
  "$top/scripts/blkps-target" stop --dir "$state"
}
trap cleanup EXIT
echo "demo: starting the parameter server (MLP on digits, $params parameters, sgd lr=$lr, mode $mode, $transport on loopback)"
"$top/scripts/blkps-target" stop --dir "$state" 2>/dev/null || true
rm -f "$state/digits-mlp.ckpt"  # a fresh model each run
"$top/scripts/blkps-target" start --dir "$state" --name digits-mlp --transport "$transport" --luns "$learners" \
  --bsopts "params=$params;rule=sgd;lr=$lr;init=normal:0.1;seed=1;mode=$mode;checkpoint=$state/digits-mlp.ckpt" \
  >/dev/null
# shellcheck source=/dev/null  # written by blkps-target: URL, URLS, CONTROL_URL, ...
. "$state/target.env"
# shellcheck disable=SC2153  # URLS comes from target.env
read -r -a urls <<<"$URLS"
echo "demo: learner devices ${urls[*]}; control device $CONTROL_URL"

# The learner program and the device each learner opens.
case "$via" in
  lib) learner=("$py" "$train") ;;
  engine) learner=("$top/build/cmake/learner/examples/blkps-train-digits") ;;
  mount)
    learner=("$py" "$top/learner/examples/plain_digits.py")
    mkdir -p "$mnt"
    "$top/build/cmake/learner/mount/blkps-mount" "$mnt" --from "$state"
    for ((k = 0; k < learners; k++)); do urls[k]="$mnt/slot$((k + 1))"; done
    echo "demo: mounted the model at $mnt: $(cd "$mnt" && echo *)" ;;
esac

echo "demo: training with $learners learner processes ($via), $epochs epochs each"
pids=()
for ((k = 0; k < learners; k++)); do
  "${learner[@]}" --target "${urls[$k]}" --learner "$k" --learners "$learners" --epochs "$epochs" --sync &
  pids+=($!)
done
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=1; done
[ "$failed" = 0 ] || { echo "demo: a learner failed" >&2; exit 1; }

"$top/scripts/blkps" status --dir "$state"
"$py" "$train" --target "$URL" --evaluate
