"""Nothing leaks: cancel every batch job a cluster submitted, whatever ends the client.

Each cluster registers one cleanup (a :class:`weakref.finalize`, which also runs
at interpreter exit) holding only what cancelling needs -- the batch system
adapter, the set of live job ids, the secret file and the scheduler -- never the
cluster, so garbage collection of the cluster runs it too. A cluster whose scheduler
keeps a journal registers :func:`leave_for_restart` instead: only its ``close()``
cancels its jobs; otherwise they wait for a restart, bounded by their workers'
``worker.scheduler-reconnect-timeout``.

Signals (handlers installed once, from the main thread only, chained to the
handlers found there):

* SIGTERM: cancel every live cluster's jobs, then do what the previous handler
  did (call it; or, for the default action, restore it and re-raise the signal
  so the process still dies of SIGTERM);
* SIGINT: when the handler is Python's (``KeyboardInterrupt``) or the program's
  own, it is left in place: the jobs are cancelled at interpreter exit if the
  interrupt ends the program, and an interrupt the program survives (a notebook cell
  interrupted) keeps the cluster. When SIGINT would kill the process outright
  (``SIG_DFL``), a handler of ours cancels first.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

from hpcsched.core.comm.base import Security
from hpcsched.core.comm.scheduler_file import write_secret_file

logger = logging.getLogger(__name__)

_finalizers: set[weakref.finalize] = set()
_lock = threading.RLock()  # a signal may arrive while the main thread holds it
_previous: dict[int, Any] = {}


def cancel_all_live(system: Any, live_ids: set[str], secret_file: str | None,
                    scheduler: Any) -> None:
    """Cancel ``live_ids`` with ``system``, remove the secret, close the scheduler.

    Runs from ``close()``, a finalizer, ``atexit`` or a signal handler: never raises.
    """
    ids = sorted(live_ids)
    if ids:
        try:
            system.cancel(ids)
            live_ids.difference_update(ids)
        except BaseException as e:  # noqa: BLE001 - last line of defence, report and go on
            _report(f"hpcsched: could not cancel batch jobs {' '.join(ids)}: {e}")
    if secret_file:
        try:
            os.unlink(secret_file)
        except FileNotFoundError:
            pass
        except OSError as e:
            _report(f"hpcsched: could not remove secret file {secret_file}: {e}")
    if scheduler is not None:
        try:
            scheduler.close(timeout=2)
        except BaseException as e:  # noqa: BLE001
            _report(f"hpcsched: closing the scheduler failed: {e}")


def leave_for_restart(scheduler: Any) -> None:
    """A journaled cluster's process ends without ``close()``: its jobs are left running
    and its scheduler stops without closing their workers, which wait
    ``worker.scheduler-reconnect-timeout`` for a cluster made again with the journal (it
    adopts them), then exit, which ends their jobs. Never raises."""
    try:
        scheduler.close(timeout=2, detach=True)
    except BaseException as e:  # noqa: BLE001
        _report(f"hpcsched: stopping the scheduler failed: {e}")


def _report(msg: str) -> None:
    try:
        logger.error(msg)
    except Exception:  # logging torn down at exit
        print(msg, file=sys.stderr)


def register(owner: object, fn: Callable[..., None], *args: Any) -> weakref.finalize:
    """Run ``fn(*args)`` when ``owner`` is collected, at exit, or on SIGTERM."""
    fin = weakref.finalize(owner, _run_and_forget, fn, *args)
    with _lock:
        _finalizers.add(fin)
    install_signal_handlers()
    return fin


def _run_and_forget(fn: Callable[..., None], *args: Any) -> None:
    fn(*args)


def unregister(fin: weakref.finalize) -> None:
    with _lock:
        _finalizers.discard(fin)


def run_all() -> None:
    """Run every registered cleanup now (each runs at most once)."""
    with _lock:
        fins = list(_finalizers)
        _finalizers.clear()
    for fin in fins:
        fin()


def _handler(signum: int, frame: Any) -> None:
    previous = _previous.get(signum, signal.SIG_DFL)
    run_all()
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def install_signal_handlers() -> None:
    """Install the SIGTERM/SIGINT handlers once (main thread only; elsewhere: no-op)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGTERM, signal.SIGINT):
        current = signal.getsignal(signum)
        if current is _handler:
            continue
        if current == signal.SIG_IGN:
            continue  # the program chose to ignore it: so do we
        if signum == signal.SIGINT and callable(current):
            # Python's KeyboardInterrupt (or the program's own handler) already ends the
            # program through the interpreter's exit, where the cleanups run; a handler of
            # ours would only forward it and put its own frame at the end of the traceback
            continue
        _previous[signum] = current if current is not None else signal.SIG_DFL
        signal.signal(signum, _handler)


def write_secret(params: dict[str, Any], cluster_id: str, security: Security,
                  cls: str) -> Any:
    """The cluster's secret in a 0600 file the workers read (a shared file system)."""
    directory = params["log_directory"]
    if params["shared_temp_directory"]:  # dask-jobqueue's place for files workers must read
        directory = os.path.abspath(os.path.expanduser(os.path.expandvars(
            params["shared_temp_directory"])))
        os.makedirs(directory, exist_ok=True)
    try:
        return write_secret_file(directory, cluster_id, security)
    except FileExistsError:
        raise RuntimeError(
            f"{cls}: the secret file of cluster {cluster_id} in {directory} is held by a live "
            "process: another cluster runs on this journal; close it first (one journal "
            "serves one cluster at a time)") from None
