"""The ablation grid and a preset in Debian's headless Chromium, against the real app and real training.

Grid: from the Train tab set a tiny config, open the grid, choose PE x norm x 2 seeds (8 runs), check
the count and estimate shown, launch, and see Compare open on the 8 runs, grouped: a band figure and a
table of 4 groups (2 seeds each) once they finish. Preset: "Hello, sort" at full size opens Compare on
its run with its curve drawn, and its explanation appears (in Compare and in the Presets tab, also after a
reload): as the first click on a fresh page (Compare never shown) and again after the grid, on its page.

Each test gets a fresh page; the server is the module's, and a short run trained through its API before
the first test gives it a measured speed whatever test comes first.
"""
from __future__ import annotations

import json
import math
import re
import time

import pytest

from tests.browser import assert_no_errors, choose, chromium, curve_names, fill, open_page, shoot, wait_curves, \
    wait_finished
from tests.helpers import AppServer, poll_until_done, start
from lab.records import EXACT_MATCH

pytestmark = pytest.mark.browser  # Chromium driving the real app (tests/conftest.py, the tiers)
WAIT_MS = 150_000  # a shared 2-core host
GROUPS = ["rope pre-LN (2 seeds)", "rope post-LN (2 seeds)", "alibi pre-LN (2 seeds)", "alibi post-LN (2 seeds)"]


@pytest.fixture(scope="module")
def trained_app(browser_app) -> AppServer:
    """The module's server after it has trained one short run (its estimates then speak of measured speed:
    a run's speed counts once it has trained 1.5 s, lab/engine/estimate.py)."""
    from gradio_client import Client

    client = Client(browser_app.url, verbose=False)
    text, _, _ = poll_until_done(client, start(client, steps=600))
    assert "Completed" in text, text
    return browser_app


@pytest.fixture
def page(trained_app):
    """A fresh page of the module's server for each test."""
    with chromium() as browser:
        yield open_page(browser, trained_app.url, WAIT_MS)


def picked(page) -> list[str]:
    """The run ids selected in Compare (the picker shows labels ending in the id's last 6 characters)."""
    return page.locator("#compare-pick .token").all_inner_texts()


def assert_tab_headers_unique(page) -> None:
    """Each tab header once (a stray component directly in gr.Tabs made headers repeat: "Presets" twice)."""
    labels = page.evaluate("() => [...document.querySelectorAll('#tabs [role=tab]')].map(t => t.innerText)")
    assert len(labels) == len(set(labels)) and {"Train", "Presets", "Compare"} <= set(labels), labels


def click_and_open_compare(page, app, button: str, runs: int, shared: bool = False) -> list[str]:
    """Click `button`: Compare opens with the `runs` new runs picked (each tab header still once); their ids.
    With `shared`, the runs may be ones the server already has for the same configurations (lab/engine/sharing.py):
    the picked runs' ids, new or not."""
    from playwright.sync_api import expect

    before = app.run_folders()
    page.locator(button).click()
    expect(page.get_by_role("tab", name="Compare")).to_have_attribute("aria-selected", "true", timeout=WAIT_MS)
    page.wait_for_function(f"() => document.querySelectorAll('#compare-pick .token').length == {runs}",
                           timeout=WAIT_MS)
    assert_tab_headers_unique(page)
    new = sorted(app.run_folders() - before)
    if shared:
        shown = [r for r in app.run_folders() if any(r[-6:] in token for token in picked(page))]
        assert len(shown) == runs and set(new) <= set(shown)
        return sorted(shown)
    assert len(new) == runs
    return new


def plot_image_drawn(page, sel: str) -> None:
    page.wait_for_function(f"() => {{ const i = document.querySelector('{sel} img'); "
                           "return i && i.complete && i.naturalWidth > 300; }", timeout=WAIT_MS, polling=250)


def test_a_preset_as_the_first_click_opens_compare_on_its_curve(page, trained_app):
    """Compare not shown yet on this page: its curve plot is first drawn while the preset's steps arrive."""
    run_hello_sort(page, trained_app)


