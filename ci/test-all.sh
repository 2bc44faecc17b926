#!/usr/bin/env bash
# test-all.sh - install hpcsched with its test dependencies, start the batch
# systems the tests use (SLURM and Grid Engine on localhost, when run as root
# on Debian), Debian's Open MPI beside the mpich wheel (root on Debian) and three
# emulated compute nodes (network namespaces, ci/nodes/, as root on Linux), check the code
# (ruff, mypy, the documentation site with warnings as errors, the sdist and the wheel in
# a clean virtual environment), run the whole test suite, then dask-jobqueue's and dask-mpi's
# own suites against hpcsched (ci/peers.sh), and stop the daemons and remove the nodes it
# started.
#
# This is the README Quickstart's last command; .ci/run runs it as the Quickstart does, in
# a fresh virtual environment (run with another interpreter: PYTHON=... bash ci/test-all.sh).
# A failed check fails the run (the tests still run, to report everything at once).
# A pytest run that collects nothing (exit 5) counts as a failure.
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
echo "== installing hpcsched[mpi,test,lint,docs]"
$PY -m pip install --quiet --disable-pip-version-check -e '.[mpi,test,lint,docs]' || exit 1
# the Snakemake executor plugin kept in this repository (a package of its own); not
# editable, so that Snakemake's plugin registry finds it among the installed packages
$PY -m pip install --quiet --disable-pip-version-check --no-deps \
    ./plugins/snakemake-executor-plugin-hpcsched || exit 1
# the mpich wheel's mpiexec lives beside this interpreter's scripts (pyenv shims may not
# know it yet): put that directory first, and make the MPI tests fail rather than skip
scripts=$($PY -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
export PATH="$scripts:$PATH"
command -v pyenv >/dev/null 2>&1 && pyenv rehash 2>/dev/null
export HPCSCHED_REQUIRE_MPI=1

started=()
nodes_made=0
slurm_nodes=0
cleanup() {
    for s in "${started[@]}"; do bash "ci/batch/stop-$s.sh" >/dev/null 2>&1 || true; done
    [ "$slurm_nodes" = 1 ] && bash ci/nodes/stop-slurm-nodes.sh >/dev/null 2>&1
    [ "$nodes_made" = 1 ] && bash ci/nodes/stop-nodes.sh >/dev/null 2>&1
    true
}
trap cleanup EXIT

require=()
if [ "$(id -u)" = 0 ] && [ -f /etc/debian_version ] && [ "${HPCSCHED_SKIP_BATCH:-0}" != 1 ]; then
    for s in slurm sge; do
        echo "== starting $s on localhost (ci/batch/start-$s.sh)"
        daemon=slurmctld; [ "$s" = sge ] && daemon=sge_qmaster
        was_running=0
        pgrep -x "$daemon" >/dev/null 2>&1 && was_running=1
        if bash "ci/batch/start-$s.sh"; then
            require+=("$s")
            [ "$was_running" = 0 ] && started+=("$s")
        else
            echo "!! could not start $s: its tests will fail" >&2
            require+=("$s")
        fi
    done
    # PBS commands from a second source: SchedMD's Torque wrappers over this SLURM, in a
    # prefix of their own (never on PATH but for the tests that ask for them)
    echo "== installing the Torque wrappers over SLURM (ci/batch/start-torque.sh)"
    bash ci/batch/start-torque.sh >/dev/null || echo "!! Torque wrappers missing: their tests will fail" >&2
    require+=(torque)
    # OAR (Debian's oar-server over PostgreSQL) with a user of its own: it refuses root's jobs
    echo "== starting OAR on localhost (ci/batch/start-oar.sh)"
    oar_was_running=0
    pgrep -f /usr/lib/oar/Almighty >/dev/null 2>&1 && oar_was_running=1
    if bash ci/batch/start-oar.sh >/dev/null; then
        [ "$oar_was_running" = 0 ] && started+=(oar)  # stopped at exit (ci/batch/stop-oar.sh)
    else
        echo "!! could not start OAR: its tests will fail" >&2
    fi
    require+=(oar)
else
    echo "== not root on Debian (or HPCSCHED_SKIP_BATCH=1): SLURM/SGE tests will be skipped"
fi
export HPCSCHED_REQUIRE_BATCH=$(IFS=,; echo "${require[*]:-}")

# a cluster in a box: compute nodes as network namespaces (ci/nodes/start-nodes.sh) for the
# tests across nodes; required (never skipped) when made here and under CI=true
if [ "$(id -u)" = 0 ] && [ "$(uname -s)" = Linux ] && [ "${HPCSCHED_SKIP_NODES:-0}" != 1 ]; then
    echo "== making 3 emulated nodes (ci/nodes/start-nodes.sh)"
    if ip link show hsbr0 >/dev/null 2>&1; then
        echo "== nodes already there: using them, leaving them"
    elif bash ci/nodes/start-nodes.sh 3; then
        nodes_made=1
    else
        echo "!! could not make the nodes: the tests across nodes will fail" >&2
    fi
    export HPCSCHED_REQUIRE_NODES=1
    # SLURM over the nodes (its own slurmctld, beside the localhost one), for SLURMCluster
    # jobs on three nodes; where the localhost SLURM runs (root on Debian)
    if [[ ",$HPCSCHED_REQUIRE_BATCH," == *,slurm,* ]]; then
        echo "== starting SLURM over the nodes (ci/nodes/start-slurm-nodes.sh)"
        nodes_ctld=${BATCH_STATE_DIR:-/var/tmp/hpcsched-batch}/slurm-nodes/slurmctld.pid
        if [ -s "$nodes_ctld" ] && kill -0 "$(cat "$nodes_ctld")" 2>/dev/null; then
            echo "   already running: using it, leaving it"
        else
            slurm_nodes=1  # stopped at exit by its pid files, also when half started
        fi
        bash ci/nodes/start-slurm-nodes.sh 3 \
            || echo "!! could not start SLURM over the nodes: its tests will fail" >&2
        export HPCSCHED_REQUIRE_BATCH="$HPCSCHED_REQUIRE_BATCH,slurm-nodes"
    fi
elif [ "${CI:-}" = true ] && [ "${HPCSCHED_SKIP_NODES:-0}" != 1 ]; then
    echo "!! CI=true but not root on Linux: the tests across nodes will fail" >&2
    export HPCSCHED_REQUIRE_NODES=1
else
    echo "== not root on Linux (or HPCSCHED_SKIP_NODES=1): tests across nodes will be skipped"
fi

# MPI mode under Debian's Open MPI as well as the mpich wheel: openmpi-bin and an mpi4py built
# against it, in a directory of its own (ci/mpi/install-openmpi.sh; the build is kept and reused)
if [ "$(id -u)" = 0 ] && [ -f /etc/debian_version ] && [ "${HPCSCHED_SKIP_OPENMPI:-0}" != 1 ]; then
    echo "== installing Open MPI and an mpi4py built against it (ci/mpi/install-openmpi.sh)"
    t0=$SECONDS
    if dir=$(PYTHON="$PY" bash ci/mpi/install-openmpi.sh); then
        export HPCSCHED_OPENMPI_MPI4PY=$dir
        echo "== Open MPI ready in $((SECONDS - t0)) s"
    else
        echo "!! could not install Open MPI: its tests will fail" >&2
    fi
    export HPCSCHED_REQUIRE_OPENMPI=1
else
    echo "== not root on Debian (or HPCSCHED_SKIP_OPENMPI=1): Open MPI tests will be skipped"
fi

# the dashboard's browser tests drive Debian's headless Chromium (tests/diagnostics/browser.py)
if [ "$(id -u)" = 0 ] && [ -f /etc/debian_version ] && [ "${HPCSCHED_SKIP_BROWSER:-0}" != 1 ]; then
    if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
        echo "== installing chromium and chromium-driver (apt-get)"
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -qq chromium chromium-driver >/dev/null; } \
            || echo "!! could not install chromium: the browser tests will fail" >&2
    fi
    export HPCSCHED_REQUIRE_BROWSER=1
