"""Run the headline benchmarks again and rewrite the head of benchmarks/RESULTS.md.

    python benchmarks/headline.py            # the full runs: about an hour on 2 cores
    python benchmarks/headline.py --quick    # fewer workers, tasks and repetitions: minutes
    python benchmarks/headline.py --plots-only   # table and plots from the last runs' JSON

Each benchmark compares hpcsched with its peer in the same run and writes its own JSON
(``--json``) into ``benchmarks/headline/``; the table and the plots are made from those
files alone, so they can be made again without running anything:

* ``bench_swarm.py``: map throughput against the number of workers (10 to 2,000), hpcsched
  and dask.distributed -> ``throughput-workers.png``;
* ``bench_efficiency.py``: efficiency against task duration (10 µs to 1 s), hpcsched,
  dask.distributed, mpi4py.futures and a process pool -> ``efficiency-duration.png``;
* ``bench_mpi.py --only throughput``: MPI mode against dask-mpi and mpi4py.futures ->
  ``mpi-mode.png``;
* ``bench_mpi.py --only transfer``: a worker-to-worker transfer against raw mpi4py
  ``Send``/``Recv`` -> ``transfers.png``.

The table between ``<!-- headline -->`` and ``<!-- /headline -->`` in RESULTS.md is
replaced; everything else in the file is left as it is. Each row carries the date, the
commit (``+`` when the work tree had changes), the load average during the run, and the
exact command. Needs ``pip install -e '.[bench,mpi]'`` (matplotlib, dask.distributed,
dask-mpi).
"""

from __future__ import annotations

# _checkout must come first, before anything imports hpcsched: not in isort's order
# ruff: noqa: I001
import _checkout  # noqa: F401 - this checkout's hpcsched, here and in what it starts

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
OUT = os.path.join(HERE, "headline")
RESULTS = os.path.join(HERE, "RESULTS.md")
BEGIN, END = "<!-- headline -->", "<!-- /headline -->"

#: name -> (full arguments, --quick arguments); each writes OUT/<name>.json
RUNS: dict[str, tuple[list[str], list[str]]] = {
    "swarm": (["bench_swarm.py", "--systems", "hpcsched,dask", "--workloads", "map",
               "--workers", "10,100,500,1000,2000", "--repeat", "1"],
              ["bench_swarm.py", "--systems", "hpcsched,dask", "--workloads", "map",
               "--workers", "10,200,1000,2000", "--repeat", "1", "--tasks", "1000",
               "--idle", "2"]),
    "efficiency": (["bench_efficiency.py"],
                   ["bench_efficiency.py", "--budget", "2", "--max-tasks", "20000"]),
    "mpi": (["bench_mpi.py", "--only", "throughput,transfer", "--sizes", "1,16,128,512"],
            ["bench_mpi.py", "--only", "throughput,transfer", "--repeat", "1",
             "--tasks", "3000", "--leaves", "1024", "--sizes", "1,16,128",
             "--transfer-reps", "3"]),
}


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.strip()


def commit() -> str:
    # the code measured: the package and the benchmarks, not the results they write
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "hpcsched", "benchmarks",
                            ":!benchmarks/RESULTS.md", ":!benchmarks/headline"],
                           cwd=REPO).returncode != 0
    return git("rev-parse", "--short", "HEAD") + ("+" if dirty else "")


def run(name: str, quick: bool) -> None:
    args = RUNS[name][1 if quick else 0]
    path = os.path.join(OUT, f"{name}.json")
    cmd = [sys.executable, os.path.join(HERE, args[0]), *args[1:], "--json", path]
    shown = "python benchmarks/" + " ".join(args)
    load0 = os.getloadavg()[0]
    measured = commit()  # the code measured: as the run starts
    t0 = time.time()
    print(f"== {shown}", file=sys.stderr, flush=True)
    subprocess.run(cmd, cwd=REPO, check=True)
    meta = {"command": shown, "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime(t0)) + " UTC",
            "minutes": round((time.time() - t0) / 60, 1), "commit": measured,
            "load": [round(load0, 1), round(os.getloadavg()[0], 1)], "quick": quick,
            "cpus": os.cpu_count()}
    with open(os.path.join(OUT, f"{name}.meta.json"), "w") as f:
        json.dump(meta, f, indent=1)


def load(name: str) -> tuple[object, dict]:
    with open(os.path.join(OUT, f"{name}.json")) as f:
        data = json.load(f)
    with open(os.path.join(OUT, f"{name}.meta.json")) as f:
        return data, json.load(f)


