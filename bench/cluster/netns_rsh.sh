#!/bin/sh
# mpirun's remote-shell agent on a cluster of network namespaces
# (bench/cluster/): mpirun runs it as "netns_rsh.sh HOST COMMAND" to start
# its daemon on HOST; this runs COMMAND in HOST's namespace instead of over
# ssh. BLKPS_CLUSTER_HOSTS names a file of lines "ADDRESS NETNS".
set -eu
host=$1
shift
ns=$(awk -v h="$host" '$1 == h { print $2 }' "${BLKPS_CLUSTER_HOSTS:?set by bench/cluster/run.py}")
[ -n "$ns" ] || { echo "netns_rsh: $host is not a host of $BLKPS_CLUSTER_HOSTS" >&2; exit 1; }
exec ip netns exec "$ns" sh -c "$*"
