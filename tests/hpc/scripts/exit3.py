"""sys.exit(3) in the script: the job's exit status is 3."""

import sys

from hpcsched import Client

with Client() as client:
    assert client.submit(abs, -2).result(timeout=30) == 2
print("exiting with 3", flush=True)
sys.exit(3)
