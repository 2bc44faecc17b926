#!/usr/bin/env bash
# start-oar.sh - install (if needed) and start a single-host OAR 2.5 (Debian 12's
# oar-server, oar-node, oar-user over PostgreSQL) without systemd: the database, the
# oar user's sshd (port 6667, how the server reaches its nodes), the Almighty server,
# one resource per core of this host (properties host, cpu, core, cpuset, memcore), and
# a user to submit with: OAR refuses jobs from root and oar. Then waits until a trivial
# job of that user has run. Idempotent. Needs root, Debian 12 and the package mirror.
# Env knobs: OAR_TEST_USER (default oartest), OAR_MEMCORE (MiB per core, default 2000),
#            OAR_WAIT_S (seconds for the smoke job, default 120).
set -euo pipefail

USER_NAME=${OAR_TEST_USER:-oartest}
MEMCORE=${OAR_MEMCORE:-2000}
WAIT=${OAR_WAIT_S:-120}
die() { echo "start-oar: ERROR: $*" >&2; exit 1; }
log() { echo "start-oar: $*" >&2; }

[ "$(id -u)" = 0 ] || die "needs root (apt-get, the database, the daemons)"
if ! command -v oarsub >/dev/null || ! command -v Almighty >/dev/null; then
    log "installing oar-server oar-node oar-user (PostgreSQL)"
    apt-get install -y -q --no-install-recommends oar-server oar-node oar-user >/tmp/start-oar-apt.log 2>&1 \
        || { tail -n 30 /tmp/start-oar-apt.log >&2; die "apt-get install failed"; }
fi

pg_lsclusters -h | grep -q online || pg_ctlcluster 15 main start
# the database's passwords: oar-database refuses to create users without them
sed -i 's/^DB_BASE_PASSWD=""/DB_BASE_PASSWD="oar-local"/; s/^DB_BASE_PASSWD_RO=""/DB_BASE_PASSWD_RO="oar-local-ro"/' /etc/oar/oar.conf
if ! su postgres -c "psql -lqt" | cut -d'|' -f1 | grep -qw oar; then
    log "creating the database"
    oar-database --create --db-is-local --db-admin-user root >/tmp/start-oar-db.log 2>&1 \
        || { tail -n 20 /tmp/start-oar-db.log >&2; die "oar-database --create failed"; }
fi

mkdir -p /run/sshd
pgrep -f "sshd -f /etc/oar/sshd_config" >/dev/null || /usr/sbin/sshd -f /etc/oar/sshd_config 2>/dev/null
pgrep -f /usr/lib/oar/Almighty >/dev/null || /etc/init.d/oar-server start >/dev/null
pgrep -f /usr/lib/oar/Almighty >/dev/null || die "the OAR server (Almighty) did not start"

# the list read whole first: `oarproperty -l | grep -q` under pipefail fails when grep
# stops reading at its match (SIGPIPE), and adding a property that exists is an error
props=$(oarproperty -l)
for prop in cpu core memcore; do grep -qx "$prop" <<<"$props" || oarproperty -a "$prop" >/dev/null; done
grep -qx host <<<"$props" || oarproperty -a host -c >/dev/null
have=$(oarnodes -l 2>/dev/null | grep -c . || true)
if [ "$have" = 0 ]; then
    for c in $(seq 0 $(( $(nproc) - 1 ))); do
        oarnodesetting -a -h localhost -p host=localhost -p cpu=0 -p core="$c" -p cpuset="$c" \
            -p memcore="$MEMCORE" >/dev/null
    done
fi

id "$USER_NAME" >/dev/null 2>&1 || useradd -m -s /bin/bash "$USER_NAME"
log "smoke job as $USER_NAME"
out=$(su "$USER_NAME" -c 'cd ~ && oarsub -l /nodes=1/core=1,walltime=0:2:0 "true"') || die "oarsub failed: $out"
id=$(echo "$out" | sed -n 's/^OAR_JOB_ID=//p')
[ -n "$id" ] || die "no job id in: $out"
for _ in $(seq "$WAIT"); do
    state=$(su "$USER_NAME" -c "oarstat -J -j $id" | python3 -c 'import json,sys; print(next(iter(json.load(sys.stdin).values()))["state"])')
    [ "$state" = Terminated ] && { log "OK: OAR ready; job $id ran; submit as $USER_NAME"; echo "$USER_NAME"; exit 0; }
    [ "$state" = Error ] && die "smoke job $id ended in Error"
    sleep 1
done
die "smoke job $id still $state after $WAIT s"
