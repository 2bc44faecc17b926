#!/bin/bash
# sbatch_mpi.sh - run an hpcsched script inside ONE SLURM allocation, over MPI:
# rank 0 runs the scheduler and your script, ranks 1..N-1 are workers, and
# Client() in the script finds them without an address.
#
#   sbatch examples/sbatch_mpi.sh my_script.py [args...]     # 4 ranks (below)
#   sbatch -n 16 -t 02:00:00 examples/sbatch_mpi.sh my_script.py
#   sbatch examples/sbatch_mpi.sh                             # built-in demo
#
# The job's exit status is the script's (an exception in it ends every rank
# with status 1; nothing is left running). Set PYTHON to the interpreter that
# has hpcsched installed if it is not the first python3 on PATH, e.g.
#   sbatch --export=ALL,PYTHON=$HOME/venv/bin/python examples/sbatch_mpi.sh x.py
#
#SBATCH -J hpcsched-mpi
#SBATCH -n 4
#SBATCH -t 00:10:00
#SBATCH -o hpcsched-mpi-%j.out
set -euo pipefail

PYTHON=${PYTHON:-python3}
NTASKS=${SLURM_NTASKS:-4}

if [ $# -eq 0 ]; then
    # no script given: a small demo written next to the job's output
    demo=$(mktemp "${TMPDIR:-/tmp}/hpcsched-demo-XXXXXX.py")
    trap 'rm -f "$demo"' EXIT
    cat > "$demo" <<'PY'
from hpcsched import Client

with Client() as client:
    futures = client.map(lambda x: x * x, range(100))
    print("sum of squares:", sum(client.gather(futures)), flush=True)
    print("workers:", len(client.scheduler_info()["workers"]), flush=True)
PY
    set -- "$demo"
fi

echo "hpcsched: job ${SLURM_JOB_ID:-?} on $(hostname): mpiexec -n $NTASKS $PYTHON -m hpcsched $*"
# no exec: the demo file is removed when mpiexec returns
mpiexec -n "$NTASKS" "$PYTHON" -m hpcsched "$@"
