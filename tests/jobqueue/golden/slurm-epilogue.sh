#!/usr/bin/env bash

#SBATCH -J hpcsched-abc123-0
#SBATCH -o /shared/logs/hpcsched-abc123-0.out
#SBATCH -p normal
#SBATCH -A proj42
#SBATCH -n 1
#SBATCH --cpus-per-task=8
#SBATCH --mem=15G
#SBATCH -t 01:00:00

module load python/3.11
source /opt/venv/bin/activate
export HPCSCHED_SECRET_FILE=/shared/logs/.hpcsched-abc123.secret
/opt/py/bin/python3 -m hpcsched worker tcp://10.1.2.3:8786 --name hpcsched-abc123-0 --nthreads 4 --memory-limit 8GB --death-timeout 60 --lifetime 3540 --lifetime-stagger 30 --local-directory /tmp/hpcsched --nworkers 2
worker_status=$?
echo "worker exited"
rm -rf /tmp/hpcsched
exit $worker_status
