"""The preset cards' time estimates follow the server, in Debian's headless Chromium against the real app.

On a fresh server a card says its estimate is a first guess. Two long runs started by someone else (through
the API) fill both training slots; opening the Presets tab again, the card says they are ahead in the
queue (training now), and once they have trained a little, that the speed was measured on this server now. The runs are
stopped at the end.
"""
from __future__ import annotations

import time

import pytest

from tests.browser import assert_no_errors, chromium, open_page

pytestmark = pytest.mark.browser  # Chromium driving the real app (tests/conftest.py, the tiers)
WAIT_MS = 150_000  # a shared 2-core host
LONG = {"task": "reverse", "steps": 50_000}  # trains far longer than the test


def reopen_until(page, card, text: str, timeout_s: float = WAIT_MS / 1000) -> str:
    """Select another tab, then Presets, until `card` contains `text` (the cards refresh when the tab is
    selected); its text."""
    from playwright.sync_api import expect

    deadline = time.monotonic() + timeout_s
    while True:
        page.get_by_role("tab", name="Train").click()
        page.get_by_role("tab", name="Presets").click()
        try:
            expect(card).to_contain_text(text, timeout=5_000)
            return card.inner_text()
        except AssertionError:
            if time.monotonic() > deadline:
                raise


def test_preset_cards_show_the_estimate_for_this_server_now(browser_app):
    from gradio_client import Client
    from playwright.sync_api import expect

    client = Client(browser_app.url, verbose=False)
    with chromium() as browser:
        page = open_page(browser, browser_app.url, WAIT_MS)
        page.get_by_role("tab", name="Presets").click()
        card = page.locator("#preset-card-induction")
        expect(card).to_contain_text("until all 2 runs are done", timeout=WAIT_MS)
        expect(card).to_contain_text("a first guess: nothing has trained on this server yet", timeout=WAIT_MS)

        ids = [client.predict(**LONG, seed=s, my_runs=[], owner="other", api_name="/start")[0]["value"]
               for s in (1, 2)]
        try:
            text = reopen_until(page, card, "2 runs ahead of them (training now)")
            assert "first guess" in text or "measured on this server now" in text, text
            text = reopen_until(page, card, "speed measured on this server now, from the 2 runs training")
            assert "2 runs ahead of them (training now)" in text and "2 at a time" in text, text
            assert_no_errors(page)
        finally:
            for run_id in ids:
                client.predict(run_id, "other", api_name="/stop")
