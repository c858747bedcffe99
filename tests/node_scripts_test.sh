#!/usr/bin/env bash
# The learner-node scripts, checked without a kernel initiator: shellcheck of
# every shell file in the tree, and `blkps login --dry-run` printing
# exactly the commands a node would run (login over tcp and iser, a 2-shard
# layout assembled with dm and with md, logout), plus its one-line errors.
# Usage: node_scripts_test.sh <repo> [case]   (no case: every case)
set -euo pipefail
top=$1
login="$top/scripts/blkps"
work=$(mktemp -d /tmp/blkps-nodes-test-XXXXXX)
trap 'rm -rf "$work"' EXIT
failures=0

fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# Runs the command; it must succeed and print exactly `want`.
expect_output() {
  local what=$1 want=$2; shift 2
  local got rc=0
  got=$("$@" 2>"$work/stderr") || rc=$?
  if [ "$rc" != 0 ]; then fail "$what: exit $rc: $(cat "$work/stderr")"; return; fi
  if [ "$got" != "$want" ]; then
    fail "$what: output differs (- expected, + got):"
    diff <(echo "$want") <(echo "$got") | sed 's/^/  /' >&2 || true
  fi
}

# Runs the command; it must fail with exactly one line on stderr that contains
# the given text.
expect_error() {
  local what=$1 text=$2; shift 2
  local rc=0
  "$@" >/dev/null 2>"$work/stderr" || rc=$?
  if [ "$rc" = 0 ]; then fail "$what: succeeded, expected an error"; return; fi
  if [ "$(wc -l <"$work/stderr")" != 1 ] || ! grep -qF -- "$text" "$work/stderr"; then
    fail "$what: expected one line containing '$text', got: $(cat "$work/stderr")"
  fi
}

# The node record blkps login makes for the portal given, and the settings it
# writes before each login (IQN, portal, iface); replacement_timeout is
# $replacement (default 30).
settings() {
  local node="iscsiadm -m node -T $1 -p $2 -I $3 -o update -n"
  cat <<EOF
iscsiadm -m node -o new -T $1 -p $2 -I $3
$node node.startup -v manual
$node node.session.iscsi.InitialR2T -v No
$node node.session.iscsi.ImmediateData -v Yes
$node node.session.iscsi.FirstBurstLength -v 262144
$node node.session.iscsi.MaxBurstLength -v 16776192
$node 'node.conn[0].iscsi.MaxRecvDataSegmentLength' -v 262144
$node node.session.cmds_max -v 128
$node node.session.queue_depth -v 64
$node node.session.timeo.replacement_timeout -v ${replacement:-30}
EOF
  [ "${4:-}" = chap ] || echo "$node node.session.auth.authmethod -v None"
}

# The SCSI command timeout blkps login sets on a LUN's disk.
command_timeout() {
  # shellcheck disable=SC2016  # the script's words, verbatim
  printf '%s\n' "sh -c 'echo \"\$1\" > \"/sys/block/\$(basename \"\$(readlink -f \"\$2\")\")/device/timeout\"' sh 30 $1"
}

iqn_a=iqn.2026-11.io.blkps:a iqn_b=iqn.2026-11.io.blkps:b
dev_a=/dev/disk/by-path/ip-127.0.0.1:3261-iscsi-$iqn_a-lun-1
dev_b=/dev/disk/by-path/ip-127.0.0.1:3262-iscsi-$iqn_b-lun-1
# A layout as blkps shards start writes it: 1 MiB stripe units on 2 shards.
cat >"$work/slot-1.layout" <<EOF
# blkps shard layout
stripe_unit = 1048576          # bytes
shard = iscsi://127.0.0.1:3261/$iqn_a/1
shard = iscsi://127.0.0.1:3262/$iqn_b/1
EOF
shard_logins() {  # the login commands for both shards, tcp
  echo "iscsiadm -m iface -I blkps-tcp -o new"
  echo "iscsiadm -m iface -I blkps-tcp -o update -n iface.transport_name -v tcp"
  echo "iscsiadm -m discovery -t sendtargets -p 127.0.0.1:3261 -I blkps-tcp -o nonpersistent"
  settings "$iqn_a" 127.0.0.1:3261 blkps-tcp
  echo "iscsiadm -m node -T $iqn_a -p 127.0.0.1:3261 -I blkps-tcp --login"
  echo "iscsiadm -m discovery -t sendtargets -p 127.0.0.1:3262 -I blkps-tcp -o nonpersistent"
  settings "$iqn_b" 127.0.0.1:3262 blkps-tcp
  echo "iscsiadm -m node -T $iqn_b -p 127.0.0.1:3262 -I blkps-tcp --login"
  echo "udevadm settle"
  command_timeout "$dev_a"
  command_timeout "$dev_b"
}
# A fake sysfs with one RDMA device, and one with none.
mkdir -p "$work/rdma/class/infiniband/mlx5_0" "$work/no-rdma/class/infiniband"

