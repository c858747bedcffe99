#!/usr/bin/env bash
# The fio sweep: throughput of blkps model LUNs next to tgt's own stores, by
# request size and queue depth, with fio as the initiator.
#
#   sudo bench/fio/sweep.sh --out DIR [--quick] [--netns] [--netns-only]
#                           [--shape none,10gbit:0.5ms,...] [--build BUILD_DIR]
#
# One private tgtd (blkps target) serves four stores side by side:
#   blkps-sgd   a blkps model LUN, rule sgd (64M parameters, 256 MiB)
#   blkps-adam  a second model in the same tgtd, rule adam
#   rdwr        tgt's "rdwr" store over a 256 MiB file on tmpfs (/dev/shm)
#   null        tgt's "null" store: moves the bytes, does nothing (the ceiling)
# and fio runs request sizes 4K..16M x {sync: iodepth 1; async: iodepth 16, 32}
# x {read, write} on each, interleaving the stores so that machine noise hits
# them alike. Paths:
#   libiscsi  fio's own libiscsi engine, built as an external engine for the
#             installed fio (bench/fio/build-libiscsi-engine.sh)
#   fuse      the stock libaio engine, direct=1, on the files of blkps-mount
#             (learner/mount/), when it is built (a subset: 4K, 64K, 1M, 16M
#             x qd 1, 16 on blkps-sgd and null)
# Writes carry zeros (a zero gradient: the model is unchanged, the rule runs).
#
# --netns adds the same sweep over a real link (a subset: 64K, 1M, 16M x qd 1,
# 16 x read, write on blkps-sgd and null): tgtd in its own network namespace
# behind a veth pair, once per --shape: "none", or RATE[:DELAY] (tc: netem
# rate+delay on both ends, or tbf rate only where the kernel has no netem;
# DELAY is added in each direction). Then a multi-host run: one model sharded
# over 2 server namespaces, 4 learner namespaces on a bridge, 4 blkps-iobench
# learners at once on layout: targets.
# --netns-only skips the loopback sweep. --quick: fewer sizes and shorter runs.
#
# Output: DIR/fio.csv (link,store,path,rw,bs,iodepth,mbps,iops,lat_us),
# DIR/fio.md (MB/s and ratio to null from the same run), DIR/fio-*.png.
# Needs root, a build (scripts/build.sh: bs_blkps, blkps-iobench) and
# scripts/setup.sh --bench. Exit status 1 if any run failed.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
prog=fio-sweep
die() { echo "$prog: error: $*" >&2; exit 1; }
note() { echo "$prog: $*" >&2; }

# shellcheck disable=SC1091  # bench/lib.sh
. "$top/bench/lib.sh"
out="" quick=0 loopback=1 netns=0 shapes="" build=$(default_build)
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=${2:?--out needs a folder}; shift 2 ;;
    --quick) quick=1; shift ;;
    --netns) netns=1; shift ;;
    --netns-only) netns=1 loopback=0; shift ;;
    --shape) shapes=${2:?--shape needs a list, e.g. none,10gbit:0.5ms}; shift 2 ;;
    --build) build=${2:?--build needs a folder}; shift 2 ;;
    -h|--help) awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; exit 0 ;;
    *) die "unknown option '$1' (see $0 --help)" ;;
  esac
done
[ -n "$out" ] || die "--out DIR is required"
need_root "$prog" "tgtd, network namespaces"
command -v fio >/dev/null || die "fio not found: run scripts/setup.sh"
python=/usr/bin/python3
[ -x "$python" ] || die "$python not found: run scripts/setup.sh"
[ -d "$build" ] || die "no build folder $build: run scripts/build.sh, or give --build"
build=$(cd "$build" && pwd)
plugin="$build/target-plugin/bs_blkps.so"
iobench="$build/bench/blkps-iobench"
mount_bin="$build/learner/mount/blkps-mount"
[ -f "$plugin" ] || die "$plugin not built: run scripts/build.sh"
engine=$("$here/build-libiscsi-engine.sh") || die "fio's libiscsi engine could not be built (above)"

