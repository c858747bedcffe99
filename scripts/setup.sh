#!/usr/bin/env bash
# Installs everything blkps needs on a Debian 12 machine, as root:
#   - the Debian packages it builds and runs with;
#   - tgt's headers for the installed tgt version, from Debian's source package
#     (unpacked under build/deps/, never committed).
#   - the learner-node guests' kernel (tests/vm/guest): Debian's
#     linux-image-amd64, unpacked under build/deps/linux-image/ (never
#     installed, never committed), with its modules.dep;
#   - with --bench, also what bench/ needs (plots, OpenMPI).
# Idempotent: a second run checks and returns in a second or two.
# Usage: scripts/setup.sh [--quiet] [--bench]
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
deps="$top/build/deps"
quiet=0 bench=0
for arg in "$@"; do
  case "$arg" in
    --quiet) quiet=1 ;;
    --bench) bench=1 ;;
    *) echo "setup: error: unknown option '$arg' (use --quiet, --bench)" >&2; exit 2 ;;
  esac
done
say() { [ "$quiet" = 1 ] || echo "setup: $*"; }
# Slow steps are announced even with --quiet: a first run is minutes of work.
progress() { echo "setup: $*"; }
die() { echo "setup: error: $*" >&2; exit 1; }

packages=(
  build-essential cmake pkg-config g++ git
  tgt libiscsi-dev libiscsi-bin libaio-dev libopenblas-dev libopenblas-serial-dev
  rdma-core libibverbs-dev librdmacm-dev ibverbs-providers  # ibverbs-providers: rxe (soft-RoCE) for the vm iser test
  fio fuse3 libfuse3-dev libgtest-dev zlib1g-dev
  python3 python3-numpy python3-sklearn
  python3-torch dataset-fashion-mnist
  dpkg-dev iproute2 procps shellcheck
  python3-pyflakes          # tests/pyflakes_check.sh: the tree's Python files
  file                      # cpack: finds the ELF files dpkg-shlibdeps reads
  systemd                   # systemd-analyze: Install.service verifies blkps@.service
  help2man                  # man pages from the commands' --help
  prometheus                # promtool and a real Prometheus for tests/monitoring_test.py
  slurmctld slurmd munge slurm-client   # a Slurm cluster out of namespaces: tests/slurm_cluster_test.py
  etcd-server               # leases for replicas' failover: tests/lease_test.py starts private members
  clang-format clang-tidy   # scripts/format.sh, -DBLKPS_CLANG_TIDY=ON
  clang libclang-rt-14-dev    # -DBLKPS_FUZZ=ON (libFuzzer), scripts/checked-tests.sh
  qemu-system-x86 open-iscsi mdadm dmsetup udev kmod busybox-static   # tests/vm: learner-node guests
)
bench_packages=(
  python3-matplotlib openmpi-bin libopenmpi-dev iperf3
  chromium                  # bench/monitoring-graph.sh photographs Prometheus's graph page
)
[ "$bench" = 1 ] && packages+=("${bench_packages[@]}")

[ "$(id -u)" = 0 ] || die "run as root (it installs Debian packages): sudo $0"
export DEBIAN_FRONTEND=noninteractive

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  progress "installing ${#missing[@]} Debian package(s) (a few minutes): ${missing[*]}"
  apt-get update -qq || die "apt-get update failed"
  # etcd-server's postinst starts a system etcd on 127.0.0.1:2379 and enables
  # it at boot; blkps needs the binary only (tests start private members). A
  # policy-rc.d (Debian's way for an installer to veto service starts) denies
  # etcd's start for this install, unless the machine has its own policy.
  policy=/usr/sbin/policy-rc.d
  if [[ " ${missing[*]} " == *" etcd-server "* ]] && [ ! -e "$policy" ]; then
    cat >"$policy" <<'POLICY'
#!/bin/sh
# blkps setup.sh, while it installs: no system etcd
[ "$1" = etcd ] && exit 101
exit 0
POLICY
    chmod 755 "$policy"
    trap 'rm -f "$policy"' EXIT
  fi
  # One line per package as dpkg sets it up.
  apt-get install -y -q --no-install-recommends "${missing[@]}" 2>&1 |
    sed -un 's/^Setting up \([^ ]*\) .*/setup: set up \1/p' \
    || die "apt-get install failed for: ${missing[*]}"
  if [[ " ${missing[*]} " == *" etcd-server "* ]]; then
    if command -v update-rc.d >/dev/null; then update-rc.d etcd disable >/dev/null 2>&1 || true; fi
    if [ -d /run/systemd/system ]; then systemctl disable --now etcd >/dev/null 2>&1 || true; fi
  fi
