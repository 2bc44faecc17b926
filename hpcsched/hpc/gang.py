"""A gang's communicator: the MPI ranks of a task that holds many slots, among themselves.

A task submitted with ``ranks=N`` (``client.submit(f, *args, ranks=N)``) holds a slot
on each of N worker ranks at once (:mod:`hpcsched.core.state.placement` gathers them).
The scheduler sends each member the task with every member's address in order
(``compute-task``'s ``gang``); each member runs ``f(*args)`` on one of its threads, and
inside it :func:`get_task_comm` makes the members' communicator:

* **Only the members take part.** MPI-3's ``Comm.Create_group`` is collective over
  the group alone, so no other rank (busy with other tasks) is involved.
* **Rank order is member order**: the first member, whose return value is the task's
  result, is rank 0.
* **The tag** tells apart the ``Create_group`` calls of gangs formed at the same time
  (on a worker with several threads, one rank may enter two): it is a hash of the
  task's key, which every member knows and which no two running tasks share.
* **Made once for a set of members**: the scheduler names each task's communicator
  by a number (:class:`~hpcsched.core.state.tasks.GangComms`), the same for the next
  task on the same members in the same order, never for two tasks running at once; a
  member makes it (``Create_group``) when it holds none of that number, so members
  agree without a word, and the next task skips the ``Create_group`` (its messages
  among the members were most of what forming a gang cost). A rank keeps a bounded
  number of them: the scheduler tells it which to free (``Comm.Free``, local in effect)
  with its next task, and :func:`free_all` frees the rest as the rank leaves.
* **Waiting members keep their rank alive** only in collectives that release Python's
  lock while they wait: mpi4py's buffer calls (``Allreduce``, ``Bcast``...) do; its
  pickle-based ones (``allreduce``, ``bcast``...) held it in every wait measured, so the
  rank's worker cannot answer meanwhile, and a wait longer than ``mpi.rank-timeout``
  ends the job as having lost the rank.

A member that raises fails the task at once with its traceback; members blocked in a
collective waiting for it stay blocked, as MPI cannot interrupt them: the scheduler
counts each such thread lost, a worker with none left ``blocked`` (no new work) until
their part ends (see :meth:`~hpcsched.core.state.registry.WorkerRegistry.block_slot`),
and the end of the user's script
ends every rank (:mod:`hpcsched.hpc.bootstrap`): a rank with a member still inside MPI
(:func:`members_in_mpi`) leaves without ``MPI_Finalize``, which would free what that
thread is using under it (measured: heap corruption, the job aborted).

**A member computes undisturbed.** In a gang the slowest rank sets the pace of every
collective, so a delay on any one rank delays them all (the noise amplification of
Petrini et al., "The Case of the Missing Supercomputer Performance", SC'03). Each time
another thread of a worker rank wakes (the MPI progress thread's fallback poll, the
worker's loop sampling memory) it takes Python's lock from the member's thread for a
switch, which on a loaded node waits for the OS to run it. So while a member holds its
communicator the progress thread polls only every ``mpi.gang-poll`` and while a worker
runs a member its loop samples memory every ``worker.memory.gang-monitor-interval``.
A message from a peer on the same node still wakes the progress thread at once (its
doorbell); one from another node, which rings no doorbell, is seen up to
``mpi.gang-poll`` late: the scheduler's next word to a busy member, or a peer's request
for data this worker holds (lower ``mpi.gang-poll`` if gangs over several nodes hold
data that others wait for). A pending send or a message half received is polled for
at once, as always.

**MPI programs on the task's slots.** While a task with ``ranks=N`` runs, each member's
environment says how to start an MPI executable on exactly the hosts of its slots
(:func:`enter_environment`): ``HPCSCHED_MPI_PREFIX`` is the launcher's command line
(:func:`launcher_prefix`: ``srun`` inside a SLURM allocation, MPICH's ``mpiexec``
elsewhere), ``HPCSCHED_HOSTFILE`` a file naming each slot's host, one a line,
``HPCSCHED_NRANKS`` and ``HPCSCHED_GANG_MEMBER`` (this member's place, 0 the first)::

    def simulate(params):
        if os.environ["HPCSCHED_GANG_MEMBER"] == "0":
            cmd = shlex.split(os.environ["HPCSCHED_MPI_PREFIX"]) + ["./sim", params]
            return subprocess.run(cmd, check=True).returncode

    client.map(simulate, ensemble, ranks=4, ranks_per_node=2)

The variables are the process's: a worker of one thread (the usual for gangs) runs one
task at a time; with more threads, tasks running beside a gang see them too.
"""

