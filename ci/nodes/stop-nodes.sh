#!/usr/bin/env bash
# stop-nodes.sh - end every process running in the nodes of start-nodes.sh (by their PIDs:
# `ip netns pids`), then remove the namespaces and the two bridges.
set -uo pipefail
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^hsn[0-9]+$'); do
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
    ip netns del "$ns"
done
for link in hsbr0 hsbr1; do
    ip link show "$link" >/dev/null 2>&1 && ip link del "$link"
done
echo "stop-nodes: removed"