def test_grid_of_8_runs_opens_compare_grouped_then_a_preset_on_its_run_alone(page, trained_app):
    """The grid's 8 runs grouped in Compare; then, on the same page, a preset opens Compare on its run alone."""
    from playwright.sync_api import expect

    browser_app = trained_app
    page.get_by_role("tab", name="Train").click()
    fill(page, "#steps", "60")  # a tiny config: 60 steps of the default model
    page.locator("#grid").get_by_text("Ablation grid").first.click()
    choose(page, "#grid-axis-1", "PE")
    fill(page, "#grid-values-1", "rope, alibi")
    choose(page, "#grid-axis-2", "norm")
    fill(page, "#grid-values-2", "pre, post")
    choose(page, "#grid-axis-3", "seed")
    fill(page, "#grid-values-3", "1, 2")
    preview = page.locator("#grid-preview")
    expect(preview).to_contain_text("8 runs", timeout=WAIT_MS)
    text = preview.inner_text()
    est = re.search(r"About ([\d.]+) (s|min) until all are done \(.*2 at a time", text)
    assert est, text  # the wait for all 8, two jobs at a time, and what the speed comes from
    wall = float(est.group(1)) * (60 if est.group(2) == "min" else 1)
    assert wall > 0 and "speed measured on this server" in text, text  # the fixture's run trained here

    t0 = time.monotonic()
    new = click_and_open_compare(page, browser_app, "#grid-launch", 8)
    names = {json.loads((browser_app.runs_dir / r / "config.json").read_text())["name"] for r in new}
    assert names == {f"pos={p} norm={n} seed={s}" for p in ("rope", "alibi") for n in ("pre", "post") for s in (1, 2)}
    assert {t[-7:-1] for t in picked(page)} == {r[-6:] for r in new}
    wait_finished(page, browser_app, new, WAIT_MS)
    took = time.monotonic() - t0

    groups = page.locator("#compare-groups")
    for g in GROUPS:  # the grouped table: 4 groups of 2 seeds, all finished
        expect(groups).to_contain_text(g, timeout=WAIT_MS)
    # 4 rows (not the header) of runs 2, seeds "1, 2", finished 2; the timer refreshes it within 2 s
    done = groups.get_by_role("row").filter(has_text=re.compile(r"\(2 seeds\)\s+2\s+1, 2\s+2\s"))
    expect(done).to_have_count(4, timeout=WAIT_MS)
    expect(groups.get_by_role("row")).to_have_count(5)
    plot_image_drawn(page, "#compare-bands")  # the mean curves with their min-max bands
    wait_curves(page, "#compare-curves", 8, points=30)  # the per-run view stays
    legend = curve_names(page, "#compare-curves")
    assert len(legend) == 8 and all(len(t) <= 25 and not t.endswith("…") for t in legend), legend
    assert_no_errors(page)
    print(f"\ngrid: estimate {wall} s (2 at a time); 8 runs finished {took:.0f} s after launch")
    shoot(page, browser_app.runs_dir.parent / "grid-compare.png", top="#compare-bands", settle_ms=500)
    see_accuracy_by_length(page)

    run_hello_sort(page, browser_app)  # Compare showing the grid's 8 runs: the preset's run replaces them


def see_accuracy_by_length(page) -> None:
    """Compare's accuracy-by-length panel (open, under the curves) on the grid's runs (reverse, trained on lengths
    1-8, scored to 16): the first configuration drawn at once, another picked by typing its name and Enter, then
    by the mouse."""
    from playwright.sync_api import expect

    cell, title = page.locator("#compare-cell input"), page.locator("#compare-lengths .gtitle")
    expect(cell).to_have_value(GROUPS[0], timeout=WAIT_MS)
    said = re.compile(r"lengths 1-8: \d+%[\s\u200b]*longer lengths 9-16: \d+% \(mean over 2 seeds\)")
    expect(title).to_contain_text(GROUPS[0], timeout=WAIT_MS)
    expect(title).to_contain_text(said)
    expect(page.locator("#compare-lengths .legendtext")).to_have_text(["seed 1", "seed 2", "mean over seeds"])
    cell.click()
    cell.fill("alibi post")
    cell.press("Enter")
    expect(title).to_contain_text(GROUPS[3], timeout=WAIT_MS)
    expect(cell).to_have_value(GROUPS[3])
    choose(page, "#compare-cell", GROUPS[1])
    expect(title).to_contain_text(GROUPS[1], timeout=WAIT_MS)
    expect(title).to_contain_text(said)
    assert_no_errors(page)


