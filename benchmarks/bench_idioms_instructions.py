"""bench_idioms.py's idioms counted in instructions per call, for several checkouts in one run.

Usage::

    python benchmarks/bench_idioms_instructions.py --checkout /tmp/base --checkout . \\
        [--calls 3000] [--repeat 3] [--only map|submit]

Where the wall clock of a loaded machine cannot resolve a microsecond per call, and the
CPU time of the processes only a tick, instructions can. For each checkout (its root on
``PYTHONPATH``, its package byte-compiled first) one process runs under valgrind's
callgrind with instrumentation off: it starts a ``LocalCluster`` of 2 worker processes of
1 thread with the client in it (as bench_idioms.py does), warms up, then runs each idiom
of bench_idioms.py ``--repeat`` times (``--calls`` calls of ``inc`` each) with callgrind's
instrumentation switched on around each run (``callgrind_control -i on``, a dump, ``-i
off``; https://valgrind.org/docs/manual/cl-manual.html#cl-manual.callgrind_control).
Callgrind counts that process: the client and the scheduler's thread (the workers run
natively). The same switching around no work is subtracted. Each figure is the median of
the runs, in instructions per call, and over its road's gather in the same checkout.
"""

# ruff: noqa: I001 - _checkout is imported first, before anything that imports hpcsched
from __future__ import annotations

import _checkout  # noqa: F401  (first: the hpcsched measured is this checkout's)

import argparse
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

GATHER = {"map": "gather(map(...))", "submit": "gather([submit(...) ...])"}


def _control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(os.getpid())], check=True,
                   capture_output=True, timeout=600)


def one(calls: int, repeat: int, only: list[str] | None) -> None:
    """``--one``: this process, under callgrind, runs the idioms (instrumented one by one)."""
    import bench_idioms
    import hpcsched
    from hpcsched import Client, LocalCluster

    assert os.path.dirname(os.path.dirname(hpcsched.__file__)) == os.environ["PYTHONPATH"]
    rows = {name: (kind, fn) for name, (kind, fn) in bench_idioms.idioms(hpcsched).items()
            if not only or kind in only}
    expected = list(range(1, calls + 1))
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, \
            Client(cluster, set_as_default=False) as client:
        for _, fn in rows.values():  # warm: functions, connections, each idiom's code
            fn(client, 64)
        for r in range(repeat):
            _control("-i", "on")
            _control("-d", f"none-{r}")
            _control("-i", "off")
            for i, (name, (_, fn)) in enumerate(rows.items()):
                _control("-i", "on")
                got = fn(client, calls)
                _control("-d", f"idiom-{i}-{r}")
                _control("-i", "off")
                assert sorted(got) == expected, f"{name}: wrong results"
    print(json.dumps(list(rows)))


def counted(checkout: str, calls: int, repeat: int, only: list[str] | None,
            timeout: float) -> dict[str, list[int]]:
    """Instructions of each idiom's runs with ``checkout``'s package: name -> [per run]."""
    env = dict(os.environ, PYTHONPATH=checkout)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cg.out")
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
               f"--callgrind-out-file={out}", sys.executable, os.path.abspath(__file__),
               "--one", "--calls", str(calls), "--repeat", str(repeat), "--checkout", checkout]
        for kind in only or ():
            cmd += ["--only", kind]
        done = subprocess.run(cmd, env=env, cwd=checkout, capture_output=True, text=True,
                              timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"the idioms at {checkout} failed:\n{done.stderr[-3000:]}")
        names = json.loads(done.stdout.strip().splitlines()[-1])
        parts: dict[str, int] = {}
        for path in glob.glob(out + ".*"):
            text = open(path).read()
            trigger = re.search(r"^desc: Trigger: Client Request: (\S+)$|^desc: Trigger: "
                                r"dump (\S+)$", text, re.M)
            total = re.search(r"^totals: (\d+)$", text, re.M)
            if trigger and total:
                parts[trigger.group(1) or trigger.group(2)] = int(total.group(1))
    none = statistics.median(parts[f"none-{r}"] for r in range(repeat))
    return {name: [parts[f"idiom-{i}-{r}"] - none for r in range(repeat)]
            for i, name in enumerate(names)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkout", action="append", required=True,
                   help="a checkout's root (repeat; the first is the base)")
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--repeat", type=int, default=3, help="runs of each idiom, median kept")
    p.add_argument("--only", action="append", choices=("map", "submit"),
                   help="only the idioms of this road (repeatable)")
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.calls < 64 or args.repeat < 1:
        p.error("--calls must be at least 64 (a bulk map) and --repeat at least 1")
    if args.one:
        # the checkout measured, not this file's (which _checkout put first), here and in
        # the workers this process starts
        checkout = os.path.abspath(args.checkout[0])
        sys.path[:0] = [os.path.join(checkout, "benchmarks"), checkout]
        os.environ["PYTHONPATH"] = checkout
        one(args.calls, args.repeat, args.only)
        return
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        p.error("valgrind and callgrind_control are not on the PATH")
    checkouts = [os.path.abspath(c) for c in args.checkout]
    runs = {}
    for c in checkouts:
        subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(c, "hpcsched")],
                       check=True, stdout=subprocess.DEVNULL)
        runs[c] = counted(c, args.calls, args.repeat, args.only, args.timeout)
        print(f"counted {c}", file=sys.stderr, flush=True)
    import bench_idioms

    kinds = {name: kind for name, (kind, _) in bench_idioms.idioms(None).items()}
    print(f"{args.calls} calls of inc; instructions per call in the client's process (client "
          f"and scheduler), median of {args.repeat} runs; 'of gather': the road's gather's "
          "over the idiom's (as a rate)")
    print(f"{'idiom':50}" + "".join(f"{os.path.basename(c)[:14]:>16}{'of gather':>10}"
                                    for c in checkouts))
    for name in runs[checkouts[0]]:
        line = f"{name:50}"
        for c in checkouts:
            per = statistics.median(runs[c][name]) / args.calls
            base = statistics.median(runs[c][GATHER[kinds[name]]]) / args.calls
            line += f"{per:16,.0f}{base / per:9.2f}x"
        print(line, flush=True)


if __name__ == "__main__":
    main()
