"""``Client.get_versions``, run the same over TCP (LocalCluster) and under mpiexec:
``check(client, tmp_dir, add_worker)``."""

from __future__ import annotations

import sys
from typing import Any

from tests.conformance.primitives import raises


def check(client: Any, tmp_dir: str, add_worker: Any) -> None:
    workers = sorted(client.scheduler_info()["workers"])
    v = client.get_versions(check=True)
    assert sorted(v) == ["client", "scheduler", "workers"]
    assert sorted(v["workers"]) == workers
    python = ".".join(map(str, sys.version_info[:3]))
    for where in [v["client"], v["scheduler"], *v["workers"].values()]:
        assert where["host"]["python"] == python
        assert where["packages"]["hpcsched"] == v["client"]["packages"]["hpcsched"]
        assert "cloudpickle" in where["packages"] and "numpy" in where["packages"]
    assert "toolz" in client.get_versions(packages=["toolz"])["client"]["packages"]

    # a worker whose hpcsched differs is named (ValueError with check=True)
    def set_version(value: str) -> str:
        import hpcsched

        old, hpcsched.__version__ = hpcsched.__version__, value
        return old

    old = client.run(set_version, "0.0.0-other", workers=[workers[-1]])[workers[-1]]
    try:
        e = raises(ValueError, client.get_versions, check=True)
        assert "hpcsched" in str(e) and workers[-1] in str(e), str(e)
        assert client.get_versions()["workers"][workers[-1]]["packages"]["hpcsched"] \
            == "0.0.0-other"
    finally:
        client.run(set_version, old, workers=[workers[-1]])
    client.get_versions(check=True)
