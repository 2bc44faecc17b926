#!/usr/bin/env bash
# install-openmpi.sh - Debian's Open MPI (openmpi-bin, libopenmpi-dev) and an mpi4py built
# against it, for the tests that run hpcsched under Open MPI's mpirun
# (tests/hpc/test_mpi_openmpi.py). Prints the directory holding that mpi4py.
#
# The mpi4py is built from its sdist with Open MPI's compiler wrapper and installed with
# `pip install --target` into a directory of its own: the environment keeps the mpich wheel
# and the mpi4py the project installs, and only a process with that directory first on
# PYTHONPATH imports the Open MPI one. The build takes minutes, so the directory is kept
# (one per Python, Open MPI and mpi4py version) and reused by the next run.
# --no-cache-dir: pip would otherwise cache the wheel it built and hand it to a later
# `pip install --no-binary mpi4py mpi4py` made for another MPI. LDSHARED and LDFLAGS: Python's
# link command names its own library directory (-L) before the wrapper's, and where the mpich
# wheel is installed in that Python its libmpi.so is there: -lmpi would find MPICH's library.
# Open MPI's directories come first instead. CFLAGS likewise: the compile line names the
# environment's include directory (-I) before the wrapper's own, and the mpich wheel puts
# its mpi.h there: a module compiled against MPICH's header but linked with Open MPI's
# library fails at import (undefined symbol: MPI_UNWEIGHTED). Open MPI's headers come first.
#
# Needs root and Debian 12 (openmpi 4.1). Idempotent.
# Env knobs: BATCH_STATE_DIR (default /var/tmp/hpcsched-batch), PYTHON (the interpreter the
# tests run, default python3), MPI4PY_VERSION (default: the version that interpreter has,
# else the newest).
set -euo pipefail

LAB=${BATCH_STATE_DIR:-/var/tmp/hpcsched-batch}
D=$LAB/openmpi
PY=${PYTHON:-python3}
MPICC=/usr/bin/mpicc.openmpi

die() { echo "install-openmpi: ERROR: $*" >&2; exit 1; }
log() { echo "install-openmpi: $*" >&2; }

[ "$(id -u)" = 0 ] || die "needs root (apt-get)"
[ -f /etc/debian_version ] || die "needs Debian (apt-get install openmpi-bin libopenmpi-dev)"
mkdir -p "$D/log"

if [ ! -x /usr/bin/mpirun.openmpi ] || [ ! -x "$MPICC" ]; then
    log "installing openmpi-bin libopenmpi-dev (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends openmpi-bin libopenmpi-dev \
        >"$D/log/apt.log" 2>&1 || {
        apt-get update -qq >>"$D/log/apt.log" 2>&1
        apt-get install -y -qq --no-install-recommends openmpi-bin libopenmpi-dev \
            >>"$D/log/apt.log" 2>&1 \
            || { tail -n 30 "$D/log/apt.log" >&2; die "apt-get install of Open MPI failed"; }
    }
fi
ompi=$(dpkg-query -W -f='${Version}' openmpi-bin) || die "openmpi-bin is not installed"
ompi=${ompi%%-*}

pyver=$($PY -c 'import sys; print("%d.%d" % sys.version_info[:2])') || die "$PY does not run"
version=${MPI4PY_VERSION:-$($PY -c 'from importlib.metadata import version; print(version("mpi4py"))' 2>/dev/null || true)}
spec=mpi4py${version:+==$version}
target=$D/mpi4py-${version:-latest}-py$pyver-openmpi$ompi

# the built module must link Open MPI's library (libmpi.so.40), not MPICH's (.12), and load
# with every symbol resolved (dlopen RTLD_NOW, as ctypes does): a module built against
# MPICH's header links but names symbols Open MPI does not have
built() {
    local so
    for so in "$target"/mpi4py/MPI.*.so; do
        # (no grep -q: under pipefail, ldd cut short by its early exit would fail the test)
        [ -f "$so" ] && ldd "$so" | grep 'libmpi\.so\.40' >/dev/null \
            && $PY -c 'import ctypes, sys; ctypes.CDLL(sys.argv[1])' "$so" 2>/dev/null && return 0
    done
    return 1
}
if ! built; then
    log "building $spec against Open MPI $ompi into $target (pip --no-binary, a few minutes)"
    rm -rf "$target" "$target.tmp"
    ldflags= cflags=
    for dir in $($MPICC --showme:libdirs); do ldflags="$ldflags -L$dir"; done
    for dir in $($MPICC --showme:incdirs); do cflags="$cflags -I$dir"; done
    MPICC=$MPICC LDSHARED="$MPICC -shared" LDFLAGS=$ldflags CFLAGS=$cflags \
        $PY -m pip install --verbose --disable-pip-version-check --no-cache-dir \
        --no-binary mpi4py --target "$target.tmp" "$spec" >"$D/log/build.log" 2>&1 \
        || { tail -n 30 "$D/log/build.log" >&2; die "building $spec against Open MPI failed"; }
    mv "$target.tmp" "$target"
    built || { ldd "$target"/mpi4py/MPI.*.so >&2
               die "$target's mpi4py does not link libmpi.so.40 or does not load with it"; }
fi
log "OK: Open MPI $ompi (/usr/bin/mpirun.openmpi), $spec built against it in $target"
echo "$target"
