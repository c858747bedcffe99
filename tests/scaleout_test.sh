#!/usr/bin/env bash
# `blkps target start --tgtd 2`: one model served by two co-located tgtds
# (doc/data-path.md "Scale-out"), end to end against real tgtds on loopback.
#
#   scaleout_test.sh <repo> <build dir> learners
#     `target show` names layout files and two live tgtds; 2 digits learners
#     train in bsp through the URLs it prints (>= 0.90 held out); `blkps
#     status --dir` shows both shards and `blkps set --dir` reaches both; a
#     sync checkpoints every shard; `target stop` leaves no tgtd; a start
#     with --tgtd auto from the checkpoint serves the same weights through
#     2 tgtds again, and --tgtd 1 is refused for that checkpoint.
#   scaleout_test.sh <repo> <build dir> torch-mount
#     blkps.torch given only the learner layout (no BLKPS_CONTROL) finds the
#     job's control: it reads the mode, broadcast_parameters puts rank 0's
#     values on both shards (pulled back exactly), and steps train; then
#     `blkps mount --dir` gives a slot file whose bytes are the model's and
#     whose pwrite is a gradient applied once (sgd lr=1, integers);
#     `target stop` leaves no tgtd.
set -euo pipefail
top=$1 build=$2 what=$3
py=/usr/bin/python3
blkps="$top/scripts/blkps"
plugin="$build/target-plugin/bs_blkps.so"
export BLKPS_LIB="$build/learner/libblkps.so" PYTHONPATH="$top/learner/python"
state=$(mktemp -d /tmp/blkps-scaleout-test-XXXXXX)
mnt="$state/mnt" mount_pid=""
cleanup() {
  if [ -n "$mount_pid" ] && kill -0 "$mount_pid" 2>/dev/null; then
    kill -TERM "$mount_pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$mount_pid" 2>/dev/null || break; sleep 0.1; done
  fi
  if grep -qs " $mnt " /proc/mounts; then fusermount3 -u "$mnt" || true; fi
  "$blkps" target stop --dir "$state/ps"
  rm -rf "$state"
}
trap cleanup EXIT
fail() { echo "scaleout_test: $*" >&2; exit 1; }

# Fails unless no process of <pids> runs (zombies count as gone).
no_tgtd_left() {
  local pid
  for pid in "$@"; do
    if [ -e "/proc/$pid" ] && ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null; then
      fail "tgtd $pid still runs after target stop"
    fi
  done
}

case "$what" in
  learners)
    train="$top/learner/examples/train_digits.py"
    params=$("$py" "$train" --params)
    start() {
      "$blkps" target start --dir "$state/ps" --plugin "$plugin" --owner-pid $$ --luns 2 "$@" \
        --bsopts "params=$params;block=4K;lr=0.2;init=normal:0.1;mode=bsp;checkpoint=$state/model.ckpt"
    }
    start --tgtd 2 > "$state/started"
    cat "$state/started"
    grep -q "^learner 2: layout:$state/ps/slot-2.layout$" "$state/started" || fail "no layout for slot 2 printed"
    read -r -a pids < <("$blkps" target show --dir "$state/ps" --get PIDS)
    [ "${#pids[@]}" = 2 ] || fail "expected 2 tgtd pids, got '${pids[*]}'"
    for pid in "${pids[@]}"; do kill -0 "$pid" || fail "tgtd $pid is not running"; done
    read -r slot1 slot2 < <("$blkps" target show --dir "$state/ps" --get URLS)
    "$py" "$train" --target "$slot1" --learner 0 --learners 2 --epochs 6 & a=$!
    "$py" "$train" --target "$slot2" --learner 1 --learners 2 --epochs 6 & b=$!
    wait $a
    wait $b
    "$py" "$train" --target "$slot1" --evaluate --min-accuracy 0.90
    "$blkps" status --dir "$state/ps" > "$state/status"
    [ "$(grep -c '^== shard' "$state/status")" = 2 ] || fail "status does not show both shards: $(cat "$state/status")"
    "$blkps" set lr=0.05 --dir "$state/ps"
    lrs=$("$blkps" status --dir "$state/ps" --json |
          "$py" -c 'import json, sys; print(" ".join(str(s["rule_params"]["lr"]) for s in json.load(sys.stdin)))')
    [ "$lrs" = "0.05 0.05" ] || fail "lr per tgtd after set: '$lrs', expected '0.05 0.05'"
    "$py" - "$slot1" "$params" "$state/before.f32" <<'PY'
import sys
import blkps
with blkps.Model(sys.argv[1]) as m:
    m.pull(0, int(sys.argv[2])).tofile(sys.argv[3])
    m.sync()  # fsync: every shard checkpoints its part
