#!/usr/bin/env bash
# Prometheus's own graph of a training job, for README's "Watching a job"
# (doc/monitoring.md): a target with --metrics, two digits learners
# (learner/examples/train_digits.py) training for --seconds, Debian's
# prometheus scraping every second (with packaging/monitoring/blkps.rules.yml
# loaded), then headless Chromium (Debian's chromium) photographs the graph
# page of the job's updates per second and each learner's iterations per
# second over 10 s windows (the rules' 1-minute rates would ramp up over a
# run's first minute).
# Writes --out (default bench/results/monitoring/graph.png). The picture's
# rates are the machine's: take it on a quiet one and say which.
#
# Usage: sudo bench/monitoring-graph.sh [--seconds S] [--out FILE.png] [--build DIR]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck disable=SC1091  # bench/lib.sh
. "$top/bench/lib.sh"
seconds=60 out="$top/bench/results/monitoring/graph.png" build=$(default_build)
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    *) echo "monitoring-graph: unknown option '$1' (see the usage at the top of $0)" >&2; exit 2 ;;
  esac
done
need_root monitoring-graph "tgtd"
need_built monitoring-graph "$build/target-plugin/bs_blkps.so" "$build/learner/libblkps.so"
for program in prometheus chromium; do
  command -v "$program" >/dev/null ||
    { echo "monitoring-graph: $program not found: apt-get install $program (Debian 12)" >&2; exit 1; }
done
export BLKPS_LIB="$build/learner/libblkps.so"
py=/usr/bin/python3 blkps="$top/scripts/blkps" train="$top/learner/examples/train_digits.py"
state=$(mktemp -d /tmp/blkps-monitoring-graph-XXXXXX)
pids=()
cleanup() {
  local status=$?
  set +e
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  wait
  "$blkps" target stop --dir "$state/ps" >/dev/null
  rm -rf "$state"
  exit "$status"
}
trap cleanup EXIT
free_port() { "$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
metrics_port=$(free_port) prometheus_port=$(free_port)

params=$("$py" "$train" --params)
"$blkps" target start --dir "$state/ps" --plugin "$build/target-plugin/bs_blkps.so" --owner-pid $$ --luns 2 \
  --bsopts "params=$params;lr=0.2;init=normal:0.1;seed=1;mode=async" --metrics "127.0.0.1:$metrics_port" >/dev/null
cat >"$state/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: ["$top/packaging/monitoring/blkps.rules.yml"]
scrape_configs:
  - job_name: blkps
    static_configs:
      - targets: ["127.0.0.1:$metrics_port"]
EOF
prometheus --config.file="$state/prometheus.yml" --storage.tsdb.path="$state/data" \
  --web.listen-address="127.0.0.1:$prometheus_port" >"$state/prometheus.log" 2>&1 &
pids+=($!)
read -r url0 url1 <<<"$("$blkps" target show --dir "$state/ps" --get URLS)"
"$py" "$train" --target "$url0" --learner 0 --learners 2 --epochs 1000000 >/dev/null &
pids+=($!)
"$py" "$train" --target "$url1" --learner 1 --learners 2 --epochs 1000000 >/dev/null &
pids+=($!)
echo "monitoring-graph: training for $seconds s (load $(cut -d' ' -f1 /proc/loadavg))"
sleep "$seconds"

# The graph page: two panels, the last --seconds, lines only.
range="${seconds}s"
page="http://127.0.0.1:$prometheus_port/graph?g0.expr=sum+by%28job%29%28rate%28blkps_updates_total%5B10s%5D%29%29&g0.tab=0"
page+="&g0.range_input=$range&g1.expr=deriv%28blkps_learner_iteration%5B10s%5D%29&g1.tab=0&g1.range_input=$range"
mkdir -p "$(dirname "$out")"
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1100,1640 \
  --virtual-time-budget=15000 --screenshot="$out" "$page" >"$state/chromium.log" 2>&1 ||
  { echo "monitoring-graph: chromium failed; its log:" >&2; cat "$state/chromium.log" >&2; exit 1; }
echo "monitoring-graph: wrote $out (load $(cut -d' ' -f1 /proc/loadavg))"