from __future__ import annotations

import os
import tempfile
import threading
import zlib
from typing import Any

from hpcsched.core.comm.base import parse_address
from hpcsched.core.worker.context import at_task_end, current, off_loop

_made = threading.local()  # .task: the Running its .comm was made for
# members on this rank between entering Create_group and their communicator's free
_live = [0]
_live_lock = threading.Lock()


def members_in_mpi() -> int:
    """How many task threads of this rank may be inside a gang's MPI calls now."""
    return _live[0]


def _count(delta: int) -> None:
    with _live_lock:
        _live[0] += delta
    from hpcsched.hpc import mpi

    mpi.quiet(delta)  # the progress thread polls rarely while a member computes


def gang_tag(key: Any, tag_ub: int) -> int:
    """The ``Create_group`` tag of the gang running ``key``, in ``0..tag_ub``: the same on
    every member, and different for another key (but for a hash collision).

    >>> gang_tag("allreduce-1", 32767) == gang_tag("allreduce-1", 32767)
    True
    >>> gang_tag("allreduce-1", 32767) != gang_tag("allreduce-2", 32767)
    True
    """
    return zlib.crc32(repr(key).encode()) % (tag_ub + 1)


def member_ranks(gang: tuple) -> list[int]:
    """The ``COMM_WORLD`` ranks of a gang's members (``mpi://<rank>`` addresses), in order.

    >>> member_ranks(("mpi://3", "mpi://1"))
    [3, 1]
    """
    ranks = []
    for address in gang:
        scheme, location = parse_address(address)
        if scheme != "mpi":
            raise RuntimeError(
                f"get_task_comm(): the members of this task are not MPI ranks ({address!r}); "
                "a communicator exists for tasks with ranks=N in MPI mode "
                "(mpiexec -n N python -m hpcsched script.py)")
        ranks.append(int(location))
    return ranks


def get_task_comm() -> Any:
    """The mpi4py communicator of the ranks running the current task, submitted with
    ``ranks=N``: exactly those N ranks, the task's first member as rank 0.

    Call it from the task's function on every member (it is collective over them the
    first time a set of members runs a task)::

        def total(x):
            comm = hpcsched.get_task_comm()
            return comm.allreduce(x)

        client.submit(total, 1, ranks=4).result()  # 4, rank 0's return value

    The same communicator for every call within one run of the task, and for the next
    task on the same ranks: leave no message pending on it. Raises ``ValueError``
    outside a task submitted with ``ranks``.
    """
    running = current()
    if running is None or not running.gang:
        raise ValueError("get_task_comm() works only inside a task submitted with ranks=N "
                         "(e.g. client.submit(f, ranks=4)), running on an MPI worker rank")
    if getattr(_made, "task", None) is running:
        return _made.comm
    off_loop(running, "get_task_comm()")
    number, to_free = (running.lease.comm, running.lease.free_comms) if running.lease \
        else (0, ())
    _kept.free(to_free)
    comm = _kept.get(number)
    _count(1)
    if comm is None:
        try:
            comm = _create(running)
        except BaseException:
            _count(-1)
            raise
        _kept.add(number, comm)
    _made.task, _made.comm = running, comm

    def done() -> None:
        _made.task = _made.comm = None
        try:
            _kept.release(number, comm)
        finally:
            _count(-1)

    at_task_end(done)
    return comm


def _create(running: Any) -> Any:
    """``Create_group`` over the members of the task ``running``, in member order."""
    ranks = member_ranks(running.gang)
    from hpcsched.hpc.mpi_init import mpi_module

    MPI = mpi_module()
    world = MPI.COMM_WORLD
    group = world.Get_group().Incl(ranks)
    try:
        return world.Create_group(group, gang_tag(running.key, world.Get_attr(MPI.TAG_UB)))
    finally:
        group.Free()


