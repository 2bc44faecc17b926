#!/usr/bin/env bash
# on-node.sh I CMD... - run CMD on node I of start-nodes.sh: in its network namespace hsnI,
# with the hostname nodeI (a UTS namespace of its own). The command replaces this shell, so
# its PID is the one a caller started (a signal to it reaches CMD).
set -eu
i=$1; shift
exec ip netns exec "hsn$i" unshare --uts sh -c 'hostname "$0"; exec "$@"' "node$i" "$@"
