#!/usr/bin/env bash
# check-wheel.sh - build hpcsched's sdist and its wheel (the wheel from the sdist, as pip
# builds one from PyPI's sdist), check both with `twine check --strict`, and install the
# wheel in a fresh virtual environment WITHOUT the mpi extra, as a user does on a login node
# that has no MPI. There, outside the source tree:
#   * mpi4py is absent and `import hpcsched` works;
#   * `hpcsched --version` answers;
#   * a LocalCluster computes a map, SLURMCluster(cores=1, memory="1GB").job_script() renders;
#   * MPI mode (`python -m hpcsched script.py` as a launcher starts it) fails at once with
#     the install command: pip install 'hpcsched[mpi]'.
# ci/test-all.sh runs it as one of its checks. Needs the `build` and `twine` packages (the
# lint extra) and the package index for the wheel's dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/hpcsched-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT

step() { echo "-- $*"; }
fail() { echo "check-wheel: $*" >&2; exit 1; }

step "building the sdist and the wheel from it (python -m build)"
$PY -m build --outdir "$work/dist" . >"$work/build.log" 2>&1 \
    || { cat "$work/build.log" >&2; fail "python -m build failed"; }
sdist=$(ls "$work"/dist/hpcsched-*.tar.gz)
wheel=$(ls "$work"/dist/hpcsched-*-py3-none-any.whl)
echo "   $(basename "$sdist"), $(basename "$wheel")"

step "twine check --strict (metadata, and the README renders on PyPI)"
$PY -m twine check --strict "$sdist" "$wheel"

step "the wheel holds the dashboard's static files, py.typed and the license"
$PY - "$wheel" <<'EOF'
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
wanted = {"hpcsched/diagnostics/static/dashboard.js", "hpcsched/diagnostics/static/dashboard.css",
          "hpcsched/py.typed"}
missing = sorted(wanted - names)
if not any(n.endswith(".dist-info/licenses/LICENSE") for n in names):
    missing.append("LICENSE")
if missing:
    sys.exit(f"missing from the wheel: {missing}")
EOF

step "a fresh virtual environment with the wheel and no extra"
$PY -m venv "$work/venv"
vpy="$work/venv/bin/python"
"$vpy" -m pip install --quiet --disable-pip-version-check "$wheel" \
    || fail "pip install of the wheel failed"
"$vpy" -m pip check >/dev/null || { "$vpy" -m pip check >&2; fail "pip check failed"; }

# from here on: no PYTHONPATH, no source tree, no launcher variables
cd "$work"
unset PYTHONPATH PMI_SIZE PMI_RANK OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_RANK \
    MV2_COMM_WORLD_SIZE MV2_COMM_WORLD_RANK PMIX_SIZE PMIX_RANK SLURM_STEP_ID SLURM_PROCID

step "mpi4py is not installed"
if "$vpy" -c "import mpi4py" 2>/dev/null; then fail "mpi4py is importable in the clean venv"; fi

step "hpcsched --version"
version=$("$work/venv/bin/hpcsched" --version)
echo "   $version"
case "$version" in "hpcsched "*) ;; *) fail "unexpected --version output: $version" ;; esac

step "import hpcsched, a LocalCluster's map, SLURMCluster(...).job_script()"
"$vpy" - "$work/venv" <<'EOF'
import os, sys
import hpcsched
from hpcsched import Client, LocalCluster, SLURMCluster

here = os.path.realpath(hpcsched.__file__)
assert here.startswith(os.path.realpath(sys.argv[1])), f"hpcsched imported from {here}"
with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
    assert client.gather(client.map(lambda x: x * x, range(10))) == [x * x for x in range(10)]
with SLURMCluster(cores=1, memory="1GB") as slurm:
    script = slurm.job_script()
assert script.startswith("#!") and "#SBATCH" in script and "-m hpcsched worker" in script
assert "mpi4py" not in sys.modules
print("   ok: LocalCluster map, SLURMCluster job script, mpi4py never imported")
EOF

step "MPI mode without mpi4py fails at once, naming the install command"
echo "print('the script ran')" > script.py
set +e
out=$(PMI_SIZE=2 PMI_RANK=0 timeout 60 "$vpy" -m hpcsched script.py 2>&1)
rc=$?
set -e
echo "   exit $rc: $out"
[ "$rc" = 1 ] || fail "expected exit status 1, got $rc"
case "$out" in *"pip install 'hpcsched[mpi]'"*) ;; *) fail "no install command in: $out" ;; esac
case "$out" in *"the script ran"*) fail "the script ran without MPI" ;; esac

echo "check-wheel: sdist and wheel built and checked; the wheel works without MPI"
