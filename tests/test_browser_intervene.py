"""Inspect's intervention panel in Debian's headless Chromium (issue 15's acceptance): a student opens the
induction preset's 2-layer model, sees its answer to a typed sequence with a repeat, computes the head
importance map, clicks its top cell, and sees the accuracy on the predictable positions drop in the metrics
table and the answer go wrong.

The run is trained (the preset's own settings) into the store before the app is launched; what
the page shows is compared with what the server computes for the same run through the API.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from lab.teach.presets.catalog import INDUCTION
from tests.browser import SHOTS, assert_no_errors, chromium, open_page, shoot
from tests.helpers import app_with_run

pytestmark = pytest.mark.browser  # Chromium driving the real app (tests/conftest.py, the tiers)

WAIT_MS = 180_000  # a shared 2-core host
TYPED = "5 9 2 7 5 9 2 7 5 9"  # a repeat: an induction head predicts the second half
ROW_COUNT = "(sel) => document.querySelector(sel + ' [role=grid]')?.getAttribute('aria-rowcount')"
CELLS = """(sel) => Object.fromEntries([...document.querySelectorAll(sel + ' [role=gridcell]')]
    .map(c => [c.dataset.testid, c.innerText.trim()]))"""  # "cell-R-C" -> text


@pytest.fixture(scope="module")
def induction_app(tmp_path_factory):
    with app_with_run(tmp_path_factory.mktemp("intervene-app"), INDUCTION) as (server, run_id):
        from gradio_client import Client

        yield server, run_id, Client(server.url, verbose=False)


def open_inspect(browser, url: str, viewport: dict):
    page = open_page(browser, url, WAIT_MS, viewport=viewport)
    tab = page.get_by_role("tab", name="Inspect")
    if not tab.is_visible():  # a narrow screen may fold tabs into a menu
        page.locator("#tabs").get_by_role("button").last.click()
    tab.click()
    page.locator("#answer-table").wait_for(state="visible")
    return page


def type_input(page, text: str, rows: int) -> None:
    """Type `text` in the Typed input box, press Enter, wait until the answer table has `rows` rows."""
    box = page.locator("#inspect-text input")
    box.fill(text)
    box.press("Enter")
    page.wait_for_function(f"(sel) => ({ROW_COUNT})(sel) === '{rows + 1}'", arg="#answer-table", polling=250)


def wrong(summary: str) -> int:
    """Tokens wrong in an answer's summary line ("... all 5 scored ... right" or "... 2 of 5 ... wrong")."""
    m = re.search(r"(\d+) of \d+ .*wrong|all \d+ .*right|answer right", summary)
    assert m, summary
    return int(m.group(1)) if m.group(1) else 0


def metric(cells: dict, name: str) -> tuple[float, float]:
    """(intact, with interventions) of the metrics table's row `name`, as numbers."""
    row = next(k.split("-")[1] for k, v in cells.items() if k.endswith("-0") and v == name)
    return tuple(float(cells[f"cell-{row}-{c}"].rstrip("%")) for c in (1, 2))


def test_a_student_knocks_out_the_top_head_and_the_copy_fails(induction_app, tmp_path: Path):
    server, run_id, client = induction_app
    with chromium() as browser:
        page = open_inspect(browser, server.url, {"width": 1400, "height": 900})
        type_input(page, TYPED, len(TYPED.split()))
        intact = page.locator("#answer-summary").inner_text()
        assert intact.startswith("Intact model:") and "scored next-token prediction" in intact
        assert f"Final weights (step {INDUCTION.train.steps})" in page.locator("#answer-weights-note").inner_text()

        page.locator("#importance-btn").click()
        sentence = page.locator("#importance-sentence")
        sentence.get_by_text("Knocking out layer").wait_for()
        layer, head = map(int, re.search(r"layer (\d+) head (\d+)", sentence.inner_text()).groups())
        assert sentence.inner_text().split(". Each")[0] + "." == client.predict(
            run_id, "zero", api_name="/importance")[1].split("**")[1]  # the same measurement as the server's
        top = page.locator(f"#importance-grid [data-testid='cell-{layer}-{head + 1}']")
        assert "background-color" in (top.get_attribute("style") or "")  # coloured like a heatmap
        starred = page.evaluate("""() => [...document.querySelectorAll('#importance-grid [role=gridcell]')]
            .filter(c => c.innerText.trim().startsWith('★')).map(c => c.dataset.testid)""")
        assert starred == [f"cell-{layer}-{head + 1}"], starred  # the sentence's head, marked on the grid
        top.click()

        page.locator("#intervene-metrics").wait_for(state="visible")
        page.locator("#ablated-summary").get_by_text("With interventions").wait_for()
        assert page.locator("#intervene-note").inner_text() == f"Interventions applied: knock out head {layer}.{head} (zero)."
        assert page.locator("#intervene-heads").get_by_label(f"{layer}.{head}", exact=True).is_checked()
        cells = page.evaluate(CELLS, "#intervene-metrics")
        # induction is read on the predictable positions (its exact-match counts the unpredictable first token)
        acc_before, acc_after = metric(cells, "accuracy (predictable positions) (training lengths)")
        loss_before, loss_after = metric(cells, "loss (training lengths)")
        assert acc_after < acc_before and loss_after > loss_before, cells
        api = client.predict(run_id, "typed", TYPED, [f"{layer}.{head}"], "zero", [], [], "intact", api_name="/intervene")
        assert [r[1:] for r in api[0]["value"]["data"]] == [[cells[f"cell-{r}-1"], cells[f"cell-{r}-2"]]
                                                   for r in range(len(api[0]["value"]["data"]))]

        ablated = page.locator("#ablated-summary").inner_text()
        assert wrong(ablated) > wrong(intact), (intact, ablated)  # the answer goes wrong
        assert page.evaluate(CELLS, "#ablated-table")  # its table is on screen beside the intact one
        assert page.locator("#ablated-attn-dec_self img").is_visible()
        assert page.locator("#logit-lens img").is_visible()
        shoot(page, SHOTS / "interventions.png", top="#answer-weights-note", settle_ms=500)  # the README's picture
        assert_no_errors(page)

        page.locator("#intervene-reset").click()  # Reset clears the interventions
        page.locator("#intervene-metrics").wait_for(state="hidden")
        assert not page.locator("#intervene-heads").get_by_label(f"{layer}.{head}", exact=True).is_checked()
        assert_no_errors(page)


def test_the_panel_at_a_phones_width(induction_app, tmp_path: Path):
    server, run_id, client = induction_app
    with chromium() as browser:
        page = open_inspect(browser, server.url, {"width": 390, "height": 844})
        type_input(page, TYPED, len(TYPED.split()))
        page.locator("#importance-btn").click()
        page.locator("#importance-grid").wait_for(state="visible")
        page.locator("#intervene-apply").click()
        page.locator("#intervene-metrics").wait_for(state="visible")
        assert page.evaluate("document.scrollingElement.scrollWidth") <= 390
        for sel in ("#answer-table", "#ablated-table", "#intervene-heads", "#intervene-apply", "#intervene-metrics",
                    "#importance-grid", "#logit-lens", "#generate-prompt"):
            box = page.locator(sel).bounding_box()
            assert box and box["x"] >= 0 and box["x"] + box["width"] <= 390, sel
        page.screenshot(path=str(tmp_path / "intervene-390.png"), full_page=True)
        assert_no_errors(page)
