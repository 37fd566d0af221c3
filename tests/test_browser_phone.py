"""The app on a phone (390 x 844, Chromium): every tab is reachable from the tab bar, Start is on the first
screens of the Train tab, nothing is wider than the screen, and each tab is saved as a screenshot for the
guide (docs/guide.md, docs/screenshots/phone-*.png)."""
from __future__ import annotations

import pytest

from tests.browser import SHOTS, WAIT_MS, assert_no_errors, chromium, open_page, shoot, wait_finished

pytestmark = pytest.mark.browser  # Chromium driving the real app (tests/conftest.py, the tiers)
PHONE = {"width": 390, "height": 844}
TABS = ("Train", "Presets", "Compare", "Inspect", "Learn")
SMALL = {"task": "reverse", "n_layers": 1, "n_heads": 2, "d_model": 32, "d_ff": 64, "steps": 300}


@pytest.fixture(scope="module")
def trained(browser_app) -> list[str]:
    """Two small finished runs (learned and sinusoidal positions) for Compare and Inspect to show."""
    from gradio_client import Client

    from ui.knobs import KNOBS

    client = Client(browser_app.url, verbose=False)
    ids = []
    for pos in ("learned", "sinusoidal"):
        args = {k.url_key: k.default() for k in KNOBS} | SMALL | {"pos": pos}
        pick, *_ = client.predict(**args, my_runs=[], owner="phone-test-user", api_name="/start")
        ids.append(pick["value"])
    return ids


def test_every_tab_at_phone_width(browser_app, trained):
    with chromium() as browser:
        page = open_page(browser, browser_app.url, viewport=PHONE)
        wait_finished(page, browser_app, trained, WAIT_MS)
        tabs = page.get_by_role("tab")
        assert [t.strip() for t in tabs.all_inner_texts()] == list(TABS)  # none hidden behind a "more" menu
        assert all(t.is_visible() for t in tabs.all())
        start = page.locator("#start-btn").bounding_box()
        assert start is not None and start["y"] + start["height"] < 2 * PHONE["height"], start
        for name in TABS:
            page.get_by_role("tab", name=name).click()
            if name == "Compare":
                page.get_by_role("button", name="Select all shown").click()
                page.wait_for_function("() => document.querySelector('#compare-curves .js-plotly-plot')?.data?.length",
                                       polling=250)
            if name == "Inspect":
                page.wait_for_function("() => document.querySelector('#attn-dec_self img, #attn-dec_self canvas')",
                                       polling=250)
            width = page.evaluate("() => document.documentElement.scrollWidth")
            assert width <= PHONE["width"], f"{name}: the page is {width} px wide on a {PHONE['width']} px screen"
            shoot(page, SHOTS / f"phone-{name.lower()}.png")
        assert_no_errors(page)
