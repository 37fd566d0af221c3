"""Helpers for the browser tests: Debian's headless Chromium driven by Playwright against a launched app
(tests/conftest.py), the page scripts that watch it (error toasts, vega marks), and the steps the tests
share: pick in a dropdown, fill a box, wait for plots or runs, check for errors, take a screenshot.

Nothing here skips: without Playwright or Chromium a test fails and says what to install.
"""
from __future__ import annotations

import atexit
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from tests.helpers import REPO

CHROMIUM = os.environ.get("LAB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
SHOTS = REPO / "docs" / "screenshots"  # the README's and the guide's screenshots
VIEWPORT = {"width": 1400, "height": 1000}
WAIT_MS = 120_000  # a shared 2-core host: training, rendering and polling all compete

# Gradio error toasts, recorded as they appear (they vanish after a few seconds).
WATCH_ERRORS = """
window.__labErrors = [];
new MutationObserver(() => {
  for (const t of document.querySelectorAll('.toast-body.error')) {
    if (!t.dataset.labSeen) { t.dataset.labSeen = '1'; window.__labErrors.push(t.innerText); }
  }
}).observe(document, {childList: true, subtree: true});
"""
# Marks a vega plot has drawn: coloured line paths with at least `points` points (a series missing
# from the plot's colour scale is drawn without a stroke, i.e. invisibly).
LINES_DRAWN = """([sel, points]) => [...document.querySelectorAll(sel + ' g.mark-line.role-mark path')]
    .filter(p => p.getAttribute('stroke') && ((p.getAttribute('d') || '').match(/L/g) || []).length >= points - 1)
    .length"""
LEGEND = """(sel) => [...document.querySelectorAll(sel + ' g.role-legend-label text')].map(t => t.textContent)"""
# A plotly plot's lines as the page holds them (Compare's curves): [{name, points}] in drawing order.
CURVES = """(sel) => { const g = document.querySelector(sel + ' .js-plotly-plot');
    return g && g.data ? g.data.map(t => ({name: t.name, points: Array.from(t.x || []).length})) : []; }"""


class _Session:
    """One Playwright and one headless Chromium for the test process (each pytest-xdist worker has its own),
    launched at the first browser test and closed when the process exits: each test opens its own
    contexts (own cookies and localStorage), which close when its `with chromium()` ends."""

    playwright = None
    browser = None

    @classmethod
    def browser_now(cls):
        if cls.browser is None or not cls.browser.is_connected():
            try:
                from playwright.sync_api import sync_playwright
            except ImportError:  # pragma: no cover
                pytest.fail("the browser tests need Playwright for Python: pip install playwright (no browser "
                            "download: they drive Debian's Chromium)")
            if not os.access(CHROMIUM, os.X_OK):
                pytest.fail(f"the browser tests need Chromium at {CHROMIUM}: apt-get install chromium "
                            "(or set LAB_CHROMIUM to its path)")
            if cls.playwright is None:
                cls.playwright = sync_playwright().start()
                atexit.register(cls.close)
            cls.browser = cls.playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            from playwright.sync_api import expect

            expect.set_options(timeout=WAIT_MS)  # an `expect` waits as long as a page does (5 s by default)
        return cls.browser

    @classmethod
    def close(cls) -> None:
        if cls.browser is not None:
            cls.browser.close()
        if cls.playwright is not None:
            cls.playwright.stop()
        cls.browser = cls.playwright = None


class _Contexts:
    """The shared Chromium as a test sees it: `new_context` opens a context that `close` closes again."""

    def __init__(self, browser) -> None:
        self._browser, self._opened = browser, []

    def new_context(self, **kwargs):
        context = self._browser.new_context(**kwargs)
        self._opened.append(context)
        return context

    def close(self) -> None:
        while self._opened:
            try:
                self._opened.pop().close()
            except Exception:  # noqa: BLE001 - a context the test closed itself, or a crashed page
                pass


@contextmanager
def chromium() -> Iterator:
    """Headless Chromium for one test: the process's shared browser (launched once), with the contexts
    the test opens closed at the end."""
    contexts = _Contexts(_Session.browser_now())
    try:
        yield contexts
    finally:
        contexts.close()


def open_page(browser, url: str, wait_ms: int = WAIT_MS, *, viewport: dict = VIEWPORT, watch: str = WATCH_ERRORS,
              ready: str | None = "#start-btn:enabled"):
    """A page in a new context (its own localStorage) with `wait_ms` as its default timeout, `watch`
    recording error toasts in window.__labErrors and uncaught page errors in `page.crashes`, opened at
    `url` and, unless `ready` is None, waited on until that selector matches (the Start button is
    enabled once the page has loaded)."""
    context = browser.new_context(viewport=viewport)
    context.set_default_timeout(wait_ms)
    page = context.new_page()
    page.add_init_script(watch)
    page.crashes = []
    page.on("pageerror", lambda exc: page.crashes.append(str(exc)))
    page.goto(url)
    if ready:
        page.wait_for_selector(ready)
    return page


def choose(page, dropdown: str, option: str) -> None:
    """Pick `option` in the dropdown `dropdown` from its own list (another dropdown's list may still be
    closing on a loaded machine: two lists can hold the same option), and wait for the list to close."""
    from playwright.sync_api import expect

    page.locator(f"{dropdown} input").click()
    page.locator(dropdown).get_by_role("option", name=option, exact=True).click()
    page.keyboard.press("Escape")
    expect(page.locator(dropdown).get_by_role("option")).to_have_count(0)
    assert page.locator(f"{dropdown} input").input_value() == option


def fill(page, sel: str, text: str) -> None:
    """Type `text` into the box of the component `sel` and leave it (Tab), so the app sees the change."""
    box = page.locator(f"{sel} input, {sel} textarea").first
    box.fill(text)
    box.press("Tab")


def wait_lines(page, sel: str, count: int, points: int = 3) -> None:
    """Wait (the page's default timeout) until the vega plot `sel` has drawn `count` lines of at least
    `points` points."""
    page.wait_for_function(f"(args) => ({LINES_DRAWN})(args) >= {count}", arg=[sel, points], polling=250)


def wait_curves(page, sel: str, count: int, points: int = 3) -> None:
    """Wait until the plotly plot `sel` holds `count` lines of at least `points` points."""
    page.wait_for_function(f"(a) => ({CURVES})(a[0]).filter(c => c.points >= a[1]).length >= a[2]",
                           arg=[sel, points, count], polling=250)


def curve_names(page, sel: str) -> list[str]:
    """The names of the plotly plot `sel`'s lines (its legend), in order."""
    return [c["name"] for c in page.evaluate(CURVES, sel)]


def wait_finished(page, app, run_ids: list[str], wait_ms: int) -> None:
    """Wait until each run's status file says it ended (within `wait_ms` for all), and check it completed."""
    deadline = time.monotonic() + wait_ms / 1000
    for r in run_ids:
        status = app.runs_dir / r / "status.json"
        while json.loads(status.read_text()).get("state") in ("queued", "running"):
            assert time.monotonic() < deadline, f"run {r} did not finish in {wait_ms / 1000:.0f} s"
            page.wait_for_timeout(250)
        assert json.loads(status.read_text())["state"] == "completed"


def settle(page, state: str, quiet_ms: int = 1500) -> dict:
    """The page's state once it has stopped changing for `quiet_ms` (a stale view is stable too)."""
    last, since, before = None, 0, None
    for _ in range(WAIT_MS // 250):
        now = page.evaluate(state)
        if now == last:
            since += 250
            if since >= quiet_ms:
                return now
        else:
            before, last, since = last, now, 0
        page.wait_for_timeout(250)
    moving = {k: (str(before.get(k))[:200], str(last.get(k))[:200]) for k in last if before and before.get(k) != last.get(k)}
    raise AssertionError(f"the page never settled: {moving}")


def assert_no_errors(page) -> None:
    """No error toast so far, no uncaught page error, no traceback shown."""
    shown = page.evaluate("window.__labErrors")
    assert not shown, f"error toasts: {shown}"
    assert not page.crashes, f"uncaught page errors: {page.crashes}"
    assert "Traceback" not in page.locator("body").inner_text()


def shoot(page, path: Path, top: str | None = None, settle_ms: int = 1500) -> Path:
    """Scroll `top` to the top of the viewport (else the page top), move the mouse away (no hover
    highlight in the picture), let vega finish, save a screenshot to `path` and check it is not empty."""
    if top:
        page.locator(top).evaluate("e => e.scrollIntoView({block: 'start'})")
    else:
        page.evaluate("window.scrollTo(0, 0)")
    page.mouse.move(0, 0)
    page.wait_for_timeout(settle_ms)
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path))
    assert path.stat().st_size > 20_000, f"{path} looks empty"
    return path
