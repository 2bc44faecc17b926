"""Counting a process's instructions in windows: callgrind, switched on and off from outside.

Where the wall clock of a loaded machine cannot resolve a few per cent, instructions can. The
process runs under ``valgrind --tool=callgrind --instr-atstart=no
--callgrind-out-file=OUT`` (:func:`valgrind`): uninstrumented, so that starting and
waiting cost little. :meth:`Counter.window` switches the instrumentation on with
``callgrind_control``, and at the block's end off, then has callgrind dump (which zeroes
its counts) and reads the dump's total. The process may be another (the scheduler of
bench_swarm.py) or the caller itself (rank 0 of bench_mpi.py): ``callgrind_control``
reaches it through valgrind's gdbserver either way.
"""

from __future__ import annotations

import contextlib
import glob
import re
import shutil
import subprocess
import time
from collections.abc import Iterator


def valgrind(out: str) -> list[str]:
    """The command line's prefix that runs a process under callgrind, its instrumentation
    off until a :class:`Counter` switches it on; ``out`` names the dumps (``out.1``, ...)."""
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no",
            f"--callgrind-out-file={out}"]


def missing_tools() -> list[str]:
    """The tools of this module that are not on the PATH."""
    return [t for t in ("valgrind", "callgrind_control") if shutil.which(t) is None]


class Counter:
    """Instructions of process ``pid``, which runs under callgrind (:func:`valgrind`) with
    its instrumentation off but inside :meth:`window`."""

    def __init__(self, pid: int, out: str) -> None:
        self.pid, self.out = pid, out

    def _control(self, *args: str) -> None:
        done = subprocess.run(["callgrind_control", *args, str(self.pid)],
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"callgrind_control {' '.join(args)}: {done.stderr}")

    @contextlib.contextmanager
    def window(self) -> Iterator[list[float]]:
        """Counts what the process runs inside the block: the list yielded holds the count
        and the window's seconds once the block is done."""
        counted: list[float] = []
        before = set(glob.glob(self.out + ".*"))
        self._control("--instr=on")
        t0 = time.perf_counter()
        yield counted
        self._control("--instr=off")
        seconds = time.perf_counter() - t0
        self._control("--dump")  # writes the counts since the last dump, and zeroes them
        deadline = time.monotonic() + 60
        while True:  # the dump is complete once its last line, the totals, is written
            new = sorted(set(glob.glob(self.out + ".*")) - before)
            if len(new) > 1:
                raise RuntimeError(f"callgrind wrote {new} for one dump")
            if new:
                with open(new[0]) as f:
                    totals = re.search(r"^totals: (\d+)", f.read(), re.M)
                if totals is not None:
                    counted += [int(totals.group(1)), seconds]
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"no complete callgrind dump {self.out}.* after 60 s")
            time.sleep(0.1)
