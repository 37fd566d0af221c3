"""Every view shows the current state (Chromium, the real app, stored runs): random sequences of control
changes on Compare (runs picked, curves, x-axis, smoothing, grouping) and on Inspect (run, probe, step,
interventions), some in quick bursts. After each burst the page settles, and every figure's data read
from the page (the curves' plotted values, titles and colours; the pictures; the tables) must equal
what a freshly loaded page shows for the same controls. Compare once drew the previous curve's values
under the new axis titles after a curve or x-axis switch.
"""
from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from lab.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from lab.engine.store import RunStore
from tests.browser import assert_no_errors, choose, chromium, open_page, settle
from tests.helpers import launch_app, trained_run
from lab.views.curves import CURVES, X_AXES

pytestmark = pytest.mark.browser  # Chromium driving the real app (tests/conftest.py, the tiers)
WAIT_MS = 120_000
TINY = RunConfig(model=ModelConfig(n_layers=2, n_heads=2, d_model=16, d_ff=32, pos="learned"),
                 task=TaskConfig(name="copy", max_len=4),
                 train=TrainConfig(steps=40, batch_size=16, warmup=0, eval_every=10, eval_samples=16, snapshots=3))
# What a person sees of Compare: the curves' titles and points (as plotted), the band picture, the tables, and
# the accuracy-by-length panel (the configuration picked, its curves' title and points).
COMPARE_STATE = """() => { const g = document.querySelector('#compare-curves .js-plotly-plot');
  const rows = (sel) => [...document.querySelectorAll(sel + ' [role=row]')].map(r => r.innerText);
  const img = document.querySelector('#compare-bands img');
  // a plot being drawn may have no layout or titles yet: read as absent, and settle_both waits for it
  return {curves: g && g.data && g.layout ? {x: (g.layout.xaxis2 || g.layout.xaxis)?.title?.text ?? null,
            y: g.layout.yaxis?.title?.text ?? null, title: g.layout.title?.text ?? null,
            lines: g.data.map(t => [t.name, t.line.color, t.line.dash, Array.from(t.x || []),
                                    Array.from(t.y || []).map(v => v === null ? null : +(+v).toPrecision(6))])} : null,
          bands: img && img.offsetParent ? img.src : null, finals: rows('#compare-finals'),
          groups: document.querySelector('#compare-groups')?.offsetParent ? rows('#compare-groups') : null,
          configs: rows('#compare-configs'),
          cell: document.querySelector('#compare-cell input')?.value ?? null,
          lengths: ((p) => p && p.offsetParent && p.data && p.layout ? {title: p.layout.title?.text ?? null,
            lines: p.data.map(t => [t.name, Array.from(t.y || []).map(v => +(+v).toPrecision(6))])} : null)(
            document.querySelector('#compare-lengths .js-plotly-plot'))}; }"""
# What a person sees of Inspect: the caption, the step, every picture, the answer and metrics tables, and
# side A of the positional panel (the run's name, its PCA and similarity pictures, their note).
INSPECT_STATE = """() => { const src = (sel) => { const i = document.querySelector(sel + ' img');
    return i && i.offsetParent ? i.src : null; };
  const rows = (sel) => { const e = document.querySelector(sel);
    return e && e.offsetParent ? [...e.querySelectorAll('[role=row]')].map(r => r.innerText) : null; };
  return {caption: document.querySelector('#inspect-caption').innerText,
          step: document.querySelector('#inspect-step input[type=number]').value,
          attention: src('#attn-dec_self'), ablated: src('#ablated-attn-dec_self'), lens: src('#logit-lens'),
          answer: rows('#answer-table'), metrics: rows('#intervene-metrics'),
          side_a: document.querySelector('#inspect-run-a textarea, #inspect-run-a input')?.value,
          pca_a: src('#pca-A'), pe_a: src('#pe-fig-A'), pe_note_a: document.querySelector('#pe-note-A').innerText}; }"""


@pytest.fixture(scope="module")
def views_app(tmp_path_factory):
    """The app on a store of five finished tiny runs: two seeds of one config, a RoPE run, a post-LN run
    and a 1-layer run (so groups, differing labels and different head grids all occur)."""
    folder = tmp_path_factory.mktemp("views")
    store = RunStore(folder / "runs")
    cfgs = [TINY, replace(TINY, train=replace(TINY.train, seed=1)), replace(TINY, model=replace(TINY.model, pos="rope")),
            replace(TINY, model=replace(TINY.model, norm="post")), replace(TINY, model=replace(TINY.model, n_layers=1))]
    ids = [trained_run(store, c) for c in cfgs]
    store.close()
    with launch_app(folder) as server:
        yield server, ids


