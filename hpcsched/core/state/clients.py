"""Scheduler state, continued: what clients ask for.

:class:`ClientRequests` owns the set of clients and changes tasks through the
:class:`~.tasks.TaskGraph`'s methods (same rules: events in, ``Send`` commands out, no
clock): clients come and go, submit graphs (``update-graph``: new tasks get
priorities ``(generation, -user priority, static priority from order())``), want
keys, release them, cancel them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpcsched.core.graph.dsk import GraphError, check_acyclic, gc_paused, key_split
from hpcsched.core.protocol.annotations import annotation_problem
from hpcsched.core.protocol.dispatch import Handlers
from hpcsched.core.protocol.messages import CancelledKeys, KeyInMemory
from hpcsched.core.state import events as ev
from hpcsched.core.state.model import FIRE_AND_FORGET, Outbox, Rec, TaskState
from hpcsched.core.state.placement import Placement
from hpcsched.core.state.registry import WorkerRegistry
from hpcsched.core.state.tasks import TaskGraph

Key = Any


class ClientRequests:
    """The handlers of what clients ask, and the clients connected."""

    handlers = Handlers("scheduler state (clients)")

    def __init__(self, graph: TaskGraph, registry: WorkerRegistry, placement: Placement,
                 out: Outbox):
        self.graph = graph
        self.registry = registry
        self.placement = placement
        self.out = out
        self.clients: set[str] = set()

    @handlers.on(ev.AddClient)
    def add_client(self, e: ev.AddClient) -> None:
        """A client registered."""
        self.clients.add(e.client)

    @handlers.on(ev.RemoveClient)
    def remove_client(self, e: ev.RemoveClient) -> None:
        """A client left: it wants none of its keys any more."""
        self.clients.discard(e.client)
        keys = [ts.key for ts in self.graph.tasks.values() if e.client in ts.who_wants]
        self.client_releases(ev.ClientReleasesKeys(e.client, keys, now=e.now))

    def update_graph(self, e: ev.UpdateGraph) -> None:
        """A client submitted tasks: check them, add them, make the runnable ones ready."""
        graph = self.graph
        tasks = graph.tasks
        check_update_graph(e, tasks)  # all of it, before anything changes
        generation = graph.new_generation()
        new: list[TaskState] = []
        recs: list[Rec] = []
        missing: dict[TaskState, Key] = {}
        for key, spec in e.tasks.items():
            ts = graph.promote(key)
            if ts is not None:
                if ts.state == "erred" and ts.exception_blame is None:
                    # re-submission of a failed task runs it again
                    ts.exception = None
                    ts.traceback = ts.exception_text = ""
                    graph.transition(ts, "released")
                    ts.run_spec = spec.get("run_spec", ts.run_spec)
                    ts.suspicious = 0
                    ts.erred_on = ()
                    new.append(ts)
                continue
            new.append(graph.new_task(key, spec.get("run_spec"), key_split(key)))
        for ts in new:
            spec = e.tasks[ts.key]
            for dk in spec.get("deps", ()):
                dts = tasks.get(dk)  # a task (of this graph, mostly), else an element
                if dts is None:
                    dts = graph.promote(dk)
                if dts is None:
                    missing[ts] = dk
                    continue
                ts.dependencies.add(dts)
                dts.dependents.add(ts)
                if len(ts.group.dep_keys) < 64 and dts.group is not ts.group:
                    ts.group.dep_keys.add(dk)
            ts.retries = int(e.retries.get(ts.key, 0)) if e.retries else 0
            if e.resources:
                ts.resource_restrictions = dict(e.resources)
            if e.workers:
                ts.worker_restrictions = set(e.workers)
                ts.loose_restrictions = e.allow_other_workers
        if e.annotations:
            _annotate(new, e.annotations)
        # static priorities for the new part of the graph
        static = e.static_priorities
        if static is None:
            if len(new) > 1:
                from hpcsched.core.graph.order import order

                keys = {ts.key for ts in new}
                static = order({ts.key: [d.key for d in ts.dependencies if d.key in keys]
                                for ts in new})
            else:
                static = {}
        user_priority = (e.annotations or {}).get("priority") or {}
        for i, ts in enumerate(new):
            ts.priority = (generation, -user_priority.get(ts.key, e.priority),
                           static.get(ts.key, i))
        for key in e.keys:
            ts = tasks.get(key)  # one of the tasks above, mostly, else an element
            if ts is None:
                ts = graph.promote(key)
            if ts is not None:
                ts.who_wants.add(e.client)
        for ts, dk in missing.items():
            exc = KeyError(f"task {ts.key!r} depends on {dk!r}, which the scheduler does not "
                           "hold (was its future released?)")
            recs += graph.set_erred(ts, exc, "", str(exc))
        if self.placement.rootish_policy == "mars" and self.registry.workers:
            running = [ws.address for ws in self.registry.workers.values()
                       if ws.status == "running"]
            if running:
                self.placement.plan_mars({ts.key: [d.key for d in ts.dependencies]
                                          for ts in new}, running)
        # existing wanted keys: report their state to the new client
        for key in e.keys:
            ts = tasks.get(key)
            if ts is not None and ts not in missing:
                recs += self._report_or_wake(ts, e.client)
        new_wanted = sorted((ts for ts in new if ts.state == "released" and graph.wanted(ts)),
                            key=lambda t: t.priority, reverse=True)
        recs += [(ts, "waiting") for ts in new_wanted]
        graph.transitions(recs)
        # parts of the graph no requested key needs (a dask graph is sent whole) go at once
        graph.transitions([(ts, "forgotten") for ts in new
                           if ts.state == "released" and not graph.wanted(ts)])

    @handlers.on(ev.UpdateGraph)
    def update_graph_gc_paused(self, e: ev.UpdateGraph) -> None:
        """:meth:`update_graph` with the cyclic garbage collector paused (it finds nothing in a new
        graph, and costs much on a large one)."""
        with gc_paused(len(e.tasks)):
            self.update_graph(e)

    def _report_or_wake(self, ts: TaskState, client: str) -> list[Rec]:
        if ts.state == "memory":
            self.out.send(client, KeyInMemory(ts.key, ts.typename))
        elif ts.state == "erred":
            self.graph.report_erred(ts, [client])
        elif ts.state == "released":
            return [(ts, "waiting")]
        return []

    @handlers.on(ev.ClientDesiresKeys)
    def client_desires(self, e: ev.ClientDesiresKeys) -> None:
        """A client wants ``keys``: tell it of those already done, run the released ones again."""
        recs: list[Rec] = []
        for key in e.keys:
            ts = self.graph.promote(key)
            if ts is None:
                self.out.send(e.client, CancelledKeys([key]))
                continue
            if e.fire_and_forget:
                if ts.state not in ("memory", "erred"):
                    ts.who_wants.add(FIRE_AND_FORGET)
                continue
            ts.who_wants.add(e.client)
            recs += self._report_or_wake(ts, e.client)
        self.graph.transitions(recs)

    @handlers.on(ev.RetryKeys)
    def retry(self, e: ev.RetryKeys) -> None:
        """Erred tasks run again: each key's erred dependencies first (the task that raised
        and everything that erred because of it)."""
        graph = self.graph
        again: list[TaskState] = []
        stack = [ts for ts in map(graph.promote, e.keys) if ts is not None]
        seen: set = set()
        while stack:
            ts = stack.pop()
            if ts in seen or ts.state != "erred":
                continue
            seen.add(ts)
            graph.transition(ts, "released")
            ts.exception = ts.exception_blame = None
            ts.traceback = ts.exception_text = ""
            ts.suspicious = 0
            ts.erred_on = ()
            again.append(ts)
            stack.extend(ts.dependencies)
        graph.transitions([(ts, "waiting") for ts in again if graph.wanted(ts)])

    @handlers.on(ev.ClientReleasesKeys)
    def client_releases(self, e: ev.ClientReleasesKeys) -> None:
        """A client dropped its futures to ``keys``: release those nobody wants."""
        graph = self.graph
        recs: list[Rec] = []
        for key in e.keys:
            ts = graph.tasks.get(key)
            if ts is None or e.client not in ts.who_wants:
                continue
            ts.who_wants.discard(e.client)
            if not graph.wanted(ts):
                recs.append((ts, "released"))
        graph.transitions(recs)

    @handlers.on(ev.CancelKeys)
    def cancel(self, e: ev.CancelKeys) -> None:
        """Cancel ``keys`` and their dependents, for every client."""
        send = self.out.send
        recs: list[Rec] = []
        cancelled = []
        for key in e.keys:
            ts = self.graph.promote(key)
            if ts is None:
                continue
            cancelled.append(key)
            clients = set(ts.who_wants)
            ts.who_wants.clear()
            for c in clients | {e.client}:
                send(c, CancelledKeys([key]))
            # dependents cannot run any more: cancel them too
            stack = list(ts.dependents)
            while stack:
                dts = stack.pop()
                if dts.who_wants:
                    for c in dts.who_wants:
                        send(c, CancelledKeys([dts.key]))
                    dts.who_wants.clear()
                    stack.extend(dts.dependents)
                if dts.state != "released" and (dts.state != "memory" or
                                                not self.graph.wanted(dts)):
                    # a result nobody wants any more is freed on its workers too
                    recs.append((dts, "released"))
            recs.append((ts, "released"))
        self.graph.transitions(recs)


def _annotate(new: list[TaskState], annotations: dict) -> None:
    """Per-key annotations (``dask.annotate``) override the values given for the whole call."""
    retries = annotations.get("retries") or {}
    resources = annotations.get("resources") or {}
    workers = annotations.get("workers") or {}
    loose = annotations.get("allow_other_workers") or {}
    ranks = annotations.get("ranks") or {}
    duration = annotations.get("duration") or {}
    per_node = annotations.get("ranks_per_node") or {}
    for ts in new:
        k = ts.key
        if k in retries:
            ts.retries = int(retries[k])
        if k in resources:
            ts.resource_restrictions = dict(resources[k])
        if k in workers:
            ts.worker_restrictions = set(workers[k])
        if k in loose:
            ts.loose_restrictions = bool(loose[k])
        if k in ranks:
            ts.width = int(ranks[k])
        if k in duration:
            ts.duration = float(duration[k])
        if k in per_node:
            ts.per_node = int(per_node[k])


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def check_update_graph(e: ev.UpdateGraph, known: Mapping) -> None:
    """Raise :class:`~hpcsched.core.state.events.MalformedMessage` naming the problem if
    ``update-graph`` cannot be applied whole: it is checked entirely before any state changes,
    so a rejected graph leaves the scheduler as it was."""
    bad = ev.MalformedMessage
    if not isinstance(e.tasks, dict):
        raise bad(f"update-graph: tasks must be a dict, not {type(e.tasks).__name__}")
    if not isinstance(e.keys, (list, tuple)):
        raise bad(f"update-graph: keys must be a list, not {type(e.keys).__name__}")
    if not _number(e.priority):
        raise bad(f"update-graph: priority must be a number, not {e.priority!r}")
    deps_of: dict = {}
    for key, spec in e.tasks.items():
        if not isinstance(spec, dict) or "run_spec" not in spec:
            raise bad(f"update-graph: task {key!r} has no run_spec")
        deps = spec.get("deps", ())
        if not isinstance(deps, (list, tuple, set, frozenset)):
            raise bad(f"update-graph: deps of {key!r} must be a list, not "
                      f"{type(deps).__name__}")
        for d in deps:
            try:
                hash(d)
            except TypeError:
                raise bad(f"update-graph: dependency {d!r} of {key!r} is not a key") from None
        deps_of[key] = deps
    for k in e.keys:
        try:
            hash(k)
        except TypeError:
            raise bad(f"update-graph: {k!r} is not a key") from None
    for name, table in (("retries", e.retries), ("static_priorities", e.static_priorities)):
        if table is None and name == "static_priorities":
            continue
        if not isinstance(table, dict) or not all(_number(v) for v in table.values()):
            raise bad(f"update-graph: {name} must map keys to numbers")
    if e.retries and any(v < 0 for v in e.retries.values()):
        raise bad("update-graph: retries must not be negative")
    if e.resources is not None and not (isinstance(e.resources, dict) and all(
            _number(v) for v in e.resources.values())):
        raise bad(f"update-graph: resources must map names to numbers, not {e.resources!r}")
    if e.workers is not None and not (isinstance(e.workers, (list, tuple)) and all(
            isinstance(w, (str, int)) and not isinstance(w, bool) for w in e.workers)):
        raise bad(f"update-graph: workers must be a list of addresses, names or ranks, "
                  f"not {e.workers!r}")
    if e.annotations is not None:
        if not isinstance(e.annotations, dict) or not all(
                isinstance(v, dict) for v in e.annotations.values()):
            raise bad("update-graph: annotations must map names to {key: value}")
        for name, per_key in e.annotations.items():
            for k, v in per_key.items():
                if annotation_problem(name, v) is not None:
                    raise bad(f"update-graph: annotation {name}={v!r} of {k!r} is not valid")
    # a cycle among the tasks this graph (re)defines: new ones, and erred ones submitted
    # again (they run anew with the dependencies given now); tasks held otherwise keep
    # theirs and cannot depend on new ones
    redefined = {k for k in deps_of
                 if k not in known or (known[k].state == "erred"
                                       and known[k].exception_blame is None)}
    new = {k: [d for d in deps_of[k] if d in redefined] for k in redefined}
    try:
        check_acyclic(new)
    except GraphError as err:
        raise bad(f"update-graph: {err}") from None
    for k, deps in new.items():
        if k in deps:
            raise bad(f"update-graph: {k!r} depends on itself")
