"""Compare in Debian's headless Chromium, against the real app and real training.

Three runs start from the Train tab and Compare opens while they train. Without another click, the
stored-runs table follows them to "completed" and agrees with the final metrics and the groups (it once
stayed at "running"). One run is named alike in the picker, the legend and the tables, by what tells it
from the others picked. Nothing is empty or cut: no "1 2 3" header, no empty export box; at a phone's
width (390x844) the seed-band figure shows whole and the tables carry each curve's colour.
"""
from __future__ import annotations

import re

import pytest

from tests.browser import assert_no_errors, choose, chromium, curve_names, fill, open_page, shoot, wait_curves, \
    wait_finished

pytestmark = pytest.mark.browser  # Chromium driving the real app (tests/conftest.py, the tiers)
WAIT_MS = 300_000  # a shared 2-core host: three runs train while the page polls
STEPS = 300
LIVE = re.compile(r"\b(queued|running)\b")
# Elements of a block drawn over its image (its containers, hidden ones and the passing progress overlay
# aside): a label on top.
COVERING = """(sel) => { const img = document.querySelector(sel + ' img'), r = img.getBoundingClientRect();
  return [...document.querySelector(sel).querySelectorAll('*')]
    .filter(e => e !== img && !e.contains(img) && !e.closest('[data-testid=status-tracker]')
      && getComputedStyle(e).visibility !== 'hidden' && getComputedStyle(e).opacity !== '0')
    .filter(e => { const b = e.getBoundingClientRect();
      return b.width > 0 && b.height > 0 && b.left < r.right && b.right > r.left && b.top < r.bottom && b.bottom > r.top; })
    .map(e => e.tagName + ' ' + (e.innerText || '').trim().slice(0, 40)); }"""
ROWS = "(sel) => [...document.querySelectorAll(sel + ' [role=row]')].slice(1).map(r => r.innerText)"


@pytest.fixture
def page(browser_app):
    """A fresh page for each test: no test depends on what another left on screen."""
    with chromium() as browser:
        yield open_page(browser, browser_app.url, WAIT_MS)


def start(page, previous: str) -> str:
    """Click Start; the new run's id once the Train tab shows it."""
    page.locator("#start-btn").click()
    page.wait_for_function("([sel, prev]) => { const v = document.querySelector(sel).value; return v && v !== prev; }",
                           arg=["#run-pick input", previous], polling=250)
    return page.locator("#run-pick input").input_value()


def rows(page, sel: str) -> dict[str, str]:
    """A table's rows on the page: its first cell -> the row's text."""
    return {text.split("\n")[0].strip(): text for text in page.evaluate(ROWS, sel) if text.strip()}


def state_of(page, sel: str, key: str) -> str:
    """The state a table on the page shows in the row whose first cell contains `key`."""
    hits = [text for first, text in rows(page, sel).items() if key in first]
    assert len(hits) == 1, (sel, key, rows(page, sel))
    found = re.search(r"\b(queued|running|completed|stopped|failed|interrupted)\b", hits[0])
    return found.group(1) if found else ""


def test_before_a_selection_compare_shows_no_placeholder(page):
    """No placeholder header ("1 2 3") over the final metrics, no empty export box, no empty figures."""
    from playwright.sync_api import expect

    page.get_by_role("tab", name="Compare").click()
    expect(page.locator("#compare-finals").get_by_role("row").first).to_contain_text("wall time (s)")
    assert page.evaluate(ROWS.replace(".slice(1)", ""), "#compare-finals")[0].split("\n")[0].strip() == "run"
    expect(page.get_by_text("Exported files")).to_be_hidden()
    for hidden in ("#compare-files", "#compare-params", "#compare-bands"):
        expect(page.locator(hidden)).to_be_hidden()
    assert_no_errors(page)


