#!/usr/bin/env bash
# What an installed blkps gives a user, checked from outside the tree.
#
#   install_test.sh <repo> <build dir> staged
#     cmake --install into a staging prefix; libblkps.so exports only the
#     public API; a C program copied out of the tree builds with pkg-config
#     and with find_package(blkps), and both copies push and pull a model on
#     a target that runs the staged plugin; `import blkps` from the staged
#     prefix opens that model too, and the staged `blkps status` reads it.
#     Then the same from a /usr/local-style prefix: `blkps status` and
#     `import blkps` (through the blkps.pth that Debian's python3 reads in
#     /usr/local/lib/python3.X/dist-packages) with neither PYTHONPATH nor
#     LD_LIBRARY_PATH: both find the package and libblkps from where they are.
#   install_test.sh <repo> <build dir> beside-itself
#     the command installed in a prefix that is not on PATH, run with
#     nothing set from outside the tree, starts and stops a target with the
#     programs and the plugin installed beside it.
#   install_test.sh <repo> <build dir> service
#     the blkps-server unit template blkps@.service, installed with the rest
#     into a root folder beside a copy of this host's units, passes
#     `systemd-analyze verify`; its ExecStart and ExecStop, run as systemd
#     would (instance, /etc/blkps/NAME.conf's variables), start a server,
#     stop it and start it again with the weights of its checkpoint.
#   install_test.sh <repo> <build dir> debs
#     cpack builds the learner-node and server .debs, with their files and
#     Debian dependencies.
#
# Needs root (tgtd) for "staged". Every temporary file and the target go away
# on exit, also on failure.
set -euo pipefail
top=$1 build=$2 part=$3
here="$top/tests/install"
fail() { echo "install_test: $*" >&2; exit 1; }

