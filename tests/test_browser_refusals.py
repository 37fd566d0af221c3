"""What a widget refuses, said on the page (issue 34, item 9; ui/page_scripts.py), in Debian's headless
Chromium on the shared app: a slider's box typed past its range says what it allowed and what it set, by Tab
and by Enter, and the note goes at the next valid value or drag; d_model typed past its usual values is
checked, not put back to 64 unsaid; "Runs to compare" only filters: Enter picks the run the text matches,
and text that matches none adds nothing and says so."""
from __future__ import annotations

import pytest

from tests.browser import WAIT_MS, assert_no_errors, choose, chromium, fill, open_page, wait_finished

pytestmark = pytest.mark.browser  # Chromium driving the real app (tests/conftest.py, the tiers)


def test_a_slider_says_what_it_refused_and_d_model_is_checked(app_server):
    from playwright.sync_api import expect

    with chromium() as browser:
        page = open_page(browser, app_server.url)
        layers = page.locator("#n_layers")
        box = layers.locator("input[data-testid=number-input]")
        box.fill("500")
        box.press("Tab")
        expect(box).to_have_value("8")  # the slider's most
        expect(layers.locator(".lab-refused")).to_have_text(
            "Layers: 500 is more than this slider allows (1 to 8); it was set to 8.")
        box.fill("3")
        box.press("Enter")
        expect(layers.locator(".lab-refused")).to_have_count(0)
        expect(box).to_have_value("3")
        box.fill("0")
        box.press("Enter")
        expect(layers.locator(".lab-refused")).to_have_text(
            "Layers: 0 is less than this slider allows (1 to 8); it was set to 1.")
        layers.locator("input[type=range]").press("ArrowRight")  # the slider moved: the note goes
        expect(layers.locator(".lab-refused")).to_have_count(0)

        fill(page, "#d_model", "100000")
        expect(page.locator("#d_model input")).to_have_value("100000")  # kept, and refused by name
        expect(page.locator("#config-summary")).to_contain_text("d_model: 100000 is out of range (allowed: 1 to 4096)")
        assert page.locator("#start-btn").is_enabled()
        fill(page, "#d_model", "48")
        expect(page.locator("#config-summary")).not_to_contain_text("out of range")
        assert_no_errors(page)


def test_typing_in_runs_to_compare_filters_and_never_adds_the_text(app_server):
    from playwright.sync_api import expect

    with chromium() as browser:
        page = open_page(browser, app_server.url)
        fill(page, "#steps", "20")
        choose(page, "#pos", "alibi")
        page.locator("#start-btn").click()
        page.wait_for_function("() => document.querySelector('#run-pick input').value.includes('alibi')",
                               polling=250)
        run_id = page.locator("#run-pick input").input_value()
        wait_finished(page, app_server, [run_id], WAIT_MS)

        page.get_by_role("tab", name="Compare").click()
        pick = page.locator("#compare-pick")
        page.locator("#compare-refresh").click()
        box = pick.locator("input")
        box.click()
        box.fill("zzz-no-such-run")
        box.press("Enter")
        expect(pick.locator(".lab-refused")).to_contain_text('Runs to compare: no stored run matches "zzz-no-such-run"')
        expect(pick.locator(".token")).to_have_count(0)  # nothing added
        box.fill("")
        box.type(run_id[-6:])  # the tail every label ends in
        expect(pick.locator(".lab-refused")).to_have_count(0)
        # as a person presses Enter once the run shows in the list (Refresh's new list may still be on its way)
        expect(pick.get_by_role("option").filter(has_text=run_id[-6:])).to_have_count(1)
        box.press("Enter")
        expect(pick.locator(".token")).to_have_count(1)
        expect(pick.locator(".token")).to_contain_text(run_id[-6:])
        expect(page.locator("#compare-note")).not_to_contain_text("not a stored run")
        box.click()  # the same text again: the run stays picked (Enter on a picked option would unpick it)
        box.type(run_id[-6:])
        box.press("Enter")
        expect(pick.locator(".lab-refused")).to_contain_text(f'matches "{run_id[-6:]}" is picked already')
        expect(pick.locator(".token")).to_have_count(1)
        assert_no_errors(page)
