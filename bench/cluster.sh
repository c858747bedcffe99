#!/usr/bin/env bash
# The cluster benchmark: blkps against MPI_Allreduce and PyTorch DDP on H
# hosts made on this machine (network namespaces on a bridge, links shaped
# with tc). Installs what it needs (scripts/setup.sh --bench), builds what it
# runs, then runs bench/cluster/run.py, which leaves no namespace, qdisc or
# process behind, Ctrl-C included.
#
# Usage: sudo bench/cluster.sh --out DIR [--quick] [--hosts 2,4]
#          [--params 25000000,100000000] [--link 1gbit] [--servers K] ...
#        sudo bench/cluster.sh --out DIR --table ROWS:WIDTH [--table-memory 64M]
#          [--servers K] [--hosts L]   (a table over shards: doc/embeddings.md)
#        sudo bench/cluster.sh --out DIR --table hash:CAPACITY:WIDTH [--table-ids N]
#          [--servers K] [--hosts L]   (a hashed table over server hosts)
#   (all options: bench/cluster/run.py --help)
# Writes DIR/cluster.md, DIR/cluster.json, DIR/cluster.png and DIR/raw/.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck disable=SC1091  # bench/lib.sh
. "$top/bench/lib.sh"
need_root cluster "network namespaces, tgtd"
"$top/scripts/setup.sh" --quiet --bench
"$top/scripts/build.sh" bs_blkps blkps blkps-layout blkps-bsopts
exec /usr/bin/python3 "$top/bench/cluster/run.py" "$@"