tmp=$(mktemp -d /tmp/blkps-install-test.XXXXXX)
cleanup() {
  [ ! -f "$tmp/state/target.env" ] || "$top/scripts/blkps" target stop --dir "$tmp/state" >/dev/null 2>&1 || true
  [ ! -f "$tmp/root/var/lib/blkps/svc/target.env" ] ||
    "$top/scripts/blkps" target stop --dir "$tmp/root/var/lib/blkps/svc" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT

# Asserts that `haystack` (a command's output) has a line matching `pattern`.
expect_line() {
  local what=$1 haystack=$2 pattern=$3
  grep -qE -- "$pattern" <<<"$haystack" || fail "$what: no line matching '$pattern' in:"$'\n'"$haystack"
}

staged() {
  local prefix="$tmp/stage/usr" params=3000
  cmake --install "$build" --prefix "$prefix" >/dev/null
  export PKG_CONFIG_PATH
  PKG_CONFIG_PATH=$(dirname "$(find "$prefix" -name blkps.pc)")
  local libdir
  libdir=$(pkg-config --variable=libdir blkps)

  # Of blkps's own functions and objects, only the C API and the classes of
  # include/blkps/ leave libblkps.so (the standard library's templates
  # instantiated on blkps types may: they are weak and self-contained).
  local leaked
  leaked=$(nm -DC --defined-only "$libdir/libblkps.so" |
           grep -E '^[0-9a-f]+ [A-Za-z] blkps::' |
           grep -vE ' blkps::(Model|Engine)::' || true)
  [ -z "$leaked" ] || fail "libblkps.so exports internals:"$'\n'"$leaked"

  # The program is built from a copy outside the tree, so that only the
  # staged prefix can supply blkps.h and libblkps.
  mkdir -p "$tmp/src"
  cp "$here/open_model.c" "$here/CMakeLists.txt" "$tmp/src/"
  # shellcheck disable=SC2046  # pkg-config's output is a list of words
  cc -std=c11 -Wall -Wextra -Werror -o "$tmp/open_model-pc" "$tmp/src/open_model.c" \
    $(pkg-config --cflags --libs blkps)
  cmake -S "$tmp/src" -B "$tmp/src/build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
  cmake --build "$tmp/src/build" >/dev/null

  "$top/scripts/blkps" target start --dir "$tmp/state" --owner-pid $$ \
    --plugin "$prefix/lib/tgt/backing-store/bs_blkps.so" \
    --bsopts "params=$params;rule=sgd;lr=1;mode=async" >/dev/null
  local url
  url=$("$top/scripts/blkps" target show --dir "$tmp/state" --get URL)

  # Each push of g (from zero weights, lr=1) is checked to give w = -g; the
  # Python step below pushes -g back to zero between the two programs.
  LD_LIBRARY_PATH=$libdir "$tmp/open_model-pc" "$url" "$params"
  local pythonpath
  pythonpath=$(find "$prefix" -type d -name dist-packages | head -n 1)
  (cd "$tmp" && env -u BLKPS_LIB -u LD_LIBRARY_PATH PYTHONPATH="$pythonpath" \
    /usr/bin/python3 - "$url" "$params" "$prefix" <<'EOF'
import os
import sys
import numpy as np
import blkps
url, n, prefix = sys.argv[1], int(sys.argv[2]), os.path.realpath(sys.argv[3])
if not blkps.__file__.startswith(prefix):
    sys.exit(f"install_test: imported {blkps.__file__}, not the staged package")
with blkps.Model(url) as model:
    with open("/proc/self/maps") as maps:
        loaded = {line.split()[-1] for line in maps if "libblkps" in line}
    if not loaded or not all(path.startswith(prefix) for path in loaded):
        sys.exit(f"install_test: Python loaded {loaded}, not the staged libblkps")
    g = (np.arange(n) % 5 + 1).astype(np.float32)
    w = model.pull(0, n)
    if not np.array_equal(w, -g):
        sys.exit("install_test: Python did not see the C program's push")
    model.push(0, -g)
    if np.any(model.pull(0, n)):
        sys.exit("install_test: Python's push did not bring the weights back to zero")
EOF
  )
  LD_LIBRARY_PATH=$libdir "$tmp/src/build/open_model" "$url" "$params"

  # The installed command reads the job's status through the installed
  # Python package and library.
  local control status
  control=$("$top/scripts/blkps" target show --dir "$tmp/state" --get CONTROL_URL)
  status=$(cd "$tmp" && env -u BLKPS_LIB -u PYTHONPATH -u LD_LIBRARY_PATH \
    "$prefix/bin/blkps" status --control "$control" --json)
  expect_line "staged blkps status" "$status" '"params": '"$params"

  # A /usr/local-style prefix: nothing set by hand.
  local local_prefix="$tmp/stage/usr/local" site
  cmake --install "$build" --prefix "$local_prefix" >/dev/null
  status=$(cd "$tmp" && env -u BLKPS_LIB -u PYTHONPATH -u LD_LIBRARY_PATH \
    "$local_prefix/bin/blkps" status --control "$control" --json)
  expect_line "blkps status installed in usr/local" "$status" '"params": '"$params"
  site=$(/usr/bin/python3 -c 'import sys; print("lib/python%d.%d/dist-packages" % sys.version_info[:2])')
  [ -f "$local_prefix/$site/blkps.pth" ] || fail "no blkps.pth in $local_prefix/$site"
  # site.addsitedir does for this folder what python3's start does for
  # /usr/local/lib/python3.X/dist-packages: it reads the .pth files there.
  (cd "$tmp" && env -u BLKPS_LIB -u PYTHONPATH -u LD_LIBRARY_PATH \
    /usr/bin/python3 - "$url" "$params" "$local_prefix" "$local_prefix/$site" <<'EOF'
import os
import site
import sys
url, n, prefix = sys.argv[1], int(sys.argv[2]), os.path.realpath(sys.argv[3])
site.addsitedir(sys.argv[4])
import blkps  # noqa: E402
if not os.path.realpath(blkps.__file__).startswith(prefix):
    sys.exit(f"install_test: imported {blkps.__file__}, not the package in {prefix}")
with blkps.Model(url) as model:
    with open("/proc/self/maps") as maps:
        loaded = {line.split()[-1] for line in maps if "libblkps" in line}
    if not loaded or not all(path.startswith(prefix) for path in loaded):
        sys.exit(f"install_test: Python loaded {loaded}, not libblkps of {prefix}")
    model.pull(0, n)
EOF
  )
}

# The installed command from a prefix that is not on PATH, run from outside
# the tree with nothing set: it finds its programs beside itself (bin/,
# the plugin under the prefix's lib/tgt/backing-store), not a build.
beside_itself() {
  local prefix="$tmp/opt/blkps" plain=/usr/sbin:/usr/bin:/sbin:/bin pid
  cmake --install "$build" --prefix "$prefix" >/dev/null
  prefix=$(realpath "$prefix")
  installed() { (cd "$tmp" && env -u BLKPS_LIB -u BLKPS_BUILD -u PYTHONPATH -u LD_LIBRARY_PATH PATH=$plain \
                   "$prefix/bin/blkps" "$@"); }
  installed target start --dir "$tmp/state" --owner-pid $$ --tgtd 1 --bsopts "params=3000;rule=sgd" >/dev/null ||
    fail "the installed blkps target start failed"
  pid=$(cat "$tmp/state/tgtd.pid")
  grep -q " $prefix/lib/tgt/backing-store/bs_blkps\.so$" "/proc/$pid/maps" ||
    fail "tgtd $pid did not load the plugin installed in $prefix"
  [ "$(installed layout bytes 1M)" = 1048576 ] || fail "the installed blkps layout did not run blkps-layout"
  installed target stop --dir "$tmp/state" || fail "the installed blkps target stop failed"
  ! running "$pid" || fail "tgtd $pid still runs after target stop"
}

# Whether process PID runs (a zombie, which nobody here may reap, does not).
running() { [ -e "/proc/$1" ] && ! grep -qE '^[^)]*\) [ZX]' "/proc/$1/stat"; }

service() {
  local root="$tmp/root" name=svc unit
  mkdir -p "$root/usr/lib/systemd" "$root/etc/blkps"
  cp -a /lib/systemd/system "$root/usr/lib/systemd/"  # what the unit's dependencies name
  cmake --install "$build" --prefix "$root/usr" >/dev/null
  unit="$root/usr/lib/systemd/system/blkps@.service"
  [ -f "$unit" ] || fail "no blkps@.service installed"
  # It exits 0 on a line it ignores (a bad value): any message fails.
  local verify
  if ! verify=$(systemd-analyze verify --man=no --root="$root" "blkps@$name.service" 2>&1) ||
     [ -n "$verify" ]; then
    fail "systemd-analyze verify blkps@$name.service: $verify"
  fi

  # The unit's commands as systemd runs them: %i is the instance, ${VAR} one
  # word of the EnvironmentFile, $VAR its words; paths moved into $root, and
  # the staged plugin in OPTIONS (the last --plugin wins).
  local state="$root/var/lib/blkps/$name" ckpt="$tmp/$name.ckpt"
  cat >"$root/etc/blkps/$name.conf" <<EOF
BSOPTS=params=3000;rule=sgd;lr=1;mode=async;checkpoint=$ckpt
OPTIONS=--luns 1 --plugin $root/usr/lib/tgt/backing-store/bs_blkps.so
EOF
  run_unit_line() {  # ExecStart|ExecStop
    /usr/bin/python3 - "$unit" "$1" "$name" "$root" <<'EOF'
import re, subprocess, sys
unit, key, instance, root = sys.argv[1:]
line = next(l.split("=", 1)[1] for l in open(unit).read().splitlines() if l.startswith(key + "="))
env = dict(l.split("=", 1) for l in open(f"{root}/etc/blkps/{instance}.conf").read().splitlines() if "=" in l)
words = []
for word in line.replace("%i", instance).split():
    if m := re.fullmatch(r"\$\{(\w+)\}", word):
        words.append(env[m[1]])
    elif m := re.fullmatch(r"\$(\w+)", word):
        words += env[m[1]].split()
    else:
        words.append(word.replace("/var/lib/", f"{root}/var/lib/"))
words[0] = f"{root}/usr/bin/{words[0]}"
sys.exit(subprocess.run(words).returncode)
EOF
  }
  export PATH="$root/usr/bin:$PATH"  # blkps-bsopts, as systemd finds it in /usr/bin
  mkdir -p "$state"                 # StateDirectory=
  run_unit_line ExecStart >/dev/null || fail "the unit's ExecStart failed"
  local url pid
  url=$("$top/scripts/blkps" target show --dir "$state" --get URL)
  pid=$(cat "$state/tgtd.pid") || fail "no PIDFile after ExecStart"
  running "$pid" || fail "tgtd of PIDFile $pid does not run"
  PYTHONPATH="$top/learner/python" BLKPS_LIB="$build/learner/libblkps.so" /usr/bin/python3 - "$url" <<'EOF'
import sys
import numpy as np
import blkps
with blkps.Model(sys.argv[1]) as model:
    model.push(0, -np.arange(3000, dtype=np.float32))  # lr=1 from zeros: w = arange
    model.sync()                                       # the checkpoint
EOF
  run_unit_line ExecStop || fail "the unit's ExecStop failed"
  ! running "$pid" || fail "tgtd $pid still runs after ExecStop"
  run_unit_line ExecStart >/dev/null || fail "the unit's ExecStart failed after a stop"
  url=$("$top/scripts/blkps" target show --dir "$state" --get URL)
  PYTHONPATH="$top/learner/python" BLKPS_LIB="$build/learner/libblkps.so" /usr/bin/python3 - "$url" <<'EOF'
import sys
import numpy as np
import blkps
with blkps.Model(sys.argv[1]) as model:
    if not np.array_equal(model.pull(0, 3000), np.arange(3000, dtype=np.float32)):
        sys.exit("install_test: the restarted server does not hold its checkpoint's weights")
EOF
  run_unit_line ExecStop || fail "the unit's ExecStop failed"
}

debs() {
  (cd "$build" && cpack -G DEB -B "$tmp/debs" >/dev/null)
  local learner server
  learner=$(find "$tmp/debs" -maxdepth 1 -name 'blkps_*.deb')
  server=$(find "$tmp/debs" -maxdepth 1 -name 'blkps-server_*.deb')
  if [ ! -f "$learner" ] || [ ! -f "$server" ]; then
    fail "cpack made no blkps and blkps-server .debs: $(ls "$tmp/debs")"
  fi

  local info files
  info=$(dpkg-deb -I "$learner")
  expect_line "blkps .deb" "$info" '^ Depends: .*libiscsi7'
  expect_line "blkps .deb" "$info" '^ Depends: .*libfuse3-3'
  expect_line "blkps .deb" "$info" '^ Depends: .*python3-numpy'
  expect_line "blkps .deb" "$info" '^ Depends: .*open-iscsi'
  files=$(dpkg-deb -c "$learner")
  expect_line "blkps .deb" "$files" '/usr/lib/.*libblkps\.so\.0 '
  expect_line "blkps .deb" "$files" '/usr/include/blkps/blkps\.h$'
  expect_line "blkps .deb" "$files" '/pkgconfig/blkps\.pc$'
  expect_line "blkps .deb" "$files" '/cmake/blkps/blkpsConfig\.cmake$'
  expect_line "blkps .deb" "$files" '/usr/lib/python3/dist-packages/blkps/__init__\.py$'
  expect_line "blkps .deb" "$files" '/usr/bin/blkps -> \.\./lib/blkps/blkps$'
  expect_line "blkps .deb" "$files" '/usr/lib/blkps/blkps$'
  expect_line "blkps .deb" "$files" '/usr/bin/blkps-mount$'
  expect_line "blkps .deb" "$files" '/usr/share/man/man1/blkps\.1$'
  expect_line "blkps .deb" "$files" '/usr/share/man/man1/blkps-mount\.1$'
  expect_line "blkps .deb" "$files" '/usr/lib/python3/dist-packages/blkps/_installed\.py$'
  if grep -q 'blkps\.pth' <<<"$files"; then  # /usr's python3 reads the package's folder itself
    fail "blkps .deb holds a blkps.pth:"$'\n'"$files"
  fi

  info=$(dpkg-deb -I "$server")
  expect_line "blkps-server .deb" "$info" '^ Depends: .*tgt \(>= '
  expect_line "blkps-server .deb" "$info" '^ Depends: .*blkps \(= '
  expect_line "blkps-server .deb" "$info" '^ Depends: .*libopenblas0-serial'
  files=$(dpkg-deb -c "$server")
  expect_line "blkps-server .deb" "$files" '/usr/lib/tgt/backing-store/bs_blkps\.so$'
  expect_line "blkps-server .deb" "$files" '/usr/bin/blkps-bsopts$'
  expect_line "blkps-server .deb" "$files" '/usr/lib/systemd/system/blkps@\.service$'
  expect_line "blkps-server .deb" "$files" '/usr/share/blkps/monitoring/blkps\.rules\.yml$'
  expect_line "blkps-server .deb" "$files" '/usr/share/blkps/monitoring/blkps-grafana\.json$'
  if grep -qE '/usr/bin/blkps(-mount|-layout)?$|libblkps' <<<"$files"; then
    fail "blkps-server .deb holds files of the blkps .deb:"$'\n'"$files"
  fi
}

case "$part" in
  staged) staged ;;
  beside-itself) beside_itself ;;
  service) service ;;
  debs) debs ;;
  *) fail "unknown part '$part' (staged, beside-itself, service, debs)" ;;
esac
echo "install_test: $part ok"
