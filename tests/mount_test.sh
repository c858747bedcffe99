#!/usr/bin/env bash
# blkps-mount end to end: each part starts its own tgtd (blkps target),
# mounts the model in a temporary folder, checks, and always unmounts and
# stops the target, also on failure.
# Usage: mount_test.sh <repo> <build dir> lifecycle|exactly_once|fio|learner|sixteen_bit
#   lifecycle     files and sizes, weights as libblkps reads them, unmount by
#                 SIGTERM, daemon mode and fusermount3 -u, kill -9 then
#                 fusermount3 -u cleans up
#   exactly_once  misaligned Python pwrites (buffer at byte 1 and 3 of a page,
#                 with and without O_DIRECT), concurrent adjacent writes, and
#                 fio libaio QD16 from misaligned buffers: every gradient is
#                 applied exactly once (exact integer check, sgd lr=1)
#   fio           fio, stock libaio engine, direct=1, iodepth=16, bs=1M, read
#                 and write: exit status 0 and no errors
#   learner       2 learners in bsp through the mount (plain_digits.py, plain
#                 file I/O) reach the same test accuracy (>= 0.90) as through
#                 libblkps (train_digits.py)
#   table         doc/embeddings.md's recipe on a FUSE-mounted table: row 42
#                 read with dd and with pread (its seeded initial values,
#                 equal), a row gradient written with pwrite (sgd lr=1: the
#                 row moves by it, its neighbours do not), status rows_made
#   sixteen_bit   --dtype float16 over a float16 LUN: the file is 2 bytes per
#                 parameter; unaligned pwrites of float16 integers add up
#                 exactly (read back through the file and through libblkps);
#                 a half-written value fails close with EIO
set -euo pipefail
top=$1 build=$2 part=$3
# shellcheck source=SCRIPTDIR/lib.sh
. "$top/tests/lib.sh"
mount_bin="$build/learner/mount/blkps-mount"
scratch mount-test
mnt="$state/mnt"
mkdir -p "$mnt"
mount_pid=""

cleanup() {
  if [ -n "$mount_pid" ] && kill -0 "$mount_pid" 2>/dev/null; then
    kill -TERM "$mount_pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$mount_pid" 2>/dev/null || break; sleep 0.1; done
  fi
  if grep -qs " $mnt " /proc/mounts; then fusermount3 -u "$mnt" || true; fi
  stop_started
}
trap cleanup EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

is_mounted() { grep -qs " $mnt fuse" /proc/mounts; }

# show NAME KEY: a value of the target in $state/NAME (target.env).
show() { "$blkps" target show --dir "$state/$1" --get "$2"; }

# mount_fg ARGS...: blkps mount -f in the background (it becomes blkps-mount,
# same pid); waits until mounted.
mount_fg() {
  "$blkps" mount "$mnt" -f "$@" 2>"$state/mount.log" &
  mount_pid=$!
  for _ in $(seq 100); do
    is_mounted && return 0
    kill -0 "$mount_pid" 2>/dev/null || { cat "$state/mount.log" >&2; fail "blkps-mount exited"; }
    sleep 0.1
  done
  fail "not mounted after 10 s"
}

# unmount_by_signal: SIGTERM, then the process must exit 0 and leave nothing mounted.
unmount_by_signal() {
  kill -TERM "$mount_pid"
  local rc=0
  wait "$mount_pid" || rc=$?
  mount_pid=""
  [ "$rc" = 0 ] || fail "blkps-mount exited with $rc after SIGTERM"
  ! is_mounted || fail "still mounted after SIGTERM"
  [ -z "$(ls -A "$mnt")" ] || fail "mount point not empty after unmount"
}

fio_json() {  # fio_json ARGS...: runs fio, prints "error ios" of job 0
  fio --output-format=json "$@" >"$state/fio.json" || fail "fio exited with $? ($*)"
  "$py" -c 'import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
print(j["error"], j["read"]["total_ios"] + j["write"]["total_ios"])' "$state/fio.json"
}

