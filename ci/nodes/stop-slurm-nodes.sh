#!/usr/bin/env bash
# stop-slurm-nodes.sh - cancel the jobs of the SLURM of start-slurm-nodes.sh and stop its
# daemons, by their pid files (munged, shared with the localhost SLURM, stays).
set -uo pipefail
B=${BATCH_STATE_DIR:-/var/tmp/hpcsched-batch}/slurm-nodes
export SLURM_CONF=$B/slurm.conf
if [ -s "$B/slurmctld.pid" ] && [ -f "$SLURM_CONF" ]; then
    ids=$(timeout 10 squeue -h -o %A 2>/dev/null | sort -u)
    [ -n "$ids" ] && timeout 10 scancel $ids 2>/dev/null
fi
for f in "$B"/slurmd-*.pid "$B"/slurmctld.pid; do
    [ -s "$f" ] || continue
    pid=$(cat "$f")
    kill "$pid" 2>/dev/null
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
    rm -f "$f"
done
echo "stop-slurm-nodes: stopped"