test_shellcheck() {
  local f files=()
  # Every shell file of the tree (scripts/tree-files.sh): *.sh, and any file
  # whose #! names sh or bash (scripts/blkps, .ci/run, ...).
  local listing
  listing=$("$top/scripts/tree-files.sh")
  while IFS= read -r f; do
    [ -f "$top/$f" ] || continue
    case "$f" in
      *.sh) ;;
      *) head -n 1 "$top/$f" | grep -qE '^#!.*\b(ba|da)?sh\b' || continue ;;
    esac
    files+=("$top/$f")
  done <<<"$listing"
  [ "${#files[@]}" -gt 10 ] || fail "shellcheck: found only ${#files[@]} shell files"
  for f in "${files[@]}"; do
    shellcheck "$f" >&2 || fail "shellcheck found issues in ${f#"$top"/}"
  done
}

test_tcp_login() {
  want=$(
    echo "iscsiadm -m iface -I blkps-tcp -o new"
    echo "iscsiadm -m iface -I blkps-tcp -o update -n iface.transport_name -v tcp"
    echo "iscsiadm -m discovery -t sendtargets -p 127.0.0.1:3261 -I blkps-tcp -o nonpersistent"
    settings iqn.2026-11.io.blkps:model 127.0.0.1:3261 blkps-tcp
    echo "iscsiadm -m node -T iqn.2026-11.io.blkps:model -p 127.0.0.1:3261 -I blkps-tcp --login"
    echo "udevadm settle"
    command_timeout /dev/disk/by-path/ip-127.0.0.1:3261-iscsi-iqn.2026-11.io.blkps:model-lun-2
    echo "/dev/disk/by-path/ip-127.0.0.1:3261-iscsi-iqn.2026-11.io.blkps:model-lun-2"
  )
  expect_output "tcp login" "$want" "$login" login --dry-run \
        --url iscsi://127.0.0.1:3261/iqn.2026-11.io.blkps:model/2
}

