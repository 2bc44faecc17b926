"""The worker's result store on its hot path: store, read and delete small results.

    python benchmarks/bench_spill_buffer.py [--n 100000] [--repeat 3] [--compare OLD_SPILL_PY]

Every task's result goes through :class:`hpcsched.core.worker.spill.SpillBuffer` when memory is
managed (always on a LocalCluster), mostly far below its target. Measured per result, best
of ``--repeat``, in one process: ``store`` (with the measured nbytes), one ``__getitem__``
(a task reading its dependency) and ``pop(key, None)`` (the worker forgetting it), for

* ``dict``: the floor;
* ``zict.Buffer``: zict's LRU over a dict with zict.File behind it, as dask's worker sets it
  up (``distributed.spill.SpillBuffer``), a weight callback and spill callbacks;
* ``SpillBuffer``: this tree's;
* ``SpillBuffer (compare)``: the ``SpillBuffer`` of another version of ``spill.py``
  (``git show main:hpcsched/core/worker/spill.py > /tmp/old_spill.py``), if given.
"""

from __future__ import annotations

import _checkout  # noqa: F401 - this checkout's hpcsched, here and in what it starts

import argparse
import importlib.util
import tempfile
import time
from typing import Any

import zict

from hpcsched.core.worker.spill import SpillBuffer


def zict_buffer(directory: str) -> Any:
    nbytes: dict = {}

    def weight(key: Any, value: Any) -> int:
        return nbytes[key]

    def on_spill(key: Any, value: Any) -> None:
        pass

    buf = zict.Buffer({}, zict.File(directory), n=2**40, weight=weight,
                      fast_to_slow_callbacks=[on_spill], slow_to_fast_callbacks=[on_spill])

    def store(key: Any, value: Any, n: int) -> None:
        nbytes[key] = n
        buf[key] = value

    buf.store = store  # type: ignore[attr-defined]
    return buf


class Dict(dict):
    def store(self, key: Any, value: Any, nbytes: int) -> None:
        self[key] = value


def measure(data: Any, keys: list) -> tuple[float, float, float]:
    """Microseconds per result: store, getitem, pop."""
    value = b"x" * 8
    store, pop = data.store, data.pop
    t0 = time.perf_counter()
    for k in keys:
        store(k, value, 41)
    t1 = time.perf_counter()
    for k in keys:
        data[k]
    t2 = time.perf_counter()
    for k in keys:
        pop(k, None)
    t3 = time.perf_counter()
    return tuple(dt / len(keys) * 1e6 for dt in (t1 - t0, t2 - t1, t3 - t2))  # type: ignore[return-value]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--compare", help="another version of hpcsched/core/worker/spill.py")
    args = p.parse_args()
    keys = [f"noop-{i}" for i in range(args.n)]
    with tempfile.TemporaryDirectory() as d:
        candidates: dict[str, Any] = {"dict": Dict(), "zict.Buffer": zict_buffer(d + "/zict"),
                                      "SpillBuffer": SpillBuffer(d, target=2**40)}
        if args.compare:
            spec = importlib.util.spec_from_file_location("compare_spill", args.compare)
            assert spec is not None and spec.loader is not None
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            candidates["SpillBuffer (compare)"] = mod.SpillBuffer(d, target=2**40)
        print(f"{args.n} small results, microseconds per result, best of {args.repeat}")
        print(f"{'':24}{'store':>9}{'getitem':>9}{'pop':>9}{'total':>9}")
        best = {name: (float("inf"),) * 3 for name in candidates}
        for _ in range(args.repeat):  # in turns: a noisy machine slows all alike
            for name, data in candidates.items():
                r = measure(data, keys)
                best[name] = tuple(min(a, b) for a, b in zip(best[name], r, strict=True))
        for name, r in best.items():
            print(f"{name:24}" + "".join(f"{v:9.2f}" for v in r) + f"{sum(r):9.2f}")

if __name__ == "__main__":
    main()
