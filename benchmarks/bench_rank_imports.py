"""What a worker rank of MPI mode imports, and what importing it costs, for several checkouts.

Usage::

    python benchmarks/bench_rank_imports.py --checkout /tmp/base --checkout . --rounds 3

For each checkout (its root on ``PYTHONPATH``, its package byte-compiled first), one
``mpiexec -n 3 python -m hpcsched`` run lists the ``hpcsched`` modules a worker rank holds
after running one task; then, alternating the checkouts, each round counts the
instructions of ``python -c "import <those modules>"`` under valgrind's callgrind (the
whole process, the interpreter's own start included) and times the same line with
``python -X importtime`` (the sum of its top-level imports). The modules a rank pulls in
beside ``hpcsched`` follow from these imports; the task itself imports nothing.

The line imports them as a rank does: with the garbage collector paused
(``hpcsched/__main__.py`` pauses it until the rank has started), and with a fixed hash seed
(``PYTHONHASHSEED=0``), so that a count repeats exactly from run to run. ``--gc`` leaves
the collector running, as a plain ``import hpcsched`` in a script does.
"""

# ruff: noqa: I001 - _checkout is imported first, before anything that imports hpcsched
from __future__ import annotations

import _checkout  # noqa: F401  (first: the hpcsched measured is this checkout's)

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

SCRIPT = """\
import os, sys
from hpcsched import Client

def modules():
    return sorted(m for m in sys.modules if m == "hpcsched" or m.startswith("hpcsched."))

if __name__ == "__main__":
    with Client() as c:
        names = c.submit(modules, pure=False).result(timeout=300)
    with open(os.environ["RANK_MODULES_OUT"], "w") as f:
        f.write("\\n".join(names))
"""


def _env(checkout: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=checkout, PYTHONHASHSEED="0", **extra)
    return env


def rank_modules(checkout: str, timeout: float) -> list[str]:
    """The ``hpcsched`` modules a worker rank of ``checkout`` holds after one task."""
    with tempfile.TemporaryDirectory() as tmp:
        script, out = os.path.join(tmp, "modules.py"), os.path.join(tmp, "modules.txt")
        with open(script, "w") as f:
            f.write(SCRIPT)
        subprocess.run(["mpiexec", "-n", "3", sys.executable, "-m", "hpcsched", script],
                       env=_env(checkout, RANK_MODULES_OUT=out), cwd=tmp, check=True,
                       timeout=timeout, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(out) as f:
            return f.read().split()


def instructions(checkout: str, line: str, timeout: float) -> int:
    """Instructions of ``python -c line`` counted by callgrind."""
    done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                           sys.executable, "-c", line], env=_env(checkout), cwd="/",
                          capture_output=True, text=True, timeout=timeout, check=True)
    counted = re.findall(r"Collected : (\d+)", done.stderr)
    if not counted:
        raise RuntimeError(f"no instruction count from valgrind:\n{done.stderr}")
    return int(counted[-1])


def import_ms(checkout: str, line: str, timeout: float) -> float:
    """Milliseconds of the line's top-level imports by ``python -X importtime``."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", line], env=_env(checkout),
                          cwd="/", capture_output=True, text=True, timeout=timeout, check=True)
    total = 0
    for row in done.stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\S.*)$", row)
        if m and not m.group(2).startswith(" "):
            total += int(m.group(1))
    return total / 1000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkout", action="append", required=True,
                   help="a checkout's root (repeat; the first is the base)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--gc", action="store_true",
                   help="import with the garbage collector running (a rank pauses it)")
    args = p.parse_args()
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    for tool in ("valgrind", "mpiexec"):
        if shutil.which(tool) is None:
            p.error(f"{tool} is not on the PATH")
    checkouts = [os.path.abspath(c) for c in args.checkout]
    lines = {}
    for c in checkouts:
        if not os.path.isdir(os.path.join(c, "hpcsched")):
            p.error(f"{c} holds no hpcsched package")
        subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(c, "hpcsched")],
                       check=True, stdout=subprocess.DEVNULL)
        names = rank_modules(c, args.timeout)
        lines[c] = ("" if args.gc else "import gc; gc.disable(); ") + "import " + ", ".join(names)
        print(f"{c}: a worker rank holds {len(names)} hpcsched modules", flush=True)
        instructions(c, lines[c], args.timeout)  # a first run: nothing left to compile
    counts: dict[str, list[int]] = {c: [] for c in checkouts}
    times: dict[str, list[float]] = {c: [] for c in checkouts}
    for r in range(args.rounds):
        for c in checkouts if r % 2 == 0 else checkouts[::-1]:
            counts[c].append(instructions(c, lines[c], args.timeout))
            times[c].append(import_ms(c, lines[c], args.timeout))
            print(f"round {r} {c}: {counts[c][-1]:,} instructions, {times[c][-1]:.1f} ms",
                  flush=True)
    base = statistics.median(counts[checkouts[0]])
    print(f"{'checkout':40}{'instructions (median)':>24}{'change':>9}{'importtime ms (best)':>22}")
    for c in checkouts:
        med = statistics.median(counts[c])
        print(f"{c:40}{med:24,.0f}{100 * (med / base - 1):8.1f}%{min(times[c]):22.1f}")


if __name__ == "__main__":
    main()
