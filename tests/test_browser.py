"""The real app in Debian's headless Chromium: train two small runs from the Train tab, overlay them
in Compare, see attention heatmaps and PCA plots in Inspect, and save a screenshot of each tab
(docs/screenshots/*.png, 1400x1000, used by the README).

It never skips: without Playwright or Chromium it fails and says what to install. The app runs in
its own subprocess with an empty run store, so the screenshots show exactly these two runs.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, launch_app

pytestmark = pytest.mark.slow
CHROMIUM = os.environ.get("LAB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
SHOTS = REPO / "docs" / "screenshots"
VIEWPORT = {"width": 1400, "height": 1000}
WAIT_MS = 120_000  # a shared 2-core host: training, rendering and polling all compete
STEPS = 400

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
# from the plot's colour scale is drawn without a stroke, i.e. invisibly), or scatter symbols.
LINES_DRAWN = """([sel, points]) => [...document.querySelectorAll(sel + ' g.mark-line.role-mark path')]
    .filter(p => p.getAttribute('stroke') && ((p.getAttribute('d') || '').match(/L/g) || []).length >= points - 1)
    .length"""
SYMBOLS_DRAWN = """(sel) => document.querySelectorAll(sel + ' g.mark-symbol.role-mark path').length"""
LEGEND = """(sel) => [...document.querySelectorAll(sel + ' g.role-legend-label text')].map(t => t.textContent)"""
CRASHES: list[str] = []  # uncaught errors in the page


@pytest.fixture(scope="module")
def browser_app(tmp_path_factory):
    with launch_app(tmp_path_factory.mktemp("browser")) as server:
        yield server


@pytest.fixture(scope="module")
def page(browser_app):
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:  # pragma: no cover
        pytest.fail("the browser test needs Playwright for Python: pip install playwright (no browser download: "
                    "it drives Debian's Chromium)")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"the browser test needs Chromium at {CHROMIUM}: apt-get install chromium "
                    "(or set LAB_CHROMIUM to its path)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport=VIEWPORT)
        context.set_default_timeout(WAIT_MS)
        page = context.new_page()
        page.add_init_script(WATCH_ERRORS)
        CRASHES.clear()
        page.on("pageerror", lambda exc: CRASHES.append(str(exc)))
        page.goto(browser_app.url)
        page.wait_for_selector("#start-btn:enabled")  # enabled once the page has loaded
        yield page
        browser.close()


def wait_lines(page, sel: str, count: int, points: int = 3) -> None:
    """Wait until the vega plot `sel` has drawn `count` lines of at least `points` points."""
    page.wait_for_function(f"(args) => ({LINES_DRAWN})(args) >= {count}", arg=[sel, points], timeout=WAIT_MS,
                           polling=250)


def settle_and_shoot(page, name: str, top: str | None = None) -> Path:
    """Scroll `top` to the top of the viewport (else the page top), let vega finish, save a screenshot."""
    if top:
        page.locator(top).evaluate("e => e.scrollIntoView({block: 'start'})")
    else:
        page.evaluate("window.scrollTo(0, 0)")
    page.mouse.move(0, 0)  # no hover highlight in the picture
    page.wait_for_timeout(1500)
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / name
    page.screenshot(path=str(path))
    assert path.stat().st_size > 20_000, f"{path} looks empty"
    return path


def start_run(page, app, previous: str | None) -> str:
    """Click Start; wait until the new run is shown, has completed, and the page says so; return its id."""
    page.locator("#start-btn").click()
    page.wait_for_function("([sel, prev]) => { const v = document.querySelector(sel).value; return v && v !== prev; }",
                           arg=["#run-pick input", previous or ""], timeout=WAIT_MS, polling=250)
    run_id = page.locator("#run-pick input").input_value()
    status = app.runs_dir / run_id / "status.json"
    deadline = time.monotonic() + WAIT_MS / 1000
    while json.loads(status.read_text()).get("state") in ("queued", "running"):
        assert time.monotonic() < deadline, f"run {run_id} did not finish in {WAIT_MS / 1000:.0f} s"
        page.wait_for_timeout(250)
    assert json.loads(status.read_text())["state"] == "completed"
    page.locator("#progress").get_by_text("Completed").wait_for(timeout=WAIT_MS)
    assert f"after {STEPS} steps" in page.locator("#progress").inner_text()
    return run_id


def choose(page, dropdown: str, option: str) -> None:
    """Pick `option` in the dropdown `dropdown` from its own list (another dropdown's list may still be
    closing on a loaded machine: two lists can hold the same option), and wait for the list to close."""
    from playwright.sync_api import expect

    page.locator(f"{dropdown} input").click()
    page.locator(dropdown).get_by_role("option", name=option, exact=True).click()
    page.keyboard.press("Escape")
    expect(page.locator(dropdown).get_by_role("option")).to_have_count(0)
    assert page.locator(f"{dropdown} input").input_value() == option


def assert_no_errors(page) -> None:
    shown = page.evaluate("window.__labErrors")
    assert not shown, f"error toasts: {shown}"
    assert not CRASHES, f"uncaught page errors: {CRASHES}"
    assert "Traceback" not in page.locator("body").inner_text()


def test_train_compare_inspect_in_chromium(page, browser_app):
    from playwright.sync_api import expect

    # Train: a default run with few steps, then the same with sinusoidal positions.
    steps = page.locator("#steps input")
    steps.fill(str(STEPS))
    steps.press("Tab")
    first = start_run(page, browser_app, None)
    wait_lines(page, "#live-loss", 2)  # train and held-out loss
    wait_lines(page, "#live-acc", 1)  # exact-match at training lengths
    choose(page, "#pos", "sinusoidal")
    second = start_run(page, browser_app, first)
    assert "learned" in first and "sinusoidal" in second
    assert {p.name for p in browser_app.runs_dir.iterdir()} >= {first, second}
    wait_lines(page, "#live-loss", 2)
    wait_lines(page, "#live-acc", 1)
    assert set(page.evaluate(LEGEND, "#live-loss")) == {"train", "held-out"}
    assert_no_errors(page)
    settle_and_shoot(page, "train.png")

    # Compare: both runs, curves overlaid.
    page.get_by_role("tab", name="Compare").click()
    expect(page.locator("#runs-table")).to_contain_text(second, timeout=WAIT_MS)  # the tab listed the runs
    page.get_by_role("button", name="Select all shown").click()
    wait_lines(page, "#compare-curves", 2, points=50)
    page.wait_for_function(f"() => ({LEGEND})('#compare-curves').length == 2", timeout=WAIT_MS, polling=250)
    assert page.get_by_text("completed").count() >= 2
    assert_no_errors(page)
    settle_and_shoot(page, "compare.png", top="#compare-pick")

    # Inspect: the newest run's attention heatmap and both runs' PCA of positions.
    page.get_by_role("tab", name="Inspect").click()
    page.wait_for_function("() => { const i = document.querySelector('#attn-dec_self img, #attn-dec_self canvas');"
                           " return i && (i.naturalWidth || i.width) > 100; }", timeout=WAIT_MS, polling=250)
    for side in ("A", "B"):
        page.wait_for_function(f"() => ({SYMBOLS_DRAWN})('#pca-{side}') >= 8", timeout=WAIT_MS, polling=250)
    assert page.locator("#inspect-run input").input_value().endswith(f"({second[-6:]})")
    assert page.locator("#inspect-run-b input").input_value().endswith(f"({first[-6:]})")
    assert_no_errors(page)
    settle_and_shoot(page, "inspect.png", top="#inspect-step")
