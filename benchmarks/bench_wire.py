"""A message's way through the protocol, against the dict it stands for, in one run.

    python benchmarks/bench_wire.py [--messages 50000] [--repeat 3]

Per message, on the ops a task's life sends by the thousand: the sender builds the record
and encodes it (``encode``), the transport pickles and unpickles it, and the receiver
decodes it (``receive``, with its context and a stimulus id where the op is a state
machine's event):

* ``compute-task`` (scheduler -> worker, unchecked);
* ``task-finished`` (worker -> scheduler, every field checked);
* ``key-in-memory`` (scheduler -> client, unchecked, no context).

The peer is the floor: the same dict written as a literal, pickled and unpickled. Prints
ns per message for both and their ratio, best of ``--repeat``. To compare two checkouts,
run each one's copy of this script; under load, count instructions instead
of one side (``valgrind --tool=callgrind --callgrind-out-file=/dev/null python bench_wire.py
--ops task-finished --side records --messages 5000 --repeat 1``, less the same with
``--messages 0``).
"""

from __future__ import annotations

import argparse
import pickle
import time

import _checkout  # noqa: F401 - this checkout's hpcsched

from hpcsched.core.protocol import messages as pr


def _stimulus(op: str) -> str:
    return op


def compute_task(n: int) -> None:
    for i in range(n):
        msg = pr.encode(pr.ComputeTask(key=f"x-{i}", run_spec=None, priority=(0, i),
                                       duration=0.5))
        msg = pickle.loads(pickle.dumps(msg))
        pr.receive(pr.SCHEDULER_TO_WORKER, msg, _stimulus, now=1.0)


def compute_task_dict(n: int) -> None:
    for i in range(n):
        msg = {"op": "compute-task", "key": f"x-{i}", "run_spec": None, "priority": (0, i),
               "duration": 0.5}
        pickle.loads(pickle.dumps(msg))


def task_finished(n: int) -> None:
    for i in range(n):
        msg = pr.encode(pr.TaskFinished(key=f"x-{i}", nbytes=28, typename="int", start=1.0,
                                        stop=2.0, worker=""))
        msg = pickle.loads(pickle.dumps(msg))
        pr.receive(pr.WORKER_TO_SCHEDULER, msg, _stimulus, worker="tcp://w:1", now=2.0)


def task_finished_dict(n: int) -> None:
    for i in range(n):
        msg = {"op": "task-finished", "key": f"x-{i}", "nbytes": 28, "typename": "int",
               "start": 1.0, "stop": 2.0}
        pickle.loads(pickle.dumps(msg))


def key_in_memory(n: int) -> None:
    for i in range(n):
        msg = pr.encode(pr.KeyInMemory(key=f"x-{i}", type="int"))
        msg = pickle.loads(pickle.dumps(msg))
        pr.decode(pr.SCHEDULER_TO_CLIENT, msg)


def key_in_memory_dict(n: int) -> None:
    for i in range(n):
        msg = {"op": "key-in-memory", "key": f"x-{i}", "type": "int"}
        pickle.loads(pickle.dumps(msg))


CASES = {"compute-task": (compute_task, compute_task_dict),
         "task-finished": (task_finished, task_finished_dict),
         "key-in-memory": (key_in_memory, key_in_memory_dict)}


def best(fn, n: int, repeat: int) -> float:
    out = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(n)
        out = min(out, time.perf_counter() - t0)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--messages", type=int, default=50_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--ops", default=",".join(CASES))
    p.add_argument("--side", choices=("both", "records", "dict"), default="both",
                   help="run one side alone (to count its instructions)")
    a = p.parse_args()
    cases = {op: CASES[op] for op in a.ops.split(",")}
    for fn, peer in cases.values():  # first use generates each op's codec
        fn(1)
        peer(1)
    if a.messages <= 0:
        return
    if a.side != "both":
        for fn, peer in cases.values():
            (fn if a.side == "records" else peer)(a.messages)
        return
    print(f"{'op':<16}{'records ns':>12}{'dict ns':>10}{'ratio':>8}")
    for op, (fn, peer) in cases.items():
        ours = best(fn, a.messages, a.repeat) / a.messages * 1e9
        floor = best(peer, a.messages, a.repeat) / a.messages * 1e9
        print(f"{op:<16}{ours:>12.0f}{floor:>10.0f}{ours / floor:>8.2f}")


if __name__ == "__main__":
    main()
