"""The dashboard and the performance report in a real browser (headless Chromium).

While a computation runs on a LocalCluster, the pages are opened as a user
opens them, from the printed link: they must show the workers, progress and a
task stream that advance, and refuse a visit without the token. Screenshots of
every page are saved in the test's temporary directory, or where
$HPCSCHED_SCREENSHOTS says (``HPCSCHED_SCREENSHOTS=docs/images`` regenerates the
documentation's pictures; see tests/diagnostics/browser.py).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import psutil
import pytest

from hpcsched import Client, LocalCluster, performance_report
from tests.conftest import REPO, wait_until, worker_env
from tests.diagnostics.browser import canvas_ink, chromium, screenshots_dir
from tests.diagnostics.conftest import split_link

pytestmark = pytest.mark.timeout(180)


def slow_square(x: int) -> int:
    time.sleep(0.03)
    return x * x


def add(x: int, y: int) -> int:
    return x + y


def text_of(driver, selector: str) -> str:
    return driver.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.innerText : '';",
        selector)


def finished_of(driver, group: str) -> int | None:
    """The 'finished / total' figure the status page shows for ``group``."""
    m = re.search(rf"^{group}\n.*?([\d,]+) / ([\d,]+)", text_of(driver, "#progress"), re.M)
    return int(m.group(1).replace(",", "")) if m else None


def no_browser_left(before: set[int]) -> bool:
    me = psutil.Process()
    return not [p for p in me.children(recursive=True) if p.pid not in before
                and "chrom" in p.name()]


def test_screenshots_leave_the_checkout_alone_unless_asked(tmp_path, monkeypatch):
    monkeypatch.delenv("HPCSCHED_SCREENSHOTS", raising=False)
    shots = screenshots_dir(tmp_path / "shots")
    assert shots == tmp_path / "shots" and shots.is_dir()
    assert Path(REPO) not in shots.resolve().parents
    monkeypatch.setenv("HPCSCHED_SCREENSHOTS", str(tmp_path / "asked"))
    assert screenshots_dir(tmp_path / "shots") == tmp_path / "asked"


def test_dashboard_pages_while_a_computation_runs(tmp_path):
    shots = screenshots_dir(tmp_path)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address="127.0.0.1:0",
                      worker_env=worker_env()) as cluster, \
            Client(cluster, set_as_default=False) as client, chromium() as driver:
        link = cluster.dashboard_link
        base, token = split_link(link)

        # without the token: refused
        driver.get(base + "/status")
        assert "403" in driver.find_element("tag name", "body").text
        driver.get(base + "/workers?token=" + "f" * len(token))
        assert "403" in driver.find_element("tag name", "body").text

        squares = client.map(slow_square, range(600))
        sums = [client.submit(add, squares[i], squares[i + 1]) for i in range(0, 600, 2)]

        driver.get(link)  # what the user clicks
        first = wait_until(lambda: finished_of(driver, "slow_square"), timeout=60,
                           what="progress of slow_square shown")
        wait_until(lambda: (finished_of(driver, "slow_square") or 0) > first, timeout=60,
                   what="progress advancing")
        cards = text_of(driver, "#cards")
        assert re.search(r"^2\nWORKERS", cards, re.M | re.I), cards
        assert re.search(r"^4\nTHREADS", cards, re.M | re.I), cards
        assert canvas_ink(driver, "canvas") > 0
        driver.save_screenshot(str(shots / "status.png"))

        driver.get(base + "/tasks")  # the cookie carries the token from here on

        def stream_count() -> int:
            m = re.search(r"\(([\d,]+) tasks", text_of(driver, "main"))
            return int(m.group(1).replace(",", "")) if m else 0

        n0 = wait_until(stream_count, timeout=60, what="tasks in the stream")
        wait_until(lambda: stream_count() > n0, timeout=60, what="the task stream advancing")
        assert canvas_ink(driver, "#stream") > 0 and "slow_square" in text_of(driver, "main")
        driver.save_screenshot(str(shots / "tasks.png"))

        driver.get(base + "/workers")
        addresses = sorted(client.scheduler_info()["workers"])
        table = wait_until(lambda: (t := text_of(driver, "#workers")) and
                           all(a in t for a in addresses) and t, timeout=30,
                           what="both workers in the table")
        assert "local-0" in table and "local-1" in table
        # sortable: a click on "name" sorts by name, a second click reverses
        header = driver.find_element("xpath", "//th[text()='name']")
        header.click()
        rows = lambda: [r for r in text_of(driver, "#workers tbody").split("\n") if r]  # noqa: E731
        wait_until(lambda: "local-0" in rows()[0], timeout=10, what="sorted by name")
        driver.find_element("xpath", "//th[starts-with(text(),'name')]").click()
        wait_until(lambda: "local-1" in rows()[0], timeout=10, what="sorted by name, reversed")
        driver.save_screenshot(str(shots / "workers.png"))

        driver.get(base + "/events")
        wait_until(lambda: text_of(driver, "#events").count("joined") >= 2, timeout=30,
                   what="the workers' arrival in the events")
        driver.save_screenshot(str(shots / "events.png"))
        assert client.gather(sums)[-1] == 598 ** 2 + 599 ** 2
    wait_until(lambda: no_browser_left(before), timeout=20, what="the browser gone")


def test_performance_report_opened_from_disk(tmp_path):
    shots = screenshots_dir(tmp_path / "shots")
    path = tmp_path / "report.html"
    with LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=None,
                      worker_env=worker_env()) as cluster, Client(cluster) as client:
        with performance_report(filename=str(path)):
            squares = client.map(slow_square, range(120))
            sums = [client.submit(add, squares[i], squares[i + 1]) for i in range(0, 120, 2)]
            client.gather(sums)
    with chromium() as driver:
        driver.get(path.as_uri())
        wait_until(lambda: text_of(driver, "#cards"), timeout=30, what="the report drawn")
        cards = text_of(driver, "#cards")
        assert re.search(r"^180\nTASKS", cards, re.M | re.I), cards
        assert re.search(r"^2\nWORKERS", cards, re.M | re.I), cards
        for canvas in ("#stream", "#groups", "#utilization"):
            assert canvas_ink(driver, canvas) > 0, canvas
        groups = text_of(driver, "#group-table")
        assert "slow_square" in groups and "add" in groups
        assert "Scheduler events" in text_of(driver, "main")
        driver.save_screenshot(str(shots / "report.png"))
        logs = driver.get_log("browser") if hasattr(driver, "get_log") else []
        assert not [e for e in logs if e.get("level") == "SEVERE"], logs
