"""Cluster control assertions, run the same over TCP (LocalCluster) and under mpiexec.

``check(client, tmp_dir, add_worker)``: ``add_worker()`` starts one more worker
and returns once it joined, or returns False where workers cannot be added
(MPI: ranks are fixed), which skips only the late-joiner part.
"""

from __future__ import annotations

import os
import sys
import uuid
from typing import Any


def check(client: Any, tmp_dir: str, add_worker: Any, supervisor_pid: int | None = None) -> None:
    workers = client.scheduler_info()["workers"]
    assert len(workers) >= 2, workers
    addrs = sorted(workers)

    # run: every worker, dask_worker passed, one worker, errors three ways
    assert client.run(lambda dask_worker: dask_worker.address) == {a: a for a in addrs}
    assert client.run(lambda x, y=0: x + y, 1, y=2, workers=[addrs[0]]) == {addrs[0]: 3}
    name = workers[addrs[1]]["name"]
    assert list(client.run(os.getpid, workers=[name])) == [addrs[1]]
    try:
        client.run(lambda: 1 / 0)
        raise AssertionError("run did not raise")
    except ZeroDivisionError:
        pass
    errs = client.run(lambda: 1 / 0, on_error="return")
    assert sorted(errs) == addrs and all(isinstance(e, ZeroDivisionError) for e in errs.values())
    assert client.run(lambda: 1 / 0, on_error="ignore") == {}
    assert client.run(lambda: 1, wait=False) is None

    # run_on_scheduler
    assert client.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.state.workers)) \
        == addrs
    assert client.run_on_scheduler(lambda a, b: a * b, 6, 7) == 42
    try:
        client.run_on_scheduler(lambda: {}["missing"])
        raise AssertionError("run_on_scheduler did not raise")
    except KeyError:
        pass

    # who_has / has_what / nthreads / ncores
    fut = client.submit(lambda x: x + 1, 1, workers=[addrs[0]], pure=False)
    assert fut.result(timeout=30) == 2
    assert client.who_has(fut) == {fut.key: [addrs[0]]}
    assert client.who_has([fut])[fut.key] == [addrs[0]]
    assert fut.key in client.who_has()
    has = client.has_what()
    assert sorted(has) == addrs and fut.key in has[addrs[0]]
    assert list(client.has_what(workers=[addrs[1]])) == [addrs[1]]
    threads = {a: w["nthreads"] for a, w in workers.items()}
    assert client.nthreads() == threads == client.ncores()
    assert client.nthreads(workers=[addrs[0]]) == {addrs[0]: threads[addrs[0]]}

    # upload_file: imported on every worker, reloaded on a second upload, and sent to a
    # worker that joins later
    module = f"uploaded_{uuid.uuid4().hex[:8]}"
    path = os.path.join(tmp_dir, f"{module}.py")
    with open(path, "w") as f:
        f.write("VALUE = 1\n")
    paths = client.upload_file(path)
    assert sorted(paths) == addrs
    assert client.submit(lambda: sys.modules[module].VALUE, pure=False).result(30) == 1
    with open(path, "w") as f:
        f.write("VALUE = 2\n")
    client.upload_file(path)
    assert set(client.run(lambda: sys.modules[module].VALUE).values()) == {2}
    if add_worker():
        values = client.run(lambda: __import__(module).VALUE)
        assert len(values) == len(addrs) + 1 and set(values.values()) == {2}, values
    try:
        client.upload_file(os.path.join(tmp_dir, "no-such-file.py"))
        raise AssertionError("upload_file of a missing file did not raise")
    except FileNotFoundError:
        pass

    # run(nanny=True): in each worker's nanny, the process supervising it (supervisor_pid:
    # a LocalCluster's is this process), results by worker address, dask_worker= the nanny;
    # a worker nothing supervises (an MPI rank) answers why it cannot
    now = sorted(client.scheduler_info()["workers"])  # a worker may have joined above
    if supervisor_pid is not None:
        assert client.run(os.getpid, nanny=True) == dict.fromkeys(now, supervisor_pid)
        names = client.run(lambda dask_worker: type(dask_worker).__name__, nanny=True,
                           workers=[addrs[0]])
        assert names == {addrs[0]: "Nanny"}, names
        assert client.run(lambda x, y=0: x + y, 1, y=2, nanny=True) == dict.fromkeys(now, 3)
        try:
            client.run(lambda: 1 / 0, nanny=True)
            raise AssertionError("run(nanny=True) did not raise the function's error")
        except ZeroDivisionError:
            pass
    else:
        errs = client.run(os.getpid, nanny=True, on_error="return")
        assert sorted(errs) == now, errs
        assert all(isinstance(e, RuntimeError) and "has no nanny" in str(e)
                   for e in errs.values()), errs
    del fut

    # replicate: onto every worker, or n of them; the data stays gettable
    futs = client.map(lambda i: [i] * 100, range(4), workers=[addrs[0]], pure=False)
    client.replicate(futs)
    has = client.who_has(futs)
    now = sorted(client.scheduler_info()["workers"])  # a worker may have joined above
    assert all(sorted(has[f.key]) == now for f in futs), has
    one = client.submit(lambda: "one", workers=[addrs[0]], pure=False)
    client.replicate(one, n=2)
    assert len(client.who_has(one)[one.key]) == 2
    assert client.gather(futs) == [[i] * 100 for i in range(4)] and one.result(30) == "one"
    try:
        client.replicate(one, n=0)
        raise AssertionError("replicate(n=0) did not raise")
    except ValueError:
        pass

    # rebalance: keys all on one worker move (not copy) to the others; all still gather
    heavy = client.map(lambda i: bytes(20_000) + bytes([i]), range(8), workers=[addrs[0]],
                       pure=False)
    values = client.gather(heavy)
    assert {w for f in heavy for w in client.who_has(heavy)[f.key]} == {addrs[0]}
    client.rebalance(heavy)
    has = client.who_has(heavy)
    assert all(len(has[f.key]) == 1 for f in heavy), has  # moved: the old copy is dropped
    spread = {has[f.key][0] for f in heavy}
    assert addrs[0] in spread and len(spread) > 1, has
    assert client.gather(heavy) == values
    client.rebalance()  # everything, everywhere: still nothing lost
    assert client.gather(heavy) == values and all(client.who_has(heavy).values())
