#!/usr/bin/env bash
# peers.sh - dask-jobqueue's and dask-mpi's own test suites, as their wheels ship them,
# run against hpcsched through tests/peers/ (the import line a user changes, and the
# fixtures their repositories' top-level conftest.py gives them). Each test hpcsched fails
# on purpose is listed with its reason in tests/peers/differences.py (strict expected
# failures: a listed test that passes fails too), and the list is printed; any other
# failure fails this step.
#
# The peers are hpcsched's extra "peers" of pyproject.toml (pinned), installed into the
# interpreter's environment (PYTHON=..., default python3): ci/test-all.sh runs this step
# last, in its own virtual environment, since the peers bring dask.distributed, which the
# main suite runs without. Needs the batch systems ci/test-all.sh starts (SLURM, Grid
# Engine, the Torque wrappers for PBS); LSF runs on the emulator of tests/jobqueue/emulators/.
# PEERS_BATCH_SYSTEMS="slurm sge pbs lsf" chooses them.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
$PY -m pip install --quiet --disable-pip-version-check -e '.[mpi,test,peers]' || exit 1
# the peers' tests call mpirun by name: this interpreter's scripts first
scripts=$($PY -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
export PATH="$scripts:$PATH"
# a task no rank can run fails after this long in MPI mode (scheduler.no-workers-timeout):
# dask-mpi's test of a world of one pins a task to rank 2 and expects the script to fail
export HPCSCHED_SCHEDULER__NO_WORKERS_TIMEOUT=${HPCSCHED_SCHEDULER__NO_WORKERS_TIMEOUT:-10}

rc=0
run() {  # run LABEL PYTEST-ARGS...
    local label=$1; shift
    echo "== peers: $label"
    local t0=$SECONDS
    $PY -m pytest -p tests.peers.plugin -p no:cacheprovider -q -rfE --timeout 300 \
        -o asyncio_default_fixture_loop_scope=function --continue-on-collection-errors "$@"
    local r=$?
    echo "== peers: $label: exit $r after $((SECONDS - t0)) s"
    [ "$r" = 0 ] || rc=1
}
run "dask-jobqueue 0.9.0, no batch system" --pyargs dask_jobqueue.tests
for system in ${PEERS_BATCH_SYSTEMS:-slurm sge pbs lsf}; do
    run "dask-jobqueue 0.9.0, -E $system" -E "$system" -m env --pyargs dask_jobqueue.tests
done
run "dask-mpi 2026.3.0" --pyargs dask_mpi.tests
exit "$rc"
