#!/usr/bin/env bash
# Builds fio's own libiscsi engine (engines/libiscsi.c) as an external engine
# for the installed fio, which Debian builds without libiscsi:
#
#   bench/fio/build-libiscsi-engine.sh [--deps DIR]    # default: build/deps
#   fio --ioengine=external:build/deps/fio-libiscsi.so \
#       --filename='iscsi\://127.0.0.1\:3260/iqn...\:model/1' ...
#
# How fio 3.33 loads an external engine (ioengines.c, load_ioengine): with
# ioengine=external:PATH it dlopen()s PATH and takes the engine from the
# exported symbol "ioengine" (struct ioengine_ops, whose .version must equal
# the binary's FIO_IOOPS_VERSION). libiscsi.c exports that symbol when
# compiled with CONFIG_DYNAMIC_ENGINES (FIO_STATIC is then empty), and
# resolves fio's own functions (log_err, register_ioengine) from the fio
# binary, which exports them. The engine reads fio's structs, so it is built
# from Debian's source package of exactly the installed fio version,
# configured like Debian's build, plus --enable-libiscsi --dynamic-libengines.
#
# The source is unpacked under DIR/fio-src and never committed. Idempotent: a
# second run sees DIR/fio-libiscsi.so built for this fio version and returns.
# Needs deb-src entries (scripts/setup.sh adds them), dpkg-dev, libiscsi-dev.
# Prints the engine's path on stdout; every failure prints one line.
set -euo pipefail

top=$(cd "$(dirname "$0")/../.." && pwd)
prog=build-libiscsi-engine
die() { echo "$prog: error: $*" >&2; exit 1; }
deps="$top/build/deps"
while [ $# -gt 0 ]; do
  case "$1" in
    --deps) deps=${2:?--deps needs a value}; shift 2 ;;
    -h|--help) awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; exit 0 ;;
    *) die "unknown option '$1' (see $0 --help)" ;;
  esac
done

command -v fio >/dev/null || die "fio not found: run scripts/setup.sh (Debian package fio)"
fio_version=$(dpkg-query -W -f='${Version}' fio 2>/dev/null) || die "fio is not a Debian package here; cannot match its source"
engine="$deps/fio-libiscsi.so"
stamp="$deps/fio-libiscsi.version"
if [ -f "$engine" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$fio_version" ]; then
  echo "$engine"; exit 0
fi

command -v dpkg-source >/dev/null || die "dpkg-source not found: run scripts/setup.sh (Debian package dpkg-dev)"
pkg-config --exists libiscsi || die "libiscsi development files not found: run scripts/setup.sh (libiscsi-dev)"
for tool in make cc; do
  command -v "$tool" >/dev/null || die "$tool not found: run scripts/setup.sh (build-essential)"
done

mkdir -p "$deps"
src="$deps/fio-src" fetch="$deps/fio-fetch"
if [ ! -f "$src/.blkps-version" ] || [ "$(cat "$src/.blkps-version")" != "$fio_version" ]; then
  echo "$prog: fetching fio $fio_version source package" >&2
  rm -rf "$src" "$fetch"
  mkdir -p "$fetch"
  (cd "$fetch" && apt-get source -qq --download-only "fio=$fio_version" >/dev/null 2>&1) \
    || die "could not fetch fio $fio_version's source package (no deb-src entry? run scripts/setup.sh)"
  (cd "$fetch" && dpkg-source -q --no-check -x ./*.dsc fio >/dev/null 2>&1) \
    || die "could not unpack fio's source package in $fetch"
  mv "$fetch/fio" "$src"
  rm -rf "$fetch"
  [ -f "$src/engines/libiscsi.c" ] || die "fio's source has no engines/libiscsi.c"
  echo "$fio_version" > "$src/.blkps-version"
fi

echo "$prog: configuring and building fio's libiscsi engine" >&2
log="$deps/fio-libiscsi.build.log"
(
  cd "$src"
  # Debian's configure line (debian/rules) without the GUI, plus the engine.
  ./configure --disable-native --prefix=/usr --enable-libiscsi --dynamic-libengines
  grep -q '^CONFIG_LIBISCSI=y' config-host.mak || { echo "configure did not enable libiscsi"; exit 1; }
  make -j2 engines/fio-libiscsi.so
) > "$log" 2>&1 || die "building the engine failed; see $log"
install -m 755 "$src/engines/fio-libiscsi.so" "$engine"

# The engine must load into the installed fio and name itself libiscsi.
fio --enghelp="$engine" 2>&1 | grep -q '^initiator' \
  || { rm -f "$engine"; die "the built engine does not load into $(command -v fio): $(fio --enghelp="$engine" 2>&1 | head -n 1)"; }
echo "$fio_version" > "$stamp"
echo "$engine"