sixteen_bit() {
  target_start "$state/ps" "params=1000000;rule=sum;dtype=float16" --luns 1
  local url
  url=$(show ps URL)
  mount_fg --dtype float16 "m=$url"
  [ "$(stat -c %s "$mnt/m")" = $(( (2 * 1000000 + 511) / 512 * 512 )) ] || fail "size $(stat -c %s "$mnt/m")"
  "$py" - "$mnt/m" "$url" "$top/learner/python" <<'PY' || fail "16-bit writes through the mount"
import errno, os, sys
import numpy as np
path, url = sys.argv[1], sys.argv[2]
sys.path.insert(0, sys.argv[3])
import blkps
n = 1000000
g = ((np.arange(n) % 7) - 3).astype(np.float16)
fd = os.open(path, os.O_RDWR)
os.pwrite(fd, g[:333333].tobytes(), 0)           # ends inside a block
os.pwrite(fd, g[333333:].tobytes(), 2 * 333333)  # starts inside it
os.pwrite(fd, g[5:1005].tobytes(), 2 * 5)        # a second gradient for 1000 of them
os.fsync(fd)
os.close(fd)
want = 1.0 * g.astype(np.float32)
want[5:1005] += g[5:1005]
got = np.fromfile(path, dtype=np.float16, count=n).astype(np.float32)
assert np.array_equal(got, want), f"through the file: {got[:8]} != {want[:8]}"
with blkps.Model(url, dtype="float16") as m:
    assert np.array_equal(m.pull(0, n), want), "through libblkps"
fd = os.open(path, os.O_WRONLY)
os.pwrite(fd, b"\x01", 11)  # half of parameter 5's value
try:
    os.close(fd)
    sys.exit("a half-written 16-bit value did not fail close")
except OSError as e:
    assert e.errno == errno.EIO, e
PY
  grep -q "16-bit value at byte 10 is only partly written" "$state/mount.log" || fail "no log line: $(cat "$state/mount.log")"
  unmount_by_signal
}

case "$part" in
table)
  target_start "$state/ps" "table=1000:128;rule=sgd;lr=1;init=normal:0.01;seed=7"
  mount_fg --dir "$state/ps"
  # The recipe, as doc/embeddings.md shows it.
  dd if="$mnt/slot1" bs=512 skip=42 count=1 status=none | od -A d -t f4 | head -2 >"$state/od.txt"
  [ -s "$state/od.txt" ] || fail "dd of row 42 gave nothing"
  dd if="$mnt/slot1" bs=512 skip=42 count=1 status=none >"$state/row42.dd"
  "$py" - "$mnt/slot1" "$state/row42.dd" <<'PY' || fail "row I/O through the mounted table"
import os, sys
import numpy as np
path, dd_row = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_RDWR)
row = np.frombuffer(os.pread(fd, 512, 42 * 512), dtype="<f4")   # row 42
assert np.array_equal(row, np.fromfile(dd_row, dtype="<f4")), "dd and pread disagree"
assert 0.001 < np.std(row) < 0.1, f"row 42 is not normal:0.01: {row[:4]}"
neighbours = os.pread(fd, 512, 41 * 512) + os.pread(fd, 512, 43 * 512)  # rows 41 and 43
os.pwrite(fd, np.full(128, 0.5, dtype="<f4").tobytes(), 42 * 512)  # its gradient
after = np.frombuffer(os.pread(fd, 512, 42 * 512), dtype="<f4")
assert np.allclose(after, row - 0.5, atol=1e-6), f"{after[:4]} != {row[:4]} - 0.5"
assert os.pread(fd, 512, 41 * 512) + os.pread(fd, 512, 43 * 512) == neighbours, "a neighbouring row moved"
os.close(fd)
PY
  head -c 65536 "$mnt/control" | tr -d '\0' | "$py" -c 'import json, sys
t = json.load(sys.stdin)["table"]
assert t == {"rows": 1000, "width": 128, "row_bytes": 512, "rows_made": 1, "hashed": False, "row_limit": 1000, "evict": "none", "evictions": 0, "memory_bytes": 512128}, t' || fail "status table"
  unmount_by_signal
  ;;
chap)
  # A target with one-way CHAP: the mount (and every session it opens) logs
  # in with BLKPS_CHAP_FILE's credentials, and is refused without them.
  printf 'user=learner\nsecret=mount-Secret-01\n' >"$state/chap"
  chmod 600 "$state/chap"
  target_start "$state/ps" "params=100000;init=normal:0.1;seed=3" --chap-file "$state/chap"
  if "$blkps" mount "$mnt" -f --dir "$state/ps" 2>"$state/mount.log"; then fail "mounted without credentials"; fi
  grep -q "Authentication failure" "$state/mount.log" || fail "no login refusal: $(cat "$state/mount.log")"
  export BLKPS_CHAP_FILE="$state/chap"
  mount_fg --dir "$state/ps"
  "$py" "$top/tests/mount_test.py" same "$mnt/slot1" "$(show ps URL)"
  unmount_by_signal
  ;;
