#!/bin/bash
# An MPI job that serves clients elsewhere (a notebook on the login node):
#     sbatch examples/sbatch_serve.sh
# then, where ~/hpcsched-sched.json is visible:
#     from hpcsched import Client
#     client = Client(scheduler_file="~/hpcsched-sched.json")
#     ...
#     client.shutdown()   # ends the job
# Rank 0 runs the scheduler (over MPI for the workers, over TCP with a secret for
# clients), the other ranks are workers. The job also ends 30 s before its time limit.
#SBATCH --job-name=hpcsched-serve
#SBATCH --ntasks=4
#SBATCH --cpus-per-task=1
#SBATCH --mem-per-cpu=1G
#SBATCH --time=01:00:00
#SBATCH --output=hpcsched-serve-%j.out

set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-.}"
# activate the environment hpcsched[mpi] is installed in, e.g.:
# source ~/venvs/hpcsched/bin/activate

# with an MPI that srun supports directly (else: mpiexec -n "$SLURM_NTASKS" python ...)
srun python -m hpcsched --scheduler-file ~/hpcsched-sched.json
