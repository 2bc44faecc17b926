#!/usr/bin/env bash

#BSUB -J hpcsched-abc123-0
#BSUB -o /l/hpcsched-abc123-0.out
#BSUB -n 1
#BSUB -M 2000
#BSUB -W 00:30

export HPCSCHED_SECRET_FILE=/shared/logs/.hpcsched-abc123.secret
exec /usr/bin/python3 -m hpcsched worker tcp://10.1.2.3:8786 --name hpcsched-abc123-0 --nthreads 1 --memory-limit 2GB --death-timeout 60 --lifetime 1740 --lifetime-stagger 30 --nworkers 1