class _Kept:
    """This rank's communicators by the scheduler's number, and which are in use (a
    number 0 is a communicator made for one task, freed when it ends)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.comms: dict[int, Any] = {}
        self.users: dict[int, int] = {}
        self.doomed: set[int] = set()  # to free once not in use

    def get(self, number: int) -> Any:
        with self.lock:
            comm = self.comms.get(number) if number else None
            if comm is not None:
                self.users[number] = self.users.get(number, 0) + 1
            return comm

    def add(self, number: int, comm: Any) -> None:
        if number:
            with self.lock:
                self.comms[number] = comm
                self.users[number] = self.users.get(number, 0) + 1

    def release(self, number: int, comm: Any) -> None:
        if not number:
            comm.Free()
            return
        with self.lock:
            self.users[number] -= 1
            if self.users[number] or number not in self.doomed:
                return
            self._drop(number)

    def free(self, numbers: Any) -> None:
        if not numbers:
            return
        with self.lock:
            for number in numbers:
                if self.users.get(number):
                    self.doomed.add(number)  # a member still in an earlier task's tail
                elif number in self.comms:
                    self._drop(number)

    def free_all(self) -> None:
        with self.lock:
            for number in [n for n in self.comms if not self.users.get(n)]:
                self._drop(number)

    def _drop(self, number: int) -> None:
        self.doomed.discard(number)
        self.users.pop(number, None)
        self.comms.pop(number).Free()


_kept = _Kept()


def free_all() -> None:
    """Free the communicators this rank keeps for gangs and no task uses (before
    ``MPI_Finalize``, which would otherwise find them still allocated)."""
    _kept.free_all()


def launcher_prefix(hosts: list[str], environ: Any, hostfile: str) -> str:
    """The command line that starts one process on each of ``hosts`` (one entry a slot,
    repeated for several slots of one host): ``srun`` inside a SLURM allocation (placing
    each task on its slot's host through ``hostfile``, and sharing the cores the workers'
    own step holds: ``--overlap``; the node list names each task's node in order, as
    ``--distribution=arbitrary`` wants one entry a task), MPICH's ``mpiexec`` elsewhere.

    >>> launcher_prefix(["n1", "n1", "n2"], {}, "/tmp/h")
    'mpiexec -n 3 -hosts n1:2,n2:1'
    >>> launcher_prefix(["n1", "n2", "n1"], {"SLURM_JOB_ID": "7"}, "/tmp/h")
    'srun --overlap -N 2 -n 3 --nodelist=n1,n2,n1 --distribution=arbitrary'
    """
    counts: dict[str, int] = {}
    for host in hosts:
        counts[host] = counts.get(host, 0) + 1
    if environ.get("SLURM_JOB_ID"):
        return (f"srun --overlap -N {len(counts)} -n {len(hosts)} "
                f"--nodelist={','.join(hosts)} --distribution=arbitrary")
    return f"mpiexec -n {len(hosts)} -hosts " + ",".join(f"{h}:{n}" for h, n in counts.items())


_env_lock = threading.Lock()


def enter_environment(gang: tuple, lease: Any) -> None:
    """The current task holds ``gang``'s slots (``lease.hosts`` their hosts): set its
    launcher environment (see the module's docstring) until it ends on this thread."""
    hosts = list(lease.hosts)
    if len(hosts) != len(gang):
        return  # a scheduler that did not say where the members are
    fd, hostfile = tempfile.mkstemp(prefix="hpcsched-hosts-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        f.write("".join(f"{h}\n" for h in hosts))
    running = current()
    address = getattr(running.worker, "address", None) if running is not None else None
    env = {"HPCSCHED_HOSTFILE": hostfile, "HPCSCHED_NRANKS": str(len(hosts)),
           "HPCSCHED_MPI_PREFIX": launcher_prefix(hosts, os.environ, hostfile),
           "HPCSCHED_GANG_MEMBER": str(gang.index(address) if address in gang else -1)}
    if os.environ.get("SLURM_JOB_ID"):
        env["SLURM_HOSTFILE"] = hostfile  # srun --distribution=arbitrary reads it
    with _env_lock:
        saved = {name: os.environ.get(name) for name in env}
        os.environ.update(env)

    def restore() -> None:
        with _env_lock:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        try:
            os.unlink(hostfile)
        except OSError:
            pass

    at_task_end(restore)
