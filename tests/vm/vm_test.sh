#!/usr/bin/env bash
# Learner nodes with the kernel's iSCSI initiator, in guests that boot a real
# Linux kernel (tests/vm/guest), against real tgtds on the host's loopback
# (the guest reaches the host's 127.0.0.1:PORT as 10.0.2.2:PORT).
#
#   vm_test.sh <repo> <build dir> <case>
#
#   guest-boots     the guest runs the fetched Debian kernel with iscsi_tcp
#                   loaded, prints the command's output and returns its status.
#   guest-in-tmp    the harness of a copy of the tree under /tmp, in a folder
#                   whose name has a space (its build/deps linked or copied
#                   in): the guest sees that checkout, and loads iscsi_tcp
#                   from its build/deps.
#   guest-killed    killing tests/vm/guest (SIGTERM, or SIGKILL) leaves no QEMU.
#   login           scripts/blkps login / status / logout against a
#                   real iscsiadm and iscsid: the by-path device it prints is
#                   the learner slot's LUN, O_DIRECT reads give the server's
#                   weights, the session settings it documents are in force;
#                   --transport iser fails with its one line.
#   chap-login      blkps login with mutual CHAP (secrets from files): a wrong
#                   secret, or another expected target secret, is refused;
#                   the right ones log in and read the server's weights.
#   train-bsp       two learners in bsp train the digits MLP: one in a guest,
#                   plain_digits.py on /dev/sdX (O_DIRECT), one on the host
#                   through libblkps; the final weights equal those of two
#                   libblkps learners on the host, byte for byte, and the
#                   held-out accuracy is >= 0.90.
#   shards          a model striped over 2 shards (blkps shards),
#                   logged in from a guest with blkps login --layout as a dm
#                   striped device and as md RAID-0: a learner in the guest
#                   trains through /dev/mapper/NAME and /dev/md/NAME and gets
#                   the weights of a libblkps learner on layout:, byte for byte.
#   target-restart  a guest learner is logged in while its target is killed
#                   (kill -9): restarted from its checkpoint within
#                   replacement_timeout, the kernel logs in again and the
#                   learner goes on to its end; a target that stays away
#                   fails the learner's I/O after replacement_timeout with
#                   one line (EIO).
#   node-dies       a guest learner killed mid-training in bsp is declared
#                   dead by the server and the host learner goes on.
#   iser            blkps over iSER for real, in one guest with soft-RoCE
#                   (tests/vm/guest --rdma, tests/vm/iser_in_guest.sh): the
#                   target serves on the guest's own address through tgt's
#                   iSER, the kernel's ib_iser logs in (blkps login
#                   --transport iser) with InitialR2T=Yes, ImmediateData=No;
#                   two learners push integer gradients and pull through
#                   the disks with exact sums in async, bsp and ssp, and the
#                   control LUN's status is read through iSER. The same over
#                   TCP in that guest prints the MB/s to compare.
#   iser-train      in such a guest, plain_digits.py trains the digits MLP
#                   through the ib_iser disk (O_DIRECT) to a held-out
#                   accuracy of at least 0.85.
#   iser-url        in such a guest, libblkps itself over iSER (no kernel
#                   initiator): two learners push and pull on iser:// URLs
#                   with exact sums in async, bsp and ssp, the control LUN's
#                   status is read on its iser:// URL, then the same on
#                   iscsi:// (the MB/s to compare); and blkps-mount serves an
#                   iser:// LUN as a file that an O_DIRECT gradient write and
#                   read-back go through exactly.
#   replica-failover a target with a backup (target start --replicas 2): the
#                   guest logs in to its layout (blkps login --layout), one
#                   dm-multipath device over both replicas' disks, and
#                   trains the digits MLP through it; the primary's tgtd is
#                   killed (kill -9) after epoch 1 and the backup promoted:
#                   the kernel fails the path over and the learner goes on
#                   to its last epoch with no error; the promoted backup's
#                   model reaches a held-out accuracy of 0.90. A layout whose
#                   replica is another target's LUN is refused.
#   held-write      a bsp gradient write from a guest that the server holds
#                   past hold_limit fails (ABORTED COMMAND) and the kernel's
#                   SCSI layer retries it; it is applied once, when the round
#                   completes, and pwrite returns success.
set -euo pipefail
top=$1 build=$2 what=$3
# shellcheck source=SCRIPTDIR/../lib.sh
. "$top/tests/lib.sh"
guest="$top/tests/vm/guest"
train="$top/learner/examples/train_digits.py"
# In the guest scripts below: relative, as the guest starts in the checkout
# (and $top may hold spaces, which a generated script would split).
plain=learner/examples/plain_digits.py
scratch vm-test
trap stop_started EXIT
fail() { echo "vm_test: $*" >&2; exit 1; }
cd "$top"

