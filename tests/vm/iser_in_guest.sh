#!/usr/bin/env bash
# Runs in a guest with soft-RoCE (tests/vm/guest --rdma), for vm_test.sh's
# iser case: for each TRANSPORT:MODE, a rule=sum model with 2 learner LUNs
# served on the guest's own address (blkps-target), logged in by the kernel
# (blkps-login: ib_iser or iscsi_tcp); two learners push integer gradients
# and pull through the disks (push_pull.py, O_DIRECT) and the control LUN's
# status, read through the same session, must name MODE.
#
# TRANSPORT:train instead has plain_digits.py train the digits MLP on one
# learner LUN's disk (O_DIRECT) for 3 epochs and reach a held-out accuracy
# of at least 0.85.
#
#   iser_in_guest.sh TRANSPORT:MODE|TRANSPORT:train...   (MODE: async, bsp or ssp:S)
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
# The guest's own initiator name: tgt's iSER admits only named initiators.
iqn=$(sed -n 's/^InitiatorName=//p' /etc/iscsi/initiatorname.iscsi)
params=262144
plain="$top/learner/examples/plain_digits.py"
for run in "$@"; do
  if [ "${run#*:}" = train ]; then
    transport=${run%%:*} dir=/tmp/target-$transport-train
    "$top/scripts/blkps-target" start --dir "$dir" --transport "$transport" --address 10.0.2.15 \
      --initiator "$iqn" --luns 1 --bsopts "params=$(python3 "$plain" --params);lr=0.2;init=normal:0.1;seed=1" > /dev/null
    url=$("$top/scripts/blkps" target show --dir "$dir" --get URL)
    dev=$("$top/scripts/blkps-login" login --transport "$transport" --url "$url" 2>/dev/null)
    echo "$transport train: session transport $(iscsiadm -m session -P 1 | sed -n 's/^[[:space:]]*Iface Transport: //p' | sort -u)"
    OPENBLAS_NUM_THREADS=1 python3 "$plain" --target "$dev" --epochs 3
    python3 "$plain" --target "$dev" --evaluate --min-accuracy 0.85
    "$top/scripts/blkps-login" logout --url "$url"
    "$top/scripts/blkps-target" stop --dir "$dir"
    continue
  fi
  transport=${run%%:*} mode=${run#*:} dir=/tmp/target-${run//:/-} devs=()
  "$top/scripts/blkps-target" start --dir "$dir" --transport "$transport" --address 10.0.2.15 \
    --initiator "$iqn" --luns 2 --bsopts "params=$params;rule=sum;mode=$mode" > /dev/null
  for url in $("$top/scripts/blkps" target show --dir "$dir" --get URLS); do
    devs+=("$("$top/scripts/blkps-login" login --transport "$transport" --url "$url" 2>/dev/null)")
  done
  echo "$transport $mode: session transport $(iscsiadm -m session -P 1 | sed -n 's/^[[:space:]]*Iface Transport: //p' | sort -u)"
  iscsiadm -m session -P 2 | sed -n 's/^[[:space:]]*\(InitialR2T\|ImmediateData\|MaxBurstLength\): /session \1 /p' | sort -u |
    sed "s/^/$transport /"
  python3 "$top/tests/vm/push_pull.py" --mode "$mode" --params "$params" --rounds 4 "${devs[@]}"
  control=${devs[0]%-lun-1}-lun-3
  "$top/scripts/blkps" status --control "$control" --json |
    python3 -c 'import json, sys; s = json.load(sys.stdin); print("control LUN status: mode", s["mode"]); sys.exit(s["mode"] != sys.argv[1])' "$mode"
  "$top/scripts/blkps-login" logout --url "$("$top/scripts/blkps" target show --dir "$dir" --get URL)"
  "$top/scripts/blkps-target" stop --dir "$dir"
done
