"""Shared core of the PBS and LSF command emulators: the job store and the job runner.

Neither PBS nor LSF can be installed on the development machine, so ``qsub``/``qstat``/
``qdel`` and ``bsub``/``bjobs``/``bkill`` are emulated by small scripts (``pbs/bin``,
``lsf/bin``) that share this module. The rules of this file:

* All state lives in one directory, named by ``HPCSCHED_EMU_STATE``. Each job (and each
  array subjob) is one JSON file ``jobs/<key>.json`` (key ``"12"`` or ``"12_3"``), always
  written atomically (temporary file + ``os.replace``). Read-modify-write cycles and job-id
  allocation (file ``seq``) happen under an ``fcntl`` lock on the file ``lock``.
* Every job really runs. The submit command stores the record and starts one detached
  *supervisor* per job (``python emucore.py supervise STATE KEY``, a new session). The
  supervisor waits while the job must stay pending, starts the script in its own process
  group, enforces the walltime (first signal, grace period, SIGKILL), honours kill requests
  written by ``qdel``/``bkill``, kills whatever is left of the job's process group when the
  script ends, records exit status and end time, and exits. Nothing keeps running after a
  job ends.
* Pending jobs: a file ``hold`` in the state directory keeps every job queued (``Q`` /
  ``PEND``) until it is removed; ``HPCSCHED_EMU_HOLD=1`` at submit time creates that file.
  ``HPCSCHED_EMU_MAX_RUNNING=N`` at submit time (or a file ``max_running`` holding N) lets
  at most N jobs run at once, first come first served. Supervisors poll every 0.1 s.
* The grace period between the polite signal and SIGKILL is ``HPCSCHED_EMU_KILL_GRACE``
  seconds (default 1.0; the real systems use 10 s: PBS ``kill_delay``, LSF
  ``JOB_TERMINATE_INTERVAL``). ``HPCSCHED_EMU_TIME_SCALE`` (default 1.0) multiplies every
  walltime, so a test can give LSF's one-minute minimum ``-W 1`` a one-second life.

The system modules (``pbs_cli``, ``lsf_cli``) decide what a record contains and how it is
displayed; this module only knows the generic fields listed in :func:`new_record`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

STATE_ENV = "HPCSCHED_EMU_STATE"
HOLD_ENV = "HPCSCHED_EMU_HOLD"
MAX_RUNNING_ENV = "HPCSCHED_EMU_MAX_RUNNING"
GRACE_ENV = "HPCSCHED_EMU_KILL_GRACE"
TIME_SCALE_ENV = "HPCSCHED_EMU_TIME_SCALE"
POLL = 0.1

# generic job states; each system maps them to its own letters/words
QUEUED, HELD, RUNNING, EXITING, FINISHED = "queued", "held", "running", "exiting", "finished"
ACTIVE = (QUEUED, HELD, RUNNING, EXITING)


class EmulatorError(Exception):
    """A command fails: ``message`` goes to stderr, ``code`` is the exit status."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def hostname() -> str:
    return socket.gethostname().split(".")[0]