# Starts a target in $state/NAME with the given --bsopts and --luns, and sets
# URL, URLS, PORT, IQN, CONTROL_URL and PID from its state.
# More arguments go to blkps target start as they are.
start_target() {
  local name=$1 bsopts=$2 luns=$3
  shift 3
  target_start "$state/$name" "$bsopts" --luns "$luns" "$@"
  load_state target "$state/$name" URL URLS PORT IQN CONTROL_URL PID
}
# Starts a model striped over 2 shards in $state/NAME (one learner slot, 4 KiB
# stripe units) and sets LAYOUT from its state.
start_shards() {
  local name=$1 bsopts=$2
  shards_start "$state/$name" "$bsopts" --shards 2 --stripe-unit 4096
  load_state shards "$state/$name" LAYOUT
}
# A host URL as the guest reaches it.
guest_url() { echo "${1/iscsi:\/\/127.0.0.1:/iscsi://10.0.2.2:}"; }

# Writes the model's weights (COUNT float32 from byte 0) to FILE, through libblkps.
pull_weights() {  # URL COUNT FILE
  "$py" - "$@" <<'PY'
import os, sys
sys.path.insert(0, os.environ["BLKPS_PY"])
import blkps
with blkps.Model(sys.argv[1]) as m:
    m.pull(0, int(sys.argv[2])).tofile(sys.argv[3])
PY
}

# Waits until FILE exists or process PID has ended; fails in the second case.
wait_for_file() {  # FILE PID WHAT
  until [ -e "$1" ]; do
    kill -0 "$2" 2>/dev/null || fail "$3 ended before $1 appeared"
    sleep 0.2
  done
}

# Waits until FILE has a line matching the extended regular expression RE, or
# process PID has ended (then fails).
wait_for_line() {  # FILE RE PID WHAT
  until grep -qE "$2" "$1" 2>/dev/null; do
    kill -0 "$3" 2>/dev/null || fail "$4 ended before '$2' appeared in $1"
    sleep 0.2
  done
}

# Waits until the learner at LUN has written to the model (the server's
# status through CONTROL_URL), or process PID has ended (then fails).
wait_for_first_write() {  # CONTROL_URL LUN PID WHAT
  until "$top/scripts/blkps" status --control "$1" --json |
        "$py" -c 'import json, sys
sys.exit(json.load(sys.stdin)["learners"][int(sys.argv[1]) - 1]["writes"] == 0)' "$2"; do
    kill -0 "$3" 2>/dev/null || fail "$4 ended before it wrote to lun $2"
    sleep 0.5
  done
}

# Learners' numerics, the same in the guest and on the host: the guest's CPU
# is a Nehalem (SSE4.2, see tests/vm/guest), so OpenBLAS uses its Nehalem
# kernels in one thread everywhere, and numpy on the host leaves out the loops
# for what a Nehalem lacks (AVX and later round differently).
blas_env="OPENBLAS_CORETYPE=Nehalem OPENBLAS_NUM_THREADS=1"
host_numerics() {
  local later
  later=$("$py" -c 'from numpy.core._multiarray_umath import __cpu_dispatch__ as d, __cpu_features__ as f
nehalem = {"SSSE3", "SSE41", "POPCNT", "SSE42"}
print(",".join(k for k in d if f[k] and k not in nehalem))')
  echo "$blas_env${later:+ NPY_DISABLE_CPU_FEATURES=$later}"
}

# Writes $state/in-guest.sh: log in to the host's URL and train learner 0 of
# 2 with plain_digits.py on the disk for EPOCHS, output to OUT; log out.
write_guest_learner() {  # URL EPOCHS OUT
  local url
  url=$(guest_url "$1")
  cat > "$state/in-guest.sh" <<EOF
set -euo pipefail
dev=\$(scripts/blkps login --url $url)
env $blas_env python3 $plain --target "\$dev" --learner 0 --learners 2 --epochs $2 > $3 2>&1
scripts/blkps logout --url $url
EOF
}

test_guest_boots() {
  local out rc=0 version
  version=$(sed 's/^linux-image-//' "$top/build/deps/linux-image/.blkps-package")
  out=$("$guest" -- sh -c 'cat /proc/version; lsmod | grep iscsi_tcp; echo to-stderr >&2; exit 3' \
        2>"$state/stderr") || rc=$?
  echo "$out"
  [ "$rc" = 3 ] || fail "the guest returned $rc, expected the command's 3: $(cat "$state/stderr")"
  case "$out" in "Linux version $version "*) ;; *) fail "the guest does not run kernel $version" ;; esac
  echo "$out" | grep -q '^iscsi_tcp ' || fail "iscsi_tcp is not loaded in the guest"
  grep -qx to-stderr "$state/stderr" || fail "the command's stderr did not arrive on stderr"
}

