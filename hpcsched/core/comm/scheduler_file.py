"""Scheduler files and secret files: how peers elsewhere find a scheduler and its secret.

A scheduler file is JSON ``{"address": ..., "secret": <hex>}``; a secret file
holds the hex secret alone (batch jobs read it through ``HPCSCHED_SECRET_FILE``).
Both are written the same careful way, so that no other user can ever read a
secret, even for an instant:

* a fresh temporary name (random, ``O_CREAT | O_EXCL | O_NOFOLLOW``): never a
  stale file someone else prepared, never through a symbolic link;
* mode 0600 at creation and again with ``fchmod`` before a byte is written (a
  umask cannot loosen it, nor can a file that already existed);
* renamed into place, so readers see the whole file or none.

A secret file also carries a lock: its cluster holds an ``flock`` on it for as
long as the process lives. The kernel drops the lock when the process dies,
however it dies (SIGKILL included), so the next cluster that starts in the
same directory removes the secret files nobody holds (:func:`remove_stale_secrets`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from hpcsched.core.comm.base import Security

logger = logging.getLogger("hpcsched.comm")

SECRET_PREFIX = ".hpcsched-"
SECRET_SUFFIX = ".secret"
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL}


def _create_private(path: str) -> int:
    """A new file at ``path`` (``FileExistsError`` if anything is there), mode 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    return fd


def _temp_suffix() -> str:
    """Twelve random hex digits, as ``secrets.token_hex(6)``."""
    return os.urandom(6).hex()


@contextlib.contextmanager
def _private_temp(path: str) -> Iterator[tuple[int, str]]:
    """``(fd, temporary path)`` next to ``path``; removed unless renamed into place."""
    for _ in range(100):
        tmp = f"{path}.tmp-{os.getpid()}-{_temp_suffix()}"
        try:
            fd = _create_private(tmp)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(errno.EEXIST, f"cannot create a temporary file next to {path}")
    try:
        yield fd, tmp
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def write_scheduler_file(path: str, address: str, security: Security | None) -> None:
    """JSON with the address and the secret, mode 0600 from its creation."""
    import json  # here: an MPI rank imports this module but never reads a scheduler file

    data = json.dumps({"address": address, "secret": security.secret_hex() if security else ""})
    with _private_temp(path) as (fd, tmp):
        with os.fdopen(fd, "w") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


def read_scheduler_file(path: str, security: Security | None = None
                        ) -> tuple[str, Security | None]:
    import json

    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read scheduler file {path}: {e}") from e
    if not isinstance(data, dict) or "address" not in data:
        raise ValueError(f"scheduler file {path} has no address")
    if security is None and data.get("secret"):
        security = Security.from_hex(data["secret"])
    return data["address"], security


FIRST_DELAY = 0.1  # seconds between the first attempts: a restart takes about a second
MAX_DELAY = 5.0
ATTEMPT_TIMEOUT = 10.0  # seconds one attempt may take


def find_again(address: str, security: Security | None, scheduler_file: str | None,
               timeout: float, attempt: Callable[[str, Security | None, float], Any],
               retry_on: tuple[type[BaseException], ...], stopped: threading.Event
               ) -> tuple[Any, str, Security | None] | None:
    """Look for a scheduler that vanished, for ``timeout`` seconds: ``attempt(address,
    security, seconds)`` where the scheduler file says it is (re-read each time: a
    scheduler restarted elsewhere writes its new address there), else at ``address``,
    again after a backoff (from :data:`FIRST_DELAY`, doubling up to :data:`MAX_DELAY`)
    while it raises one of ``retry_on``. Returns what ``attempt`` returned, with the
    address and security that worked; None once ``stopped`` is set; past the timeout,
    ``TimeoutError`` naming the last failure."""
    deadline = time.monotonic() + timeout
    delay = FIRST_DELAY
    last: BaseException | None = None
    while not stopped.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"the scheduler did not come back within {timeout}s "
                               f"(last error: {last})")
        where, secret = address, security
        if scheduler_file:
            try:
                where, secret = read_scheduler_file(scheduler_file, security)
            except ValueError:
                pass  # not rewritten yet
        try:
            return attempt(where, secret, min(left, ATTEMPT_TIMEOUT)), where, secret
        except retry_on as e:
            last = e
            stopped.wait(min(delay, max(left, 0.0)))
            delay = min(delay * 2, MAX_DELAY)
    return None


