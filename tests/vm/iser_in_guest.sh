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
# Starts a target in DIR serving LUNS learner LUNs with BSOPTS over
# TRANSPORT on the guest's address, logs the kernel in to each learner LUN,
# sets devs to their disks and prints the session's transport.
serve() {  # TRANSPORT DIR LUNS BSOPTS LABEL
  local url
  "$top/scripts/blkps-target" start --dir "$2" --transport "$1" --address 10.0.2.15 \
    --initiator "$iqn" --luns "$3" --bsopts "$4" > /dev/null
  devs=()
  for url in $("$top/scripts/blkps" target show --dir "$2" --get URLS); do
    devs+=("$("$top/scripts/blkps-login" login --transport "$1" --url "$url")")
  done
  echo "$5: session transport $(iscsiadm -m session -P 1 | sed -n 's/^[[:space:]]*Iface Transport: //p' | sort -u)"
}
# Logs out of DIR's target and stops it.
unserve() {  # DIR
  "$top/scripts/blkps-login" logout --url "$("$top/scripts/blkps" target show --dir "$1" --get URL)"
  "$top/scripts/blkps-target" stop --dir "$1"
}
for run in "$@"; do
  transport=${run%%:*} mode=${run#*:} dir=/tmp/target-${run//:/-}
  if [ "$mode" = train ]; then
    serve "$transport" "$dir" 1 "params=$(python3 "$plain" --params);lr=0.2;init=normal:0.1;seed=1" "$transport train"
    OPENBLAS_NUM_THREADS=1 python3 "$plain" --target "${devs[0]}" --epochs 3
    python3 "$plain" --target "${devs[0]}" --evaluate --min-accuracy 0.85
    unserve "$dir"
    continue
  fi
  serve "$transport" "$dir" 2 "params=$params;rule=sum;mode=$mode" "$transport $mode"
  iscsiadm -m session -P 2 | sed -n 's/^[[:space:]]*\(InitialR2T\|ImmediateData\|MaxBurstLength\): /session \1 /p' | sort -u |
    sed "s/^/$transport /"
  python3 "$top/tests/vm/push_pull.py" --mode "$mode" --params "$params" --rounds 4 "${devs[@]}"
  control=${devs[0]%-lun-1}-lun-3
  "$top/scripts/blkps" status --control "$control" --json |
    python3 -c 'import json, sys; s = json.load(sys.stdin); print("control LUN status: mode", s["mode"]); sys.exit(s["mode"] != sys.argv[1])' "$mode"
  unserve "$dir"
done
