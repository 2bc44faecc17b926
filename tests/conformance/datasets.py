"""Published datasets, run the same over TCP (LocalCluster) and under mpiexec:
``check(client, tmp_dir, add_worker)``."""

from __future__ import annotations

import gc
from typing import Any

from tests.conformance.primitives import known, raises, until


def check(client: Any, tmp_dir: str, add_worker: Any) -> None:
    Client = type(client)
    assert client.list_datasets() == []
    fut = client.submit(lambda: 10, pure=False)
    key = fut.key
    assert fut.result(30) == 10
    client.publish_dataset(ten=fut, plain={"a": [1, 2]})
    assert sorted(client.list_datasets()) == ["plain", "ten"]
    del fut
    gc.collect()
    assert known(client, key), "a published future was released"
    got = client.get_dataset("ten")
    assert got.key == key and got.result(30) == 10
    assert client.get_dataset("plain") == {"a": [1, 2]}
    raises(KeyError, client.get_dataset, "missing")
    assert client.get_dataset("missing", default=None) is None
    raises(KeyError, client.publish_dataset, plain=1)
    client.publish_dataset(3, name="plain", override=True)
    assert client.get_dataset("plain") == 3
    raises(ValueError, client.publish_dataset, 1, 2, name="x")

    # from a task, and a mapping
    assert client.submit(lambda: __import__("hpcsched").get_client().get_dataset("plain"),
                         pure=False).result(30) == 3
    client.datasets["m"] = [1, 2, 3]
    assert client.datasets["m"] == [1, 2, 3] and "m" in client.datasets
    assert len(client.datasets) == 3 and sorted(client.datasets) == ["m", "plain", "ten"]
    del client.datasets["m"]
    assert "m" not in client.datasets
    raises(KeyError, client.datasets.__delitem__, "m")

    # unpublishing lets the futures go
    del got
    gc.collect()
    client.unpublish_dataset("ten")
    until(lambda: not known(client, key))
    client.unpublish_dataset("plain")
    assert client.list_datasets() == []

    # a dataset outlives the client that published it
    other = Client(client.scheduler_address, security=client.security, set_as_default=False)
    other.publish_dataset(kept=other.submit(lambda: "kept", pure=False))
    other.close()
    assert client.get_dataset("kept").result(30) == "kept"
    client.unpublish_dataset("kept")
