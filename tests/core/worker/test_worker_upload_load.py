"""Loading an uploaded module where several workers share one process.

``LocalCluster(processes=False)`` runs its workers as threads of one process: each
worker keeps its uploads in its own directory, but they share ``sys.modules``. Loads of
one module name by several such workers at once must each succeed (one popping the name
from ``sys.modules`` while another imported it failed with ``KeyError``).
"""

from __future__ import annotations

import sys
import threading

import pytest

from hpcsched.core.worker.control import load


@pytest.mark.timeout(60)
def test_concurrent_loads_of_one_module_name_from_several_directories(tmp_path):
    name = "upload_load_race_module"
    paths = []
    for i in range(4):
        d = tmp_path / f"worker-{i}"
        d.mkdir()
        (d / f"{name}.py").write_text(f"WHO = {i}\n")
        paths.append(str(d / f"{name}.py"))
        sys.path.insert(0, str(d))
    errors: list[BaseException] = []
    try:
        for _ in range(30):
            barrier = threading.Barrier(len(paths), timeout=10)

            def one(path: str, barrier: threading.Barrier = barrier) -> None:
                try:
                    barrier.wait()
                    load(path)
                except BaseException as e:  # noqa: BLE001 - collected for the assertion
                    errors.append(e)

            threads = [threading.Thread(target=one, args=(p,)) for p in paths]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=20)
            assert not any(t.is_alive() for t in threads)
        assert errors == []
        assert sys.modules[name].WHO in range(4)
    finally:
        for p in paths:
            d = p.rsplit("/", 1)[0]
            if d in sys.path:
                sys.path.remove(d)
        sys.modules.pop(name, None)