test_guest_in_tmp() {
  local clone="$state/a checkout" out
  mkdir -p "$clone/build/deps"
  (cd "$top" && scripts/tree-files.sh | tar -cf - --files-from=-) | tar -C "$clone" -xf -
  cp -al "$top/build/deps/linux-image" "$clone/build/deps/" 2>/dev/null ||
    cp -a "$top/build/deps/linux-image" "$clone/build/deps/"
  out=$(cd "$clone" && tests/vm/guest -- sh -c 'pwd; ls tests/vm/guest-init; lsmod | grep iscsi_tcp') ||
    fail "the guest of a checkout in '$clone' failed: $out"
  echo "$out"
  [ "$(head -n 1 <<<"$out")" = "$clone" ] || fail "the command did not run in '$clone' in the guest"
  grep -qx tests/vm/guest-init <<<"$out" || fail "the guest does not see the checkout in '$clone'"
  grep -q '^iscsi_tcp ' <<<"$out" || fail "iscsi_tcp is not loaded from '$clone/build/deps'"
}

test_guest_killed() {
  local sig harness qemu
  for sig in TERM KILL; do
    "$guest" --name "killed-$sig" -- sleep 600 >/dev/null 2>&1 & harness=$!
    qemu=""
    until [ -n "$qemu" ]; do
      kill -0 "$harness" 2>/dev/null || fail "the harness ended before starting QEMU"
      qemu=$(pgrep -P "$harness" -f qemu-system-x86_64 || true)
      sleep 0.1
    done
    kill "-$sig" "$harness"
    wait "$harness" || true
    # The harness is gone; QEMU must follow (SIGKILL from PR_SET_PDEATHSIG,
    # or the harness's own kill), at once or within 30 s at worst.
    for _ in $(seq 300); do kill -0 "$qemu" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$qemu" 2>/dev/null; then
      kill -9 "$qemu"
      fail "QEMU (pid $qemu) outlived the harness killed by SIG$sig"
    fi
    echo "SIG$sig: QEMU $qemu went with the harness"
  done
}

