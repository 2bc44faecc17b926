"""The import line a user changes when moving to hpcsched, done for the peers' own tests.

dask-jobqueue's and dask-mpi's wheels ship their test suites (``dask_jobqueue/tests/``,
``dask_mpi/tests/``). A user moving over changes one line: ``from dask_jobqueue import
SLURMCluster`` and ``from dask.distributed import Client`` become imports from hpcsched
(the site's "Moving from dask-jobqueue", docs/moving/dask-jobqueue.md). :func:`install` makes that change for code
that cannot be edited: ``dask_jobqueue`` and ``dask_mpi`` become modules handing on
hpcsched's names, and dask.distributed's ``Client`` is hpcsched's. Their ``tests``
subpackages still load from the installed wheels, unchanged.

Nothing of the peers' code runs: only their tests. A name the peer has and hpcsched
lacks is left out, so a test that imports it fails to import and is counted as failing.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

#: module -> {name: "module:attribute"}; what each peer module hands on. dask-jobqueue's
#: ``Job`` classes (``job_cls``: what one job asks for and how it is submitted) are
#: hpcsched's ``BatchSystem`` classes; its test cluster ``dask_jobqueue.local`` is
#: :mod:`tests.peers.local`.
_SYSTEMS = "hpcsched.jobqueue.systems"
JOBQUEUE = {
    "dask_jobqueue": {
        "SLURMCluster": "hpcsched.jobqueue:SLURMCluster",
        "SGECluster": "hpcsched.jobqueue:SGECluster",
        "PBSCluster": "hpcsched.jobqueue:PBSCluster",
        "LSFCluster": "hpcsched.jobqueue:LSFCluster",
        "HTCondorCluster": "hpcsched.jobqueue:HTCondorCluster",
        "OARCluster": "hpcsched.jobqueue:OARCluster",
        "MoabCluster": "hpcsched.jobqueue:MoabCluster",
        "JobQueueCluster": "hpcsched.jobqueue:JobQueueCluster",
    },
    "dask_jobqueue.core": {
        "JobQueueCluster": "hpcsched.jobqueue:JobQueueCluster",
        "Job": "hpcsched.jobqueue.base:BatchSystem",
    },
    "dask_jobqueue.local": {
        "LocalCluster": "tests.peers.local:LocalCluster",
        "LocalJob": "tests.peers.local:LocalSystem",
    },
    "dask_jobqueue.slurm": {"SLURMCluster": "hpcsched.jobqueue:SLURMCluster",
                            "SLURMJob": f"{_SYSTEMS}.slurm:SLURMSystem"},
    "dask_jobqueue.sge": {"SGECluster": "hpcsched.jobqueue:SGECluster",
                          "SGEJob": f"{_SYSTEMS}.sge:SGESystem"},
    "dask_jobqueue.pbs": {"PBSCluster": "hpcsched.jobqueue:PBSCluster",
                          "PBSJob": f"{_SYSTEMS}.pbs:PBSSystem"},
    "dask_jobqueue.moab": {"MoabCluster": "hpcsched.jobqueue:MoabCluster",
                           "MoabJob": f"{_SYSTEMS}.moab:MoabSystem"},
    "dask_jobqueue.oar": {"OARCluster": "hpcsched.jobqueue:OARCluster",
                          "OARJob": f"{_SYSTEMS}.oar:OARSystem"},
    "dask_jobqueue.htcondor": {"HTCondorCluster": "hpcsched.jobqueue:HTCondorCluster",
                               "HTCondorJob": f"{_SYSTEMS}.htcondor:HTCondorSystem"},
    "dask_jobqueue.lsf": {
        "LSFCluster": "hpcsched.jobqueue:LSFCluster",
        "LSFJob": f"{_SYSTEMS}.lsf:LSFSystem",
        "lsf_detect_units": f"{_SYSTEMS}.lsf:lsf_units",
        "lsf_format_bytes_ceil": f"{_SYSTEMS}.lsf:lsf_format_bytes_ceil",
    },
}

MPI = {
    "dask_mpi": {
        "initialize": "hpcsched:initialize",
        "send_close_signal": "hpcsched:send_close_signal",
        "execute": "hpcsched:execute",
    },
}


def _resolve(target: str):
    module, _, attribute = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError):
        return None


def _module(name: str, names: dict[str, str]) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__doc__ = f"hpcsched's names under {name} (tests/peers/shims.py)"
    for attribute, target in names.items():
        value = _resolve(target)
        if value is not None:
            setattr(module, attribute, value)
    return module


class _PeerCodeBlocked:
    """Keeps the peer's own code from loading: of its package only ``tests`` may be
    imported from the wheel; any other submodule is one hpcsched does not hand on."""

    def __init__(self, tops: tuple[str, ...]) -> None:
        self.tops = tops

    def find_spec(self, name, path=None, target=None):
        top, _, rest = name.partition(".")
        if top in self.tops and rest and rest.split(".")[0] != "tests":
            raise ModuleNotFoundError(f"hpcsched hands on no counterpart of {name}", name=name)
        return None


def _package(table: dict[str, dict[str, str]]) -> None:
    top = next(iter(table))
    spec = importlib.util.find_spec(top)  # the peer's wheel: its tests load from there
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError(f"{top} is not installed: pip install the pinned peer first")
    for name, names in table.items():
        module = _module(name, names)
        if name == top:
            module.__path__ = list(spec.submodule_search_locations)
        else:
            setattr(sys.modules[top], name.rpartition(".")[2], module)
        sys.modules[name] = module


def install() -> None:
    """Hand on hpcsched's names under the peers' module names (idempotent)."""
    if getattr(sys.modules.get("dask_jobqueue"), "__doc__", "") and "hpcsched" in (
            sys.modules["dask_jobqueue"].__doc__ or ""):
        return
    import dask.distributed
    import distributed

    import hpcsched

    distributed.Client = hpcsched.Client
    dask.distributed.Client = hpcsched.Client
    _package(JOBQUEUE)
    _package(MPI)
    sys.meta_path.insert(0, _PeerCodeBlocked(("dask_jobqueue", "dask_mpi")))
