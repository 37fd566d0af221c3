"""The real app in Debian's headless Chromium: train two small runs from the Train tab, overlay them
in Compare, see attention heatmaps and PCA plots in Inspect, and save a screenshot of each tab
(docs/screenshots/*.png, 1400x1000, used by the README).

It never skips: without Playwright or Chromium it fails and says what to install. The app runs in
its own subprocess with an empty run store, so the screenshots show exactly these two runs.
"""
from __future__ import annotations

import pytest

from tests.browser import LEGEND, SHOTS, WAIT_MS, assert_no_errors, choose, chromium, curve_names, fill, \
    open_page, shoot, wait_curves, wait_finished, wait_lines

pytestmark = pytest.mark.browser  # Chromium driving the real app (tests/conftest.py, the tiers)
STEPS = 400


@pytest.fixture(scope="module")
def page(browser_app):
    with chromium() as browser:
        yield open_page(browser, browser_app.url)


def start_run(page, app, previous: str | None) -> str:
    """Click Start; wait until the new run is shown, has completed, and the page says so; return its id."""
    page.locator("#start-btn").click()
    page.wait_for_function("([sel, prev]) => { const v = document.querySelector(sel).value; return v && v !== prev; }",
                           arg=["#run-pick input", previous or ""], timeout=WAIT_MS, polling=250)
    run_id = page.locator("#run-pick input").input_value()
    wait_finished(page, app, [run_id], WAIT_MS)
    page.locator("#progress").get_by_text("Completed").wait_for(timeout=WAIT_MS)
    assert f"after {STEPS} steps" in page.locator("#progress").inner_text()
    return run_id


X_TICKS = """(sel) => [...document.querySelectorAll(sel + ' g.role-axis')].filter(a => a.getAttribute('aria-label')
    ?.startsWith('X-axis')).flatMap(a => [...a.querySelectorAll('g.role-axis-label text')].map(t => t.textContent))"""


def test_train_compare_inspect_in_chromium(page, browser_app):
    from playwright.sync_api import expect

    # Train: a default run with few steps, then the same with sinusoidal positions.
    fill(page, "#steps", str(STEPS))
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
    for plot in ("#live-loss", "#live-acc"):  # steps are whole numbers: '110', never '110.000000'
        ticks = page.evaluate(X_TICKS, plot)
        assert ticks and all(t.replace(",", "").isdigit() for t in ticks), ticks
    assert_no_errors(page)
    shoot(page, SHOTS / "train.png")

    # Compare: both runs, curves overlaid.
    page.get_by_role("tab", name="Compare").click()
    expect(page.locator("#runs-table")).to_contain_text(second, timeout=WAIT_MS)  # the tab listed the runs
    page.get_by_role("button", name="Select all shown").click()
    wait_curves(page, "#compare-curves", 2, points=50)
    assert len(curve_names(page, "#compare-curves")) == 2
    assert page.get_by_text("completed").count() >= 2
    assert_no_errors(page)
    shoot(page, SHOTS / "compare.png", top="#compare-pick")

    # Inspect: the newest run's attention heatmap and both runs' PCA of positions.
    page.get_by_role("tab", name="Inspect").click()
    page.wait_for_function("() => { const i = document.querySelector('#attn-dec_self img, #attn-dec_self canvas');"
                           " return i && (i.naturalWidth || i.width) > 100; }", timeout=WAIT_MS, polling=250)
    for side in ("A", "B"):
        page.wait_for_function(f"() => {{ const i = document.querySelector('#pca-{side} img'); "
                               "return !!i && i.complete && i.naturalWidth > 100; }", timeout=WAIT_MS, polling=250)
    assert page.locator("#inspect-run input").input_value().endswith(f"({second[-6:]})")
    assert page.locator("#inspect-run-b input").input_value().endswith(f"({first[-6:]})")
    assert_no_errors(page)
    shoot(page, SHOTS / "inspect.png", top="#inspect-step")
