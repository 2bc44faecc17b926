#!/usr/bin/env bash

#$ -N hpcsched-abc123-0
#$ -o /shared/logs/hpcsched-abc123-0.out
#$ -j y
#$ -cwd
#$ -q normal
#$ -P proj42
#$ -pe smp 8
#$ -l mem_free=1908M
#$ -l h_rt=01:00:00

module load python/3.11
source /opt/venv/bin/activate
export HPCSCHED_SECRET_FILE=/shared/logs/.hpcsched-abc123.secret
/opt/py/bin/python3 -m hpcsched worker tcp://10.1.2.3:8786 --name hpcsched-abc123-0 --nthreads 4 --memory-limit 8GB --death-timeout 60 --lifetime 3540 --lifetime-stagger 30 --local-directory /tmp/hpcsched --nworkers 2
worker_status=$?
echo "worker exited"
rm -rf /tmp/hpcsched
exit $worker_status