test_login() {
  local params=4096 lun2
  start_target login "params=$params;init=uniform:1;seed=3" 2
  lun2=$(guest_url "${URLS#* }")
  pull_weights "${URLS#* }" "$params" "$state/host.f32"
  cat > "$state/in-guest.sh" <<EOF
set -euo pipefail
blkps=scripts/blkps
dev=\$(\$blkps login --url $lun2 --queue-depth 16 --replacement-timeout 17 --command-timeout 31)
echo "device: \$dev"
[ "\$dev" = /dev/disk/by-path/ip-10.0.2.2:$PORT-iscsi-$IQN-lun-2 ] || { echo "unexpected device \$dev" >&2; exit 1; }
\$blkps node-status --url $lun2
disk=\$(basename "\$(readlink -f "\$dev")")
echo "queue_depth \$(cat /sys/block/\$disk/device/queue_depth)"
echo "command timeout \$(cat /sys/block/\$disk/device/timeout)"
iscsiadm -m session -P 2 | sed -n 's/^[[:space:]]*\(Recovery Timeout\|FirstBurstLength\|MaxBurstLength\|ImmediateData\|InitialR2T\|MaxRecvDataSegmentLength\): /\1 /p'
dd if="\$dev" of=$state/guest.f32 bs=$((4 * params)) count=1 iflag=direct status=none
\$blkps logout --url $lun2
if \$blkps node-status --url $lun2; then echo "status succeeded after logout" >&2; exit 1; fi
\$blkps login --transport iser --url $lun2 2> $state/iser.err && exit 1
exit 0
EOF
  "$guest" --rw "$state" -- bash "$state/in-guest.sh" | tee "$state/out"
  grep -qx "queue_depth 16" "$state/out" || fail "--queue-depth 16 is not the disk's queue_depth"
  grep -qx "command timeout 31" "$state/out" || fail "--command-timeout 31 is not the disk's timeout"
  local want
  for want in "Recovery Timeout 17" "FirstBurstLength 262144" "MaxBurstLength 16776192" \
              "ImmediateData Yes" "InitialR2T No" "MaxRecvDataSegmentLength 262144"; do
    grep -qx "$want" "$state/out" || fail "the session does not have '$want'"
  done
  grep -q "not logged in" "$state/out" || fail "status after logout does not say 'not logged in'"
  cmp "$state/guest.f32" "$state/host.f32" || fail "the guest read other bytes than libblkps on the host"
  { [ "$(wc -l < "$state/iser.err")" = 1 ] && grep -q "iSER needs an RDMA device" "$state/iser.err"; } ||
    fail "--transport iser: expected one line about the RDMA device, got: $(cat "$state/iser.err")"
}

# Mutual CHAP through the kernel initiator: blkps login with a wrong secret,
# or expecting another target secret, is refused; with the right ones the
# guest reads the weights libblkps reads on the host.
test_chap_login() {
  local params=4096 lun1 s name secret target_secret
  # One credentials file for the target and the learner (doc/server.md,
  # "Authentication and access"); two with a wrong secret of either side.
  for s in "mutual:learner-Secret1:server-Secret22" "wrong:wrong-Secret-1:server-Secret22" \
           "wrong-target:learner-Secret1:wrong-Secret-1"; do
    IFS=: read -r name secret target_secret <<<"$s"
    printf 'user=learner\nsecret=%s\ntarget_user=server\ntarget_secret=%s\n' "$secret" "$target_secret" \
      > "$state/$name.chap"
    chmod 600 "$state/$name.chap"
  done
  start_target chap "params=$params;init=uniform:1;seed=5" 1 --chap-file "$state/mutual.chap"
  lun1=$(guest_url "$URL")
  BLKPS_CHAP_FILE="$state/mutual.chap" pull_weights "$URL" "$params" "$state/host.f32"
  local login="scripts/blkps login --url $lun1"
  cat > "$state/in-guest.sh" <<EOF
set -uo pipefail
if $login --chap-file $state/wrong.chap 2> $state/wrong.err; then echo "a wrong secret logged in" >&2; exit 1; fi
if $login --chap-file $state/wrong-target.chap 2> $state/wrong-target.err; then
  echo "a target with another secret was accepted" >&2; exit 1
fi
set -e
dev=\$($login --chap-file $state/mutual.chap)
echo "device: \$dev"
dd if="\$dev" of=$state/guest.f32 bs=$((4 * params)) count=1 iflag=direct status=none
scripts/blkps logout --url $lun1
EOF
  "$guest" --rw "$state" -- bash "$state/in-guest.sh" | tee "$state/out"
  grep -q "^device: /dev/disk/by-path/" "$state/out" || fail "no device after a login with the right secrets"
  cmp "$state/guest.f32" "$state/host.f32" || fail "the guest read other bytes than libblkps on the host"
  for s in wrong wrong-target; do
    grep -q "failed" "$state/$s.err" || fail "$s: no failure line: $(cat "$state/$s.err")"
    ! grep -q "Secret" "$state/$s.err" || fail "$s: a secret in the error: $(cat "$state/$s.err")"
  done
}

