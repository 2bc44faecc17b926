"""Nanny plugins: code that runs in the process supervising a worker, as distributed's
``NannyPlugin`` (https://distributed.dask.org/en/stable/plugins.html#nanny-plugins)::

    from hpcsched import Client, LocalCluster, NannyPlugin

    class Env(NannyPlugin):
        restart = True                        # the worker starts again, in the new env

        def setup(self, nanny):
            nanny.env["OMP_PROC_BIND"] = "close"

    with LocalCluster(n_workers=2) as cluster, Client(cluster) as client:
        client.register_plugin(Env(), name="env")

A worker process is supervised by the process that started it: a
``LocalCluster`` (``processes=True``), or ``hpcsched worker --nanny`` /
``--nworkers P``. The supervisor keeps one :class:`Nanny` per worker process:
what ``setup(nanny)`` / ``teardown(nanny)`` receive; its ``env`` is laid over
the environment of every process it starts for its worker.

How the plugin reaches the nanny. The scheduler talks to workers only, so a
nanny plugin travels as a worker plugin, :class:`NannyRelay`, which holds it
pickled. The relay's ``setup`` in the worker hands it to the supervisor over a
socket pair the supervisor opened when it started the worker (its fd number in
``HPCSCHED_NANNY_FD``) and waits for the answer; the supervisor runs
``setup(nanny=)`` and answers, then, if the plugin's ``restart`` is true,
restarts that worker process so it starts in the changed environment. So the
scheduler's bookkeeping of worker plugins gives nanny plugins their meaning:
a nanny whose worker joins later gets them (the scheduler replays them to the
new worker); ``idempotent`` and replacing by ``name`` work as for worker
plugins; ``unregister_worker_plugin(name, nanny=True)`` tears the plugin down
in each nanny. A worker restarted by its nanny finds the plugin already set up
there (same name, same pickled bytes) and is not restarted again. A nanny
tears its plugins down when it closes (its worker is stopped by the cluster,
or the supervisor ends), not when its worker process merely exits.
``Client.restart`` resets worker plugins, and leaves nanny plugins as they are.
``Client.run(nanny=True)`` takes the same link: the worker runs
:func:`run_in_nanny`, which hands the call to its nanny and returns the answer.

Answered, the nanny restarts its worker at once: the worker's own answer to
the scheduler may be lost with it, so ``register_plugin`` takes a worker that
left before answering a ``restart=True`` plugin for one restarting, and returns
once as many workers are back (as distributed's returns after the restarts).

Workers with no supervisor -- MPI ranks (``mpiexec`` started them and a rank
cannot be restarted), a plain ``hpcsched worker`` without ``--nanny``, threads
of ``LocalCluster(processes=False)`` -- refuse nanny plugins: the relay's
``setup`` raises ``RuntimeError`` saying so, which ``register_plugin`` raises.
Use a ``WorkerPlugin`` there.

Built in, as distributed's: :class:`Environ` (environment variables for the
workers) and :class:`UploadDirectory` (a local directory copied to every nanny).
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import zipfile
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from hpcsched.core.protocol.calls import call_hook, call_with
from hpcsched.core.protocol.serialize import dumps_object, loads_object

logger = logging.getLogger("hpcsched.nanny")

#: environment variable naming the worker's end of the socket pair to its nanny
ENV_FD = "HPCSCHED_NANNY_FD"


class NannyPlugin:
    """Base class of nanny plugins: override ``setup(nanny)`` and ``teardown(nanny)``;
    ``restart = True`` restarts the worker process after ``setup``."""

    restart = False
    idempotent = False

    def setup(self, nanny: Any) -> None:
        """Run in the worker's supervisor when the plugin reaches its nanny."""

    def teardown(self, nanny: Any) -> None:
        """Run when the plugin is replaced or unregistered, or the nanny closes."""


class Environ(NannyPlugin):
    """Environment variables for the worker processes (distributed's ``Environ``): set in
    each nanny's ``env``, then the workers restart to see them.

    >>> Environ({"OMP_NUM_THREADS": 1}).environ
    {'OMP_NUM_THREADS': '1'}
    """

    restart = True

    def __init__(self, environ: dict | None = None):
        self.environ = {str(k): str(v) for k, v in (environ or {}).items()}

    def setup(self, nanny: Any) -> None:
        nanny.env.update(self.environ)


