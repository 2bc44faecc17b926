#!/usr/bin/env bash
# stop-oar.sh - stop what start-oar.sh started: the OAR server (Almighty and the processes
# it forks, which rename themselves "Almighty: ...") and the oar user's sshd (port 6667).
# PostgreSQL and the oar database are left as they are: the database keeps the resources
# start-oar.sh defined, for the next start.
set -uo pipefail
log() { echo "stop-oar: $*"; }
live() { pgrep -f "Almighty" | while read -r p; do
    st=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | cut -d' ' -f1)
    [ -n "$st" ] && [ "$st" != Z ] && echo "$p"; done; }
if [ -n "$(live)" ]; then
    /etc/init.d/oar-server stop >/dev/null 2>&1 || true
    pkill -TERM -f "Almighty" 2>/dev/null
    for _ in $(seq 1 100); do [ -z "$(live)" ] && break; sleep 0.1; done
    if [ -n "$(live)" ]; then log "the OAR server ignored SIGTERM for 10 s: SIGKILL"; pkill -KILL -f "Almighty"; fi
    log "stopped the OAR server"
fi
if pkill -TERM -f "sshd -f /etc/oar/sshd_config"; then
    log "stopped the oar user's sshd"
fi
exit 0