lifecycle)
  target_start "$state/ps" "params=1000000;init=normal:0.1;seed=3" --luns 2
  URL=$(show ps URL) URLS=$(show ps URLS)
  mount_fg --dir "$state/ps"
  files=("$mnt"/*)
  [ "${files[*]#"$mnt"/}" = "control slot1 slot2" ] || fail "files: ${files[*]}"
  device=$(( (4 * 1000000 + 511) / 512 * 512 ))
  for f in slot1 slot2; do
    [ "$(stat -c %s "$mnt/$f")" = "$device" ] || fail "$f size $(stat -c %s "$mnt/$f"), expected $device"
  done
  # The weights, then the learners' receipts (offsets from libblkps).
  { read -r weights_offset; read -r status_bytes; } < <("$blkps" control-layout --get weights_offset --get status_bytes)
  [ "$(stat -c %s "$mnt/control")" -gt $((weights_offset + device)) ] || fail "control size"
  "$py" "$top/tests/mount_test.py" same "$mnt/slot2" "${URLS#* }"
  head -c "$status_bytes" "$mnt/control" | tr -d '\0' | "$py" -c 'import json, sys
assert json.load(sys.stdin)["params"] == 1000000' || fail "status through the mount"
  unmount_by_signal
  # NAME=TARGET form, as a daemon; fusermount3 -u ends it.
  "$mount_bin" "$mnt" "model=$URL" || fail "daemon mode failed"
  is_mounted || fail "daemon mode: not mounted"
  [ -f "$mnt/model" ] || fail "daemon mode: no file model"
  fusermount3 -u "$mnt"
  ! is_mounted || fail "still mounted after fusermount3 -u"
  # A crash: the mount point is stale until fusermount3 -u.
  mount_fg --dir "$state/ps"
  kill -9 "$mount_pid"
  wait "$mount_pid" 2>/dev/null || true
  mount_pid=""
  if ls "$mnt" >/dev/null 2>"$state/ls.err"; then fail "mount point usable after kill -9?"; fi
  grep -q "Transport endpoint is not connected" "$state/ls.err" || fail "stale mount: $(cat "$state/ls.err")"
  if "$blkps" mount "$mnt" -f --dir "$state/ps" 2>"$state/again.err"; then fail "mounted over a stale mount"; fi
  grep -q "fusermount3 -u" "$state/again.err" || fail "no clean-up hint: $(cat "$state/again.err")"
  fusermount3 -u "$mnt"
  ! is_mounted || fail "still mounted after fusermount3 -u"
  [ -z "$(ls -A "$mnt")" ] || fail "mount point not empty after clean-up"
  # Bad input: one clear line.
  if "$mount_bin" "$mnt" "x=iscsi://127.0.0.1:1/iqn.none/1" 2>"$state/bad.err"; then fail "bad target mounted"; fi
  [ "$(wc -l <"$state/bad.err")" = 1 ] || fail "bad target: $(cat "$state/bad.err")"
  ;;
exactly_once)
  target_start "$state/ps" "params=4194304;lr=1" --luns 1
  mount_fg "m=$(show ps URL)"
  for shift in 1 3; do
    "$py" "$top/tests/mount_test.py" misaligned "$mnt/m" $shift
    "$py" "$top/tests/mount_test.py" misaligned "$mnt/m" $shift --direct
  done
  "$py" "$top/tests/mount_test.py" threads "$mnt/m"
  "$py" "$top/tests/mount_test.py" nan "$mnt/m"
  # libaio, 16 in flight, each 1 MiB buffer starting 1 or 3 bytes into a
  # page: the kernel sends the pieces concurrently. Every float is 1.0
  # (bytes 00 00 80 3f), so one pass moves every weight by exactly -1.
  for align in 1 3; do
    "$py" -c 'import sys, numpy as np; np.save(sys.argv[2], np.fromfile(sys.argv[1], dtype=np.float32))' "$mnt/m" "$state/before.npy"
    read -r err ios < <(fio_json --name=aio --filename="$mnt/m" --ioengine=libaio --direct=1 \
      --iodepth=16 --bs=1M --rw=write --size=16M --mem_align=$align \
      --buffer_pattern=0x0000803f --scramble_buffers=0)
    { [ "$err" = 0 ] && [ "$ios" = 16 ]; } || fail "fio mem_align=$align: error $err, $ios I/Os"
    "$py" -c 'import sys, numpy as np
before = np.load(sys.argv[2]); after = np.fromfile(sys.argv[1], dtype=np.float32)
moved = after - before
bad = np.nonzero(moved != -1)[0]
sys.exit(f"{len(bad)} weights did not move by exactly -1, e.g. {bad[:3]}: {moved[bad[:3]]}" if len(bad) else 0)' "$mnt/m" "$state/before.npy"
    echo "fio libaio mem_align=$align: every weight moved by exactly -1"
  done
  # One line: the refused NaN write; nothing dropped.
  if grep -v "ILLEGAL REQUEST / INVALID FIELD IN PARAMETER LIST" "$state/mount.log" | grep -q .; then fail "mount logged: $(cat "$state/mount.log")"; fi
  unmount_by_signal
  ;;
fio)
  target_start "$state/ps" "params=16777216;lr=1e-9" --luns 1
  mount_fg "m=$(show ps URL)"
  for rw in write read randwrite randread; do
    # Zero buffers: gradients that change nothing (random bytes would hold
    # NaNs, which the server rejects).
    read -r err ios < <(fio_json --name=$rw --filename="$mnt/m" --ioengine=libaio --direct=1 \
      --iodepth=16 --bs=1M --rw=$rw --size=64M --io_size=256M \
      --zero_buffers=1 --scramble_buffers=0)
    { [ "$err" = 0 ] && [ "$ios" = 256 ]; } || fail "fio $rw: error $err, $ios of 256 I/Os"
    echo "fio $rw: 256 x 1 MiB, no errors"
  done
  unmount_by_signal
  ;;
learner)
  plain="$top/learner/examples/plain_digits.py"
  train="$top/learner/examples/train_digits.py"
  [ -f "$plain" ] || fail "$plain is missing"
  params=$("$py" "$train" --params)
  # dead_after: a learner still importing under load must not be declared
  # dead, or the other trains alone for a while and the paths differ.
  opts="params=$params;lr=0.2;init=normal:0.1;seed=1;mode=bsp;dead_after=300"
  # Through the mount: plain file I/O.
  target_start "$state/viamount" "$opts" --luns 2
  mount_fg --dir "$state/viamount"
  "$py" "$plain" --target "$mnt/slot1" --learner 0 --learners 2 --epochs 15 >"$state/l0.log" & a=$!
  "$py" "$plain" --target "$mnt/slot2" --learner 1 --learners 2 --epochs 15 >"$state/l1.log" & b=$!
  wait $a || fail "learner 0 through the mount: $(tail -3 "$state/l0.log")"
  wait $b || fail "learner 1 through the mount: $(tail -3 "$state/l1.log")"
  via_mount=$("$py" "$plain" --target "$mnt/slot1" --evaluate | awk '{print $4}')
  unmount_by_signal
  # Through libblkps (libiscsi).
  target_start "$state/direct" "$opts" --luns 2
  read -r url0 url1 <<<"$(show direct URLS)"
  "$py" "$train" --target "$url0" --learner 0 --learners 2 --epochs 15 >"$state/d0.log" & a=$!
  "$py" "$train" --target "$url1" --learner 1 --learners 2 --epochs 15 >"$state/d1.log" & b=$!
  wait $a || fail "learner 0 through libblkps: $(tail -3 "$state/d0.log")"
  wait $b || fail "learner 1 through libblkps: $(tail -3 "$state/d1.log")"
  direct=$("$py" "$train" --target "$url0" --evaluate | awk '{print $4}')
  echo "test accuracy: through the mount $via_mount, through libblkps $direct"
  [ "$via_mount" = "$direct" ] || fail "accuracy differs: mount $via_mount, libblkps $direct"
  "$py" -c 'import sys; sys.exit(0 if float(sys.argv[1]) >= 0.90 else "below 0.90")' "$via_mount"
  ;;
sixteen_bit)
  sixteen_bit
  ;;
*)
  fail "unknown part '$part'"
  ;;
esac
echo "PASS: mount $part"