def username() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def state_dir(command: str) -> Path:
    """The state directory from ``HPCSCHED_EMU_STATE`` (created if missing)."""
    value = os.environ.get(STATE_ENV)
    if not value:
        raise EmulatorError(
            f"{command}: {STATE_ENV} is not set (it names the emulator's state directory)", 1
        )
    root = Path(value)
    (root / "jobs").mkdir(parents=True, exist_ok=True)
    return root


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class Store:
    """The job records of one state directory."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.jobs = self.root / "jobs"
        self.jobs.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        with open(self.root / "lock", "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def next_seq(self) -> int:
        """Allocate the next job sequence number; call with the lock held."""
        path = self.root / "seq"
        seq = int(path.read_text()) + 1 if path.exists() else 1
        write_atomic(path, str(seq))
        return seq

    def load(self, key: str) -> dict | None:
        try:
            return json.loads((self.jobs / f"{key}.json").read_text())
        except FileNotFoundError:
            return None

    def save(self, rec: dict) -> None:
        write_atomic(self.jobs / f"{rec['key']}.json", json.dumps(rec, indent=1))

    def update(self, key: str, **changes: object) -> dict:
        with self.locked():
            rec = self.load(key)
            if rec is None:
                raise KeyError(key)
            rec.update(changes)
            self.save(rec)
            return rec

    def records(self) -> list[dict]:
        """All records (parents and subjobs), in submission order."""
        out = []
        for path in self.jobs.glob("*.json"):
            try:
                out.append(json.loads(path.read_text()))
            except (FileNotFoundError, json.JSONDecodeError):
                continue
        out.sort(key=lambda r: (r["seq"], -1 if r["index"] is None else r["index"]))
        return out

    def hold_active(self) -> bool:
        return (self.root / "hold").exists()

    def file_max_running(self) -> int | None:
        try:
            return int((self.root / "max_running").read_text().strip())
        except (FileNotFoundError, ValueError):
            return None


def new_record(system: str, seq: int, index: int | None, **fields: object) -> dict:
    """A job record with the generic fields the runner uses.

    ``run`` (set by the system module) holds: ``argv``, ``cwd``, ``env``, ``stdout``,
    ``stderr`` (None: merged into stdout), ``stdout_mode``/``stderr_mode`` (``"a"``/``"w"``),
    ``files`` (path -> content written before the start), ``kill_signals`` (reason ->
    signal names), ``walltime`` (seconds or None).
    """
    rec: dict = {
        "system": system,
        "key": str(seq) if index is None else f"{seq}_{index}",
        "seq": seq,
        "index": index,
        "array": False,
        "state": QUEUED,
        "user_hold": False,
        "max_running": None,
        "kill": None,
        "never_ran": False,
        "submit_time": time.time(),
        "start_time": None,
        "end_time": None,
        "exit_code": None,
        "signal": None,
        "term_reason": None,
        "cput": 0.0,
        "pid": None,
        "supervisor_pid": None,
        "run": {},
    }
    rec.update(fields)
    return rec


def submit_env_settings(store: Store) -> int | None:
    """Apply ``HPCSCHED_EMU_HOLD`` (creates the hold file); return ``HPCSCHED_EMU_MAX_RUNNING``."""
    if os.environ.get(HOLD_ENV, "") not in ("", "0"):
        (store.root / "hold").touch()
    value = os.environ.get(MAX_RUNNING_ENV, "")
    return int(value) if value.isdigit() and int(value) > 0 else None


# ---------------------------------------------------------------------------------------
# process helpers


def pid_alive(pid: int | None, marker: str | None = None) -> bool:
    """True if ``pid`` is a live (non-zombie) process; with ``marker``, only if its
    command line contains it (guards against pid reuse)."""
    if not pid:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] in ("Z", "X"):
            return False
        if marker is not None:
            return marker in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        return True
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def killpg(pgid: int | None, sig: int) -> None:
    if pgid:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)


def spawn_supervisor(store: Store, key: str) -> None:
    """Start the detached supervisor of job ``key`` and record its pid."""
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "supervise", str(store.root), key],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(store.root / "supervisor.log", "ab"),  # noqa: SIM115 - child keeps it
        start_new_session=True,
        close_fds=True,
    )
    store.update(key, supervisor_pid=proc.pid)


# ---------------------------------------------------------------------------------------
# deleting jobs (qdel / bkill)


def request_kill(store: Store, key: str) -> str:
    """Ask for job ``key`` to be killed. Returns the state it was in.

    A pending job finishes at once (it never ran); a running job gets a kill request
    that its supervisor carries out within one poll period. If the supervisor is gone
    the processes are killed here.
    """
    with store.locked():
        rec = store.load(key)
        if rec is None:
            raise KeyError(key)
        state = rec["state"]
        if state in (QUEUED, HELD):
            rec.update(state=FINISHED, kill="delete", term_reason="delete", never_ran=True,
                       end_time=time.time())
        elif state in (RUNNING, EXITING) and rec["kill"] is None:
            rec["kill"] = "delete"
        store.save(rec)
    if state in (RUNNING, EXITING) and not pid_alive(rec["supervisor_pid"], "emucore"):
        killpg(rec["pid"], signal.SIGKILL)
        store.update(key, state=FINISHED, term_reason="delete", end_time=time.time(),
                     signal=signal.SIGKILL)
    return state


# ---------------------------------------------------------------------------------------
# the supervisor


def _eligible(store: Store, rec: dict) -> bool:
    if rec["user_hold"] or store.hold_active():
        return False
    limit = rec["max_running"] or store.file_max_running()
    array_limit = rec.get("array_limit")
    if limit is None and array_limit is None:
        return True
    others = [r for r in store.records() if not r["array"] and r["key"] != rec["key"]]
    if array_limit is not None:
        # LSF "name[1-10]%2": at most 2 elements of this array run at once
        same = [r for r in others if r["seq"] == rec["seq"]]
        if sum(1 for r in same if r["state"] in (RUNNING, EXITING)) >= array_limit:
            return False
        if limit is None:
            return True
    running = sum(1 for r in others if r["state"] in (RUNNING, EXITING))
    order = (rec["seq"], rec["index"] or 0)
    ahead = sum(
        1 for r in others
        if r["state"] == QUEUED and not r["user_hold"] and (r["seq"], r["index"] or 0) < order
    )
    return running + ahead < limit


def _wait_for_start(store: Store, key: str) -> dict | None:
    while True:
        with store.locked():
            rec = store.load(key)
            if rec is None or rec["state"] == FINISHED or rec["kill"]:
                return None
            if _eligible(store, rec):
                rec.update(state=RUNNING, start_time=time.time())
                store.save(rec)
                return rec
            pending = HELD if rec["user_hold"] else QUEUED
            if rec["state"] != pending:
                rec["state"] = pending
                store.save(rec)
        time.sleep(POLL)


def _open_outputs(run: dict) -> tuple[object, object]:
    def opener(path: str, mode: str):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        return open(path, mode + "b")  # noqa: SIM115 - closed by the caller

    out = opener(run["stdout"], run.get("stdout_mode", "w")) if run.get("stdout") else None
    if run.get("stderr") is None:
        err = subprocess.STDOUT if out is not None else None
    else:
        err = opener(run["stderr"], run.get("stderr_mode", "w"))
    return out, err


def _start(store: Store, rec: dict) -> tuple[int, list]:
    run = rec["run"]
    for path, content in run.get("files", {}).items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(content)
    for path in run.get("mkdirs", []):
        Path(path).mkdir(parents=True, exist_ok=True)
    out, err = _open_outputs(run)
    try:
        proc = subprocess.Popen(
            run["argv"], cwd=run["cwd"], env=run["env"], stdin=subprocess.DEVNULL,
            stdout=out if out is not None else subprocess.DEVNULL,
            stderr=err if err is not None else subprocess.DEVNULL,
            start_new_session=True, close_fds=True,
        )
    except OSError as exc:
        # the real systems report a job that cannot start as an exited job
        msg = f"{run['argv'][0]}: {exc.strerror}\n".encode()
        target = err if hasattr(err, "write") else out
        if hasattr(target, "write"):
            target.write(msg)
        for fh in (out, err):
            if hasattr(fh, "close"):
                fh.close()
        return -1, [127]
    for fh in (out, err):
        if hasattr(fh, "close"):
            fh.close()
    store.update(rec["key"], pid=proc.pid)
    # Popen's own bookkeeping is bypassed: wait4 gives us the rusage too
    proc.returncode = 0  # keep Popen.__del__ from warning; we reap with os.wait4
    return proc.pid, []


def _kill_sequence(signals: list[str]) -> list[int]:
    return [getattr(signal, name) for name in signals]


def _supervise_running(store: Store, rec: dict) -> None:
    key = rec["key"]
    run = rec["run"]
    pid, early = _start(store, rec)
    if pid < 0:
        _finish(store, key, exit_code=early[0], sig=None, reason=None, cput=0.0)
        return
    grace = float(os.environ.get(GRACE_ENV, "1.0"))
    # HPCSCHED_EMU_TIME_SCALE shrinks limits for tests: LSF -W counts whole minutes
    scale = float(os.environ.get(TIME_SCALE_ENV, "1.0"))
    deadline = rec["start_time"] + run["walltime"] * scale if run.get("walltime") else None
    reason: str | None = None
    pending: list[int] = []
    next_signal_at = 0.0
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done == pid:
            break
        now = time.time()
        if reason is None:
            current = store.load(key) or {}
            if current.get("kill"):
                reason = "delete"
            elif deadline is not None and now >= deadline:
                reason = "walltime"
            if reason is not None:
                pending = _kill_sequence(run["kill_signals"][reason])
                next_signal_at = now
                store.update(key, state=EXITING, term_reason=reason)
                if reason == "walltime" and run.get("walltime_message") and run.get("stderr_file"):
                    with open(run["stderr_file"], "a") as fh:
                        fh.write(run["walltime_message"].format(used=int(now - rec["start_time"])))
        if pending and now >= next_signal_at:
            killpg(pid, pending.pop(0))
            next_signal_at = now + grace
        time.sleep(POLL)
    # the job's leftovers (background children) die with the job, as on a real node
    killpg(pid, signal.SIGKILL)
    cput = usage.ru_utime + usage.ru_stime
    if os.WIFSIGNALED(status):
        _finish(store, key, exit_code=None, sig=os.WTERMSIG(status), reason=reason, cput=cput)
    else:
        _finish(store, key, exit_code=os.WEXITSTATUS(status), sig=None, reason=reason, cput=cput)


def _finish(store: Store, key: str, exit_code: int | None, sig: int | None,
            reason: str | None, cput: float) -> None:
    rec = store.update(key, state=EXITING, exit_code=exit_code, signal=sig,
                       term_reason=reason, cput=cput, end_time=time.time())
    epilogue = rec["run"].get("epilogue")
    if epilogue:
        # the system module appends what the real system writes after a job (LSF's report)
        module = __import__(epilogue)
        module.epilogue(rec)
    for path in rec["run"].get("cleanup", []):
        with contextlib.suppress(OSError):
            Path(path).unlink()
    store.update(key, state=FINISHED)


def supervise(root: str, key: str) -> int:
    store = Store(Path(root))
    rec = _wait_for_start(store, key)
    if rec is not None:
        _supervise_running(store, rec)
    return 0


# ---------------------------------------------------------------------------------------
# used by the test helpers


def live_processes(root: Path) -> list[int]:
    """Processes still alive that belong to the state directory (supervisors and jobs)."""
    store = Store(root)
    alive = []
    for rec in store.records():
        if pid_alive(rec.get("supervisor_pid"), "emucore"):
            alive.append(rec["supervisor_pid"])
        if rec.get("pid"):
            alive.extend(group_members(rec["pid"]))
    return sorted(set(alive))


def kill_everything(root: Path, timeout: float = 5.0) -> list[int]:
    """SIGKILL every supervisor and job process of ``root``; return those still alive
    after ``timeout`` (empty on success)."""
    store = Store(root)
    deadline = time.monotonic() + timeout
    while True:
        for rec in store.records():
            if pid_alive(rec.get("supervisor_pid"), "emucore"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(rec["supervisor_pid"], signal.SIGKILL)
            if rec.get("pid"):
                killpg(rec["pid"], signal.SIGKILL)
        left = live_processes(root)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "supervise":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        sys.exit(supervise(sys.argv[2], sys.argv[3]))
    sys.exit(f"usage: {sys.argv[0]} supervise STATE_DIR KEY")
