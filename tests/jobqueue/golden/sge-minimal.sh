#!/usr/bin/env bash

#$ -N hpcsched-abc123-0
#$ -o /l/hpcsched-abc123-0.out
#$ -j y
#$ -cwd
#$ -l mem_free=1908M
#$ -l h_rt=00:30:00

export HPCSCHED_SECRET_FILE=/shared/logs/.hpcsched-abc123.secret
exec /usr/bin/python3 -m hpcsched worker tcp://10.1.2.3:8786 --name hpcsched-abc123-0 --nthreads 1 --memory-limit 2GB --death-timeout 60 --lifetime 1740 --lifetime-stagger 30 --nworkers 1
