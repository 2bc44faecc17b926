"""Throughput with the dashboard watched vs off, in the same run.

    python benchmarks/bench_dashboard.py [--tasks 10000] [--leaves 8192] [--repeat 3]
                                         [--poller http|browser]

A LocalCluster of 2 worker processes x 1 thread runs the ``map`` and ``tree``
workloads of bench_local.py under three settings, interleaved round by round so
that the machine's background load hits each alike:

* ``off``: no dashboard, no recorder (``scheduler.extensions: []``);
* ``recorder``: the recorder only (``diagnostics.dashboard.address: null``), what
  every scheduler pays by default without a page open;
* ``watched``: dashboard on, and a poller asking it every second for what the
  status and task-stream pages ask (``--poller http``: a separate process with
  urllib; ``--poller browser``: headless Chromium with the status page and the
  task stream page open, needs chromium and selenium).

Prints tasks/s (best of ``--repeat``) and the slowdown of each setting against
``off``, and the CPU time this process (client, scheduler and dashboard
threads) spent per task (``cpu_us_per_task``, best = lowest).
"""

from __future__ import annotations

import _checkout  # noqa: F401 - this checkout's hpcsched, here and in what it starts

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_local import run  # noqa: E402 - the same workloads as the side-by-side benchmark

POLLER = r"""
import json, sys, time, urllib.request
base, token = sys.argv[1], sys.argv[2]
head = {"Authorization": "Bearer " + token}
seen = {"tasks": -1, "transfers": -1}  # what the task stream page asks: only what is new
while True:
    for path in ("/api/status.json", "/api/task-stream.json?tasks={tasks}&transfers={transfers}"):
        try:
            body = urllib.request.urlopen(urllib.request.Request(
                base + path.format(**seen), headers=head), timeout=10).read()
            if "task-stream" in path:
                d = json.loads(body)
                seen = {"tasks": d["task_count"], "transfers": d["transfer_count"]}
        except Exception:
            pass
    time.sleep(1.0)
"""


class Poller:
    """Something looking at the dashboard once a second, as a person with the page open."""

    def __init__(self, link: str, kind: str):
        base, _, query = link.partition("/status?")
        token = query.split("=", 1)[1]
        self.proc = self.driver = None
        if kind == "http":
            self.proc = subprocess.Popen([sys.executable, "-c", POLLER, base, token])
        else:
            from selenium import webdriver
            from selenium.webdriver.chrome.service import Service

            opts = webdriver.ChromeOptions()
            opts.binary_location = "/usr/bin/chromium"
            for f in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                      "--no-first-run", "--disable-background-networking",
                      "--disable-component-update", "--disable-sync",
                      f"--user-data-dir={tempfile.mkdtemp()}"):
                opts.add_argument(f)
            self.driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"),
                                           options=opts)
            self.driver.get(link)
            self.driver.switch_to.new_window("tab")
            self.driver.get(f"{base}/tasks")

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
        if self.driver is not None:
            self.driver.quit()


def one_round(setting: str, args: argparse.Namespace) -> dict:
    from hpcsched import Client, LocalCluster
    from hpcsched.core import config

    overrides = {"off": {"scheduler.extensions": []},
                 "recorder": {"diagnostics.dashboard.address": None},
                 "watched": {"diagnostics.dashboard.address": "127.0.0.1:0"}}[setting]
    with config.set(overrides), LocalCluster(n_workers=2, threads_per_worker=1) as cluster, \
            Client(cluster) as client:
        poller = Poller(cluster.dashboard_link, args.poller) if setting == "watched" else None
        try:
            time.sleep(1.0)  # the poller's first requests
            cpu = time.process_time()
            out = run(client, args.tasks, args.leaves, 1)
            # CPU of this process (client, scheduler, dashboard threads) per task: less
            # sensitive than tasks/s to what else runs on the machine
            out["cpu_us_per_task"] = 1e6 * (time.process_time() - cpu) / (
                args.tasks + 2 * args.leaves - 1)
            return out
        finally:
            if poller is not None:
                poller.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tasks", type=int, default=10_000)
    p.add_argument("--leaves", type=int, default=8192)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--poller", choices=("http", "browser"), default="http")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args()
    settings = ("off", "recorder", "watched")
    best: dict[str, dict] = {s: {} for s in settings}
    for r in range(args.repeat):
        for s in settings if r % 2 == 0 else reversed(settings):
            figures = one_round(s, args)
            for k, v in figures.items():
                pick = min if k.startswith("cpu") else max
                best[s][k] = pick(best[s].get(k, v), v)
            print(f"round {r + 1} {s:9s} " + "  ".join(f"{k} {v:8.0f}"
                                                        for k, v in figures.items()),
                  flush=True)
    print(f"\nbest of {args.repeat} (poller: {args.poller})")
    for s in settings:
        cells = []
        for k, v in best[s].items():
            ref = best["off"][k]
            if s == "off":
                cells.append(f"{k} {v:8.0f}")
            elif k.startswith("cpu"):
                cells.append(f"{k} {v:6.0f} ({100 * (v / ref - 1):+5.1f} % more)")
            else:
                cells.append(f"{k} {v:8.0f} ({100 * (1 - v / ref):+5.1f} % slower)")
        print(f"{s:9s} " + "  ".join(cells))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "best": best}, f, indent=1)


if __name__ == "__main__":
    main()
