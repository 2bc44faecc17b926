"""The script raises while every worker is stuck in a long task: the job still ends fast."""

import time

from hpcsched import Client


def stuck(x):
    time.sleep(60)
    return x


client = Client()
nworkers = len(client.scheduler_info()["workers"])
futures = client.map(stuck, range(2 * nworkers))
time.sleep(0.5)  # let the tasks start
raise RuntimeError("giving up while tasks run")
