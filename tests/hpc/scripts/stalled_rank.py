"""A job whose worker ranks the test stalls (SIGSTOP) and resumes: it writes their pids
to argv[1], waits for the file argv[2] (the test's word that the stall is over), then
needs every worker rank again."""

import os
import sys
import time

from hpcsched import Client

pids_file, resumed_file = sys.argv[1], sys.argv[2]

with Client() as client:
    pids = client.run(os.getpid)
    with open(pids_file + ".tmp", "w") as f:
        f.write(" ".join(str(pid) for pid in pids.values()))
    os.replace(pids_file + ".tmp", pids_file)
    deadline = time.monotonic() + 120
    while not os.path.exists(resumed_file):
        assert time.monotonic() < deadline, "the test never resumed the ranks"
        time.sleep(0.1)
    again = client.run(os.getpid)
    assert again == pids, (again, pids)
    print(f"all {len(again)} worker ranks back", flush=True)
