"""Result checkpoints: a re-run with the same directory skips the tasks it finished.

A task annotated ``checkpoint=True`` (``with dask.annotate(checkpoint=True):`` around
``submit``, ``map`` or the making of a dask collection) has its result written, when it
finishes, to a file of the scheduler's checkpoint directory named after its key. A graph
that arrives holding a key whose file exists is given, for that key, a task that reads
the file instead of running (and no dependencies: what only it needed is not computed).
So a job that ran out of walltime, or died, resumes: submitted again, its checkpointed
tasks are not run again.

Where: ``J.checkpoints/`` next to the scheduler's journal ``J`` (``hpcsched scheduler
--journal J``, ``python -m hpcsched --journal J script.py`` under MPI), or the directory
given to the :class:`~hpcsched.core.scheduler.server.Scheduler`. Without one, the
annotation does nothing.

Only keys that name the same computation in the next run make sense: the keys of pure
calls (``submit``/``map`` with ``pure=True``, the default, of functions importable by
name, or defined in the script and unchanged) and of dask collections (tokens of their
inputs). A key does not say which code computed it: a file is trusted for as long as it
is there -- remove the directory when the code changes. A write cut short (the job
killed) leaves a ``*.tmp-*`` file, never read; it is not removed here, since a worker that
outlived a restarted scheduler may be writing it. The rewriting happens here, as
each graph arrives (and again when a journal restores it): the task's run spec gains a
fourth element, ``(path, key, load)``, which the worker carries out
(:mod:`hpcsched.core.worker.checkpoint`).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from hpcsched.core.protocol import messages as pr
from hpcsched.core.protocol import records
from hpcsched.core.protocol.run_spec import Checkpoint, RunSpec

logger = logging.getLogger("hpcsched.scheduler")

ANNOTATION = "checkpoint"


def next_to_journal(journal: str) -> str:
    """Where a journaled scheduler keeps checkpoints: next to its journal ``journal``."""
    return f"{journal}.checkpoints"


class Checkpoints:
    """The checkpoint directory of one scheduler (created, 0700, by the first graph that
    has a checkpointed task)."""

    def __init__(self, directory: str):
        self.directory = os.path.abspath(os.path.expanduser(directory))
        self.loaded = 0  # tasks given their checkpoint instead of running (a count to show)

    def path(self, key: Any) -> str:
        """The file of ``key``'s result (a digest of its repr: keys are strings, or tuples
        of strings and numbers, whose reprs are stable across runs)."""
        import hashlib  # here: only a job with a journal has checkpoints

        return os.path.join(self.directory,
                            hashlib.sha256(repr(key).encode()).hexdigest()[:40] + ".pkl")

    def rewrite(self, graph: pr.UpdateGraph) -> pr.UpdateGraph:
        """``graph`` with each task annotated ``checkpoint=True`` made to read its result
        (if kept) or to keep it (a new record: the one received stays as it arrived)."""
        marked = (graph.annotations or {}).get(ANNOTATION) or {}
        keys = [k for k, on in marked.items() if on and k in graph.tasks]
        if not keys:
            return graph
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        tasks = dict(graph.tasks)
        loaded = 0
        for key in keys:
            path, spec = self.path(key), tasks[key]
            run_spec = spec["run_spec"]
            if os.path.exists(path):
                tasks[key] = {"run_spec": RunSpec(None, None, checkpoint=Checkpoint(path, key, True)),
                              "deps": []}
                loaded += 1
            else:
                tasks[key] = {**spec, "run_spec": records.replace(
                    run_spec, checkpoint=Checkpoint(path, key))}
        if loaded:
            self.loaded += loaded
            logger.info("%d of %d checkpointed tasks read from %s instead of running", loaded,
                        len(keys), self.directory)
        return records.replace(graph, tasks=tasks)
