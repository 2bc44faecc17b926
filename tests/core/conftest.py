"""Fixtures shared by the tests of hpcsched.core."""

from __future__ import annotations

import logging
import os
import random
import shutil
import subprocess
from collections.abc import Callable, Collection, Mapping
from typing import Any

import pytest

# --- graph policies (order, mars): key renaming --------------------------------------


@pytest.fixture(params=[None, 1, 2, 3], ids=["as-written", "renamed-1", "renamed-2", "renamed-3"])
def relabel(request: pytest.FixtureRequest) -> Callable[..., dict]:
    """``relabel(policy, dependencies, *args)``: run ``policy`` on the graph with its
    keys renamed at random and inserted in a random order, and map the result's keys
    back. A policy that follows structure, not key names, gives the same answers on
    every parameter."""
    seed = request.param

    def run(policy: Callable[..., Mapping], dependencies: Mapping[Any, Collection],
            *args: Any, **kwargs: Any) -> dict:
        if seed is None:
            return dict(policy(dependencies, *args, **kwargs))
        rng = random.Random(seed)
        keys = list(dependencies)
        rng.shuffle(keys)
        new = {k: f"k-{rng.getrandbits(48):012x}" for k in keys}
        old = {v: k for k, v in new.items()}
        renamed = {new[k]: [new.get(d, d) for d in dependencies[k]] for k in keys}
        return {old[k]: v for k, v in policy(renamed, *args, **kwargs).items()}

    return run


# --- configuration ---------------------------------------------------------------------
@pytest.fixture
def clean_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Any:
    """No HPCSCHED_* variables, no YAML files but the ones a test writes."""
    from hpcsched.core import config

    for name in list(os.environ):
        if name.startswith("HPCSCHED_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    config.refresh()
    try:
        yield tmp_path
    finally:
        config.refresh()


# --- TCP tests: peers on loopback, ended by the test ----------------------------------
@pytest.fixture
def net():
    from tests.core.comm.tcp_net import Net

    n = Net()
    try:
        yield n
    finally:
        n.close()


@pytest.fixture
def comm_log(caplog):
    caplog.set_level(logging.INFO, logger="hpcsched.comm")
    return caplog


# --- TLS: a certificate made once per session ------------------------------------------
@pytest.fixture(scope="session")
def tls_files(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1 and its key: ``(cert, key)`` paths."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed: cannot make a test certificate")
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=hpcsched-test",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=30,
    )
    return str(cert), str(key)
