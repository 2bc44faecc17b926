"""Headless Chromium for the tests, through selenium and Debian's chromedriver.

The browser is Debian's ``chromium`` with ``chromium-driver`` (ci/test-all.sh
installs them when run as root on Debian). Selenium is told the driver's path,
so it downloads nothing. Flags: no sandbox (root in a container), no GPU, and
no background networking, component updates, sync or QUIC, since this
machine reaches no network but its own; a fresh profile each time.

Without the browser a test skips, unless ``HPCSCHED_REQUIRE_BROWSER=1`` (the
test script sets it once it installed the browser): then it fails, so that CI
cannot pass by skipping.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1400,1000")


def screenshots_dir(default: Path) -> Path:
    """Where the pages' screenshots go: ``default`` (a test's temporary directory), so
    that a run leaves the checkout as it was; ``$HPCSCHED_SCREENSHOTS`` names another
    directory, and ``HPCSCHED_SCREENSHOTS=docs/images`` (from the checkout's root)
    regenerates the pictures the documentation site and the README show."""
    path = Path(os.environ.get("HPCSCHED_SCREENSHOTS") or default)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _missing() -> str | None:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.path.exists(path):
            return f"{path} not installed (apt-get install chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium not installed (pip install 'hpcsched[test]')"
    return None


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium driven by selenium; quit (with every process it started) on exit."""
    why = _missing()
    if why:
        if os.environ.get("HPCSCHED_REQUIRE_BROWSER") == "1":
            pytest.fail(f"HPCSCHED_REQUIRE_BROWSER=1 but {why}")
        pytest.skip(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="hpcsched-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.set_page_load_timeout(30)
        driver.set_script_timeout(30)
        yield driver
    finally:
        try:
            driver.quit()
        finally:
            shutil.rmtree(profile, ignore_errors=True)


def canvas_ink(driver: Any, selector: str) -> int:
    """How many pixels of the canvas at ``selector`` are drawn (not transparent)."""
    return driver.execute_script("""
        const c = document.querySelector(arguments[0]);
        if (!c || !c.width) return 0;
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0;
        for (let i = 3; i < d.length; i += 4) if (d[i]) n++;
        return n;""", selector)
