"""Keeps the cluster busy until the launcher is signalled."""

import time

from hpcsched import Client


def nap(x):
    time.sleep(0.2)
    return x


with Client() as client:
    assert client.submit(nap, 1).result(timeout=30) == 1
    print("cluster running", flush=True)
    futures = client.map(nap, range(10_000))
    time.sleep(120)
