"""A worker plugin's ``transition(key, start, finish)`` hook, as distributed's
(https://distributed.dask.org/en/stable/plugins.html#worker-plugins), run the same over
TCP (LocalCluster) and under mpiexec: ``check(client, tmp_dir, add_worker)``."""

from __future__ import annotations

from typing import Any

from hpcsched import WorkerPlugin
from tests.conformance.primitives import until


class Recorder(WorkerPlugin):
    """Keeps every state change it is told of, with the thread that told it and the
    ``stimulus_id`` it came with."""

    def setup(self, worker: Any) -> None:
        self.worker = worker
        worker.conf_transitions = []

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        # "on the loop thread": the thread running the loop's iteration (a transport's
        # thread may run it, see Loop.offer)
        self.worker.conf_transitions.append((key, start, finish, self.worker.loop.on_loop(),
                                             kwargs.get("stimulus_id")))


class Failing(WorkerPlugin):
    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        raise ZeroDivisionError("a plugin's transition failed")


def logs(client: Any) -> dict:
    """worker address -> the changes its Recorder saw so far."""
    return client.run(lambda dask_worker: list(getattr(dask_worker, "conf_transitions", [])))


def chain(log: list, key: Any) -> list:
    return [(start, finish) for k, start, finish, *_ in log if k == key]


def check(client: Any, tmp_dir: str, add_worker: Any) -> None:
    client.register_plugin(Failing(), name="failing")  # first: its errors stop nothing
    client.register_plugin(Recorder(), name="recorder")
    x = client.submit(lambda: 1, pure=False)
    y = client.submit(lambda v: v + 1, x, pure=False)
    assert y.result(30) == 2

    # the worker that computed x saw it go from released to memory, each change starting
    # where the last one finished, all on its loop thread
    everything = logs(client)
    (holder,) = [w for w, log in everything.items() if ("executing", "memory") in chain(log, x.key)]
    states = chain(everything[holder], x.key)
    assert states[0][0] == "released", states
    assert all(a[1] == b[0] for a, b in zip(states, states[1:], strict=False)), states
    assert all(on_loop for *_, on_loop, _ in everything[holder]), everything[holder]
    # each change names the event that caused it: x's first, the scheduler's compute-task
    stimuli = [sid for k, *_, sid in everything[holder] if k == x.key]
    assert all(isinstance(sid, str) and sid for sid in stimuli), stimuli
    assert stimuli[0].startswith("compute-task-"), stimuli

    # released by the client: the worker drops x, and says so
    key = x.key
    del x, y
    until(lambda: chain(logs(client)[holder], key)[-1] == ("released", "forgotten"))
    assert ("memory", "released") in chain(logs(client)[holder], key)

    # unregistered: no more calls
    client.unregister_worker_plugin("recorder")
    seen = {w: len(log) for w, log in logs(client).items()}
    assert client.submit(lambda: 3, pure=False).result(30) == 3
    assert {w: len(log) for w, log in logs(client).items()} == seen
    client.unregister_worker_plugin("failing")