# ---------------------------------------------------------------------- figures
def swarm_rates(rows: list[dict]) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for r in rows:
        if r.get("map_per_s"):
            out.setdefault(r["system"], {})[r["workers"]] = float(r["map_per_s"])
    return out


def efficiency_curves(data: dict) -> dict[str, dict[float, float]]:
    out: dict[str, dict[float, float]] = {}
    for r in data["rows"]:
        out.setdefault(r["system"], {})[r["duration"]] = r["efficiency"]
    return out


def mpi_rates(data: dict) -> dict[str, dict[str, float]]:
    return {s: {w: r[f"{w}_tasks"] / r[f"{w}_s"] for w in ("map", "tree")}
            for s, r in data["throughput"].items()}


def transfer_rates(data: dict) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for mib, r in data["transfer"].items():
        for k, v in r.items():
            if k != "reps":
                out.setdefault(k, {})[int(mib)] = int(mib) * 2**20 / v / 1e9
    return out


def plots(figures: dict) -> list[tuple[str, str]]:
    """Draw the plots into OUT; (file name, caption) each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []

    def save(fig, name: str, caption: str, meta: dict) -> None:
        fig.text(0.99, 0.01, f"{meta['date']}, {meta['commit']}, load {meta['load'][0]}"
                 f"-{meta['load'][1]} on {meta['cpus']} cores"
                 + (", --quick" if meta["quick"] else ""), ha="right", fontsize=7,
                 color="gray")
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        fig.savefig(os.path.join(OUT, name), dpi=110)
        plt.close(fig)
        made.append((name, caption))

    if "swarm" in figures:
        rows, meta = figures["swarm"]
        fig, ax = plt.subplots(figsize=(6, 4))
        for system, pts in swarm_rates(rows).items():
            xs = sorted(pts)
            ax.plot(xs, [pts[x] for x in xs], marker="o", label=system)
        ax.set(xscale="log", yscale="log", xlabel="workers (one thread each, over TCP)",
               ylabel="no-op tasks per second (map)", title="Throughput against workers")
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)
        save(fig, "throughput-workers.png", "Map throughput against the number of workers",
             meta)
    if "efficiency" in figures:
        data, meta = figures["efficiency"]
        fig, ax = plt.subplots(figsize=(6, 4))
        for system, pts in efficiency_curves(data).items():
            xs = sorted(pts)
            ax.plot(xs, [pts[x] for x in xs], marker="o", label=system)
        ax.set(xscale="log", ylim=(0, 1.15), xlabel="task duration (s)",
               ylabel="efficiency (ideal time / measured)",
               title=f"Efficiency against task duration, {data['workers']} workers")
        ax.axhline(0.9, color="gray", lw=0.8, ls="--")
        ax.legend(fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
        save(fig, "efficiency-duration.png", "Efficiency against task duration", meta)
    if "mpi" in figures:
        data, meta = figures["mpi"]
        rates = mpi_rates(data)
        fig, ax = plt.subplots(figsize=(6, 4))
        systems = list(rates)
        width = 0.8 / len(systems)
        for i, s in enumerate(systems):
            ax.bar([j + i * width for j in range(2)], [rates[s]["map"], rates[s]["tree"]],
                   width, label=s)
        ax.set_xticks([j + width * (len(systems) - 1) / 2 for j in range(2)],
                      ["map of no-op tasks", "tree reduction (one graph)"])
        ax.set(yscale="log", ylabel="tasks per second",
               title="MPI mode: mpiexec -n 4 (hpcsched: 3 worker ranks)")
        ax.legend()
        save(fig, "mpi-mode.png", "MPI mode against dask-mpi and mpi4py.futures", meta)
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, pts in transfer_rates(data).items():
            xs = sorted(pts)
            ax.plot(xs, [pts[x] for x in xs], marker="o", label=name)
        ax.set(xscale="log", xlabel="array size (MiB)", ylabel="GB/s",
               title="Worker-to-worker transfer against raw MPI")
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)
        save(fig, "transfers.png", "Transfers between worker ranks against raw mpi4py", meta)
    return made


def table(figures: dict) -> list[str]:
    lines = ["| figure | hpcsched | peer, same run | ratio | date, commit, load | command |",
             "| --- | --- | --- | --- | --- | --- |"]

    def row(what: str, ours: float, peer: float, peer_name: str, meta: dict,
            unit: str = "/s") -> None:
        when = f"{meta['date']}, {meta['commit']}, load {meta['load'][0]}-{meta['load'][1]}"
        lines.append(f"| {what} | {ours:,.0f}{unit} | {peer_name} {peer:,.0f}{unit} | "
                     f"{ours / peer:,.1f}x | {when} | `{meta['command']}` |")

    if "swarm" in figures:
        rows, meta = figures["swarm"]
        rates = swarm_rates(rows)
        both = sorted(set(rates.get("hpcsched", {})) & set(rates.get("dask", {})))
        if both:
            n = both[-1]
            row(f"map of no-op tasks, {n:,} workers over TCP", rates["hpcsched"][n],
                rates["dask"][n], "dask.distributed", meta)
    if "mpi" in figures:
        data, meta = figures["mpi"]
        rates = mpi_rates(data)
        for peer in ("dask-mpi", "mpi4py.futures"):
            if peer in rates:
                row(f"map of {data['throughput']['hpcsched']['map_tasks']:,} no-op tasks, "
                    "mpiexec -n 4", rates["hpcsched"]["map"], rates[peer]["map"], peer, meta)
        t = transfer_rates(data)
        if t:
            mib = max(t["hpcsched"])
            when = f"{meta['date']}, {meta['commit']}, load {meta['load'][0]}-{meta['load'][1]}"
            lines.append(f"| transfer of {mib} MiB between worker ranks | "
                         f"{t['hpcsched'][mib]:.2f} GB/s | raw mpi4py Recv (fresh buffer) "
                         f"{t['raw-fresh'][mib]:.2f} GB/s | "
                         f"{t['hpcsched'][mib] / t['raw-fresh'][mib]:.0%} | {when} | "
                         f"`{meta['command']}` |")
    if "efficiency" in figures:
        data, meta = figures["efficiency"]
        curves = efficiency_curves(data)
        d = 1e-3
        if d in curves.get("hpcsched", {}) and d in curves.get("dask", {}):
            when = f"{meta['date']}, {meta['commit']}, load {meta['load'][0]}-{meta['load'][1]}"
            lines.append(f"| efficiency, tasks of 1 ms on {data['workers']} workers | "
                         f"{curves['hpcsched'][d]:.0%} | dask.distributed "
                         f"{curves['dask'][d]:.0%} | | {when} | `{meta['command']}` |")
    return lines


def write_results(figures: dict, made: list[tuple[str, str]], quick: bool) -> None:
    head = [BEGIN, "", "## Today's headline figures", ""]
    if quick:
        head += ["Made with `python benchmarks/headline.py --quick` (fewer workers, tasks and "
                 "repetitions than the full runs) on a shared 2-core machine while other "
                 "work ran: the load average is in each row; the ratios, measured within "
                 "one run, are what to compare.", ""]
    else:
        head += ["Made with `python benchmarks/headline.py`; the load average during each "
                 "run is in its row.", ""]
    head += table(figures) + [""]
    for name, caption in made:
        head += [f"![{caption}](headline/{name})", ""]
    head += ["Run them again, and remake this table and the plots: `python "
             "benchmarks/headline.py` (about an hour), or `--quick` (minutes). "
             "The dated runs before these are in `benchmarks/HISTORY.md`.", "", END]
    with open(RESULTS) as f:
        text = f.read()
    if BEGIN in text and END in text:
        before, rest = text.split(BEGIN, 1)
        after = rest.split(END, 1)[1]
    else:
        before, after = text, ""
    with open(RESULTS, "w") as f:
        f.write(before + "\n".join(head) + after)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="the few minutes' version")
    p.add_argument("--plots-only", action="store_true",
                   help="no runs: the table and the plots from benchmarks/headline/*.json")
    p.add_argument("--only", default=",".join(RUNS), help="runs to make (comma-separated)")
    args = p.parse_args()
    os.makedirs(OUT, exist_ok=True)
    names = [n for n in args.only.split(",") if n]
    for n in names:
        if n not in RUNS:
            p.error(f"unknown run {n!r}: choose among {', '.join(RUNS)}")
    if not args.plots_only:
        for name in names:
            run(name, args.quick)
    figures = {n: load(n) for n in RUNS if os.path.exists(os.path.join(OUT, f"{n}.meta.json"))}
    if not figures:
        sys.exit("no benchmark output in benchmarks/headline/: run without --plots-only")
    quick = any(meta["quick"] for _, meta in figures.values())
    write_results(figures, plots(figures), quick)
    print(f"wrote {RESULTS} and the plots in {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
