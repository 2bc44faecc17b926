"""Does a little work, then prints the time it ends: the test measures how long the ranks
take to be gone after it."""

import time

from hpcsched import Client

with Client() as client:
    assert sum(client.gather(client.map(abs, range(-100, 0)))) == 5050
print(f"SCRIPT END {time.time():.6f}", flush=True)
