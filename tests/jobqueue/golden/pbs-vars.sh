#!/usr/bin/env bash

#PBS -N hpcsched-abc123-0
#PBS -o /l/hpcsched-abc123-0.out
#PBS -j oe
#PBS -l select=1:ncpus=2:mem=3815MB
#PBS -l walltime=00:30:00

export HPCSCHED_SECRET_FILE=/shared/logs/.hpcsched-abc123.secret
exec "$SOMEVAR/my env/bin/python" -m hpcsched worker tcp://10.1.2.3:8786 --name hpcsched-abc123-0 --nthreads 1 --memory-limit 2GB --death-timeout 60 --lifetime 1740 --lifetime-stagger 30 --local-directory "$TMPDIR" --resources "GPU=${NGPUS}" --nworkers 2
