"""The Inspect tab: the callbacks behind it (fast, on a store of tiny runs trained here) and, in Debian's
headless Chromium, what only a browser shows (slow): the PCA on screen is the picked run's, a typed
input the run cannot take is answered beside its box while the heatmaps stay, and the tab at a phone's
width.

The browser tests launch the app in its own subprocess on a store holding three small runs trained
before launch (learned and sinusoidal positions of different lengths, and ALiBi), and compare what the
page shows with what the server computes for the same run through the API.
"""
from __future__ import annotations


import gradio as gr
import pytest

from lab.engine.store import RunStore
from lab.views.analysis import positional_view
from lab.views.plots import pca_figure
from tests.browser import assert_no_errors, chromium, open_page
from tests.helpers import app_context, launch_app, tiny_config, trained_run
from ui.inspect.attention import attention_view, positional_panel, run_label, typed_note
from ui.inspect.tab import build_inspect_tab

TINY = tiny_config(steps=20, batch_size=16, warmup=0, eval_every=20, eval_samples=16, snapshots=3)
SKIP = {"__type__": "update"}  # gr.skip(): the output is left as it is


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    with app_context(tmp_path_factory.mktemp("inspect")) as context:
        yield context


@pytest.fixture(scope="module")
def runs(ctx) -> dict[str, str]:
    return {"learned": trained_run(ctx.store, tiny_config(TINY)),
            "alibi": trained_run(ctx.store, tiny_config(TINY, pos="alibi", n_heads=4)),
            "queued": ctx.store.create(tiny_config(TINY))}  # no weights yet


def parts(out: list) -> tuple[list, object, str, object, object]:
    """attention_view's outputs: (figures, caption, note beside the box, step slider, probe choice)."""
    return out[:3], out[3], out[4], out[5], out[6]


# ---- the callbacks (fast) --------------------------------------------------------------------------
def test_the_pca_is_a_whole_figure_of_the_run_picked(ctx, runs):
    """Item 1: a figure carries its own points, axes and colours; a native scatter plot sent new points
    and new axis limits kept the previous run's points and colour scale under the new axes."""
    run_id = runs["learned"]
    pca, fig, caption = positional_panel(ctx, run_id, "A")
    assert isinstance(pca, gr.Plot) and pca.visible is True
    view = positional_view(ctx.store.config(run_id), ctx.store.load_weights(run_id))
    title = "A · " + run_label(ctx, run_id)
    assert pca.value["plot"] == gr.Plot(pca_figure(view, title)).value["plot"]  # the same picture, pixel for pixel
    assert title.startswith("A · learned") and caption.startswith(f"PCA of {len(view.pca)} position vectors")

    pca, fig, caption = positional_panel(ctx, runs["alibi"], "B")  # no position vectors: no PCA, no "NaN"
    assert isinstance(pca, gr.Plot) and pca.visible is False and pca.value is None
    assert sum(1 for ax in fig.axes if ax.images) == 4 and caption.startswith("ALiBi adds no vector")


def test_a_bad_typed_input_keeps_the_figures_and_is_answered_beside_the_box(ctx, runs):
    figures, caption, note, slider, probe = parts(attention_view(ctx, runs["learned"], "typed", "z z", 20))
    assert figures == [SKIP] * 3 and caption == SKIP and slider == SKIP and probe == SKIP
    assert note.startswith("⚠️ **Typed input**: 'z' is not a symbol of task 'copy'") and "allowed: 0, 1" in note


def test_picking_typed_before_typing_asks_for_input_without_an_error(ctx, runs):
    figures, caption, note, slider, _ = parts(attention_view(ctx, runs["learned"], "typed", "", 20))
    assert figures == [SKIP] * 3 and caption == SKIP
    assert note.startswith("Type symbols of task copy (0, 1, 2") and "⚠️" not in note and "empty" not in note


def test_the_note_goes_when_its_cause_does(ctx, runs):
    run_id = runs["learned"]
    assert "**Typed input**" in typed_note(ctx, run_id, "typed", "1 x")
    assert typed_note(ctx, run_id, "typed", "1 2") == ""  # fixed
    assert typed_note(ctx, run_id, "sampled", "1 x") == ""  # the typed input is not used
    assert "no final weights yet" in typed_note(ctx, runs["queued"], "typed", "1 2")
    _, _, note, _, _ = parts(attention_view(ctx, run_id, "typed", "1 2", 20))
    assert note == ""


def test_after_a_run_change_an_undrawable_input_hides_the_other_runs_figures(ctx, runs):
    figures, caption, note, _, _ = parts(attention_view(ctx, runs["queued"], "typed", "1 2", 0, trigger="run"))
    assert [f.visible for f in figures] == [False] * 3 and "Typed input" in caption and "final weights" in note