TOKENS = "(sel) => [...document.querySelectorAll(sel + ' .token')].map(t => t.innerText)"


def settle_both(page, fresh, state: str, quiet_ms: int = 1500) -> tuple[dict, dict]:
    """Both pages' states once neither has changed for `quiet_ms`: one wait for the two (as settle)."""
    last, since = None, 0
    for _ in range(WAIT_MS // 250):
        now = (page.evaluate(state), fresh.evaluate(state))
        if now == last:
            since += 250
            if since >= quiet_ms:
                return now
        else:
            last, since = now, 0
        page.wait_for_timeout(250)
    raise AssertionError("the pages never settled")


def same_views(page, fresh, state: str, patience_ms: int = 20_000) -> tuple[dict, dict]:
    """Both pages' states once settled; while they differ, wait and look again for `patience_ms` (a busy
    server may still be drawing one of them: a stale view stays stale, that is what fails)."""
    for _ in range(patience_ms // 1000):
        shown, expected = settle_both(page, fresh, state)
        if shown == expected:
            break
        page.wait_for_timeout(1000)
    return shown, expected


def clear_tokens(page, sel: str) -> None:
    while page.locator(f"{sel} .token-remove").count():
        page.locator(f"{sel} .token-remove").first.click()


def pick_many(page, sel: str, names: list[str]) -> None:
    """Set a multiselect dropdown to `names` (option texts, or run-id tails), as a person does."""
    clear_tokens(page, sel)
    page.locator(f"{sel} input").click()
    for n in names:
        page.locator(sel).get_by_role("option").filter(has_text=n).first.click()
    page.keyboard.press("Escape")


def set_compare(page, st: dict, what: str) -> None:
    if what == "pick":
        pick_many(page, "#compare-pick", [r[-6:] for r in st["pick"]])
    elif what == "curves":
        clear_tokens(page, "#compare-metric")
        page.locator("#compare-metric input").click()
        for m in st["curves"]:
            page.locator("#compare-metric").get_by_role("option", name=m, exact=True).click()
        page.keyboard.press("Escape")
    elif what == "x":
        page.locator("#compare-xaxis").get_by_label(st["x"], exact=True).check()
    elif what == "smoothing":
        box = page.locator("#compare-smoothing input[type=number]")
        box.fill(str(st["smoothing"]))
        box.press("Enter")
    elif what == "group":
        page.locator("#compare-group input").set_checked(st["group"])


def same_cell(page, fresh) -> None:
    """The length panel's configuration is a control too: the page keeps the one it shows while it stays among the
    picked runs (a fresh page shows the first), so the fresh page is set to the page's, as a person would pick it."""
    cell = "() => document.querySelector('#compare-cell input')?.value ?? null"
    shown, offered = settle_both(page, fresh, cell)
    if shown and shown != offered:
        choose(fresh, "#compare-cell", shown)


def open_tab(browser, url: str, name: str):
    page = open_page(browser, url, WAIT_MS)
    page.get_by_role("tab", name=name).click()
    return page


def test_compare_always_shows_what_a_fresh_page_shows_for_the_same_controls(views_app):
    """One sequence of 14 bursts (up to 4 changes each) in one page, compared with a fresh page after each."""
    server, ids = views_app
    rng = random.Random(0)
    st = {"pick": [], "curves": ["train loss (batch)"] if "train loss (batch)" in CURVES else [next(iter(CURVES))],
          "x": "step", "smoothing": 0.9, "group": True}
    changes = 0
    with chromium() as browser:
        page = open_tab(browser, server.url, "Compare")
        for _ in range(14):
            for _ in range(rng.choice([1, 2, 3, 4])):  # a burst: changes faster than the server answers
                what = rng.choice(["pick", "pick", "curves", "x", "smoothing", "group"])
                if what == "pick":
                    st["pick"] = rng.sample(ids, rng.randint(1, len(ids)))
                elif what == "curves":
                    st["curves"] = rng.sample(list(CURVES), rng.randint(1, 2))
                elif what == "x":
                    st["x"] = rng.choice(list(X_AXES))
                elif what == "smoothing":
                    st["smoothing"] = rng.choice([0, 0.5, 0.9])
                else:
                    st["group"] = not st["group"]
                set_compare(page, st, what)
                changes += 1
            if not st["pick"]:
                continue
            fresh = open_tab(browser, server.url, "Compare")
            for what in ("pick", "curves", "x", "smoothing", "group"):
                set_compare(fresh, st, what)
            same_cell(page, fresh)
            shown, expected = same_views(page, fresh, COMPARE_STATE)
            fresh.context.close()
            assert shown["curves"] is not None and expected["curves"] is not None
            assert shown == expected, (f"after {changes} changes, controls {json.dumps(st)}; picker shows "
                                       f"{page.evaluate(TOKENS, '#compare-pick')}; lines "
                                       f"{[c[0] for c in shown['curves']['lines']]} vs {[c[0] for c in expected['curves']['lines']]}")
            named = shown["curves"]["y"] if len(st["curves"]) == 1 else shown["curves"]["title"]
            assert named == " / ".join(st["curves"]) and shown["curves"]["x"] == st["x"]
            assert_no_errors(page)
    assert changes >= 25


def set_inspect(page, st: dict, what: str, ids: list[str]) -> None:
    if what == "run":
        page.locator("#inspect-run input").click()
        page.locator("#inspect-run").get_by_role("option").filter(has_text=st["run"][-6:]).first.click()
        page.keyboard.press("Escape")
    elif what == "probe":
        if st["probe"] == "typed":
            box = page.locator("#inspect-text input")
            box.fill("1 2 3")
            box.press("Enter")
        else:
            page.locator("#inspect-source").get_by_text("sampled", exact=True).click()
    elif what == "step":
        box = page.locator("#inspect-step input[type=number]")
        if box.is_enabled():
            box.fill(str(st["step"]))
            box.press("Enter")
    elif what == "knockout":
        heads = page.locator("#intervene-heads input[type=checkbox]")
        for i in range(heads.count()):
            heads.nth(i).set_checked(i in st["knockout"])
        page.locator("#intervene-apply").click()


INSPECT_CONTROLS = """() => ({run: document.querySelector('#inspect-run input').value,
  source: document.querySelector('#inspect-source input:checked')?.value,
  text: document.querySelector('#inspect-text input').value,
  step: document.querySelector('#inspect-step input[type=number]').value,
  heads: [...document.querySelectorAll('#intervene-heads input:checked')].map(i => i.parentElement.innerText.trim()),
  applied: !!document.querySelector('#intervene-metrics')?.offsetParent})"""


def same_controls(fresh, c: dict) -> None:
    """Set a fresh Inspect page to the controls `c` another page shows (INSPECT_CONTROLS), in the order a
    person would: the run, its step (sampled probe), the typed input, the heads and Apply."""
    fresh.locator("#inspect-run input").click()
    fresh.locator("#inspect-run").get_by_role("option", name=c["run"], exact=True).click()
    fresh.keyboard.press("Escape")
    settle(fresh, INSPECT_STATE)
    box = fresh.locator("#inspect-step input[type=number]")
    if box.input_value() != c["step"]:
        box.fill(c["step"])
        box.press("Enter")
        fresh.locator("#inspect-step input[type=range]").dispatch_event("pointerup")
        settle(fresh, INSPECT_STATE)
    if c["source"] == "typed":
        typed = fresh.locator("#inspect-text input")
        typed.fill(c["text"])
        typed.press("Enter")
        settle(fresh, INSPECT_STATE)
    if c["applied"]:
        for label in c["heads"]:
            fresh.locator("#intervene-heads").get_by_label(label, exact=True).check()
        fresh.locator("#intervene-apply").click()


def test_inspect_always_shows_what_a_fresh_page_shows_for_the_same_controls(views_app):
    """One sequence of 10 bursts (up to 3 changes each) in one page, compared with a fresh page after each."""
    server, ids = views_app
    rng = random.Random(100)
    st = {"run": None, "probe": "sampled", "step": None, "knockout": []}
    changes = 0
    with chromium() as browser:
        page = open_tab(browser, server.url, "Inspect")
        for _ in range(10):
            for _ in range(rng.choice([1, 2, 3])):
                what = rng.choice(["run", "run", "probe", "step", "knockout"])
                if what == "run" or st["run"] is None:
                    what, st["run"] = "run", rng.choice(ids)
                elif what == "probe":
                    st["probe"] = "typed" if st["probe"] == "sampled" else "sampled"
                elif what == "step":
                    st["step"] = rng.choice([0, 20, 40])
                else:
                    st["knockout"] = rng.sample(range(2), rng.randint(1, 2))
                set_inspect(page, st, what, ids)
                changes += 1
            settle(page, INSPECT_STATE)
            controls = page.evaluate(INSPECT_CONTROLS)
            fresh = open_tab(browser, server.url, "Inspect")
            same_controls(fresh, controls)
            shown, expected = same_views(page, fresh, INSPECT_STATE)
            seen = fresh.evaluate(INSPECT_CONTROLS)
            if controls["source"] != "typed":  # the box's text matters only for a typed probe
                seen["text"] = controls["text"]
            assert seen == controls  # the same controls on both pages
            fresh.context.close()
            assert shown == expected, f"after {changes} changes, controls {json.dumps(controls)}"
            assert_no_errors(page)
    assert changes >= 12