def test_the_stored_runs_table_follows_runs_to_completed_without_a_click_at_any_width(page, browser_app):
    from playwright.sync_api import expect

    page.get_by_role("tab", name="Train").click()
    fill(page, "#steps", str(STEPS))
    learned = start(page, "")
    choose(page, "#pos", "sinusoidal")
    sinusoidal = start(page, learned)
    choose(page, "#pos", "learned")
    page.locator("#advanced-train").get_by_text("Advanced").first.click()
    fill(page, "#seed", "1")
    seed1 = start(page, sinusoidal)
    ids = [learned, sinusoidal, seed1]

    page.get_by_role("tab", name="Compare").click()
    table = page.locator("#runs-table")
    for r in ids:
        expect(table).to_contain_text(r)
    assert LIVE.search(" ".join(rows(page, "#runs-table").values())), "the runs finished before Compare opened"
    page.get_by_role("button", name="Select all shown").click()
    page.wait_for_function("() => document.querySelectorAll('#compare-pick .token').length == 3", polling=250)
    wait_finished(page, browser_app, ids, WAIT_MS)  # the status files say completed; no click from here on

    for r in ids:  # the stored-runs table follows the store, without a click
        expect(table.get_by_role("row").filter(has_text=r)).to_contain_text("completed", timeout=WAIT_MS)
    finals = page.locator("#compare-finals")
    expect(finals.get_by_role("row").filter(has_text="completed")).to_have_count(3, timeout=WAIT_MS)
    groups = page.locator("#compare-groups")  # learned, seeds 0 and 1: one group of 2; sinusoidal alone
    expect(groups.get_by_role("row").filter(has_text=re.compile(r"\(2 seeds\)\s+2\s+0, 1\s+2\s"))).to_have_count(
        1, timeout=WAIT_MS)
    for r in ids:  # every view of a run's state says the same
        assert state_of(page, "#runs-table", r) == "completed"
        assert state_of(page, "#compare-finals", r[-6:]) == "completed"
    assert not LIVE.search(page.locator("#compare-groups").inner_text() + page.locator("#runs-table").inner_text())

    # one name per run in the picker, the legend and the tables: what tells it from the others picked
    wait_curves(page, "#compare-curves", 3, points=50)
    tokens = page.locator("#compare-pick .token").all_inner_texts()
    legend = curve_names(page, "#compare-curves")
    assert sorted(tokens) == sorted(legend) == sorted(rows(page, "#compare-finals")), (tokens, legend)
    assert sorted(tokens) == sorted([f"learned s0 ({learned[-6:]})", f"sinusoidal s0 ({sinusoidal[-6:]})",
                                     f"learned s1 ({seed1[-6:]})"]), tokens
    assert "learned (2 seeds)" in rows(page, "#compare-groups")
    config = page.locator("#compare-configs").get_by_role("row").first.inner_text()
    assert "Positional encoding" in config and "Seed" in config and "model." not in config
    assert_no_errors(page)
    shoot(page, browser_app.runs_dir.parent / "compare-wide.png", top="#compare-pick", settle_ms=500)
    at_a_phone_width_the_band_figure_shows_whole(page, browser_app)


def at_a_phone_width_the_band_figure_shows_whole(page, browser_app) -> None:
    """The same page at 390x844 (the runs above, still picked): the band figure is not covered by its label
    or cut at the edge, and the tables name each curve beside a bar in its colour (the curves' legend is one
    row, cut at this width)."""
    page.set_viewport_size({"width": 390, "height": 844})
    bands = page.locator("#compare-bands img")
    bands.scroll_into_view_if_needed()
    page.wait_for_function("() => { const i = document.querySelector('#compare-bands img');"
                           " return i && i.complete && i.naturalWidth > 300; }", polling=250)
    box = bands.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= 390, box
    covering = page.evaluate(COVERING, "#compare-bands")
    assert not covering, f"the band figure is covered by {covering}"
    for sel, count in (("#compare-finals", 3), ("#compare-groups", 2)):
        bars = page.evaluate("(sel) => [...document.querySelectorAll(sel + ' [role=gridcell][aria-colindex=\"1\"]')]"
                             ".map(td => getComputedStyle(td).boxShadow).filter(s => s.includes('inset'))", sel)
        assert len(set(bars)) == count, (sel, bars)
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    shoot(page, browser_app.runs_dir.parent / "compare-phone.png", top="#compare-bands", settle_ms=500)