def test_the_step_slider_says_what_is_shown(ctx, runs):
    """Item 10: a typed input runs the final weights, so the slider shows that step, disabled."""
    run_id = runs["learned"]
    figures, caption, _, slider, _ = parts(attention_view(ctx, run_id, "typed", "3 1 2", 0))
    assert caption.startswith("Typed input, final weights") and figures[1].visible is True
    assert slider.interactive is False and slider.value == 20 and "final weights (step 20)" in slider.label
    steps = ctx.store.snapshot_steps(run_id)
    _, caption, _, slider, _ = parts(attention_view(ctx, run_id, "sampled", "3 1 2", steps[0] + 1))
    assert slider.interactive is True and slider.value == steps[0] and f"at step {steps[0]}." in caption


def test_enter_in_the_typed_box_picks_the_typed_probe(ctx, runs):
    _, caption, note, _, probe = parts(attention_view(ctx, runs["learned"], "sampled", "3 1", 0, trigger="text"))
    assert probe == "typed" and caption.startswith("Typed input") and note == ""
    assert parts(attention_view(ctx, runs["learned"], "sampled", " ", 0, trigger="text"))[4] == SKIP  # nothing typed


def test_no_figure_label_sits_over_the_figures_own_title(ctx):
    """Item 10: each figure has its title drawn in; a label above it repeated it and covered it."""
    with gr.Blocks():
        tab = build_inspect_tab(ctx)
    plots = [b for b in _walk(tab) if isinstance(b, gr.Plot)]
    assert len(plots) == 14  # three attention kinds, PCA and similarity for A and B; intervened attention x3, lens;
    # the circuits panel's roles heatmap, Fourier picture and a patch's attention
    assert [p.elem_id for p in plots if p.show_label is not False] == []


def _walk(block):
    for child in getattr(block, "children", []):
        yield child
        yield from _walk(child)


# ---- in Chromium (slow) ---------------------------------------------------------------------------
WAIT_MS = 120_000  # a shared 2-core host
BROWSER_RUNS = {"learned": tiny_config(TINY), "sinusoidal": tiny_config(TINY, pos="sinusoidal", max_len=12),
                "alibi": tiny_config(TINY, pos="alibi", n_heads=4)}
IMG_SRC = "(sel) => { const i = document.querySelector(sel + ' img'); return i ? i.src : null; }"


@pytest.fixture(scope="module")
def inspect_app(tmp_path_factory):
    folder = tmp_path_factory.mktemp("inspect-app")
    store = RunStore(folder / "runs")
    ids = {name: trained_run(store, cfg) for name, cfg in BROWSER_RUNS.items()}
    store.close()
    with launch_app(folder) as server:
        from gradio_client import Client

        yield server, ids, Client(server.url, verbose=False)


def open_inspect(browser, url: str, viewport: dict):
    page = open_page(browser, url, viewport=viewport)
    tab = page.get_by_role("tab", name="Inspect")
    if not tab.is_visible():  # a narrow screen may fold tabs into a menu
        page.locator("#tabs").get_by_role("button").last.click()
    tab.click()
    page.wait_for_function(f"() => ({IMG_SRC})('#attn-dec_self')", timeout=WAIT_MS, polling=250)
    return page


def pick(page, dropdown: str, label: str) -> None:
    """Pick the option `label` in `dropdown` (its list, then Escape), as a teacher does."""
    page.locator(f"{dropdown} input").click()
    page.locator(dropdown).get_by_role("option", name=label, exact=True).click()
    page.keyboard.press("Escape")


def wait_src(page, sel: str, expected: str) -> None:
    page.wait_for_function(f"([sel, want]) => ({IMG_SRC})(sel) === want", arg=[sel, expected], timeout=WAIT_MS,
                           polling=250)


@pytest.mark.browser
def test_the_pca_on_screen_is_the_picked_runs_in_chromium(inspect_app):
    """Item 1: pick run after run in A; each time the PCA on screen is exactly the picture the server
    draws for that run (before: the previous run's points and legend under the new run's axes)."""
    server, ids, client = inspect_app
    labels = {rid: label for label, rid in client.predict(api_name="/inspect_runs")[0]["choices"]}
    expected = {}
    for name, rid in ids.items():
        pca, fig, note = client.predict(rid, api_name="/positional_a")
        expected[name] = (pca["value"]["plot"] if pca["visible"] else None, fig["plot"], note)
    assert expected["alibi"][0] is None and len({e[0] for e in expected.values()}) == 3
    with chromium() as browser:
        page = open_inspect(browser, server.url, {"width": 1400, "height": 900})
        for name in ("learned", "sinusoidal", "alibi", "learned"):
            pick(page, "#inspect-run", labels[ids[name]])
            pca, fig, note = expected[name]
            wait_src(page, "#pe-fig-A", fig)
            if pca is None:
                page.locator("#pca-A").wait_for(state="hidden", timeout=WAIT_MS)
            else:
                wait_src(page, "#pca-A", pca)
                assert page.locator("#pca-A").is_visible()
            assert page.locator("#pe-note-A").inner_text().strip() == note.strip()
            assert page.locator("#inspect-run-a textarea").input_value() == labels[ids[name]]
        # no label box over a figure's own title (only the one screen readers read)
        labels_shown = [b for b in (page.locator(f"{s} [data-testid='block-label']").bounding_box()
                                    for s in ("#attn-dec_self", "#pca-A", "#pe-fig-A")) if b and b["height"] > 1]
        assert labels_shown == []
        assert_no_errors(page)


