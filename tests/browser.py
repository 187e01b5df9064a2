"""A small headless-Chromium helper for tests: open a local HTML file, count drawn plots, collect JS errors.

Uses selenium with the Debian ``chromium`` + ``chromium-driver`` packages. Chromium is
started offline-friendly (no background networking, no component updates, a fresh
profile), so a page that silently needs the network shows up as undrawn plots.
:func:`browser_or_skip` skips the calling test with a clear message when Chromium,
its driver or selenium is missing. :func:`load_page` opens a page and reports what it drew; a test that
acts on a page (moves a control, hovers, clicks) drives :func:`chromium` itself and reads
:func:`errors_and_requests` at the end.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")
DRIVER_NAMES = ("chromedriver",)
CHROMIUM_FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--window-size=1300,2000",
)
INSTALL_HINT = "apt-get update && apt-get install -y chromium chromium-driver; pip install selenium"


def _which(names) -> str | None:
    return next((p for p in map(shutil.which, names) if p), None)


def browser_or_skip() -> tuple[str, str]:
    """Paths of the Chromium binary and chromedriver; skips the test when either (or selenium) is absent."""
    binary, driver = _which(CHROMIUM_NAMES), _which(DRIVER_NAMES)
    try:
        import selenium  # noqa: F401
    except ImportError:
        pytest.skip(f"selenium is not installed; browser tests need it ({INSTALL_HINT}).")
    if binary is None or driver is None:
        pytest.skip(f"Chromium or chromedriver not found on PATH; install them to run browser tests ({INSTALL_HINT}).")
    return binary, driver


@dataclass
class PageResult:
    """What the page looked like once its scripts had run."""

    counts: dict[str, int]
    values: dict = field(default_factory=dict)
    console_errors: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)
    screenshot: Path | None = None


def load_page(
    html_path: str | Path,
    selectors: dict[str, str],
    *,
    screenshot: str | Path | None = None,
    wait_for: dict[str, int] | None = None,
    timeout_s: float = 60.0,
    evaluate: dict[str, str] | None = None,
    first_screen: str | Path | None = None,
) -> PageResult:
    """Open ``html_path`` in headless Chromium and count the CSS ``selectors`` (``{name: selector}``).

    Waits until each ``wait_for[name]`` count is reached (or ``timeout_s`` passes), then
    saves a full-page screenshot when ``screenshot`` is given. Console messages of level
    SEVERE are returned as errors; network requests (http, https, ws) are returned as
    ``failed_requests`` (an offline report must make none). ``evaluate`` maps names to JavaScript
    expressions whose values come back in ``values``; ``first_screen`` saves what a reader sees
    first (1300 x 900, not scrolled).
    """
    with chromium() as driver:
        driver.set_page_load_timeout(timeout_s)
        driver.get(Path(html_path).resolve().as_uri())
        deadline = time.monotonic() + timeout_s
        counts: dict[str, int] = {}
        while True:
            counts = {name: driver.execute_script(f"return document.querySelectorAll({sel!r}).length;")
                      for name, sel in selectors.items()}
            if all(counts.get(k, 0) >= n for k, n in (wait_for or {}).items()) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        time.sleep(0.5)  # let late console errors arrive
        errors, requests = errors_and_requests(driver)
        values = {name: driver.execute_script(f"return ({expr});") for name, expr in (evaluate or {}).items()}
        if first_screen is not None:
            Path(first_screen).parent.mkdir(parents=True, exist_ok=True)
            driver.set_window_size(1300, 900)
            driver.save_screenshot(str(first_screen))
        shot = None
        if screenshot is not None:
            shot = Path(screenshot)
            shot.parent.mkdir(parents=True, exist_ok=True)
            height = driver.execute_script("return document.body.scrollHeight;")
            driver.set_window_size(1300, min(max(int(height), 800), 16000))
            driver.save_screenshot(str(shot))
        return PageResult(counts, values, errors, requests, shot)


def errors_and_requests(driver) -> tuple[list[str], list[str]]:
    """The console messages of level SEVERE and the network requests (http, https, ws, ftp) logged so far."""
    import json

    errors = [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    requests = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            url = message["params"]["request"]["url"]
            if url.startswith(("http:", "https:", "ws:", "wss:", "ftp:")):
                requests.append(url)
    return errors, requests


@contextmanager
def chromium():
    """A headless Chromium driver (skips the test when it is missing) started with :data:`CHROMIUM_FLAGS` and a fresh
    profile, logging console messages and network requests; it quits, and its profile is removed, on leaving."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = browser_or_skip()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
