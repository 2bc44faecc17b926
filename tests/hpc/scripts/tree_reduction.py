"""A tree reduction as one graph: 8,192 leaves summed pairwise, 16,383 tasks.

Prints the sum, the tasks' count and the hosts of the workers, which the tests compare to
n * (n - 1) / 2 and to where the launcher put the ranks:

    mpiexec -n 4 python -m hpcsched tests/hpc/scripts/tree_reduction.py [leaves]
"""

import socket
import sys
import time
from operator import add

from hpcsched import Client


def tree(n: int) -> tuple[dict, tuple]:
    dsk: dict = {("leaf", i): i for i in range(n)}
    level, width, depth = "leaf", n, 0
    while width > 1:
        depth += 1
        name = f"level{depth}"
        for i in range(width // 2):
            dsk[(name, i)] = (add, (level, 2 * i), (level, 2 * i + 1))
        level, width = name, width // 2
    return dsk, (level, 0)


leaves = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
dsk, root = tree(leaves)
with Client() as client:
    hosts = client.run(socket.gethostname)
    start = time.perf_counter()
    total = client.get(dsk, root, timeout=600)
    elapsed = time.perf_counter() - start
print("hosts", " ".join(sorted(hosts.values())), flush=True)
print(f"tree of {len(dsk)} tasks: sum {total} in {elapsed:.2f} s "
      f"({len(dsk) / elapsed:,.0f} tasks/s)", flush=True)