PY
    for k in 0 1; do [ -s "$state/model.ckpt.shard-$k" ] || fail "no checkpoint of shard $k"; done
    "$blkps" target stop --dir "$state/ps"
    no_tgtd_left "${pids[@]}"
    [ ! -e "$state/ps/target.env" ] || fail "target.env left after stop"
    if out=$(start --tgtd 1 2>&1); then fail "--tgtd 1 started from a checkpoint of 2 tgtds"; fi
    echo "$out"
    case "$out" in *"written by 2 tgtd(s), not 1"*) ;; *) fail "unexpected refusal: $out" ;; esac
    start > "$state/started"
    [ "$("$blkps" target show --dir "$state/ps" --get TGTD)" = 2 ] || fail "auto did not follow the checkpoint's 2"
    "$py" - "$("$blkps" target show --dir "$state/ps" --get URL)" "$params" "$state/after.f32" <<'PY'
import sys
import blkps
with blkps.Model(sys.argv[1]) as m:
    m.pull(0, int(sys.argv[2])).tofile(sys.argv[3])
PY
    cmp "$state/before.f32" "$state/after.f32" || fail "the restart from the checkpoint serves other weights"
    read -r -a pids < <("$blkps" target show --dir "$state/ps" --get PIDS)
    "$blkps" target stop --dir "$state/ps"
    no_tgtd_left "${pids[@]}"
    ;;
  torch-mount)
    params=300000  # 1.2 MB: a 1 MiB stripe unit on tgtd 0, the rest on tgtd 1
    "$blkps" target start --dir "$state/ps" --tgtd 2 --plugin "$plugin" --owner-pid $$ \
      --bsopts "params=$params;rule=sgd;lr=1;mode=async" >/dev/null
    url=$("$blkps" target show --dir "$state/ps" --get URL)
    BLKPS_TARGET=$url "$py" - "$params" <<'PY' || fail "blkps.torch through 2 tgtds"
import sys
import numpy as np
import torch
import blkps
import blkps.torch as bps
n = int(sys.argv[1])
torch.manual_seed(0)
model = torch.nn.Linear(n // 100 - 1, 100)  # (n/100 - 1) * 100 + 100 = n parameters
assert bps.param_count(model) == n
bps.init()  # BLKPS_TARGET only: the layout names the control LUNs
assert bps.control() and bps.control().startswith("layout:"), bps.control()
opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
assert opt.mode == "async", opt.mode
with torch.no_grad():
    model.weight.copy_(torch.arange(model.weight.numel(), dtype=torch.float32).view_as(model.weight) % 251)
    model.bias.fill_(7)
want = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()
bps.broadcast_parameters(model.state_dict(), root_rank=0)
with blkps.Model(bps.target()) as m:
    got = m.pull(0, n)
if not np.array_equal(got, want):
    sys.exit(f"broadcast: the server holds {got[:4]}... at {np.flatnonzero(got != want)[:4]}, expected {want[:4]}...")
x = torch.randn(8, n // 100 - 1)
loss = model(x).pow(2).mean()
loss.backward()
opt.step()
with blkps.Model(bps.target()) as m:
    after = m.pull(0, n)
if np.array_equal(after, want):
    sys.exit("a step changed nothing on the server")
opt.close()
PY
    mkdir -p "$mnt"
    "$blkps" mount "$mnt" -f --dir "$state/ps" 2>"$state/mount.log" & mount_pid=$!
    for _ in $(seq 100); do
      grep -qs " $mnt fuse" /proc/mounts && break
      kill -0 "$mount_pid" 2>/dev/null || { cat "$state/mount.log" >&2; fail "blkps-mount exited"; }
      sleep 0.1
    done
    [ -e "$mnt/control" ] || fail "no control file in the mount"
    "$py" - "$mnt/slot1" "$url" "$params" <<'PY' || fail "the mounted slot over 2 tgtds"
import os, sys
import numpy as np
import blkps
path, url, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
with blkps.Model(url) as m:
    before = m.pull(0, n)
with open(path, "rb") as f:
    seen = np.frombuffer(f.read(4 * n), dtype="<f4")
if not np.array_equal(seen, before):
    sys.exit("the slot file's bytes are not the model's")
g = np.zeros(n, dtype="<f4")
g[::997] = 3  # touches every 1 MiB stripe unit, both tgtds
fd = os.open(path, os.O_WRONLY)
os.pwrite(fd, g.tobytes(), 0)
os.close(fd)
with blkps.Model(url) as m:
    after = m.pull(0, n)
if not np.array_equal(after, before - g):
    sys.exit(f"the mounted gradient was not applied once: {np.flatnonzero(after != before - g)[:4]}")
PY
    kill -TERM "$mount_pid"
    wait "$mount_pid" || fail "blkps-mount exited with $? after SIGTERM"
    mount_pid=""
    read -r -a pids < <("$blkps" target show --dir "$state/ps" --get PIDS)
    "$blkps" target stop --dir "$state/ps"
    no_tgtd_left "${pids[@]}"
    ;;
  *) fail "unknown test '$what' (learners, torch-mount)" ;;
esac