test_train_bsp() {
  local params bsopts env a b g
  params=$("$py" "$train" --params)
  # Both learners must take part in every round for the weights to equal the
  # reference, so dead_after must not strike a learner that is merely slow to
  # start: a slot unused for dead_after since the server started is declared
  # dead, and the host learner's first I/O comes after a guest's boot and
  # python start, which took over a minute on a loaded CI machine. It stays
  # under the test's timeout, so a learner that never starts still fails it.
  # A pull held past hold_limit (at most 25 s) fails; the guest's kernel
  # retries it.
  bsopts="params=$params;lr=0.2;init=normal:0.1;seed=1;mode=bsp;dead_after=240;hold_limit=25"
  env=$(host_numerics)
  # Two libblkps learners on the host: the reference.
  start_target ref "$bsopts" 2
  read -r a b <<<"$URLS"
  # shellcheck disable=SC2086  # env is words VAR=VALUE
  env $env "$py" "$train" --target "$a" --learner 0 --learners 2 --epochs 10 & a=$!
  # shellcheck disable=SC2086
  env $env "$py" "$train" --target "$b" --learner 1 --learners 2 --epochs 10 & b=$!
  wait $a
  wait $b
  pull_weights "$URL" "$params" "$state/reference.f32"
  # Learner 0 in a guest through the kernel's disk, learner 1 on the host.
  start_target node "$bsopts" 2
  local url1=${URLS#* }
  write_guest_learner "${URLS%% *}" 10 /dev/stdout
  # The host learner starts once the guest's has pushed its first gradient
  # (python starts slowly in a guest): its pulls wait for the guest's
  # gradients, at most hold_limit.
  "$guest" --rw "$state" -- bash "$state/in-guest.sh" & g=$!
  wait_for_first_write "$CONTROL_URL" 1 $g "the guest"
  # shellcheck disable=SC2086
  env $env "$py" "$train" --target "$url1" --learner 1 --learners 2 --epochs 10
  wait $g || fail "the guest's learner failed"
  pull_weights "$URL" "$params" "$state/node.f32"
  cmp "$state/node.f32" "$state/reference.f32" ||
    fail "the weights trained through the guest's /dev/sdX differ from two libblkps learners'"
  "$py" "$train" --target "$URL" --evaluate --min-accuracy 0.90
}

# One learner, so the result does not depend on timing: the same weights
# whichever way the model is reached. dm gets a model that leaves the shards
# unequal (its table ends in linear segments); md needs equal shards of whole
# stripe units, so its servers hold 10240 parameters (5 units each), of which
# the MLP uses the first 9610 (the rest stay at their initial values).
test_shards() {
  local params stripe env
  params=$("$py" "$train" --params)
  env=$(host_numerics)
  declare -A server_params=([dm]=$params [md]=10240)
  for stripe in dm md; do
    local bsopts="params=${server_params[$stripe]};block=4K;lr=0.2;init=normal:0.1;seed=1"
    start_shards "ref-$stripe" "$bsopts"
    # shellcheck disable=SC2086  # env is words VAR=VALUE
    env $env "$py" "$train" --target "layout:$LAYOUT" --epochs 2
    pull_weights "layout:$LAYOUT" "${server_params[$stripe]}" "$state/reference-$stripe.f32"
    start_shards "node-$stripe" "$bsopts"
    sed 's|iscsi://127.0.0.1:|iscsi://10.0.2.2:|' "$LAYOUT" > "$state/node-$stripe.layout"
  done
  cat > "$state/in-guest.sh" <<EOF
set -euo pipefail
for stripe in dm md; do
  dev=\$(scripts/blkps login --layout $state/node-\$stripe.layout --stripe \$stripe --name model-\$stripe)
  echo "\$stripe: \$dev"
  scripts/blkps node-status --layout $state/node-\$stripe.layout --name model-\$stripe
  env $blas_env python3 $plain --target "\$dev" --epochs 2
  scripts/blkps logout --layout $state/node-\$stripe.layout --name model-\$stripe
done
EOF
  "$guest" --rw "$state" -- bash "$state/in-guest.sh" | tee "$state/out"
  grep -qx "dm: /dev/mapper/model-dm" "$state/out" || fail "the dm login did not print /dev/mapper/model-dm"
  grep -qx "md: /dev/md/model-md" "$state/out" || fail "the md login did not print /dev/md/model-md"
  for stripe in dm md; do
    load_state shards "$state/node-$stripe" LAYOUT
    pull_weights "layout:$LAYOUT" "${server_params[$stripe]}" "$state/node-$stripe.f32"
    cmp "$state/node-$stripe.f32" "$state/reference-$stripe.f32" ||
      fail "the weights trained through the guest's $stripe device differ from a libblkps learner's on layout:"
  done
}

test_target_restart() {
  local params bsopts_a pid_a port_a url_a url_b pid_b g
  params=$("$py" "$train" --params)
  bsopts_a="params=$params;lr=0.2;init=normal:0.1;seed=1;checkpoint=$state/a.ckpt;checkpoint_every=1"
  start_target a "$bsopts_a" 1
  pid_a=$PID port_a=$PORT url_a=$(guest_url "$URL")
  start_target b "params=$params;lr=0.2;init=normal:0.1;seed=1" 1
  pid_b=$PID url_b=$(guest_url "$URL")
  cat > "$state/in-guest.sh" <<EOF
set -uo pipefail
learn() {  # NAME URL [blkps login options]: trains, output and status in $state
  local name=\$1 url=\$2 dev; shift 2
  dev=\$(scripts/blkps login --url "\$url" "\$@") || exit 1
  env $blas_env python3 $plain --target "\$dev" --epochs 6 > $state/\$name.out 2>&1
  echo \$? > $state/\$name.status
  dmesg | grep -E 'connection|session recovery' > $state/\$name.dmesg
}
learn a $url_a
learn b $url_b --replacement-timeout 5
EOF
  "$guest" --rw "$state" -- bash "$state/in-guest.sh" & g=$!
  wait_for_line "$state/a.out" "epoch +1 " $g "the guest"
  kill -9 "$pid_a"
  while kill -0 "$pid_a" 2>/dev/null; do sleep 0.1; done
  "$top/scripts/blkps" target start --dir "$state/a" --owner-pid $$ --port "$port_a" \
    --plugin "$build/target-plugin/bs_blkps.so" --bsopts "$bsopts_a" >/dev/null
  echo "target a killed after epoch 1 and restarted from its checkpoint"
  wait_for_line "$state/b.out" "epoch +1 " $g "the guest"
  kill -9 "$pid_b"
  echo "target b killed after epoch 1 for good"
  wait $g || fail "the guest's script failed"
  cat "$state/a.out" "$state/a.dmesg"
  [ "$(cat "$state/a.status")" = 0 ] || fail "the learner failed across the restart of its target"
  grep -qE "epoch +6 " "$state/a.out" || fail "the learner did not reach its last epoch"
  grep -q "detected conn error" "$state/a.dmesg" || fail "the guest's kernel saw no connection error"
  cat "$state/b.out"
  [ "$(cat "$state/b.status")" != 0 ] || fail "the learner went on with its target gone"
  tail -n 1 "$state/b.out" | grep -q "^plain_digits: .*: Input/output error$" ||
    fail "the learner's last line is not the one-line I/O error: $(tail -n 1 "$state/b.out")"
  load_state target "$state/a" URL
  "$py" "$train" --target "$URL" --evaluate --min-accuracy 0.90
}

test_node_dies() {
  local params g h
  params=$("$py" "$train" --params)
  start_target dies "params=$params;lr=0.2;init=normal:0.1;seed=1;mode=bsp;dead_after=3" 2
  local url1=${URLS#* }
  write_guest_learner "${URLS%% *}" 100 "$state/guest.out"
  # Until both learners run, each is declared dead while the other trains
  # alone (a guest boots for longer than dead_after) and rejoins with its
  # next I/O. The host learner starts once the guest's has done an epoch,
  # and the guest (with epochs to go) is killed once they have trained an
  # epoch together.
  "$guest" --rw "$state" -- bash "$state/in-guest.sh" & g=$!
  wait_for_line "$state/guest.out" "epoch +1 " $g "the guest"
  "$py" "$train" --target "$url1" --learner 1 --learners 2 --epochs 6 > "$state/host.out" 2>&1 & h=$!
  wait_for_line "$state/host.out" "epoch +1 " $h "the host learner"
  local deaths
  deaths=$(grep -c "learner at lun 1 is dead" "$state/dies/tgtd.log" || true)
  kill -9 $g || fail "the guest ended before it was killed"
  wait $g || true
  echo "guest killed after the host learner's epoch 1"
  wait $h || fail "the host learner failed after the guest died: $(tail -n 1 "$state/host.out")"
  cat "$state/host.out"
  grep -qE "epoch +6 " "$state/host.out" || fail "the host learner did not reach its last epoch"
  [ "$(grep -c "learner at lun 1 is dead" "$state/dies/tgtd.log")" -gt "$deaths" ] ||
    fail "the server did not declare the killed guest's learner (lun 1) dead"
  grep "learner at lun 1 is dead" "$state/dies/tgtd.log" | tail -n 1
}

test_replica_failover() {
  local params g
  params=$("$py" "$train" --params)
  start_target replicated "params=$params;lr=0.2;init=normal:0.1;seed=1" 1 --replicas 2
  sed 's|iscsi://127.0.0.1:|iscsi://10.0.2.2:|' "$state/replicated/slot-1.layout" > "$state/node.layout"
  # A "replica" that is another target: its LUN is not the same disk.
  start_target other "params=$params" 1
  { grep -v '^replica' "$state/node.layout"; echo "replica = $(guest_url "$URL")"; } > "$state/mismatched.layout"
  cat > "$state/in-guest.sh" <<EOF
set -uo pipefail
scripts/blkps login --layout $state/mismatched.layout 2> $state/mismatched.err && exit 1
scripts/blkps logout --layout $state/mismatched.layout
dev=\$(scripts/blkps login --layout $state/node.layout) || exit 1
echo "\$dev" > $state/device
scripts/blkps node-status --layout $state/node.layout > $state/status || exit 1
env $blas_env python3 $plain --target "\$dev" --epochs 6 > $state/learner.out 2>&1
echo \$? > $state/learner.status
dmsetup status blkps-node > $state/multipath
dmesg | grep -E 'multipath|connection' > $state/dmesg
scripts/blkps logout --layout $state/node.layout
EOF
  "$guest" --rw "$state" -- bash "$state/in-guest.sh" & g=$!
  wait_for_line "$state/learner.out" "epoch +1 " $g "the guest"
  kill -9 "$PID"
  "$top/scripts/blkps" target promote --dir "$state/replicated"
  echo "the primary's tgtd killed after epoch 1, its backup promoted"
  wait $g || fail "the guest's script failed: $(cat "$state/status" 2>/dev/null)"
  cat "$state/mismatched.err" "$state/device" "$state/status" "$state/learner.out" "$state/multipath" "$state/dmesg"
  grep -q "do not present one SCSI identity" "$state/mismatched.err" ||
    fail "a layout whose replica is another disk was not refused"
  [ "$(cat "$state/device")" = /dev/mapper/blkps-node ] || fail "blkps login did not print the multipath device"
  [ "$(cat "$state/learner.status")" = 0 ] || fail "the learner failed across the failover"
  grep -qE "epoch +6 " "$state/learner.out" || fail "the learner did not reach its last epoch"
  grep -q "Failing path" "$state/dmesg" || fail "dm-multipath failed no path"
  load_state target "$state/replicated/backup" URL
  "$py" "$train" --target "$URL" --evaluate --min-accuracy 0.90
}

test_held_write() {
  # One block of 1024 parameters, lr 1: the guest (lun 1) writes gradient 1
  # twice, the host (lun 2) writes 0 twice; each round moves the weights by
  # -(1 + 0) / 2, so two rounds applied once each leave exactly -1.
  start_target held "params=1024;block=4K;lr=1;mode=bsp;dead_after=300;hold_limit=2" 2
  local url0 url1 g
  read -r url0 url1 <<<"$URLS"
  url0=$(guest_url "$url0")
  cat > "$state/in-guest.sh" <<EOF
set -euo pipefail
dev=\$(scripts/blkps login --url $url0)
python3 - "\$dev" <<'PY'
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_DIRECT)
ones = mmap.mmap(-1, 4096)
ones.write(b"\\x00\\x00\\x80\\x3f" * 1024)  # float32 1.0
os.pwrite(fd, ones, 0)
open("$state/second-write", "w").close()
os.pwrite(fd, ones, 0)  # waits for the host's round-1 gradient
print("second write returned", flush=True)
os.close(fd)
PY
EOF
  "$guest" --rw "$state" -- bash "$state/in-guest.sh" > "$state/guest.out" 2>&1 & g=$!
  wait_for_file "$state/second-write" $g "the guest"
  # The server fails the held write at hold_limit; the kernel retries it,
  # and the retry is held and fails again: the write has been retried.
  local held="gradient write of block 0 by lun 1 .*waited 2.0 s"
  until [ "$(grep -c "log_line.*$held" "$state/held/tgtd.log")" -ge 2 ]; do
    kill -0 $g 2>/dev/null || fail "the guest ended before its write was retried: $(cat "$state/guest.out")"
    sleep 0.2
  done
  "$py" - "$url1" <<'PY'
import os, sys
import numpy as np
sys.path.insert(0, os.environ["BLKPS_PY"])
import blkps
with blkps.Model(sys.argv[1]) as m:
    for round in (1, 2):
        m.push(0, np.zeros(1024, np.float32))
PY
  wait $g || fail "the guest failed: $(cat "$state/guest.out")"
  grep -q "second write returned" "$state/guest.out" || fail "the guest's second write did not return"
  pull_weights "$URL" 1024 "$state/weights.f32"
  "$top/scripts/blkps" status --control "$CONTROL_URL" --json > "$state/status.json"
  "$py" - "$state/weights.f32" "$state/status.json" <<'PY'
import json, sys
import numpy as np
w = np.fromfile(sys.argv[1], dtype="<f4")
lun1 = json.load(open(sys.argv[2]))["learners"][0]
print(f"weights {set(w.tolist())}, lun 1: iteration {lun1['iteration']}, "
      f"writes {lun1['writes']}, hold timeouts {lun1['hold_timeouts']}")
if not np.all(w == -1.0):
    sys.exit(f"weights {set(w.tolist())}, expected all -1: a gradient was applied twice or lost")
if lun1["iteration"] != 2 or lun1["writes"] < 3:
    sys.exit("expected lun 1 at iteration 2 after at least 3 writes (2 and the kernel's retries)")
PY
}

# Runs tests/vm/iser_in_guest.sh RUN... in a guest with soft-RoCE; its
# output goes to $state/out too.
iser_guest() {
  # 2560 MiB: tgt's iSER registers a 1 GiB buffer pool per RDMA device.
  "$guest" --rdma --mem 2560 -- env BLKPS_LIB="$BLKPS_LIB" BLKPS_PY="$BLKPS_PY" BLKPS_BUILD="$BLKPS_BUILD" \
    "$top/tests/vm/iser_in_guest.sh" "$@" | tee "$state/out"
}

test_iser() {
  iser_guest iser:async iser:bsp iser:ssp:2 iscsi:bsp
  local want
  for want in "iser async: session transport iser" "iser bsp: session transport iser" \
              "iser ssp:2: session transport iser" "iscsi bsp: session transport tcp" \
              "iser session InitialR2T Yes" "iser session ImmediateData No" \
              "control LUN status: mode ssp:2"; do
    grep -qx "$want" "$state/out" || fail "the guest did not print '$want'"
  done
  [ "$(grep -c "^weights exact: " "$state/out")" = 4 ] || fail "not every run's weights were exact"
}

test_iser_train() {
  iser_guest iser:train
  grep -qx "iser train: session transport iser" "$state/out" || fail "the guest did not train over iSER"
  grep -q "^held-out test accuracy: " "$state/out" || fail "the guest's learner did not reach its evaluation"
}

test_iser_url() {
  iser_guest iser:url:async iser:url:bsp iser:url:ssp:2 iscsi:url:bsp iser:mount
  local want
  for want in "iser url async: iser" "iser url bsp: iser" "iser url ssp:2: iser" "iscsi url bsp: iscsi" \
              "control LUN status: mode ssp:2" "iser mount: weights exact through the file"; do
    grep -qx "$want" "$state/out" || fail "the guest did not print '$want'"
  done
  [ "$(grep -c "^weights exact: " "$state/out")" = 4 ] || fail "not every run's weights were exact"
}

case "$what" in
  guest-boots) test_guest_boots ;;
  guest-in-tmp) test_guest_in_tmp ;;
  guest-killed) test_guest_killed ;;
  login) test_login ;;
  chap-login) test_chap_login ;;
  train-bsp) test_train_bsp ;;
  shards) test_shards ;;
  target-restart) test_target_restart ;;
  node-dies) test_node_dies ;;
  held-write) test_held_write ;;
  replica-failover) test_replica_failover ;;
  iser) test_iser ;;
  iser-train) test_iser_train ;;
  iser-url) test_iser_url ;;
  *) fail "unknown case '$what'" ;;
esac