else
  say "Debian packages present"
fi

# The guests' kernel: the package linux-image-amd64 depends on, fetched and
# unpacked (not installed); its modules are indexed for the guest's modprobe.
kernel_dir="$deps/linux-image"
if [ -f "$kernel_dir/.blkps-package" ]; then
  say "guest kernel $(cat "$kernel_dir/.blkps-package") present"
else
  kernel_pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/ { print $2; exit }')
  [ -n "$kernel_pkg" ] || die "cannot tell which kernel package linux-image-amd64 depends on (apt-get update?)"
  echo "setup: fetching the guest kernel $kernel_pkg (about 70 MB; tests/vm/guest boots it)"
  rm -rf "$kernel_dir" "$deps/kernel-fetch"
  mkdir -p "$deps/kernel-fetch"
  (cd "$deps/kernel-fetch" && apt-get download -qq "$kernel_pkg" >/dev/null 2>&1) ||
    { apt-get update -qq && (cd "$deps/kernel-fetch" && apt-get download -qq "$kernel_pkg" >/dev/null 2>&1); } ||
    die "could not fetch the kernel package $kernel_pkg"
  echo "setup: unpacking $kernel_pkg into build/deps/linux-image"
  dpkg-deb -x "$deps/kernel-fetch/"*.deb "$deps/kernel-fetch/root" || die "could not unpack $kernel_pkg"
  kernel_version=${kernel_pkg#linux-image-}
  depmod -b "$deps/kernel-fetch/root" "$kernel_version" || die "depmod failed for $kernel_version"
  mv "$deps/kernel-fetch/root" "$kernel_dir"
  rm -rf "$deps/kernel-fetch"
  echo "$kernel_pkg" > "$kernel_dir/.blkps-package"
  say "guest kernel in $kernel_dir"
fi

# tgt's headers: from the source package matching the installed tgt.
tgt_version=$(dpkg-query -W -f='${Version}' tgt)
stamp="$deps/tgt-src/.blkps-version"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$tgt_version" ] && [ -f "$deps/tgt-src/usr/tgtd.h" ]; then
  say "tgt $tgt_version headers present"
  exit 0
fi

# A deb-src entry for every deb entry the machine already has, unless one exists.
has_src() {
  grep -rqsE '^[[:space:]]*deb-src[[:space:]]' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null && return 0
  grep -rqsE '^Types:.*deb-src' /etc/apt/sources.list.d/*.sources 2>/dev/null
}
if ! has_src; then
  say "adding deb-src entries derived from this machine's apt sources"
  src=/etc/apt/sources.list.d/blkps-deb-src.sources
  : > "$src.tmp"
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    case "$f" in */blkps-deb-src.sources) continue ;; esac
    # deb822: keep only stanzas of Types: deb; rewrite them as deb-src.
    awk 'BEGIN{RS="";ORS="\n\n"} /Types:[ \t]*([^\n]*[ \t])?deb([ \t]|\n|$)/ {sub(/Types:[^\n]*/,"Types: deb-src"); print}' "$f" >> "$src.tmp"
  done
  if [ -f /etc/apt/sources.list ]; then
    sed -n 's/^[[:space:]]*deb[[:space:]]/deb-src /p' /etc/apt/sources.list > /etc/apt/sources.list.d/blkps-deb-src.list
  fi
  mv "$src.tmp" "$src"
  apt-get update -qq || die "apt-get update failed after adding deb-src entries"
fi

progress "fetching tgt $tgt_version source package (headers only are used)"
rm -rf "$deps/tgt-src" "$deps/tgt-fetch"
mkdir -p "$deps/tgt-fetch"
# As root into a folder apt's sandbox user cannot read (mktemp's, or under
# /root): without the option apt warns "Download is performed unsandboxed".
(cd "$deps/tgt-fetch" && apt-get source -qq --download-only -o APT::Sandbox::User=root "tgt=$tgt_version" >/dev/null) \
  || die "could not fetch tgt's source package (is a deb-src entry reachable?)"
(cd "$deps/tgt-fetch" && dpkg-source -q --no-check -x ./*.dsc tgt >/dev/null) \
  || die "could not unpack tgt's source package"
mv "$deps/tgt-fetch/tgt" "$deps/tgt-src"
rm -rf "$deps/tgt-fetch"
[ -f "$deps/tgt-src/usr/tgtd.h" ] || die "tgt source has no usr/tgtd.h"
echo "$tgt_version" > "$stamp"
say "tgt headers in $deps/tgt-src/usr"