@pytest.mark.browser
def test_a_bad_typed_input_is_answered_beside_the_box_in_chromium(inspect_app):
    """Item 4: picking "typed" before typing is no error; a bad input gets a message naming the box
    just below it, the heatmaps stay; fixing the input removes the message; the slider says "final weights"."""
    server, ids, client = inspect_app
    labels = {rid: label for label, rid in client.predict(api_name="/inspect_runs")[0]["choices"]}
    with chromium() as browser:
        page = open_inspect(browser, server.url, {"width": 1400, "height": 900})
        pick(page, "#inspect-run", labels[ids["learned"]])
        _, dec_self, _, _ = client.predict(ids["learned"], "sampled", "", TINY.train.steps, api_name="/attention")
        shown = dec_self["value"]["plot"]  # the last snapshot's heatmaps, as the server draws them
        wait_src(page, "#attn-dec_self", shown)
        note = page.locator("#inspect-text-note")

        page.locator("#inspect-source").get_by_text("typed", exact=True).click()
        note.get_by_text("Type symbols of task copy").wait_for(timeout=WAIT_MS)
        box = page.locator("#inspect-text input")
        box.fill("z z")
        box.press("Enter")
        note.get_by_text("is not a symbol of task").wait_for(timeout=WAIT_MS)
        assert note.inner_text().startswith("⚠️ Typed input: 'z'")
        below, message = page.locator("#inspect-text").bounding_box(), note.bounding_box()
        assert 0 <= message["y"] - (below["y"] + below["height"]) < 60  # right under the box
        assert below["x"] - 5 <= message["x"] < below["x"] + below["width"]
        # the note can come first from the box's own check (text.change) while the Enter event still runs,
        # its plots showing their progress: once it is done, the same heatmaps are on screen
        wait_src(page, "#attn-dec_self", shown)
        assert page.locator("#attn-dec_self img").is_visible()
        assert page.get_by_text("Error", exact=True).count() == 0
        assert_no_errors(page)

        box.fill("3 1 2")  # fixed: the message goes, before the input is even drawn
        page.wait_for_function("() => document.querySelector('#inspect-text-note').innerText.trim() === ''",
                               timeout=WAIT_MS, polling=250)
        box.press("Enter")
        page.wait_for_function("() => document.querySelector('#inspect-caption').innerText.startsWith('Typed input')",
                               timeout=WAIT_MS, polling=250)
        assert page.evaluate(IMG_SRC, "#attn-dec_self") != shown
        slider = page.locator("#inspect-step")
        assert "final weights (step 20)" in slider.inner_text()
        assert slider.locator("input[type=range]").is_disabled()
        assert slider.locator("input[type=number]").input_value() == "20"

        page.locator("#inspect-source").get_by_text("sampled", exact=True).click()
        page.wait_for_function("() => !document.querySelector('#inspect-step input[type=range]').disabled",
                               timeout=WAIT_MS, polling=250)
        assert_no_errors(page)


@pytest.mark.browser
def test_the_inspect_tab_at_a_phones_width(inspect_app, tmp_path):
    """Item 11: at 390x844 nothing is wider than the screen, each control gets a usable width, and each
    side's picker sits above its own figures."""
    server, ids, client = inspect_app
    with chromium() as browser:
        page = open_inspect(browser, server.url, {"width": 390, "height": 844})
        wait_src(page, "#pe-fig-B", client.predict(ids["sinusoidal"], api_name="/positional_b")[1]["plot"])
        assert page.evaluate("document.scrollingElement.scrollWidth") <= 390
        for sel in ("#inspect-run", "#inspect-source", "#inspect-text", "#inspect-step", "#inspect-run-a",
                    "#inspect-run-b", "#attn-dec_self", "#pe-fig-A", "#pe-fig-B"):
            box = page.locator(sel).bounding_box()
            assert box["x"] >= 0 and box["x"] + box["width"] <= 390, sel
        for sel in ("#inspect-run", "#inspect-text", "#inspect-run-b"):
            assert page.locator(sel).bounding_box()["width"] >= 300, f"{sel} is too narrow to read a run's name"
        top = {s: page.locator(s).bounding_box()["y"] for s in ("#inspect-run-a", "#pe-fig-A", "#inspect-run-b",
                                                               "#pca-B", "#pe-fig-B")}
        assert sorted(top, key=top.get) == list(top), top  # A's picker, A's figures, B's picker, B's figures
        page.screenshot(path=str(tmp_path / "inspect-390.png"), full_page=True)
        assert_no_errors(page)
