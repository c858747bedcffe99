#!/usr/bin/env bash
# blkps beside peer-to-peer exchanges of the same model on loopback: for N
# processes, the time of one model exchange (median over processes and timed
# iterations, after warm-up, back to back):
#   mpi        OpenMPI MPI_Allreduce (sum, in place), default transports
#              (shared memory between processes on one host)
#   mpi-tcp    the same over TCP loopback only (--mca btl self,tcp)
#   gloo       torch.distributed all_reduce, gloo backend (TCP loopback)
#   blkps      N learners, each pushing a gradient for the whole model and
#              pulling the whole model through one blkps target (libblkps
#              over iSCSI/TCP loopback), mode async and mode bsp
# and CPU seconds per exchange (per process; for blkps also tgtd's, and
# where tgtd's time goes: perf samples of tgtd during blkps async at the
# largest N, where perf is installed).
# Writes DIR/peers.md (tables; ratio = peer time / blkps time, so > 1 means
# blkps is faster), DIR/peers.json and DIR/raw/peers-*.
#
# Usage: sudo bench/peers.sh --out DIR [--params N] [--procs 2,4]
#                            [--iterations I] [--build DIR]
#   --params N      float32 parameters exchanged (default 25000000)
#   --build DIR     cmake build folder with bs_blkps.so and libblkps.so
#                   (default: build/cmake, or $BLKPS_BUILD); mpi_allreduce is
#                   compiled into DIR/bench-peers/
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
py=/usr/bin/python3
# shellcheck disable=SC1091  # bench/lib.sh
. "$top/bench/lib.sh"
out="" params=25000000 procs="2,4" iterations=10 warmup=2 build=$(default_build)
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=${2:?--out needs a folder}; shift 2 ;;
    --params) params=${2:?--params needs a number}; shift 2 ;;
    --procs) procs=${2:?--procs needs a list such as 2,4}; shift 2 ;;
    --iterations) iterations=${2:?--iterations needs a number}; shift 2 ;;
    --build) build=${2:?--build needs a folder}; shift 2 ;;
    -h|--help) awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; exit 0 ;;
    *) echo "peers: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || { echo "peers: --out DIR is required" >&2; exit 2; }
case "$params" in ''|*[!0-9]*) echo "peers: --params: expected a positive integer, got '$params'" >&2; exit 2 ;; esac
[ "$params" -ge 128 ] || { echo "peers: --params: at least 128, got $params" >&2; exit 2; }
params=$((params / 128 * 128))  # whole 512-byte blocks: every push covers whole blocks
case "$iterations" in ''|*[!0-9]*|0) echo "peers: --iterations: expected a positive integer, got '$iterations'" >&2; exit 2 ;; esac
IFS=, read -r -a proc_list <<<"$procs"
for n in "${proc_list[@]}"; do
  case "$n" in ''|*[!0-9]*|0|1) echo "peers: --procs: expected counts >= 2 such as 2,4, got '$procs'" >&2; exit 2 ;; esac
done
plugin="$build/target-plugin/bs_blkps.so"
export BLKPS_LIB="$build/learner/libblkps.so"
need_built peers "$plugin" "$BLKPS_LIB"

mkdir -p "$out/raw"
out=$(cd "$out" && pwd)
rm -f "$out"/raw/peers-*
state=$(mktemp -d /tmp/blkps-peers-XXXXXX)
stop_target() { "$top/scripts/blkps" target stop --dir "$state"; }
pids=() profiler=""
# On any exit: end the processes this script started that still run, then
# the target.
cleanup() {
  local p
  for p in $profiler "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  stop_target 2>/dev/null || true
  rm -rf "$state"
}
trap cleanup EXIT
begin=$SECONDS
note() { echo "peers: $* ($((SECONDS - begin)) s elapsed)"; }

mpi_bin=""
if command -v mpicc >/dev/null && command -v mpirun >/dev/null; then
  mkdir -p "$build/bench-peers"
  mpicc -O2 -o "$build/bench-peers/mpi_allreduce" "$top/bench/peers/mpi_allreduce.c"
  mpi_bin="$build/bench-peers/mpi_allreduce"
else
  echo "peers: no mpicc/mpirun (OpenMPI): skipping MPI (scripts/setup.sh --bench installs it)" >&2
fi
have_torch=0
"$py" -c "import torch.distributed" 2>/dev/null && have_torch=1
[ "$have_torch" = 1 ] || echo "peers: no python3-torch: skipping gloo (scripts/setup.sh --bench installs it)" >&2
free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# utime + stime of a process, in clock ticks
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