test_chap_login() {
  # Mutual CHAP: the settings with the credentials file named, never a secret.
  printf 'user=learner\nsecret=in-secret-0123\ntarget_user=target\ntarget_secret=out-secret-0123\n' \
    >"$work/mutual.chap"
  chmod 600 "$work/mutual.chap"
  local node="iscsiadm -m node -T iqn.2026-11.io.blkps:model -p 127.0.0.1:3261 -I blkps-tcp -o update -n"
  want=$(
    echo "iscsiadm -m iface -I blkps-tcp -o new"
    echo "iscsiadm -m iface -I blkps-tcp -o update -n iface.transport_name -v tcp"
    echo "iscsiadm -m discovery -t sendtargets -p 127.0.0.1:3261 -I blkps-tcp -o nonpersistent"
    settings iqn.2026-11.io.blkps:model 127.0.0.1:3261 blkps-tcp chap
    echo "$node node.session.auth.authmethod -v CHAP"
    echo "$node node.session.auth.username -v learner"
    echo "$node node.session.auth.password -v '<secret of $work/mutual.chap>'"
    echo "$node node.session.auth.username_in -v target"
    echo "$node node.session.auth.password_in -v '<secret of $work/mutual.chap>'"
    echo "iscsiadm -m node -T iqn.2026-11.io.blkps:model -p 127.0.0.1:3261 -I blkps-tcp --login"
    echo "udevadm settle"
    command_timeout /dev/disk/by-path/ip-127.0.0.1:3261-iscsi-iqn.2026-11.io.blkps:model-lun-2
    echo "/dev/disk/by-path/ip-127.0.0.1:3261-iscsi-iqn.2026-11.io.blkps:model-lun-2"
  )
  expect_output "chap login" "$want" "$login" login --dry-run --chap-file "$work/mutual.chap" \
    --url iscsi://127.0.0.1:3261/iqn.2026-11.io.blkps:model/2
  if grep -q 'secret-0123' <("$login" login --dry-run --chap-file "$work/mutual.chap" \
                             --url iscsi://127.0.0.1:3261/iqn.2026-11.io.blkps:model/2 2>&1); then
    fail "chap login: a secret shows in the dry run"
  fi
  chmod 640 "$work/mutual.chap"
  expect_error "group-readable credentials" \
    "--chap-file: CHAP file $work/mutual.chap is readable by group or others (mode 0640)" \
    "$login" login --dry-run --chap-file "$work/mutual.chap" --url iscsi://127.0.0.1:3261/iqn.2026-11.io.blkps:model/2
  printf 'user=learner\n' >"$work/user-only.chap"
  chmod 600 "$work/user-only.chap"
  expect_error "user without secret" "needs user= with secret=" \
    "$login" login --dry-run --chap-file "$work/user-only.chap" --url iscsi://127.0.0.1:3261/iqn.2026-11.io.blkps:model/2
}

test_iser_login() {
  # An iser:// URL selects iSER; the default port is 3260.
  want=$(
    echo "iscsiadm -m iface -I blkps-iser -o new"
    echo "iscsiadm -m iface -I blkps-iser -o update -n iface.transport_name -v iser"
    echo "iscsiadm -m discovery -t sendtargets -p 10.0.0.7:3260 -I blkps-iser -o nonpersistent"
    settings iqn.2026-11.io.blkps:model 10.0.0.7:3260 blkps-iser
    echo "iscsiadm -m node -T iqn.2026-11.io.blkps:model -p 10.0.0.7:3260 -I blkps-iser --login"
    echo "udevadm settle"
    command_timeout /dev/disk/by-path/ip-10.0.0.7:3260-iscsi-iqn.2026-11.io.blkps:model-lun-1
    echo "/dev/disk/by-path/ip-10.0.0.7:3260-iscsi-iqn.2026-11.io.blkps:model-lun-1"
  )
  BLKPS_SYSFS="$work/rdma" expect_output "iser login" "$want" "$login" login --dry-run \
        --url iser://10.0.0.7/iqn.2026-11.io.blkps:model/1
}

test_iser_without_rdma_fails() {
  BLKPS_SYSFS="$work/no-rdma" expect_error "iser without an RDMA device" \
    "iSER needs an RDMA device and this host has none" \
    "$login" login --dry-run --transport iser --url iscsi://10.0.0.7:3260/iqn.2026-11.io.blkps:model/1
}

test_sharded_login_dm() {
  # 1000000 params = 4000000 bytes = 3 whole units and one of 854272 bytes:
  # shard a holds units 0 and 2 (2 MiB), shard b units 1 and 3 (1 MiB +
  # 854272, 1903104 on its 512-byte device). One striped row (2 x 2048
  # sectors), then the last row's units as linear segments.
  want=$(
    shard_logins
    printf '%s\n' "printf '%s\\n' '0 4096 striped 2 2048 $dev_a 0 $dev_b 0' '4096 2048 linear $dev_a 2048' '6144 1669 linear $dev_b 2048' | dmsetup create blkps-slot-1"
    echo "udevadm settle"
    echo "/dev/mapper/blkps-slot-1"
  )
  expect_output "2-shard login, dm, unequal shards" "$want" "$login" login --dry-run \
        --layout "$work/slot-1.layout" --params 1000000
  # 1048576 params: 4 whole units, shards of equal size: one striped segment.
  want=$(
    shard_logins
    echo "dmsetup create blkps-slot-1 --table '0 8192 striped 2 2048 $dev_a 0 $dev_b 0'"
    echo "udevadm settle"
    echo "/dev/mapper/blkps-slot-1"
  )
  expect_output "2-shard login, dm, equal shards" "$want" "$login" login --dry-run \
        --layout "$work/slot-1.layout" --params 1048576
}

test_sharded_login_md() {
  want=$(
    shard_logins
    echo "mdadm --build /dev/md/model --level=0 --chunk=1024 --raid-devices=2 $dev_a $dev_b"
    echo "udevadm settle"
    echo "/dev/md/model"
  )
  expect_output "2-shard login, md" "$want" "$login" login --dry-run --stripe md --name model \
        --layout "$work/slot-1.layout" --params 1048576
}

test_dm_table_maps_layout() {
  # For models of several sizes over 2..4 shards, the dm table that --dry-run
  # prints, read with the kernel's striped and linear semantics, sends each
  # 512-byte sector of the model to the shard and offset of the layout's
  # striping: stripe unit k on shard k mod S at (k div S) * unit.
  local shards unit params layout i
  for shards in 2 3 4; do
    layout="$work/s$shards.layout"
    for unit in 4096 65536; do
      { echo "stripe_unit = $unit"
        for ((i = 0; i < shards; i++)); do echo "shard = iscsi://127.0.0.1:$((3261 + i))/iqn.x:s$i/1"; done
      } >"$layout"
      for params in 16384 100000 123457 400000; do
        # Every shard holds at least one unit (blkps shards needs that too).
        [ $(((4 * params + unit - 1) / unit)) -ge "$shards" ] || continue
        local out
        if ! out=$("$login" login --dry-run --layout "$layout" --params "$params" 2>&1); then
          fail "dm table for $shards shards, unit $unit, $params params: $(tail -n 1 <<<"$out")"; continue
        fi
        /usr/bin/python3 - "$shards" "$unit" "$params" "$out" <<'PY' || fail "dm table for $shards shards, unit $unit, $params params does not map the layout"
import re, shlex, sys
shards, unit, params, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
line = next(l for l in out.splitlines() if "dmsetup create" in l)
words = shlex.split(line.replace("|", " "))
table = [words[words.index("--table") + 1]] if "--table" in words else \
    [w for w in words if re.match(r"^\d+ \d+ (striped|linear) ", w)]
shard_of = lambda dev: int(re.search(r"iqn\.x:s(\d+)-lun", dev).group(1))
mapping = {}  # model sector -> (shard, shard sector)
for seg in table:
    f = seg.split()
    start, length, kind = int(f[0]), int(f[1]), f[2]
    for s in range(start, start + length):
        if kind == "linear":
            mapping[s] = (shard_of(f[3]), int(f[4]) + s - start)
        else:
            stripes, chunk = int(f[3]), int(f[4])
            c, within = divmod(s - start, chunk)
            row, stripe = divmod(c, stripes)
            mapping[s] = (shard_of(f[5 + 2 * stripe]), int(f[6 + 2 * stripe]) + row * chunk + within)
model_sectors = (4 * params + 511) // 512
assert sorted(mapping) == list(range(len(mapping))), "segments leave a gap or overlap"
assert len(mapping) >= model_sectors, f"{len(mapping)} sectors, the model needs {model_sectors}"
for s in range(model_sectors):
    k, within = divmod(s * 512, unit)
    want = (k % shards, ((k // shards) * unit + within) // 512)
    assert mapping[s] == want, f"sector {s}: {mapping[s]}, layout says {want}"
PY
      done
    done
  done
}

test_md_refuses_unequal_shards() {
  expect_error "md with unequal shards" "md RAID-0 needs shards of equal size" \
    "$login" login --dry-run --stripe md --layout "$work/slot-1.layout" --params 1000000
}

test_logout() {
  want=$(
    echo "dmsetup remove blkps-slot-1"
    echo "iscsiadm -m node -T $iqn_a -p 127.0.0.1:3261 -I blkps-tcp --logout"
    echo "iscsiadm -m node -T $iqn_b -p 127.0.0.1:3262 -I blkps-tcp --logout"
  )
  expect_output "2-shard logout, dm" "$want" "$login" logout --dry-run --layout "$work/slot-1.layout"
  want=$(
    echo "mdadm --stop /dev/md/blkps-slot-1"
    echo "iscsiadm -m node -T $iqn_a -p 127.0.0.1:3261 -I blkps-tcp --logout"
    echo "iscsiadm -m node -T $iqn_b -p 127.0.0.1:3262 -I blkps-tcp --logout"
  )
  expect_output "2-shard logout, md" "$want" "$login" logout --dry-run --stripe md \
        --layout "$work/slot-1.layout"
  expect_output "logout" \
    "iscsiadm -m node -T iqn.2026-11.io.blkps:model -p 127.0.0.1:3261 -I blkps-tcp --logout" "$login" logout --dry-run --url iscsi://127.0.0.1:3261/iqn.2026-11.io.blkps:model/1
}

test_node_status() {
  # Nothing logged in on this machine: each shard and the striped device
  # say so, and the exit status is 1.
  local got rc=0
  got=$("$login" node-status --layout "$work/slot-1.layout" 2>&1) || rc=$?
  [ "$rc" = 1 ] || fail "node-status: exit $rc, expected 1"
  [ "$got" = "iscsi://127.0.0.1:3261/$iqn_a/1  not logged in
iscsi://127.0.0.1:3262/$iqn_b/1  not logged in
blkps-slot-1  not assembled" ] || fail "node-status printed: $got"
}

test_replicated_login() {
  # Both shards with a backup (replica lines, as blkps target start
  # --replicas 2 writes them): a multipath device per shard, primary's path
  # group first, then the stripe over the two; replacement_timeout 5.
  local rep_a=/dev/disk/by-path/ip-127.0.0.1:3263-iscsi-$iqn_a-lun-1
  local rep_b=/dev/disk/by-path/ip-127.0.0.1:3264-iscsi-$iqn_b-lun-1
  cat >"$work/replicated.layout" <<EOF
stripe_unit = 1048576
shard = iscsi://127.0.0.1:3261/$iqn_a/1
replica = iscsi://127.0.0.1:3263/$iqn_a/1
shard = iscsi://127.0.0.1:3262/$iqn_b/1
replica = iscsi://127.0.0.1:3264/$iqn_b/1
EOF
  local iqn portal
  want=$(
    echo "iscsiadm -m iface -I blkps-tcp -o new"
    echo "iscsiadm -m iface -I blkps-tcp -o update -n iface.transport_name -v tcp"
    for iqn_portal in "$iqn_a 3261" "$iqn_a 3263" "$iqn_b 3262" "$iqn_b 3264"; do
      read -r iqn portal <<<"$iqn_portal"
      echo "iscsiadm -m discovery -t sendtargets -p 127.0.0.1:$portal -I blkps-tcp -o nonpersistent"
      replacement=5 settings "$iqn" "127.0.0.1:$portal" blkps-tcp
      echo "iscsiadm -m node -T $iqn -p 127.0.0.1:$portal -I blkps-tcp --login"
    done
    echo "udevadm settle"
    for dev in "$dev_a" "$rep_a" "$dev_b" "$rep_b"; do command_timeout "$dev"; done
    echo "dmsetup create blkps-replicated-shard0 --table '0 4096 multipath 0 0 2 1 round-robin 0 1 1 $dev_a 1 round-robin 0 1 1 $rep_a 1'"
    echo "dmsetup create blkps-replicated-shard1 --table '0 4096 multipath 0 0 2 1 round-robin 0 1 1 $dev_b 1 round-robin 0 1 1 $rep_b 1'"
    echo "dmsetup create blkps-replicated --table '0 8192 striped 2 2048 /dev/mapper/blkps-replicated-shard0 0 /dev/mapper/blkps-replicated-shard1 0'"
    echo "udevadm settle"
    echo "/dev/mapper/blkps-replicated"
  )
  expect_output "2-shard login with replicas" "$want" "$login" login --dry-run \
        --layout "$work/replicated.layout" --params 1048576
  want=$(
    echo "dmsetup remove blkps-replicated"
    echo "dmsetup remove blkps-replicated-shard0"
    echo "dmsetup remove blkps-replicated-shard1"
    for iqn_portal in "$iqn_a 3261" "$iqn_a 3263" "$iqn_b 3262" "$iqn_b 3264"; do
      read -r iqn portal <<<"$iqn_portal"
      echo "iscsiadm -m node -T $iqn -p 127.0.0.1:$portal -I blkps-tcp --logout"
    done
  )
  expect_output "2-shard logout with replicas" "$want" "$login" logout --dry-run --layout "$work/replicated.layout"
  # One shard with a backup: its multipath device is the model's.
  head -n 3 "$work/replicated.layout" >"$work/one.layout"
  expect_output "1-shard login with a replica (last lines)" \
    "dmsetup create blkps-one --table '0 2048 multipath 0 0 2 1 round-robin 0 1 1 $dev_a 1 round-robin 0 1 1 $rep_a 1'
udevadm settle
/dev/mapper/blkps-one" \
    sh -c '"$@" | tail -n 3' sh "$login" login --dry-run --layout "$work/one.layout" --params 262144
  local got rc=0
  got=$("$login" node-status --layout "$work/one.layout" 2>&1) || rc=$?
  [ "$rc" = 1 ] || fail "node-status with a replica: exit $rc, expected 1"
  [ "$got" = "iscsi://127.0.0.1:3261/$iqn_a/1  not logged in
iscsi://127.0.0.1:3263/$iqn_a/1  not logged in
blkps-one  not assembled" ] || fail "node-status with a replica printed: $got"
}

test_missing_iscsiadm_fails() {
  # A PATH with what scripts/blkps uses but no iscsiadm.
  mkdir -p "$work/bin"
  local t
  for t in sh dirname readlink id; do ln -sf "$(command -v "$t")" "$work/bin/$t"; done
  expect_error "no iscsiadm" "iscsiadm not found: install open-iscsi" \
    env PATH="$work/bin" "$login" login --url iscsi://127.0.0.1:3261/iqn.2026-11.io.blkps:model/1
}

test_bad_layout_names_file_and_line() {
  printf 'stripe_unit = 1048576\nshard = nfs://host/x\n' >"$work/bad.layout"
  expect_error "bad shard URL" "bad target URL 'nfs://host/x'" \
    "$login" login --dry-run --layout "$work/bad.layout" --params 10
  printf 'stripe_unit = 1000\n' >"$work/bad.layout"
  expect_error "bad stripe unit" "$work/bad.layout:1: stripe_unit: expected a number of bytes > 0 and a multiple of 512" \
    "$login" login --dry-run --layout "$work/bad.layout" --params 10
  printf '# comment\nstripe_unt = 4096\n' >"$work/bad.layout"
  expect_error "unknown key" "$work/bad.layout:2: unknown key 'stripe_unt'" \
    "$login" login --dry-run --layout "$work/bad.layout" --params 10
}

cases=(shellcheck tcp_login chap_login iser_login iser_without_rdma_fails sharded_login_dm
       dm_table_maps_layout sharded_login_md md_refuses_unequal_shards logout node_status
       replicated_login missing_iscsiadm_fails bad_layout_names_file_and_line)
if [ $# -ge 2 ]; then cases=("$2"); fi
for c in "${cases[@]}"; do
  before=$failures
  "test_$c"
  [ "$failures" = "$before" ] && echo "ok: $c"
done
[ "$failures" = 0 ] || { echo "$failures check(s) failed" >&2; exit 1; }
