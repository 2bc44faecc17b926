"""Fixtures of the diagnostics tests: a cluster with its dashboard on a free port, HTTP get."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import _local_cluster


def http_get(url: str, headers: dict | None = None, timeout: float = 30.0
             ) -> tuple[int, dict, bytes]:
    """(status, headers, body) of a GET; HTTP errors are returned, not raised."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def split_link(link: str) -> tuple[str, str]:
    """``http://host:port/status?token=T`` -> (``http://host:port``, ``T``)."""
    base, _, query = link.partition("/status?")
    assert query.startswith("token="), link
    return base, query[len("token="):]


@pytest.fixture(scope="module")
def dash_cluster() -> Iterator[Any]:
    """Two worker processes, two threads each; the dashboard on a free port."""
    c = _local_cluster(threads_per_worker=2, dashboard_address="127.0.0.1:0")
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def dash_client(dash_cluster: Any) -> Iterator[Any]:
    from hpcsched import Client

    cl = Client(dash_cluster, set_as_default=False)
    try:
        yield cl
    finally:
        cl.close()
