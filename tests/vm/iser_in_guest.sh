#!/usr/bin/env bash
# Runs in a guest with soft-RoCE (tests/vm/guest --rdma), for vm_test.sh's
# iser case: for each TRANSPORT:MODE, a rule=sum model with 2 learner LUNs
# served on the guest's own address (blkps-target), logged in by the kernel
# (blkps login: ib_iser or iscsi_tcp); two learners push integer gradients
# and pull through the disks (push_pull.py, O_DIRECT) and the control LUN's
# status, read through the same session, must name MODE.
#
# TRANSPORT:url:MODE does the same through libblkps on the LUNs' URLs
# (iser:// or iscsi://, no kernel initiator), each process with its own
# initiator name in the target's ACL, and reads the status through the
# control LUN's URL.
#
# TRANSPORT:mount serves one rule=sum learner LUN through blkps-mount (FUSE,
# libblkps on the URL): a gradient written to the file with O_DIRECT must
# read back exactly added to the weights.
#
# TRANSPORT:train instead has plain_digits.py train the digits MLP on one
# learner LUN's disk (O_DIRECT) for 3 epochs and reach a held-out accuracy
# of at least 0.85.
#
#   iser_in_guest.sh TRANSPORT:MODE|TRANSPORT:url:MODE|TRANSPORT:mount|TRANSPORT:train...
#   (MODE: async, bsp or ssp:S)
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
# The guest's own initiator name: tgt's iSER admits only named initiators.
iqn=$(sed -n 's/^InitiatorName=//p' /etc/iscsi/initiatorname.iscsi)
params=262144
# push_pull.py's model. dead_after: under emulation a spawned learner
# process may take over the default 10 s to start, and a learner declared
# dead splits a bsp round.
model="params=$params;rule=sum;dead_after=120"
plain="$top/learner/examples/plain_digits.py"
# Starts a target in DIR serving LUNS learner LUNs with BSOPTS over
# TRANSPORT on the guest's address; its ACL names the guest's initiator,
# push_pull.py's learners ($iqn-1..$iqn-LUNS) and mount_file's sessions.
start_target() {  # TRANSPORT DIR LUNS BSOPTS
  local names=(--initiator "$iqn" --initiator "$iqn-slot1-1" --initiator "$iqn-slot1-2") k
  for ((k = 1; k <= $3; k++)); do names+=(--initiator "$iqn-$k"); done
  "$top/scripts/blkps-target" start --dir "$2" --transport "$1" --address 10.0.2.15 \
    "${names[@]}" --luns "$3" --bsopts "$4" > /dev/null
}
# Prints the status mode of the control LUN at TARGET (a URL or a disk),
# read as initiator $iqn, and fails unless it is MODE.
check_control_mode() {  # TARGET MODE
  python3 -c 'import os, sys; sys.path.insert(0, os.environ["BLKPS_PY"]); import blkps.control
with blkps.control.Control(sys.argv[1], initiator_name=sys.argv[3]) as c: mode = c.status()["mode"]
print("control LUN status: mode", mode); sys.exit(mode != sys.argv[2])' "$1" "$2" "$iqn"
}
# Starts a target as start_target does, logs the kernel in to each learner
# LUN, sets devs to their disks and prints the session's transport.
serve() {  # TRANSPORT DIR LUNS BSOPTS LABEL
  local url
  start_target "$1" "$2" "$3" "$4"
  devs=()
  for url in $("$top/scripts/blkps" target show --dir "$2" --get URLS); do
    devs+=("$("$top/scripts/blkps" login --transport "$1" --url "$url")")
  done
  echo "$5: session transport $(iscsiadm -m session -P 1 | sed -n 's/^[[:space:]]*Iface Transport: //p' | sort -u)"
}
# Logs out of DIR's target and stops it.
unserve() {  # DIR
  "$top/scripts/blkps" logout --url "$("$top/scripts/blkps" target show --dir "$1" --get URL)"
  "$top/scripts/blkps-target" stop --dir "$1"
}
# Mounts DIR's learner LUN 1 as file slot1 with blkps-mount (2 sessions,
# $iqn-slot1-1 and -2), adds a gradient through the file with O_DIRECT and
# checks the weights read back.
mount_file() {  # TRANSPORT DIR
  local mnt=/tmp/mnt-$1 pid
  mkdir -p "$mnt"
  modprobe fuse
  "$top/scripts/blkps" mount "$mnt" "slot1=$("$top/scripts/blkps" target show --dir "$2" --get URL)" \
    -f --initiator "$iqn" --sessions 2 &
  pid=$!
  python3 "$top/tests/vm/mount_check.py" "$mnt/slot1" "$params" "$1 mount" || { kill "$pid"; wait "$pid"; return 1; }
  kill "$pid"
  wait "$pid"
}
for run in "$@"; do
  transport=${run%%:*} mode=${run#*:} dir=/tmp/target-${run//:/-}
  if [ "${mode%%:*}" = url ]; then
    mode=${mode#url:}
    start_target "$transport" "$dir" 2 "$model;mode=$mode"
    read -r -a urls <<< "$("$top/scripts/blkps" target show --dir "$dir" --get URLS)"
    echo "$transport url $mode: ${urls[0]%%:*}"
    python3 "$top/tests/vm/push_pull.py" --mode "$mode" --params "$params" --rounds 4 --initiator "$iqn" "${urls[@]}"
    check_control_mode "$("$top/scripts/blkps" target show --dir "$dir" --get CONTROL_URL)" "$mode"
    "$top/scripts/blkps-target" stop --dir "$dir"
    continue
  fi
  if [ "$mode" = mount ]; then
    start_target "$transport" "$dir" 1 "$model"
    mount_file "$transport" "$dir"
    "$top/scripts/blkps-target" stop --dir "$dir"
    continue
  fi
  if [ "$mode" = train ]; then
    serve "$transport" "$dir" 1 "params=$(python3 "$plain" --params);lr=0.2;init=normal:0.1;seed=1" "$transport train"
    OPENBLAS_NUM_THREADS=1 python3 "$plain" --target "${devs[0]}" --epochs 3
    python3 "$plain" --target "${devs[0]}" --evaluate --min-accuracy 0.85
    unserve "$dir"
    continue
  fi
  serve "$transport" "$dir" 2 "$model;mode=$mode" "$transport $mode"
  iscsiadm -m session -P 2 | sed -n 's/^[[:space:]]*\(InitialR2T\|ImmediateData\|MaxBurstLength\): /session \1 /p' | sort -u |
    sed "s/^/$transport /"
  python3 "$top/tests/vm/push_pull.py" --mode "$mode" --params "$params" --rounds 4 "${devs[@]}"
  check_control_mode "${devs[0]%-lun-1}-lun-3" "$mode"
  unserve "$dir"
done
