#!/usr/bin/env bash
# O_DIRECT push and pull of a 16 MiB model through the kernel's iSCSI
# initiator: a learner-node guest (tests/vm/guest, QEMU TCG) logs in with
# scripts/blkps login and moves the whole model with dd (oflag/iflag=direct)
# to and from /dev/sdX of the model LUN and, in the same run, of tgt's "null"
# store (LUN 3, the ceiling: it moves the bytes and does nothing with them).
# Pushes write zeros (a zero gradient). Also prints the guest's wall time.
#
# Usage: sudo bench/kernel-initiator.sh [--rounds 3] [--bs 1M]
# Rounds interleave the stores; figures are medians over rounds (MB/s).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
rounds=3 bs=1M
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=${2:?}; shift 2 ;;
    --bs) bs=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "kernel-initiator: unknown option '$1'" >&2; exit 2 ;;
  esac
done
state=$(mktemp -d /tmp/blkps-bench-XXXXXX)
trap '"$top/scripts/blkps" target stop --dir "$state"; rm -rf "$state"' EXIT
"$top/scripts/blkps" target start --dir "$state" --null-lun --owner-pid $$ \
  --bsopts "params=4194304;lr=1e-9" >/dev/null
for key in URL PORT IQN NULL_URL; do
  printf -v "$key" '%s' "$("$top/scripts/blkps" target show --dir "$state" --get "$key")"
done
guest_url=${URL/127.0.0.1/10.0.2.2}
null_dev=/dev/disk/by-path/ip-10.0.2.2:$PORT-iscsi-$IQN-lun-${NULL_URL##*/}

cat > "$state/in-guest.sh" <<EOF
set -euo pipefail
model=\$(scripts/blkps login --url $guest_url 2>/dev/null)
udevadm settle
# dd's last line: "16777216 bytes (17 MB, 16 MiB) copied, 1.2 s, 13.6 MB/s".
rate() { dd "\$@" bs=$bs count=\$((16 * 1048576 / \$(numfmt --from=iec $bs))) 2>&1 | tail -n 1 | awk '{ print \$(NF - 1), \$NF }'; }
for ((r = 1; r <= $rounds; r++)); do
  for store in blkps null; do
    dev=\$model; [ "\$store" = null ] && dev=$null_dev
    echo "\$store push \$(rate if=/dev/zero of="\$dev" oflag=direct)"
    echo "\$store pull \$(rate if="\$dev" of=/dev/null iflag=direct)"
  done
done
EOF
start=$(date +%s%N)
"$top/tests/vm/guest" --rw "$state" -- bash "$state/in-guest.sh" | tee "$state/rates"
awk -v ns=$(($(date +%s%N) - start)) 'BEGIN { printf "guest wall time: %.1f s\n", ns / 1e9 }'
# Medians in MB/s (dd prints kB/s, MB/s or GB/s).
awk '{ v = $3; if ($4 == "kB/s") v /= 1000; if ($4 == "GB/s") v *= 1000; print $1, $2, v }' "$state/rates" |
  sort -k1,2 -k3g | awk '{ k = $1 " " $2; v[k, ++n[k]] = $3 }
    END { for (k in n) { m = n[k]; med = (m % 2) ? v[k, (m + 1) / 2] : (v[k, m / 2] + v[k, m / 2 + 1]) / 2
          printf "%s median %.1f MB/s over %d rounds\n", k, med, m } }' | sort
