#!/usr/bin/env bash
# peers.sh - dask-jobqueue's and dask-mpi's own test suites, as their wheels ship them,
# run against hpcsched through tests/peers/ (the import line a user changes, and the
# fixtures their repositories' top-level conftest.py gives them). Each test hpcsched fails
# on purpose is listed with its reason in tests/peers/differences.py (strict expected
# failures: a listed test that passes fails too); any other failure fails this step.
#
# In a virtual environment of its own (.venv-peers, made anew), since the peers bring
# dask.distributed, which the main suite runs without. Needs the batch systems that
# ci/test-all.sh starts (SLURM, Grid Engine, the Torque wrappers); the systems Debian does
# not have run on the emulators of tests/jobqueue/emulators/.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
JOBQUEUE=0.9.0        # dask-jobqueue's latest release
DASK_MPI=2026.3.0

rm -rf .venv-peers
$PY -m venv .venv-peers || exit 1
V=.venv-peers/bin
$V/python -m pip install --quiet --disable-pip-version-check -e '.[mpi,test]' \
    "dask-jobqueue==$JOBQUEUE" "dask-mpi==$DASK_MPI" pytest-asyncio || exit 1
# the peers' tests call mpirun and dask-mpi by name: the venv's first
export PATH="$PWD/$V:$PATH"

rc=0
run() {  # run LABEL PYTEST-ARGS...
    local label=$1; shift
    echo "== peers: $label"
    $V/python -m pytest -p tests.peers.plugin -p no:cacheprovider -q -rfE --timeout 300 \
        -o asyncio_default_fixture_loop_scope=function --continue-on-collection-errors "$@"
    local r=$?
    echo "== peers: $label: exit $r"
    [ "$r" = 0 ] || rc=1
}
run "dask-jobqueue $JOBQUEUE, no batch system" --pyargs dask_jobqueue.tests
for system in ${PEERS_BATCH_SYSTEMS:-slurm sge pbs lsf}; do
    run "dask-jobqueue $JOBQUEUE, -E $system" -E "$system" -m "env" --pyargs dask_jobqueue.tests
done
run "dask-mpi $DASK_MPI" --pyargs dask_mpi.tests
rm -rf .venv-peers
exit "$rc"
