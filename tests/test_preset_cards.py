"""A preset's card keeps the result of its last run on this server, in every browser: the explanation of
the newest finished run of each of its runs, found in the store by its exact config, whichever preset ran
after it and whichever browser started it.

The runs are the presets' real configs, trained in-process and stopped after a few steps (a stopped run has
its final evaluation, and the explanation says it stopped), so the tests take seconds, not minutes.
"""
from __future__ import annotations

import re
from dataclasses import replace

import pytest

import app
from lab.engine.recorder import record_run
from lab.engine.store import RunStore
from lab.teach.presets.catalog import PRESETS
from tests.helpers import launch_app
from lab.teach.presets.results import run_result, wanted
from ui.presets import newest_runs

pytestmark = pytest.mark.usefixtures("one_thread")
NOT_RUN = "Not run on this server yet"
LAST = "Last result on this server"


def stopped_run(store: RunStore, cfg, stop_at: int) -> str:
    """A run of `cfg` (a preset's own config) trained in this process and stopped at step `stop_at`."""
    run_id = store.create(cfg)
    record_run(store, run_id, threads=1, stop_at=stop_at)
    assert store.status(run_id)["state"] == "stopped" and store.summary(run_id)["eval"]
    return run_id


def preset_cards(demo) -> dict[str, str]:
    """What the Presets tab's cards say once the tab is opened (its select event): preset key -> text, less the
    projector mode's fold marks (ui/projector.py: a span around the headline and the rest)."""
    fn = next(f for f in demo.fns.values() if f.api_name == "preset_cards").fn
    return {key: re.sub(r"</?span[^>]*>", "", text) for key, text in zip(PRESETS, fn(""))}


def expected(store: RunStore, key: str, ids: dict[str, str]) -> str:
    """The preset's explanation of exactly these runs (run name -> id)."""
    preset = PRESETS[key]
    return preset.explain({name: run_result(store, r, store.summary(r), wanted(preset, name))
                           for name, r in ids.items()})


def test_each_card_keeps_its_own_presets_newest_result(tmp_path):
    store = RunStore(tmp_path / "runs")
    sort_cfg, encdec_cfg = PRESETS["hello_sort"].runs[0], PRESETS["encoder_decoder"].runs[0]
    older = stopped_run(store, sort_cfg, 25)
    demo = app.build_demo(store)
    try:
        shown = preset_cards(demo)
        assert LAST in shown["hello_sort"] and expected(store, "hello_sort", {"sort": older}) in shown["hello_sort"]
        assert "(Stopped early: sort.)" in shown["hello_sort"]
        assert all(NOT_RUN in text for key, text in shown.items() if key != "hello_sort"), shown

        # the next preset runs (from any browser): the first card keeps its result, the second shows its own
        encdec = stopped_run(store, encdec_cfg, 10)
        shown = preset_cards(demo)
        assert expected(store, "hello_sort", {"sort": older}) in shown["hello_sort"]
        assert expected(store, "encoder_decoder", {"encoder-decoder": encdec}) in shown["encoder_decoder"]
        assert "(Stopped early: encoder-decoder.)" in shown["encoder_decoder"]
        assert NOT_RUN in shown["grokking"] and NOT_RUN in shown["induction"]

        # a newer run of the sort preset replaces the older one; a run merely named "sort" (another config)
        # and one still queued do not
        newer = stopped_run(store, sort_cfg, 50)
        stopped_run(store, replace(sort_cfg, train=replace(sort_cfg.train, steps=60)), 30)
        store.create(sort_cfg)  # queued: no result yet
        assert newest_runs(demo.lab_context)["hello_sort"]["sort"][0] == newer
        new_text, old_text = (expected(store, "hello_sort", {"sort": r}) for r in (newer, older))
        assert new_text != old_text  # 50 steps measure differently from 25
        shown = preset_cards(demo)
        assert new_text in shown["hello_sort"] and old_text not in shown["hello_sort"]
        assert expected(store, "encoder_decoder", {"encoder-decoder": encdec}) in shown["encoder_decoder"]

        # a preset whose runs are only partly here says which result is missing
        one_layer = stopped_run(store, PRESETS["induction"].runs[0], 5)
        shown = preset_cards(demo)
        assert "No final results yet for: 2 layers" in shown["induction"], shown["induction"]
        store.delete(one_layer)
        assert NOT_RUN in preset_cards(demo)["induction"]
    finally:
        demo.lab_context.jobs.shutdown(wait=True)


@pytest.mark.browser
def test_another_browser_sees_every_presets_last_result(tmp_path):
    """Chromium: a page opened before the encoder-decoder preset ran shows it once the tab is opened again,
    and a second browser context (its own storage: it never ran a preset) shows both presets' results."""
    from playwright.sync_api import expect

    from tests.browser import assert_no_errors, chromium, open_page

    store = RunStore(tmp_path / "runs")
    sort_run = stopped_run(store, PRESETS["hello_sort"].runs[0], 25)
    sort_text = expected(store, "hello_sort", {"sort": sort_run})
    with launch_app(tmp_path) as server, chromium() as browser:
        first = open_page(browser, server.url)
        first.get_by_role("tab", name="Presets").click()
        expect(first.locator("#preset-card-hello_sort")).to_contain_text(LAST)
        expect(first.locator("#preset-card-hello_sort")).to_contain_text(sort_text)
        expect(first.locator("#preset-card-encoder_decoder")).to_contain_text(NOT_RUN)

        encdec = stopped_run(store, PRESETS["encoder_decoder"].runs[0], 10)  # another browser's preset
        encdec_text = expected(store, "encoder_decoder", {"encoder-decoder": encdec})
        second = open_page(browser, server.url)
        second.get_by_role("tab", name="Presets").click()
        for page in (second, first):
            if page is first:  # the first page sees it when its tab is opened again
                first.get_by_role("tab", name="Train").click()
                first.get_by_role("tab", name="Presets").click()
            expect(page.locator("#preset-card-hello_sort")).to_contain_text(sort_text)
            expect(page.locator("#preset-card-encoder_decoder")).to_contain_text(encdec_text)
            expect(page.locator("#preset-card-grokking")).to_contain_text(NOT_RUN)
            assert_no_errors(page)
    store.close()


