"""``Client.get_versions``: the versions of Python and of key packages in the client, the
scheduler and every worker, as distributed's
(https://distributed.dask.org/en/stable/api.html#distributed.Client.get_versions).

Environments that differ between the machines of a cluster cause obscure errors
(a function pickled by one cloudpickle, loaded by another); ``check=True``
raises ``ValueError`` naming each package whose version differs, and where.
"""

from __future__ import annotations

import platform
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpcsched.core.client.control import ClusterRequests

#: packages whose versions must agree across the cluster (and are reported)
REQUIRED = ("hpcsched", "cloudpickle", "msgpack", "toolz", "dask")
#: packages reported as well
OPTIONAL = ("numpy", "pandas", "mpi4py", "psutil", "lz4", "distributed")


def version_of(name: str) -> str | None:
    """The version of package ``name`` in this process (None: not installed): the imported
    module's ``__version__`` if it is loaded, else the installed distribution's."""
    module = sys.modules.get(name)
    version = getattr(module, "__version__", None) if module is not None else None
    if version is None:
        try:
            import importlib.metadata  # on the call: its import costs a script's start

            version = importlib.metadata.version(name)
        except Exception:  # noqa: BLE001 - not installed (or no metadata): absent
            return None
    return str(version)


def get_versions(packages: Any = None) -> dict:
    """``{"host": {...}, "packages": {name: version}}`` of this process."""
    names = [*REQUIRED, *OPTIONAL, *(packages or ())]
    return {
        "host": {"python": ".".join(map(str, sys.version_info[:3])),
                 "python-bits": 64 if sys.maxsize > 2**32 else 32,
                 "OS": platform.system(), "OS-release": platform.release(),
                 "machine": platform.machine(), "byteorder": sys.byteorder},
        "packages": {"python": ".".join(map(str, sys.version_info[:3])),
                     **{n: version_of(n) for n in dict.fromkeys(names)}},
    }


def mismatches(versions: dict) -> list[str]:
    """One line per required package (Python included) whose version is not the same in the
    client, the scheduler and every worker."""
    where = {"client": versions["client"], "scheduler": versions["scheduler"],
             **{f"worker {a}": v for a, v in sorted(versions["workers"].items())}}
    out = []
    for name in ("python", *REQUIRED):
        seen = {who: (v or {}).get("packages", {}).get(name) for who, v in where.items()}
        if len(set(seen.values())) > 1:
            out.append(f"{name}: " + ", ".join(f"{who}={ver}" for who, ver in seen.items()))
    return out


def collect(control: ClusterRequests, check: bool = False, packages: Any = None) -> dict:
    """``{"client", "scheduler", "workers": {address: ...}}``, asked through ``control``;
    with ``check=True``, raises ``ValueError`` if a required package's version differs
    somewhere."""
    packages = list(packages or ())
    versions = {
        "client": get_versions(packages),
        "scheduler": control.run_on_scheduler(get_versions, (packages,), {}),
        "workers": control.run(get_versions, (packages,), {}),
    }
    bad = mismatches(versions)
    if bad and check:
        raise ValueError("Mismatched versions found\n" + "\n".join(bad))
    return versions
