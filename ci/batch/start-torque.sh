#!/usr/bin/env bash
# start-torque.sh - Torque-style qsub/qstat/qdel over the local SLURM, from Debian's
# slurm-wlm-torque (SchedMD's Perl wrappers), installed in a prefix of their own so
# that they never shadow Grid Engine's /usr/bin/qsub. Prints the directory to put first
# on PATH (only for the tests that want PBS commands).
# Needs root, Debian 12, and SLURM running (ci/batch/start-slurm.sh). Idempotent.
# Env knobs: BATCH_STATE_DIR (default /var/tmp/hpcsched-batch).
set -euo pipefail

LAB=${BATCH_STATE_DIR:-/var/tmp/hpcsched-batch}
D=$LAB/torque
PREFIX=$D/root
BIN=$PREFIX/usr/bin

die() { echo "start-torque: ERROR: $*" >&2; exit 1; }
log() { echo "start-torque: $*" >&2; }

[ "$(id -u)" = 0 ] || die "needs root (apt-get)"
command -v sbatch >/dev/null || die "SLURM is not installed: run ci/batch/start-slurm.sh first"
mkdir -p "$D/log"

perl_ok() { perl -e 'use Slurm; use Slurmdb; use Switch;' >/dev/null 2>&1; }
if ! perl_ok; then
    log "installing the wrappers' Perl modules (libslurm-perl libslurmdb-perl libswitch-perl)"
    apt-get install -y -qq libslurm-perl libslurmdb-perl libswitch-perl >"$D/log/apt.log" 2>&1 || {
        apt-get update -qq >>"$D/log/apt.log" 2>&1
        apt-get install -y -qq libslurm-perl libslurmdb-perl libswitch-perl >>"$D/log/apt.log" 2>&1 \
            || { tail -n 30 "$D/log/apt.log" >&2; die "apt-get install of the Perl modules failed"; }
    }
fi

if [ ! -x "$BIN/qsub" ]; then
    log "unpacking slurm-wlm-torque into $PREFIX (dpkg -x: not installed system-wide)"
    rm -rf "$D/deb" && mkdir -p "$D/deb"
    (cd "$D/deb" && apt-get download slurm-wlm-torque >"$D/log/download.log" 2>&1) || {
        apt-get update -qq >>"$D/log/download.log" 2>&1
        (cd "$D/deb" && apt-get download slurm-wlm-torque >>"$D/log/download.log" 2>&1) \
            || { tail -n 20 "$D/log/download.log" >&2; die "apt-get download slurm-wlm-torque failed"; }
    }
    dpkg -x "$D"/deb/slurm-wlm-torque_*.deb "$PREFIX"
fi
# the wrappers run SLURM's commands from their own directory
for c in sbatch scancel squeue scontrol srun sinfo; do
    [ -e "$BIN/$c" ] || ln -s "$(command -v "$c")" "$BIN/$c"
done
for c in qsub qstat qdel; do
    [ -x "$BIN/$c" ] || die "$BIN/$c missing after unpacking"
done
# smoke: the wrapper's qstat answers
PATH="$BIN:$PATH" qstat >/dev/null 2>"$D/log/qstat.err" \
    || { cat "$D/log/qstat.err" >&2; die "$BIN/qstat does not answer"; }
log "OK: Torque wrappers in $BIN"
echo "$BIN"
