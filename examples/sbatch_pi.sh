#!/bin/bash
# Run the Monte-Carlo pi example as a SLURM batch job over MPI:
#     sbatch examples/sbatch_pi.sh
# Rank 0 runs the scheduler and the script, the other 3 ranks are workers; each
# worker's threads and memory come from the allocation (--cpus-per-task, --mem-per-cpu).
#SBATCH --job-name=hpcsched-pi
#SBATCH --ntasks=4
#SBATCH --cpus-per-task=1
#SBATCH --mem-per-cpu=1G
#SBATCH --time=00:05:00
#SBATCH --output=hpcsched-pi-%j.out

set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-.}"
# activate the environment hpcsched[mpi] is installed in, e.g.:
# source ~/venvs/hpcsched/bin/activate

# mpiexec of the MPI library mpi4py was built with (pip's mpich provides one);
# with an MPI that srun supports directly: srun python -m hpcsched examples/monte_carlo_pi.py
mpiexec -n "${SLURM_NTASKS:-4}" python -m hpcsched examples/monte_carlo_pi.py 100e6