for n in "${proc_list[@]}"; do
  if [ -n "$mpi_bin" ]; then
    mpirun --allow-run-as-root --oversubscribe -np "$n" "$mpi_bin" "$params" "$iterations" "$warmup" \
      >"$out/raw/peers-mpi-$n.json" 2>"$out/raw/peers-mpi-$n.err" ||
      { echo "peers: mpirun failed: $(tail -3 "$out/raw/peers-mpi-$n.err")" >&2; exit 1; }
    note "mpi N=$n done"
    mpirun --allow-run-as-root --oversubscribe --mca pml ob1 --mca btl self,tcp -np "$n" "$mpi_bin" \
      "$params" "$iterations" "$warmup" >"$out/raw/peers-mpi-tcp-$n.json" 2>"$out/raw/peers-mpi-tcp-$n.err" ||
      { echo "peers: mpirun (tcp) failed: $(tail -3 "$out/raw/peers-mpi-tcp-$n.err")" >&2; exit 1; }
    sed -i 's/"peer": "mpi"/"peer": "mpi-tcp"/' "$out/raw/peers-mpi-tcp-$n.json"
    note "mpi-tcp N=$n done"
  fi
  if [ "$have_torch" = 1 ]; then
    init="tcp://127.0.0.1:$(free_port)"
    pids=()
    for ((r = 0; r < n; r++)); do
      "$py" "$top/bench/peers/gloo_allreduce.py" --rank "$r" --world "$n" --init "$init" --params "$params" \
        --iterations "$iterations" --warmup "$warmup" --result "$out/raw/peers-gloo-$n.$r.json" \
        2>"$out/raw/peers-gloo-$n.$r.err" &
      pids+=($!)
    done
    for p in "${pids[@]}"; do
      wait "$p" || { echo "peers: gloo failed: $(tail -3 "$out/raw/peers-gloo-$n".*.err)" >&2; exit 1; }
    done
    pids=()
    note "gloo N=$n done"
  fi
  for mode in async bsp; do
    "$top/scripts/blkps" target start --dir "$state" --plugin "$plugin" --luns "$n" \
      --bsopts "params=$params;rule=sgd;lr=1e-6;mode=$mode" --owner-pid $$ >/dev/null
    read -r -a urls <<<"$("$top/scripts/blkps" target show --dir "$state" --get URLS)"
    start_at=$("$py" -c "import time; print(time.time() + 1.0 + 0.3 * $n)")
    pids=()
    for ((k = 0; k < n; k++)); do
      "$py" "$top/bench/peers/blkps_exchange.py" --target "${urls[$k]}" --params "$params" \
        --iterations "$iterations" --warmup "$warmup" --start-at "$start_at" \
        --result "$out/raw/peers-blkps-$mode-$n.$k.json" 2>"$out/raw/peers-blkps-$mode-$n.$k.err" &
      pids+=($!)
    done
    # tgtd's CPU over the whole run (warm-up included), scaled in the report;
    # and where it goes (perf, sampled), for async at the largest N
    before=$(cpu_ticks "$PID")
    profiler=""
    if [ "$mode" = async ] && [ "$n" = "${proc_list[-1]}" ] && command -v perf >/dev/null; then
      perf record -F 499 -p "$PID" -o "$state/perf.data" >/dev/null 2>&1 &
      profiler=$!
    fi
    failed=0
    for p in "${pids[@]}"; do wait "$p" || failed=1; done
    after=$(cpu_ticks "$PID")
    pids=()
    if [ -n "$profiler" ]; then
      kill -INT "$profiler" 2>/dev/null || true
      wait "$profiler" || true
      profiler=""
      perf report -i "$state/perf.data" --no-children --sort dso,sym --stdio 2>/dev/null |
        grep "%" >"$out/raw/peers-tgtd-perf-$n.txt" || true
    fi
    stop_target
    [ "$failed" = 0 ] || { echo "peers: a blkps learner failed: $(cat "$out/raw/peers-blkps-$mode-$n".*.err)" >&2; exit 1; }
    echo "{\"tgtd_cpu\": $(awk -v t=$((after - before)) -v hz="$(getconf CLK_TCK)" 'BEGIN {print t / hz}'), \"exchanges\": $(((iterations + warmup) * n))}" \
      >"$out/raw/peers-blkps-$mode-$n.tgtd.json"
    note "blkps $mode N=$n done"
  done
done

"$py" "$top/bench/report.py" peers --raw "$out/raw" --out "$out" --params "$params"
echo "peers: wrote $out/peers.md ($((SECONDS - begin)) s)"
