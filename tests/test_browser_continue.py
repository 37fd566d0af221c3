"""Continue training, in Debian's headless Chromium against the real app: a completed run of 60 steps gets
200 more from the Train tab; it stays one run (same id, one folder) whose curve in Compare now reaches step
260 with no repeated step; a refusal (a run still training) is answered beside the button."""
from __future__ import annotations

import json

import pytest

from tests.browser import CURVES, assert_no_errors, chromium, fill, open_page, shoot, wait_curves, wait_finished

pytestmark = pytest.mark.browser  # Chromium driving the real app (tests/conftest.py, the tiers)
WAIT_MS = 150_000
def test_a_completed_run_trains_200_more_steps_and_its_curve_extends(browser_app):
    from playwright.sync_api import expect

    with chromium() as browser:
        page = open_page(browser, browser_app.url, WAIT_MS)
        fill(page, "#steps", "60")
        page.locator("#start-btn").click()
        progress = page.locator("#progress")
        expect(progress).to_contain_text("Completed after 60 steps", timeout=WAIT_MS)
        run_id = page.locator("#run-pick input").input_value()

        page.get_by_role("tab", name="Compare").click()
        page.get_by_role("button", name="Select all shown").click()
        wait_curves(page, "#compare-curves", 1, points=55)
        before = page.evaluate(CURVES, "#compare-curves")[0]["points"]
        assert 55 <= before <= 60, before

        page.get_by_role("tab", name="Train").click()
        fill(page, "#continue-steps", "200")
        page.locator("#continue-btn").click()
        expect(progress).to_contain_text("Completed after 260 steps", timeout=WAIT_MS)
        wait_finished(page, browser_app, [run_id], WAIT_MS)
        assert [p.name for p in browser_app.runs_dir.iterdir() if not p.name.startswith(".")] == [run_id]
        steps = [json.loads(line)["step"] for line in (browser_app.runs_dir / run_id / "metrics.jsonl").open()
                 if json.loads(line)["kind"] == "train"]
        assert steps == sorted(set(steps)) and steps[-1] == 260  # one curve, no repeated step

        page.get_by_role("tab", name="Compare").click()
        page.get_by_role("button", name="Refresh").click()
        page.get_by_role("button", name="Select all shown").click()
        wait_curves(page, "#compare-curves", 1, points=250)  # the same run's curve, now to step 260
        finals = page.locator("#compare-finals").get_by_role("row").filter(has_text=run_id[-6:])
        expect(finals).to_contain_text("260", timeout=WAIT_MS)
        assert_no_errors(page)
        shoot(page, browser_app.runs_dir.parent / "continued.png", top="#compare-pick", settle_ms=500)


def test_continuing_a_run_that_still_trains_is_refused_beside_the_button(browser_app):
    from playwright.sync_api import expect

    with chromium() as browser:
        page = open_page(browser, browser_app.url, WAIT_MS)
        fill(page, "#steps", "20000")
        page.locator("#start-btn").click()
        expect(page.locator("#progress")).to_contain_text("Running", timeout=WAIT_MS)
        page.locator("#continue-btn").click()
        note = page.locator("#continue-note")
        expect(note).to_contain_text("Run", timeout=WAIT_MS)
        expect(note).to_contain_text("wait for it to end (or stop it), then continue it")
        page.locator("#stop-btn").click()
        expect(page.locator("#progress")).to_contain_text("Stopped", timeout=WAIT_MS)
        assert_no_errors(page)


def test_a_run_continued_on_one_screen_is_shown_running_then_completed_on_another(browser_app):
    """Issue 34 item 3: a second screen's Compare, idle on a finished run, once kept showing it "stopped" while
    another screen continued it (only Refresh helped). Now its watching timer finds the run running within two
    of its periods of the store saying so, and completed within two live periods of the end, with no click."""
    from playwright.sync_api import expect

    from ui.compare.render import LIVE_POLL_S, WATCH_POLL_S

    slack_ms = 3000  # the server's answer and the page's drawing, on a busy 2-core machine
    with chromium() as browser:
        teacher = open_page(browser, browser_app.url, WAIT_MS)
        fill(teacher, "#steps", "40")
        teacher.locator("#start-btn").click()
        expect(teacher.locator("#progress")).to_contain_text("Completed after 40 steps", timeout=WAIT_MS)
        run_id = teacher.locator("#run-pick input").input_value()

        student = open_page(browser, browser_app.url, WAIT_MS)  # another browser: its own context and session
        student.get_by_role("tab", name="Compare").click()
        student.get_by_role("button", name="Select all shown").click()
        row = student.locator("#compare-finals").get_by_role("row").filter(has_text=run_id[-6:])
        expect(row).to_contain_text("completed", timeout=WAIT_MS)
        student.wait_for_timeout(2 * WATCH_POLL_S * 1000)  # the page has gone idle

        fill(teacher, "#continue-steps", "1500")
        teacher.locator("#continue-btn").click()
        status = browser_app.runs_dir / run_id / "status.json"
        while json.loads(status.read_text()).get("state") != "running":
            teacher.wait_for_timeout(100)
        expect(row).to_contain_text("running", timeout=2 * WATCH_POLL_S * 1000 + slack_ms)
        wait_finished(teacher, browser_app, [run_id], WAIT_MS)
        expect(row).to_contain_text("completed", timeout=2 * LIVE_POLL_S * 1000 + slack_ms)
        expect(row).to_contain_text("1540")
        assert_no_errors(student)
        assert_no_errors(teacher)