class UploadDirectory(NannyPlugin):
    """A local directory copied to every nanny (distributed's ``UploadDirectory``): read
    and zipped here, unpacked into the nanny's :meth:`Nanny.directory`; ``update_path``
    puts it on the workers' ``PYTHONPATH`` (seen once they restart: ``restart=True``).
    Files under a directory named in ``skip_words``, or for which a ``skip`` function
    is true, are left out."""

    def __init__(self, path: str, restart: bool = False, update_path: bool = False,
                 skip_words: tuple = (".git", ".github", ".pytest_cache", "tests", "docs"),
                 skip: tuple = (lambda fn: os.path.splitext(fn)[1] == ".pyc",)):
        path = os.path.expanduser(path)
        self.path = os.path.split(os.path.abspath(path))[-1]
        self.restart = restart
        self.update_path = update_path
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            for root, dirs, files in os.walk(path):
                dirs[:] = [d for d in dirs if d not in skip_words]
                for name in files:
                    full = os.path.join(root, name)
                    if any(f(full) for f in skip):
                        continue
                    z.write(full, os.path.join(self.path, os.path.relpath(full, path)))
        self.data = buf.getvalue()

    def setup(self, nanny: Any) -> None:
        base = nanny.directory()
        with zipfile.ZipFile(io.BytesIO(self.data)) as z:
            z.extractall(base)
        if self.update_path:
            where = os.path.join(base, self.path)
            paths = nanny.env.get("PYTHONPATH", "").split(os.pathsep)
            nanny.env["PYTHONPATH"] = os.pathsep.join(
                dict.fromkeys(p for p in [where, *paths] if p))


def is_nanny_plugin(plugin: Any) -> bool:
    """Ours or distributed's ``NannyPlugin`` (by class name: distributed need not be
    installed)."""
    return isinstance(plugin, NannyPlugin) or any(
        c.__name__ == "NannyPlugin" for c in type(plugin).__mro__)


# ==================================================================== the worker's side
class NannyRelay:
    """The worker plugin that carries a nanny plugin to the worker's supervisor."""

    in_nanny = True  # Client.restart resets worker plugins, not the nanny's

    def __init__(self, name: str, plugin: Any):
        self.name = name
        self.blob = dumps_object(plugin)
        self.restart = bool(getattr(plugin, "restart", False))
        self.idempotent = bool(getattr(plugin, "idempotent", False))

    def setup(self, worker: Any) -> None:
        link = supervisor_link()
        if link is None:
            raise RuntimeError(
                f"nanny plugin {self.name!r}: worker {getattr(worker, 'address', '')} has no "
                "nanny: MPI ranks are started by mpiexec and a rank cannot be restarted; "
                "a plain `hpcsched worker` (without --nanny) and the threads of "
                "LocalCluster(processes=False) have no supervising process either. "
                "Use a WorkerPlugin there")
        link.request(("plugin-add", self.name, self.blob))

    def teardown(self, worker: Any) -> None:
        # a worker that is closing (its nanny restarts it, or it leaves) keeps the plugin
        # in its nanny: the nanny tears its plugins down when it closes itself
        closing = getattr(worker, "wait_closed", None)
        if closing is not None and closing(0):
            return
        link = supervisor_link()
        if link is not None:
            link.request(("plugin-remove", self.name))


def run_in_nanny(call: bytes, dask_worker: Any = None) -> Any:
    """``Client.run(nanny=True)``'s function on a worker: hand the call (``(function, args,
    kwargs)`` pickled) to this worker's nanny, which runs it and answers its result (as
    distributed runs it in the worker's ``Nanny`` process, ``dask_worker=`` being the
    nanny)."""
    link = supervisor_link()
    if link is None:
        raise RuntimeError(
            f"Client.run(nanny=True): worker {getattr(dask_worker, 'address', '')} has no "
            "nanny: MPI ranks are started by mpiexec, and a plain `hpcsched worker` "
            "(without --nanny) and the threads of LocalCluster(processes=False) have no "
            "supervising process either")
    return loads_object(link.request(("run", call)))


