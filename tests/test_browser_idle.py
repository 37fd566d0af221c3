"""An idle page is quiet (Chromium, the real app): once a grid's runs, and then a preset's, have finished
and 10 s have passed, the page sends at most one poll per polling period and nothing else. The preset's
sentence above Compare's curves goes when other runs are picked (it once stayed above a grid's curves). After a grid
the page once kept sending about 3.5 requests a second (the run picker's listing updated the picker,
which listed the store again): thirty students would have sent about 100 useless requests a second.

Every event the page sends is one POST to the queue's join endpoint, naming its dependency; the test
counts them, by name, in a quiet window after everything finished.
"""
from __future__ import annotations

import json
from collections import Counter

import pytest

from tests.browser import assert_no_errors, choose, chromium, fill, open_page, wait_finished
from ui.compare.tab import LIVE_POLL_S

pytestmark = pytest.mark.browser  # Chromium driving the real app (tests/conftest.py, the tiers)
WAIT_MS = 180_000
QUIET_S = 10


def record_events(page) -> list[str]:
    """A list the page's events are appended to as they are sent: the api_name of each dependency."""
    names = page.evaluate("() => window.gradio_config.dependencies.map(d => d.api_name || String(d.id))")
    ids = page.evaluate("() => window.gradio_config.dependencies.map(d => d.id)")
    by_id = dict(zip(ids, names))
    sent: list[str] = []

    def on_request(request) -> None:
        if "/queue/join" in request.url and request.method == "POST":
            body = json.loads(request.post_data or "{}")
            fn = body.get("fn_index")
            sent.append(by_id.get(fn, names[fn] if isinstance(fn, int) and fn < len(names) else str(fn)))

    page.on("request", on_request)
    return sent


def quiet_window(page, sent: list[str]) -> Counter:
    """The events sent in a QUIET_S window that starts 10 s from now."""
    page.wait_for_timeout(10_000)
    start = len(sent)
    page.wait_for_timeout(QUIET_S * 1000)
    return Counter(sent[start:])


def assert_idle(events: Counter) -> None:
    allowed = QUIET_S / LIVE_POLL_S + 1  # at most one poll per polling period...
    assert sum(events.values()) <= allowed and len(events) <= 1, f"an idle page sent {dict(events)}"  # ...of one kind


def test_after_a_grid_and_a_preset_finish_the_page_goes_quiet(browser_app):
    with chromium() as browser:
        page = open_page(browser, browser_app.url, WAIT_MS)
        sent = record_events(page)
        fill(page, "#steps", "30")
        choose(page, "#task", "copy")
        page.locator("#grid").get_by_text("Ablation grid").first.click()
        choose(page, "#grid-axis-1", "PE")
        fill(page, "#grid-values-1", "rope, alibi")
        choose(page, "#grid-axis-2", "seed")
        fill(page, "#grid-values-2", "1, 2")
        before = browser_app.run_folders()
        page.locator("#grid-launch").click()
        page.wait_for_function("() => document.querySelectorAll('#compare-pick .token').length == 4")
        runs = sorted(browser_app.run_folders() - before)
        wait_finished(page, browser_app, runs, WAIT_MS)
        page.wait_for_function("() => document.querySelector('#compare-groups').innerText.includes('(2 seeds)')")
        assert_idle(quiet_window(page, sent))

        page.get_by_role("tab", name="Presets").click()
        before = browser_app.run_folders()
        page.locator("#preset-hello_sort").click()
        page.wait_for_function("() => document.querySelectorAll('#compare-pick .token').length == 1")
        wait_finished(page, browser_app, sorted(browser_app.run_folders() - before), WAIT_MS)
        page.locator("#compare-note").get_by_text("runs done").wait_for()
        assert_idle(quiet_window(page, sent))
        # the preset's sentence speaks of its runs only: with other runs picked it goes
        page.get_by_role("button", name="Select all shown").click()
        page.wait_for_function("() => document.querySelectorAll('#compare-pick .token').length == 5")
        page.wait_for_function("() => document.querySelector('#compare-note').innerText.trim() === ''")
        assert_no_errors(page)