def run_hello_sort(page, browser_app) -> None:
    """Run the "Hello, sort" preset from its card; Compare opens on its run, draws its curve in the
    selection's colours, explains the result, and the Presets tab shows it again after a reload."""
    from playwright.sync_api import expect

    page.get_by_role("tab", name="Presets").click()
    card = page.locator("#preset-card-hello_sort")
    expect(card).to_contain_text("Predict before you click")
    expect(card).to_contain_text("until it is done")  # the estimate for this server now
    t0 = time.monotonic()
    # the module's first click trains it; a later one watches that run (one training per configuration)
    new = click_and_open_compare(page, browser_app, "#preset-hello_sort", 1, shared=True)
    assert picked(page)[0].startswith("sort (") and new[0][-6:] in picked(page)[0]
    assert page.locator("#compare-metric .token").all_inner_texts() == ["held-out exact-match"]
    note = page.locator("#compare-note")
    expect(note).to_contain_text("Hello, sort", timeout=WAIT_MS)
    wait_finished(page, browser_app, new, WAIT_MS)
    expect(note).to_contain_text("1 of 1 runs done.", timeout=WAIT_MS)
    expect(note).to_contain_text(re.compile(r"Solved by step \d+ of 300 \(held-out exact-match at or above 99\.9% from "
                                            r"that evaluation on\): every held-out sequence came back sorted|Not solved"))
    took = time.monotonic() - t0
    explanation = note.inner_text()
    assert "exact-match" in explanation
    # the new run's curve, named as the picker names it (not one of the grid's runs)
    wait_curves(page, "#compare-curves", 1, points=3)
    # a click that finds the run trained already answers at once: the grid's curves may still be on screen
    # for the moment the redraw for the new selection takes (what is asserted: they are then replaced)
    for _ in range(WAIT_MS // 250):
        if curve_names(page, "#compare-curves") == picked(page):
            break
        page.wait_for_timeout(250)
    assert curve_names(page, "#compare-curves") == picked(page)
    assert_no_errors(page)

    page.reload()  # the browser remembers the last preset
    page.wait_for_selector("#start-btn:enabled")  # enabled once the page has loaded
    page.get_by_role("tab", name="Presets").click()
    expect(page.locator("#preset-status")).to_contain_text("1 of 1 runs done.", timeout=WAIT_MS)
    assert explanation.split(". ", 1)[1][:60] in page.locator("#preset-status").inner_text()
    print(f"\npreset 'Hello, sort': finished and explained {took:.0f} s after the click")


MAP_STATE = """() => { const g = document.querySelector('#compare-stability .js-plotly-plot');
  return g && g.data ? {title: g.layout.title.text, traces: g.data.map(t => ({name: t.name, x: t.x, y: t.y, z: t.z,
    text: t.text})), notes: (g.layout.annotations || []).filter(a => a.xref !== 'paper').map(a => ({x: a.x, y: a.y,
    text: a.text})), drawn: g.querySelectorAll('.annotation-text').length} : null; }"""


def test_a_grid_over_learning_rate_and_warmup_draws_the_stability_map_of_the_stores_numbers(page, trained_app):
    """A grid over two numbers (learning rate x warmup) opens Compare with the stability map: each cell is the
    run's final held-out loss as the store has it; switching the curve redraws the map with the new measure;
    picking two runs (one number varies) hides it."""
    from playwright.sync_api import expect

    page.get_by_role("tab", name="Train").click()
    fill(page, "#steps", "150")
    page.locator("#grid").get_by_text("Ablation grid").first.click()
    choose(page, "#grid-axis-1", "lr")
    fill(page, "#grid-values-1", "3e-3, 1e-2")
    choose(page, "#grid-axis-2", "warmup")
    fill(page, "#grid-values-2", "0, 20")
    expect(page.locator("#grid-preview")).to_contain_text("4 runs", timeout=WAIT_MS)
    new = click_and_open_compare(page, trained_app, "#grid-launch", 4)
    wait_finished(page, trained_app, new, WAIT_MS)
    summaries = {}
    for r in new:
        cfg = json.loads((trained_app.runs_dir / r / "config.json").read_text())
        summary = json.loads((trained_app.runs_dir / r / "summary.json").read_text())
        summaries[(f"{cfg['train']['lr']:g}", str(cfg["train"]["warmup"]))] = summary["eval"]

    def drawn(measure: str) -> dict:
        """The map on the page once every cell says something: {(lr, warmup): its number, or its mark}."""
        page.wait_for_function(f"() => {{ const s = ({MAP_STATE})(); return s && s.title.startsWith('Stability map: final {measure}<br>') && "
                               "s.traces[0].z.flat().filter(v => v === null).length == s.notes.length && "
                               "s.notes.every(n => n.text && !n.text.includes('training')); }",
                               timeout=WAIT_MS, polling=250)
        state = page.evaluate(MAP_STATE)
        (trace,) = state["traces"]
        assert trace["x"] == ["0.003", "0.01"] and trace["y"] == ["0", "20"], trace
        written = {(trace["x"][n["x"]], trace["y"][n["y"]]): n["text"] for n in state["notes"]}  # at category numbers
        assert state["drawn"] >= len(written) + 1, state  # the notes and the panel's title are on the page
        return {(x, y): written[(x, y)] if trace["z"][i][j] is None else trace["z"][i][j]
                for i, y in enumerate(trace["y"]) for j, x in enumerate(trace["x"])}

    def expected(measure: str) -> dict:  # a run that learned nothing is marked, not averaged
        return {k: "✕ did not<br>learn" if v["loss"] >= 0.9 * math.log(11) else pytest.approx(v[measure], rel=1e-6)
                for k, v in summaries.items()}

    def drawn_as(measure: str, key: str, patience_s: float = 20.0) -> dict:
        """The map once it shows the store's numbers; the page redraws at its next tick after the last run
        ends, so a map drawn a tick earlier (a run at its last evaluation but one) gets `patience_s` to
        follow; a map that stays stale fails."""
        deadline = time.monotonic() + patience_s
        while True:
            shown = drawn(measure)
            if shown == expected(key) or time.monotonic() > deadline:
                return shown
            page.wait_for_timeout(500)

    page.locator("#compare-metric input").click()
    page.locator("#compare-metric").get_by_role("option", name="held-out loss", exact=True).click()
    page.keyboard.press("Escape")
    page.locator("#compare-metric .token-remove").first.click()  # the preset-less default curve goes
    losses = drawn_as("held-out loss", "loss")
    assert losses == expected("loss"), (losses, summaries)
    assert any(isinstance(v, float) for v in losses.values()), losses
    shoot(page, trained_app.runs_dir.parent / "stability-map.png", top="#compare-stability", settle_ms=500)

    page.locator("#compare-metric .token-remove").first.click()
    page.locator("#compare-metric input").click()
    page.locator("#compare-metric").get_by_role("option", name="held-out exact-match", exact=True).click()
    page.keyboard.press("Escape")
    em = drawn_as("held-out exact-match", EXACT_MATCH)
    assert em == expected(EXACT_MATCH), (em, summaries)

    page.locator("#compare-pick .token-remove").first.click()
    page.locator("#compare-pick .token-remove").first.click()  # two runs left: the map has nothing to map
    expect(page.locator("#compare-stability")).to_be_hidden(timeout=WAIT_MS)
    assert_no_errors(page)
