"""Nothing leaks: cleanups run on garbage collection and on SIGTERM, chained to the
handler that was there before; they never raise."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time

import pytest

from hpcsched.jobqueue import cleanup
from hpcsched.jobqueue.runner import BatchCommandError


class Owner:
    pass


@pytest.fixture
def fresh_handlers():
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    saved_prev = dict(cleanup._previous)
    cleanup._previous.clear()
    yield
    for s, h in saved.items():
        signal.signal(s, h)
    cleanup._previous.clear()
    cleanup._previous.update(saved_prev)


def test_garbage_collection_runs_the_cleanup():
    calls = []
    owner = Owner()
    cleanup.register(owner, calls.append, "cancelled")
    assert calls == []
    del owner
    gc.collect()
    assert calls == ["cancelled"]


def test_sigterm_cancels_then_chains_to_the_previous_handler(fresh_handlers):
    events = []
    signal.signal(signal.SIGTERM, lambda s, f: events.append("previous"))
    owner = Owner()
    fin = cleanup.register(owner, events.append, "cancel")
    assert signal.getsignal(signal.SIGTERM) is cleanup._handler
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = time.monotonic() + 5
    while len(events) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)  # the handler runs between bytecodes of the main thread
    assert events == ["cancel", "previous"]
    assert not fin.alive  # runs once: not again at exit
    del owner


def test_sigint_with_pythons_handler_raises_keyboardinterrupt_and_keeps_the_cluster(
        fresh_handlers):
    events = []
    signal.signal(signal.SIGINT, signal.default_int_handler)
    owner = Owner()
    fin = cleanup.register(owner, events.append, "cancel")
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    assert events == [] and fin.alive  # a notebook survives an interrupted cell
    fin()
    assert events == ["cancel"]


def test_ignored_signals_stay_ignored(fresh_handlers):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    cleanup.install_signal_handlers()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN


def test_no_handlers_from_other_threads(fresh_handlers):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    t = threading.Thread(target=cleanup.install_signal_handlers)
    t.start()
    t.join()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_cancel_all_live_reports_failures_and_still_cleans_up(tmp_path, caplog):
    secret = tmp_path / "s.secret"
    secret.write_text("ab")

    class FailingSystem:
        def cancel(self, ids):
            raise BatchCommandError("scancel failed with exit status 1: slurmctld down")

    class Sched:
        closed = False

        def close(self, timeout):
            Sched.closed = True

    live = {"1", "2"}
    cleanup.cancel_all_live(FailingSystem(), live, str(secret), Sched())
    assert "could not cancel batch jobs 1 2" in caplog.text and "slurmctld down" in caplog.text
    assert live == {"1", "2"}  # still known as live
    assert not secret.exists() and Sched.closed