def looks_like_scheduler_file(address: str) -> bool:
    """An address argument that names a file (``"sched.json"``, ``"~/run/sched"``), not a
    ``host:port``."""
    return (address.endswith(".json") or os.sep in address or address.startswith("~")
            or os.path.exists(address))


def wait_for_scheduler_file(path: str, timeout: float | None,
                            security: Security | None = None) -> tuple[str, Security | None]:
    """Read the scheduler file at ``path``, waiting up to ``timeout`` seconds for it to appear
    (a batch job's scheduler may start after the client), as dask's ``Client(scheduler_file=)``
    does; then an error that names the file."""
    path = os.path.expanduser(path)
    deadline = time.monotonic() + (timeout if timeout is not None else 30.0)
    delay = 0.01
    while True:
        if os.path.exists(path):
            try:
                return read_scheduler_file(path, security)
            except ValueError:
                if time.monotonic() >= deadline:  # still half-written, or not ours
                    raise
        elif time.monotonic() >= deadline:
            raise FileNotFoundError(
                f"scheduler file {path} did not appear within {timeout}s: start the scheduler "
                "with --scheduler-file pointing there, or check the path")
        time.sleep(min(delay, max(deadline - time.monotonic(), 0.001)))
        delay = min(delay * 2, 0.5)


class SecretFile:
    """A secret written for batch jobs, locked by this process while it is open."""

    def __init__(self, path: str, fd: int):
        self.path = path
        self._fd: int | None = fd

    def close(self, remove: bool = True) -> None:
        """Remove the file (by default) and drop the lock; idempotent."""
        if remove:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def __del__(self) -> None:  # the lock goes with the fd; the file is the owner's to remove
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)


def write_secret_file(directory: str, name: str, security: Security) -> SecretFile:
    """``directory/.hpcsched-<name>.secret`` holding the hex secret, mode 0600, locked by
    this process; stale secret files of dead clusters there are removed first."""
    remove_stale_secrets(directory)
    path = os.path.join(directory, f"{SECRET_PREFIX}{name}{SECRET_SUFFIX}")
    with _private_temp(path) as (fd, tmp):
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:  # a file system without locks: nobody can clean up after us
                if e.errno not in _NO_LOCKS:
                    raise
                logger.debug("no lock on %s (%s): it is removed at close only", path, e)
            os.write(fd, security.secret_hex().encode())
            os.fsync(fd)
            try:
                os.link(tmp, path)  # never replaces: a name in use is an error, not a takeover
            except FileExistsError:
                raise
            except OSError:  # a file system without hard links
                os.rename(tmp, path)
        except BaseException:
            os.close(fd)
            raise
    return SecretFile(path, fd)


def remove_stale_secrets(directory: str) -> list[str]:
    """Remove the secret files in ``directory`` that no live process holds (their cluster
    was killed before it could clean up); returns their paths."""
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        if not (name.startswith(SECRET_PREFIX) and name.endswith(SECRET_SUFFIX)):
            continue
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # gone already, or not ours to read
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)  # held: its cluster is alive (or locks are unsupported here)
            continue
        try:
            st = os.fstat(fd)
            if st.st_uid == os.getuid() and st.st_size > 0 and os.path.samestat(
                    st, os.stat(path, follow_symlinks=False)):
                os.unlink(path)
                removed.append(path)
        except OSError:
            pass
        finally:
            os.close(fd)
    if removed:
        logger.info("removed %d secret file(s) of clusters that are gone: %s", len(removed),
                    ", ".join(removed))
    return removed