else
    echo "== not root on Debian (or HPCSCHED_SKIP_BROWSER=1): browser tests will be skipped"
fi

# check NAME COMMAND...: run one check, say how long it took, remember a failure
failed=()
check() {
    local name=$1; shift
    echo "== $name"
    local t0=$SECONDS
    if "$@"; then
        echo "== $name: passed in $((SECONDS - t0)) s"
    else
        echo "!! $name FAILED (after $((SECONDS - t0)) s): fix the errors above; the run fails" >&2
        failed+=("$name")
    fi
}
check "ruff check (lint and the public API's docstrings)" $PY -m ruff check hpcsched tests docs
check "mypy hpcsched (types; settings in pyproject.toml)" $PY -m mypy hpcsched
rm -rf docs/_build
check "sphinx-build (the documentation site, warnings are errors)" \
    $PY -m sphinx -W --keep-going -q -b html docs docs/_build/html
check "the sdist and the wheel (ci/check-wheel.sh: twine check, a clean venv without MPI)" \
    env PYTHON="$PY" bash ci/check-wheel.sh

echo "== running the test suite"
t0=$SECONDS
$PY -m pytest -q -p no:cacheprovider "$@"
rc=$?
echo "== test suite: exit $rc after $((SECONDS - t0)) s"
if [ "$rc" = 5 ]; then
    echo "!! pytest collected no tests: failing" >&2
    rc=1
fi
# dask-jobqueue's and dask-mpi's own test suites against hpcsched, with the batch systems
# started above; last, since installing the peers brings dask.distributed into this venv
check "the peers' own test suites (ci/peers.sh; differences: tests/peers/differences.py)" \
    env PYTHON="$PY" bash ci/peers.sh
if [ "${#failed[@]}" -gt 0 ]; then
    echo "!! failed checks: $(IFS=';'; echo "${failed[*]}")" >&2
    [ "$rc" = 0 ] && rc=1
fi
exit "$rc"
