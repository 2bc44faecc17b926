#!/usr/bin/env bash

#SBATCH -J hpcsched-abc123-0
#SBATCH -o /l/hpcsched-abc123-0.out
#SBATCH -n 1
#SBATCH --cpus-per-task=1
#SBATCH --mem=1908M

export HPCSCHED_SECRET_FILE=/shared/logs/.hpcsched-abc123.secret
exec /usr/bin/python3 -m hpcsched worker tcp://10.1.2.3:8786 --name hpcsched-abc123-0 --nthreads 1 --memory-limit 2GB --death-timeout 60 --nworkers 1