if [ "$quick" = 1 ]; then
  sizes="4K 64K 1M 16M" depths="1 16" runtime=500ms ramp=100ms
  net_sizes="64K 1M" net_depths="16" mh_seconds=1
  fuse_sizes="64K 1M" fuse_depths="16"
  : "${shapes:=none}"
else
  sizes="4K 16K 64K 256K 1M 4M 16M" depths="1 16 32" runtime=800ms ramp=150ms
  net_sizes="64K 1M 16M" net_depths="1 16" mh_seconds=2
  fuse_sizes="4K 64K 1M 16M" fuse_depths="1 16"
  : "${shapes:=none,10gbit:0.5ms}"
fi
params=67108864 span=256M    # a 256 MiB model; every run stays inside it
bsopts="params=$params;lr=1e-9"
IFS=, read -r -a shape_list <<< "$shapes"
for s in "${shape_list[@]}"; do
  [[ "$s" =~ ^(none|[0-9]+(\.[0-9]+)?[kmg]bit(:[0-9]+(\.[0-9]+)?(us|ms))?)$ ]] \
    || die "--shape: expected none or RATE[:DELAY] such as 10gbit:0.5ms, got '$s'"
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
csv="$out/fio.csv"
rm -f "$out"/fio-*.png

# --- clean-up: every tgtd, mount and namespace this run made goes, always ----
state=$(mktemp -d /tmp/blkps-fio-XXXXXX)
img="/dev/shm/blkps-fio-$$.img"
namespaces=() mount_pid="" mnt=""
cleanup() {
  set +e
  if [ -n "$mount_pid" ]; then
    kill "$mount_pid" 2>/dev/null; wait "$mount_pid" 2>/dev/null
    fusermount3 -u "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null
  fi
  for d in "$state"/target-*; do
    [ -d "$d" ] || continue
    [ -f "$d/tgtd.log" ] && cp "$d/tgtd.log" "$out/tgtd-${d##*/target-}.log"
    "$top/scripts/blkps" target stop --dir "$d"
  done
  for ns in "${namespaces[@]}"; do ip netns del "$ns" 2>/dev/null; done
  rm -f "$img"
  rm -rf "$state"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- one fio run: a CSV row and a progress line --------------------------------
bytes() { numfmt --from=iec "$1"; }
count() { wc -w <<< "$1"; }
runs=0 failures=0
total=0
if [ "$loopback" = 1 ]; then
  total=$((total + $(count "$sizes") * $(count "$depths") * 2 * 4))
  [ -x "$mount_bin" ] && total=$((total + $(count "$fuse_sizes") * $(count "$fuse_depths") * 2 * 2))
fi
if [ "$netns" = 1 ]; then
  total=$((total + ${#shape_list[@]} * $(count "$net_sizes") * $(count "$net_depths") * 2 * 2))
  [ -x "$iobench" ] && total=$((total + 4))
fi
echo "link,store,path,rw,bs,iodepth,mbps,iops,lat_us" > "$csv"

record() {  # link store path rw bs qd mbps iops lat_us
  runs=$((runs + 1))
  echo "$1,$2,$3,$4,$(bytes "$5"),$6,$7,$8,$9" >> "$csv"
  if [ -n "$7" ]; then
    printf '[%d/%d] %s %s %s %s %s qd%s ... %.0f MB/s\n' "$runs" "$total" "$1" "$3" "$2" "$4" "$5" "$6" "$7"
  else
    failures=$((failures + 1))
    printf '[%d/%d] %s %s %s %s %s qd%s ... FAILED: %s\n' "$runs" "$total" "$1" "$3" "$2" "$4" "$5" "$6" \
      "$(grep -v '^$' "$state/run.err" | tail -n 1)"
  fi
}

run_fio() {  # link path store file rw bs qd [fio engine options...]
  local link=$1 path=$2 store=$3 file=$4 rw=$5 bs=$6 qd=$7 res mbps="" iops="" lat=""
  shift 7
  if fio --name=sweep "$@" --filename="$file" --rw="$rw" --bs="$bs" --iodepth="$qd" --size=$span \
       --time_based --runtime=$runtime --ramp_time=$ramp --zero_buffers --scramble_buffers=0 \
       --output-format=json --output="$state/run.json" > "$state/run.err" 2>&1 &&
     res=$("$python" "$here/report.py" result "$state/run.json" "$rw" 2>> "$state/run.err"); then
    read -r mbps iops lat <<< "$res"
  fi
  record "$link" "$store" "$path" "$rw" "$bs" "$qd" "$mbps" "$iops" "$lat"
}

# fio splits --filename at ':'; a URL's colons are escaped.
fio_url() { printf '%s' "$1" | sed 's/:/\\:/g'; }

sweep_libiscsi() {  # link "sizes" "depths" name=url...
  local link=$1 sz=$2 qds=$3 rw bs qd s
  shift 3
  for rw in read write; do
    for qd in $qds; do
      for bs in $sz; do
        for s in "$@"; do
          run_fio "$link" libiscsi "${s%%=*}" "$(fio_url "${s#*=}")" "$rw" "$bs" "$qd" \
            --ioengine="external:$engine"
        done
      done
    done
  done
}

# target_values DIR: URL, URLS, NULL_URL, RDWR_URL, TGT_IPC_SOCKET and LOG of
# the target started in DIR.
target_values() {
  { read -r URL; read -r URLS; read -r NULL_URL; read -r RDWR_URL; read -r TGT_IPC_SOCKET; read -r LOG; } < <(
    "$top/scripts/blkps" target show --dir "$1" --get URL --get URLS --get NULL_URL --get RDWR_URL \
      --get TGT_IPC_SOCKET --get LOG)
}

start_target() {  # name [netns] -- blkps target start options...; prints its DIR
  local name=$1 ns=$2 dir="$state/target-$1"
  shift 3
  # The EXIT trap stops every target this script started; --owner-pid also
  # stops it if this script is killed.
  ${ns:+ip netns exec "$ns"} "$top/scripts/blkps" target start --dir "$dir" --plugin "$plugin" \
    --tgtd 1 --owner-pid $$ "$@" > /dev/null || die "could not start target $name (above)"
  echo "$dir"
}

started=$SECONDS
# --- loopback: four stores in one tgtd -----------------------------------------
if [ "$loopback" = 1 ]; then
  truncate -s $span "$img"
  target_values "$(start_target loopback "" -- --null-lun --rdwr-lun "$img" --bsopts "$bsopts;rule=sgd")"
  # The adam model: a second model in the same tgtd (LUN 10, its control LUN 11).
  for lun_args in "10 --backing-store adam --bsopts params=$params;lr=1e-9;rule=adam" \
                  "11 --backing-store adam --bsopts role=control"; do
    # shellcheck disable=SC2086
    TGT_IPC_SOCKET=$TGT_IPC_SOCKET tgtadm --lld iscsi --op new --mode logicalunit --tid 1 \
      --lun ${lun_args%% *} --bstype blkps ${lun_args#* } > "$state/run.err" 2>&1 \
      || die "creating the adam model LUN failed: $(cat "$state/run.err")"
  done
  adam_url="${URL%/*}/10"
  note "loopback: $(count "$sizes") sizes x qd $depths x read/write x 4 stores through fio's libiscsi engine"
  sweep_libiscsi loopback "$sizes" "$depths" \
    "blkps-sgd=$URL" "blkps-adam=$adam_url" "rdwr=$RDWR_URL" "null=$NULL_URL"

  if [ -x "$mount_bin" ]; then
    mnt="$state/mnt"
    mkdir -p "$mnt"
    "$mount_bin" -f "$mnt" "blkps-sgd=$URL" "null=$NULL_URL" > "$out/blkps-mount.log" 2>&1 &
    mount_pid=$!
    for _ in $(seq 100); do [ -e "$mnt/null" ] && break; sleep 0.1; done
    [ -e "$mnt/null" ] || die "blkps-mount did not show $mnt/null within 10 s; see $out/blkps-mount.log"
    note "fuse: blkps-mount files, libaio direct=1"
    for rw in read write; do
      for qd in $fuse_depths; do
        for bs in $fuse_sizes; do
          for s in blkps-sgd null; do
            run_fio loopback fuse "$s" "$mnt/$s" "$rw" "$bs" "$qd" --ioengine=libaio --direct=1
          done
        done
      done
    done
    kill "$mount_pid" 2>/dev/null || true     # SIGTERM: blkps-mount unmounts and exits
    wait "$mount_pid" 2>/dev/null || true
    fusermount3 -u "$mnt" 2>/dev/null || true
    mount_pid=""
  else
    note "fuse path skipped: $mount_bin is not built (learner/mount/, target blkps-mount)"
  fi
  "$top/scripts/blkps" target stop --dir "$state/target-loopback"
  cp "$LOG" "$out/tgtd-loopback.log" 2>/dev/null || true
  rm -rf "$state/target-loopback" "$img"
fi

# --- a real link: veth pairs between network namespaces ------------------------
new_netns() { ip netns add "$1"; namespaces+=("$1"); ip netns exec "$1" ip link set lo up; }
free_subnet() {  # prints a 10.77.N / 10.78.N prefix with no route on this host yet
  local n
  for n in $(seq 0 250); do
    ip route show | grep -q "^$1\.$n\." || { echo "$1.$n"; return; }
  done
  die "no free $1.N.0/24 subnet for the namespaces"
}
bits_per_s() { local r=${1%bit}; numfmt --from=si "${r^^}"; }

shape_link() {  # spec  (applies to both ends of the veth pair)
  local spec=$1 rate delay dev ns burst
  for dev in "$veth_root" "$ns_target:$veth_ns"; do
    ns=""; [[ "$dev" == *:* ]] && { ns=${dev%%:*}; dev=${dev#*:}; }
    ${ns:+ip netns exec "$ns"} tc qdisc del dev "$dev" root 2>/dev/null || true
    [ "$spec" = none ] && continue
    rate=${spec%%:*} delay=""
    [[ "$spec" == *:* ]] && delay=${spec#*:}
    if [ -n "$delay" ] && [ "$have_netem" = 1 ]; then
      ${ns:+ip netns exec "$ns"} tc qdisc add dev "$dev" root netem delay "$delay" rate "$rate" limit 100000
    else
      # tbf's bucket must hold a few ms at line rate, and more than one 64K TSO packet.
      burst=$(( $(bits_per_s "$rate") / 8 / 500 ))
      [ "$burst" -ge 262144 ] || burst=262144
      ${ns:+ip netns exec "$ns"} tc qdisc add dev "$dev" root tbf rate "$rate" burst "$burst" latency 50ms
    fi
  done
}

if [ "$netns" = 1 ]; then
  tag=$$
  ns_target="blkpsfio$tag-t" veth_root="bf$tag-r" veth_ns="bf$tag-t"
  net=$(free_subnet 10.77)
  new_netns "$ns_target"
  ip link add "$veth_root" type veth peer name "$veth_ns" netns "$ns_target"
  ip addr add "$net.2/24" dev "$veth_root"
  ip link set "$veth_root" up
  ip netns exec "$ns_target" ip addr add "$net.1/24" dev "$veth_ns"
  ip netns exec "$ns_target" ip link set "$veth_ns" up
  have_netem=0
  if tc qdisc add dev "$veth_root" root netem delay 1ms 2>/dev/null; then
    have_netem=1; tc qdisc del dev "$veth_root" root
  elif [[ "$shapes" == *:* ]]; then
    note "this kernel has no netem qdisc: --shape delays are left out (rate only, with tbf)"
  fi
  target_values "$(start_target veth "$ns_target" -- --address "$net.1" --port 3260 --allow "$net.2" \
        --null-lun --bsopts "$bsopts;rule=sgd")"
  for spec in "${shape_list[@]}"; do
    shape_link "$spec"
    link=veth
    if [ "$spec" != none ]; then
      link="veth-${spec%%:*}"
      [[ "$spec" == *:* ]] && [ "$have_netem" = 1 ] && link="$link-${spec#*:}"
    fi
    note "$link: target in network namespace $ns_target at $net.1"
    sweep_libiscsi "$link" "$net_sizes" "$net_depths" "blkps-sgd=$URL" "null=$NULL_URL"
  done
  "$top/scripts/blkps" target stop --dir "$state/target-veth"
  cp "$LOG" "$out/tgtd-veth.log" 2>/dev/null || true
  rm -rf "$state/target-veth"

  # --- multi-host: one model sharded over 2 servers, 4 learners -------------
  # Each host is a namespace with eth0 on one bridge. blkps shards
  # serves every shard on one address, so here each shard is started by
  # blkps target in its own namespace and the learners' layout files
  # (format: learner/src/shard_layout.h) are written here: learner slot L is
  # LUN L of both shards, striped in 1 MiB units. Each learner is a
  # blkps-iobench process opening layout:PATH; the ceiling is the same
  # layout over the shards' null LUNs.
  if [ -x "$iobench" ]; then
    ns_br="blkpsfio$tag-br"
    new_netns "$ns_br"
    ip netns exec "$ns_br" ip link add br0 type bridge
    ip netns exec "$ns_br" ip link set br0 up
    mnet=$(free_subnet 10.78)
    host_up() {  # host address: a namespace with eth0 on the bridge
      new_netns "blkpsfio$tag-$1"
      ip netns exec "$ns_br" ip link add "bf$tag-$1" type veth peer name eth0 netns "blkpsfio$tag-$1"
      ip netns exec "$ns_br" ip link set "bf$tag-$1" master br0 up
      ip netns exec "blkpsfio$tag-$1" ip addr add "$2/24" dev eth0
      ip netns exec "blkpsfio$tag-$1" ip link set eth0 up
    }
    for l in 1 2 3 4; do
      printf 'stripe_unit = 1048576\n' > "$state/slot-$l.layout"
    done
    printf 'stripe_unit = 1048576\n' > "$state/null.layout"
    for s in 1 2; do
      host_up "s$s" "$mnet.$s"
      target_values "$(start_target "shard$s" "blkpsfio$tag-s$s" -- --address "$mnet.$s" --port 3260 \
        --allow ALL --luns 4 --null-lun --bsopts "params=16777216;lr=1e-9;rule=sgd")"
      read -r -a urls <<< "$URLS"
      for l in 1 2 3 4; do echo "shard = ${urls[$((l - 1))]}" >> "$state/slot-$l.layout"; done
      echo "shard = $NULL_URL" >> "$state/null.layout"
    done
    for l in 1 2 3 4; do host_up "l$l" "$mnet.$((10 + l))"; done
    note "multi-host: a model sharded over 2 servers, 4 learners (blkps-iobench 1M x qd16 each) on a bridge"
    for rw in write read; do
      for store in blkps-sgd null; do
        pids=()
        for l in 1 2 3 4; do
          layout="$state/slot-$l.layout"; [ "$store" = null ] && layout="$state/null.layout"
          ip netns exec "blkpsfio$tag-l$l" "$iobench" --target "layout:$layout" --op "$rw" --bs 1M \
            --qd 16 --span 64M --seconds "$mh_seconds" > "$state/learner$l.out" 2>&1 &
          pids+=($!)
        done
        ok=1
        for p in "${pids[@]}"; do wait "$p" || ok=0; done
        mbps="" iops=""
        if [ "$ok" = 1 ]; then
          mbps=$(sed -n 's/.*MBps=\([0-9.]*\).*/\1/p' "$state"/learner?.out | awk '{s += $1} END {printf "%.1f", s}')
          iops=$(awk -v m="$mbps" 'BEGIN {printf "%.0f", m * 1e6 / 1048576}')
        else
          cat "$state"/learner?.out > "$state/run.err"
        fi
        record "bridge-2shards-4learners" "$store" libblkps-layout "$rw" 1M 16 "$mbps" "$iops" ""
      done
    done
  else
    note "multi-host run skipped: $iobench is not built (target blkps-iobench)"
  fi
fi

"$python" "$here/report.py" summary "$csv" "$out" || die "could not write $out/fio.md"
note "$runs runs in $((SECONDS - started)) s, $failures failed: $csv, $out/fio.md"
[ "$failures" = 0 ]
