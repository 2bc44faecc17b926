"""A map over every worker rank of a wide job: prints the workers that joined and the sum."""

import sys

from hpcsched import Client

n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
with Client() as client:
    workers = len(client.scheduler_info()["workers"])
    total = sum(client.gather(client.map(abs, range(-n, 0))))
print(f"WIDTH {workers} {total}", flush=True)