def test_the_why_attention_card_quotes_the_lstms_accuracy_by_distance(tmp_path):
    """The card measures the LSTM's final weights (lab/teach/distance.py) and quotes the nearest and farthest
    distance as measured there: the app's path from the store, not the test's."""
    from lab.teach.distance import accuracy_by_distance, near_and_far
    from lab.views.analysis import load_model

    store = RunStore(tmp_path / "runs")
    t_cfg, lstm_cfg = PRESETS["why_attention"].runs
    ids = {"Transformer": stopped_run(store, t_cfg, 30), "LSTM": stopped_run(store, lstm_cfg, 30)}
    demo = app.build_demo(store)
    try:
        card = preset_cards(demo)["why_attention"]
    finally:
        demo.lab_context.jobs.shutdown(wait=True)
    dist = accuracy_by_distance(load_model(lstm_cfg, store.load_weights(ids["LSTM"])), lstm_cfg)
    d0, near, d1, far = near_and_far(dist)
    assert (d0, d1) == (1, 31) and sorted(dist) == list(range(1, 32, 2))
    assert f"right {100 * near:.0f}% of the time when the token to copy was 1 position back and {100 * far:.0f}% " \
           "when it was 31 back" in card, card
    assert LAST in card and "(Stopped early: Transformer, LSTM.)" in card


@pytest.mark.browser
def test_projector_mode_from_the_address_or_the_toggle_shows_each_result_as_a_headline(tmp_path):
    """?projector=1 (or the toggle, kept by the browser) draws the page larger and a preset's result as its
    first sentence, the rest folded until the headline is clicked, and Inspect's panels folded in sections
    under the heatmaps; off, the same text reads as one paragraph and every section is open."""
    from playwright.sync_api import expect

    from tests.browser import assert_no_errors, chromium, open_page

    store = RunStore(tmp_path / "runs")
    sort_run = stopped_run(store, PRESETS["hello_sort"].runs[0], 25)
    text = expected(store, "hello_sort", {"sort": sort_run})
    store.close()
    card = "#preset-card-hello_sort"
    with launch_app(tmp_path) as server, chromium() as browser:
        page = open_page(browser, server.url + "/?projector=1", viewport={"width": 1280, "height": 720})
        expect(page.locator("#projector input")).to_be_checked()
        assert page.evaluate("() => document.body.classList.contains('lab-projector')")
        assert page.evaluate("() => getComputedStyle(document.querySelector('.gradio-container')).zoom") == "1.35"
        page.get_by_role("tab", name="Presets").click()
        headline, rest = page.locator(f"{card} .lab-headline"), page.locator(f"{card} .lab-rest")
        expect(headline).to_be_visible()
        assert text.startswith(headline.inner_text().strip()) and len(headline.inner_text()) < len(text)
        expect(rest).to_be_hidden()
        headline.click()  # unfolds the whole explanation
        expect(rest).to_be_visible()
        assert f"{headline.inner_text().strip()} {rest.inner_text().strip()}" == text

        # Inspect: the heatmaps on top, the panels under them folded in sections; a click opens one
        page.get_by_role("tab", name="Inspect").click()
        page.locator("#attn-dec_self img, #attn-dec_self .js-plotly-plot").first.wait_for()
        sections = ("#inspect-sec-answer", "#inspect-sec-circuits", "#inspect-sec-positions")
        for sec in sections:
            expect(page.locator(f"{sec} .label-wrap")).not_to_have_class(re.compile(r"\bopen\b"))
        expect(page.locator("#answer-weights-note")).to_be_hidden()
        page.locator("#inspect-sec-answer .label-wrap").click()
        expect(page.locator("#answer-weights-note")).to_be_visible()
        expect(page.locator("#answer-weights-note")).to_contain_text("step")
        expect(page.locator("#circuits-roles-note")).to_be_hidden()  # the others stay folded
        page.get_by_role("tab", name="Presets").click()

        page.locator("#projector input").uncheck()  # off: one paragraph, the page at its own size
        assert not page.evaluate("() => document.body.classList.contains('lab-projector')")
        expect(rest).to_be_visible()
        expect(page.locator(card)).to_contain_text(text)
        page.get_by_role("tab", name="Inspect").click()  # and every section open, as without projector mode
        for sec in sections:
            expect(page.locator(f"{sec} .label-wrap")).to_have_class(re.compile(r"\bopen\b"))
        page.get_by_role("tab", name="Presets").click()
        page.locator("#projector input").check()
        page.reload()  # the browser keeps the choice without the address's parameter
        page.goto(server.url)
        expect(page.locator("#projector input")).to_be_checked()
        assert page.evaluate("() => document.body.classList.contains('lab-projector')")
        assert_no_errors(page)
        phone = open_page(browser, server.url + "/?projector=1", viewport={"width": 390, "height": 844})
        assert phone.evaluate("() => getComputedStyle(document.querySelector('.gradio-container')).zoom") == "1"
        phone.get_by_role("tab", name="Presets").click()  # a phone keeps its size; the headline still folds
        expect(phone.locator(f"{card} .lab-rest")).to_be_hidden()
