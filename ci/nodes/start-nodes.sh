#!/usr/bin/env bash
# start-nodes.sh - a cluster in a box: N compute "nodes", each a Linux network namespace
# (hsn1..hsnN) with its own address 10.77.0.1<i> on eth0, joined by the bridge hsbr0 whose
# side in this host's own namespace -- the "login node" -- is 10.77.0.1. The login side also
# gets a second network the nodes cannot reach (a bridge of its own, hsbr1, 10.78.0.1), so
# that a scheduler naming the wrong interface fails as it would on a real cluster.
# Processes in a node share this host's PID space and file system (a shared file system, as
# on a cluster); abstract Unix sockets are per namespace (no doorbells between nodes).
#
#   bash ci/nodes/start-nodes.sh 3            # idempotent; root only
#   bash ci/nodes/on-node.sh 2 hostname       # runs in hsn2 with the hostname node2
#   bash ci/nodes/stop-nodes.sh               # kills what runs in the nodes, removes them
#
# Only these addresses are used: 10.77.0.0/24 and 10.78.0.0/24, made and removed here.
set -euo pipefail
N=${1:-3}
die() { echo "start-nodes: ERROR: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (network namespaces)"
command -v ip >/dev/null || die "the ip command (iproute2) is missing"
command -v unshare >/dev/null || die "unshare (util-linux) is missing"

if ! ip link show hsbr0 >/dev/null 2>&1; then
    ip link add hsbr0 type bridge
    ip addr add 10.77.0.1/24 dev hsbr0
fi
ip link set hsbr0 up
if ! ip link show hsbr1 >/dev/null 2>&1; then  # no port: nothing else is on it
    ip link add hsbr1 type bridge
    ip addr add 10.78.0.1/24 dev hsbr1
fi
ip link set hsbr1 up
for i in $(seq 1 "$N"); do
    ns=hsn$i
    if ! ip netns list | grep -qw "$ns"; then
        ip netns add "$ns"
        ip link add "hsv$i" type veth peer name eth0 netns "$ns"
        ip netns exec "$ns" ip addr add "10.77.0.1$i/24" dev eth0
    fi
    ip link set "hsv$i" master hsbr0 up
    ip netns exec "$ns" ip link set eth0 up
    ip netns exec "$ns" ip link set lo up
    ip netns exec "$ns" ip route get 10.77.0.1 >/dev/null 2>&1 \
        || die "node $i (10.77.0.1$i) has no route to the login side 10.77.0.1"
done
echo "start-nodes: $N nodes up (10.77.0.11..10.77.0.1$N, hostnames node1..node$N);" \
     "login side 10.77.0.1 on hsbr0, unreachable from the nodes: 10.78.0.1 on hsbr1"
