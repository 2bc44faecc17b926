"""The dashboard at 1,000 workers and 100,000 tasks: snapshot cost and page responsiveness.

    python benchmarks/bench_dashboard_scale.py [--workers 1000] [--tasks 100000]
                                               [--groups 20] [--browser]

No processes: a scheduler is started in this process and fed the events of
``--workers`` simulated workers (4 threads each) and ``--tasks`` tasks in
``--groups`` task groups, half of them finished over the last minute. Then:

* the time the scheduler's thread spends taking each snapshot (status, task
  stream), which it pays at most every ``diagnostics.dashboard.refresh`` seconds
  while a page is open;
* the time and size of each JSON answer over HTTP;
* with ``--browser`` (headless Chromium): how long each page takes from load to
  drawn, and how many DOM elements it has (the task stream is a canvas: the
  count does not grow with tasks).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import urllib.request

import _checkout  # noqa: F401 - this checkout's hpcsched, here and in what it starts


def build(n_workers: int, n_tasks: int, n_groups: int):
    from hpcsched.core.scheduler.server import Scheduler
    from hpcsched.core.state import events as ev

    sched = Scheduler("inproc://", dashboard_address="127.0.0.1:0").start()
    now = time.time()

    def feed(s) -> None:
        state = s.state
        for i in range(n_workers):
            state.handle(ev.AddWorker(f"tcp://10.0.{i // 250}.{i % 250}:4000", 4,
                                      memory_limit=8 << 30, name=f"w{i}", host=f"node{i // 8}",
                                      now=now - 120))
            state.handle(ev.Heartbeat(f"tcp://10.0.{i // 250}.{i % 250}:4000",
                                      {"memory": 1 << 30, "cpu": 90.0}, now=now - 1))
        state.handle(ev.AddClient("bench", now=now - 120))
        keys = [f"group{g}-{i}" for i in range(n_tasks // n_groups) for g in range(n_groups)]
        tasks = {k: {"run_spec": "opaque", "deps": []} for k in keys}  # never run
        state.handle(ev.UpdateGraph("bench", tasks, keys, now=now - 60))
        s.outbox.clear()  # messages to the simulated workers go nowhere
        done = 0
        for ws in list(state.workers.values()):
            for ts in list(ws.processing):
                if done >= n_tasks // 2:
                    break
                t0 = now - 60 + 60 * done / (n_tasks / 2)
                state.handle(ev.TaskFinished(ws.address, ts.key, nbytes=1000, start=t0,
                                             stop=t0 + 0.5, now=t0 + 0.5))
                done += 1
        # keep finishing whatever the state hands out until half are done
        while done < n_tasks // 2:
            progressed = False
            for ws in list(state.workers.values()):
                for ts in list(ws.processing)[:1]:
                    t0 = now - 60 + 60 * done / (n_tasks / 2)
                    state.handle(ev.TaskFinished(ws.address, ts.key, nbytes=1000, start=t0,
                                                 stop=t0 + 0.5, now=t0 + 0.5))
                    done += 1
                    progressed = True
            if not progressed:
                break
        s.outbox.clear()

    sched.call(feed, timeout=600)
    return sched


def timed(fn, n: int = 5) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=1000)
    p.add_argument("--tasks", type=int, default=100_000)
    p.add_argument("--groups", type=int, default=20)
    p.add_argument("--browser", action="store_true")
    args = p.parse_args()
    from hpcsched.diagnostics import snapshot

    t0 = time.perf_counter()
    sched = build(args.workers, args.tasks, args.groups)
    print(f"built {args.workers} workers, {args.tasks} tasks in "
          f"{time.perf_counter() - t0:.1f} s")
    diag = sched.extensions["diagnostics"]
    try:
        info = sched.scheduler_info()
        print(f"tasks by state: {info['task_counts']}")
        st = timed(lambda: sched.call(lambda s: snapshot.status(s, diag.recorder, time.time())))
        ts = timed(lambda: sched.call(lambda s: snapshot.live_stream(diag.recorder, -1, -1)))
        print(f"scheduler thread per snapshot: status {st * 1e3:.1f} ms, "
              f"task stream {ts * 1e3:.1f} ms (at most every "
              f"{diag.refresh} s while a page is open)")
        base, _, query = diag.link.partition("/status?")
        head = {"Authorization": "Bearer " + query.split("=", 1)[1]}
        for path in ("/api/status.json", "/api/task-stream.json", "/metrics"):
            body = b""

            def get(path: str = path) -> None:
                nonlocal body
                diag.forget()  # measure a fresh snapshot, not the cache
                body = urllib.request.urlopen(urllib.request.Request(base + path,
                                                                     headers=head)).read()

            t = timed(get)
            print(f"GET {path}: {t * 1e3:.0f} ms, {len(body) / 1e3:.0f} kB")
        if args.browser:
            browse(diag.link, base)
    finally:
        sched.close()


def browse(link: str, base: str) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for f in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update",
              "--disable-sync", "--window-size=1400,1000",
              f"--user-data-dir={tempfile.mkdtemp()}"):
        opts.add_argument(f)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
    try:
        driver.get(link)
        for page in ("status", "tasks", "workers", "events"):
            driver.get(f"{base}/{page}")
            t0 = time.perf_counter()
            while driver.execute_script("return document.getElementById('main').dataset"
                                        ".updates || '0'") == "0":
                if time.perf_counter() - t0 > 60:
                    raise TimeoutError(f"{page} not drawn in 60 s")
                time.sleep(0.01)
            drawn = time.perf_counter() - t0
            # one more refresh, timed inside the page: fetch + draw
            stats = driver.execute_async_script("""
                const done = arguments[arguments.length - 1];
                const main = document.getElementById('main');
                const start = Number(main.dataset.updates);
                const t0 = performance.now();
                const poll = () => Number(main.dataset.updates) > start ?
                    done([performance.now() - t0, document.getElementsByTagName('*').length]) :
                    setTimeout(poll, 5);
                poll();""")
            print(f"page {page}: first drawn {drawn * 1e3:.0f} ms after load; "
                  f"{stats[1]} DOM elements; next refresh within {stats[0]:.0f} ms "
                  f"(1 s period)")
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