class SupervisorLink:
    """The worker's end of the socket pair: one request at a time, answered in order."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.lock = threading.Lock()

    def request(self, msg: tuple) -> Any:
        with self.lock:
            try:
                self.conn.send(msg)
                status, value = self.conn.recv()
            except (EOFError, OSError) as e:
                raise RuntimeError(f"the worker's nanny is gone: {e!r}") from e
        if status == "error":
            raise loads_object(value)
        return value


_link_lock = threading.Lock()
_link: list = []  # [SupervisorLink | None] once looked up


def supervisor_link() -> SupervisorLink | None:
    """This worker process's link to its nanny, or None when nothing supervises it.
    The variable is taken out of the environment, so processes this one starts do not
    mistake the fd for theirs."""
    with _link_lock:
        if not _link:
            fd = os.environ.pop(ENV_FD, None)
            link = None
            if fd is not None:
                try:
                    link = SupervisorLink(Connection(int(fd)))
                except (ValueError, OSError) as e:
                    logger.warning("%s=%r is not usable: %s", ENV_FD, fd, e)
            _link.append(link)
        return _link[0]


# ==================================================================== the supervisor's side
class Nanny:
    """The supervisor's handle on one worker process: what nanny plugins see.

    ``name`` (the worker's), ``env`` (laid over the environment of each process started
    for the worker), ``local_directory``, ``scheduler_addr``, ``process`` (the current
    ``Popen``), ``pid``, ``plugins`` (name -> plugin set up here), ``restart()`` and
    ``directory()``. ``PYTHONPATH`` in ``env`` goes before the worker's own."""

    def __init__(self, name: str, scheduler_addr: str, restart: Callable[[], None],
                 local_directory: str | None = None):
        self.name = name
        self.scheduler_addr = scheduler_addr
        self.local_directory = local_directory
        self.env: dict[str, str] = {}
        self.plugins: dict[str, Any] = {}
        self.process: subprocess.Popen | None = None
        self._blobs: dict[str, bytes] = {}
        self._restart = restart
        self._lock = threading.Lock()
        self._closed = False
        self._made: str | None = None  # a temporary directory made here: removed at close

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def restart(self) -> None:
        """Stop the worker process and start it again (in ``env`` as it is now)."""
        self._restart()

    def directory(self) -> str:
        """The nanny's directory for files: ``local_directory``, else a temporary one made
        on first use and removed when the nanny closes."""
        if self.local_directory is None:
            self.local_directory = self._made = tempfile.mkdtemp(
                prefix=f"hpcsched-nanny-{self.name}-")
        os.makedirs(self.local_directory, exist_ok=True)
        return self.local_directory

    def popen(self, cmd: list[str], env: dict[str, str], **kwargs: Any) -> subprocess.Popen:
        """Start a process for the worker, with ``env`` under this nanny's ``env`` and the
        worker's end of a new socket pair to this nanny."""
        mine, theirs = socket.socketpair()
        try:
            paths = [self.env.get("PYTHONPATH", ""), env.get("PYTHONPATH", "")]
            env = {**env, **self.env, ENV_FD: str(theirs.fileno())}
            if any(paths):
                env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
            p = subprocess.Popen(cmd, env=env, pass_fds=(theirs.fileno(),), **kwargs)
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        self.process = p
        threading.Thread(target=self._serve, args=(Connection(mine.detach()), p), daemon=True,
                         name=f"nanny {self.name} pid {p.pid}").start()
        return p

    def _serve(self, conn: Connection, p: subprocess.Popen) -> None:
        """Answer one worker process's requests until it exits (its end closes)."""
        with conn:
            while True:
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    return
                restart = False
                try:
                    reply: tuple = ("OK", None)
                    if msg[0] == "run":  # Client.run(nanny=True), see run_in_nanny
                        fn, args, kwargs = loads_object(msg[1])
                        reply = ("OK", dumps_object(call_with(fn, args, kwargs,
                                                              "dask_worker", self)))
                    else:
                        restart = self._handle(msg)
                except Exception as e:  # noqa: BLE001 - the user's plugin: its error goes back
                    logger.warning("nanny %s: %s failed: %s", self.name, msg[0], e)
                    try:
                        reply = ("error", dumps_object(e))
                    except Exception:  # noqa: BLE001 - an exception that cannot travel
                        reply = ("error", dumps_object(RuntimeError(f"{type(e).__name__}: {e}")))
                try:
                    conn.send(reply)
                except OSError:
                    return
                if restart and self.process is p:
                    # answered first: the worker reports the setup done, then leaves
                    logger.info("nanny %s: restarting its worker after a plugin's setup",
                                self.name)
                    self.restart()

    def _handle(self, msg: tuple) -> bool:
        """A plugin set up (True: restart the worker) or torn down."""
        op, name = msg[0], msg[1]
        with self._lock:
            if self._closed:
                raise RuntimeError(f"nanny {self.name} is closed")
            if op == "plugin-add" and self._blobs.get(name) == msg[2]:
                return False  # already here: this worker was restarted after its setup
            old = self.plugins.pop(name, None)
            self._blobs.pop(name, None)
            if old is not None:
                self._teardown(name, old)
            if op != "plugin-add":
                return False
            plugin = loads_object(msg[2])
            call_hook(plugin, "setup", nanny=self)
            self.plugins[name], self._blobs[name] = plugin, msg[2]
            return bool(getattr(plugin, "restart", False))

    def _teardown(self, name: str, plugin: Any) -> None:
        try:
            call_hook(plugin, "teardown", nanny=self)
        except Exception:  # noqa: BLE001 - the nanny goes on without it
            logger.exception("nanny plugin %s failed to tear down", name)

    def close(self) -> None:
        """The nanny stops supervising: its plugins are torn down."""
        with self._lock:
            self._closed = True
            plugins, self.plugins = list(self.plugins.items()), {}
            self._blobs.clear()
        for name, plugin in plugins:
            self._teardown(name, plugin)
        if self._made is not None:
            shutil.rmtree(self._made, ignore_errors=True)
