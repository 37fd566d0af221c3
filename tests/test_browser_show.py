"""Show, don't tell (Chromium, the real app, on a store of two tiny runs).

Inspect's Training step is one step: however a person sets it (typing then Tab or Enter, the arrow, Page,
Home and End keys on the slider, a click on its track, a drag, a run change in between, a typed probe),
every panel that depends on it, the heatmaps' caption, the answer's weights note, the logit lens and the
circuits panel, reads the step the box shows, and that step is a snapshot.

The runs keep snapshots at rounded steps (0, 13, 27, 40): the slider once moved by the first gap (13) from 0,
so a click on its track gave 39 where the heatmaps drew the nearest snapshot (40) and the answer fell back to
the final weights; the arrow keys and Enter redrew nothing, and Tab drew the answer at the typed step while
the heatmaps snapped elsewhere.

Play steps through the snapshots as the arrow keys do, each drawn by every panel before the next.

Compare draws a loss and an accuracy in panels of their own, each axis titled (they once shared one
unlabelled axis from 0 to 7, the accuracy flat at the bottom), and its Export writes that figure, a colour
per run, at slide size.
"""
from __future__ import annotations

import io

import pytest
from PIL import Image

from lab.engine.store import RunStore
from tests.browser import assert_no_errors, chromium, open_page, settle
from tests.helpers import launch_app, tiny_config, trained_run

pytestmark = pytest.mark.browser  # Chromium driving the real app (tests/conftest.py, the tiers)
TINY = tiny_config(steps=40, batch_size=16, warmup=0, eval_every=20, eval_samples=16, snapshots=4)
SNAPSHOTS = [0, 13, 27, 40]
# Every step the page shows: the box and the slider, and the step each panel says it read.
PANELS = """() => {
  const said = (sel) => { const m = (document.querySelector(sel)?.innerText || '').match(/step (\\d+)/i);
    return m ? Number(m[1]) : null; };
  const input = (type) => Number(document.querySelector(`#inspect-step input[type=${type}]`).value);
  return {box: input('number'), slider: input('range'), heatmaps: said('#inspect-caption'),
          answer: said('#answer-weights-note'), lens: said('#lens-note'), circuits: said('#circuits-roles-note')};
}"""


@pytest.fixture(scope="module")
def step_app(tmp_path_factory):
    """The app on a store of two finished tiny runs with snapshots at 0, 13, 27 and 40."""
    folder = tmp_path_factory.mktemp("inspect_step")
    store = RunStore(folder / "runs")
    ids = [trained_run(store, tiny_config(TINY, name="first")), trained_run(store, tiny_config(TINY, name="second", seed=1))]
    assert all(store.snapshot_steps(r) == SNAPSHOTS for r in ids)
    store.close()
    with launch_app(folder) as server:
        yield server, ids


def one_step(page, expected: int | None = None, patience_ms: int = 30_000) -> int:
    """The step every panel shows once the page has settled (a busy server may still be drawing one panel: it
    is given `patience_ms`; a panel left at another step stays there, and that fails)."""
    for _ in range(patience_ms // 1000):
        shown = settle(page, PANELS)
        if len(set(shown.values())) == 1 and (expected is None or shown["box"] == expected):
            break
        page.wait_for_timeout(1000)
    assert len(set(shown.values())) == 1, f"the panels show different steps: {shown}"
    assert shown["box"] in SNAPSHOTS, shown
    assert expected is None or shown["box"] == expected, f"expected step {expected}: {shown}"
    assert_no_errors(page)
    return shown["box"]


def type_step(page, value: int, key: str) -> None:
    box = page.locator("#inspect-step input[type=number]")
    box.fill(str(value))
    box.press(key)


def press_on_slider(page, *keys: str) -> None:
    page.locator("#inspect-step input[type=range]").focus()
    for key in keys:
        page.keyboard.press(key)


def slider_x(page, fraction: float) -> tuple[float, float]:
    """Page coordinates of the point `fraction` of the way along the slider's track."""
    box = page.locator("#inspect-step input[type=range]").bounding_box()
    return box["x"] + fraction * box["width"], box["y"] + box["height"] / 2


def test_every_way_of_setting_the_step_leaves_every_panel_at_the_step_the_box_shows(step_app):
    server, ids = step_app
    with chromium() as browser:
        page = open_page(browser, server.url)
        page.get_by_role("tab", name="Inspect").click()
        one_step(page, 40)  # the newest run, at its last snapshot
        type_step(page, 13, "Tab")
        one_step(page, 13)
        type_step(page, 27, "Enter")
        one_step(page, 27)
        type_step(page, 31, "Enter")  # between snapshots: the nearest one, in the box too
        one_step(page, 27)
        press_on_slider(page, "ArrowRight")
        one_step(page, 40)
        press_on_slider(page, "ArrowLeft", "ArrowLeft")  # a burst: the last one is drawn
        one_step(page, 13)
        press_on_slider(page, "PageUp")
        one_step(page, 27)
        press_on_slider(page, "Home")
        one_step(page, 0)
        press_on_slider(page, "End")
        one_step(page, 40)
        page.mouse.click(*slider_x(page, 0.33))  # a click on the track, about step 13
        one_step(page, 13)
        page.mouse.move(*slider_x(page, 13 / 40))  # a drag from the thumb to about step 38
        page.mouse.down()
        for f in (0.5, 0.8, 0.95):
            page.mouse.move(*slider_x(page, f))
        page.mouse.up()
        one_step(page, 40)

        # a run change with a step typed right after it: whichever is drawn last, the panels agree
        page.locator("#inspect-run input").click()
        page.locator("#inspect-run").get_by_role("option").filter(has_text=ids[0][-6:]).first.click()
        page.keyboard.press("Escape")
        type_step(page, 13, "Enter")
        one_step(page)
        type_step(page, 27, "Tab")  # and then a step on the new run
        one_step(page, 27)

        # a typed probe reads the final weights: every panel follows, and back on the sampled probe too
        text = page.locator("#inspect-text input")  # Enter in the box picks the typed probe
        text.fill("1 2 3")
        text.press("Enter")
        one_step(page, 40)
        page.locator("#inspect-source").get_by_text("sampled", exact=True).click()
        one_step(page, 40)
        type_step(page, 0, "Enter")
        one_step(page, 0)


def test_play_steps_through_every_snapshot_with_every_panel_following(step_app):
    """Play moves the step through the snapshots in order, each drawn by every panel before the next, then
    stops at the last; a second Play starts from the first; Pause stops it where it is. The requests it sends
    are counted (the idle-page test: tests/test_browser_idle.py)."""
    server, ids = step_app
    with chromium() as browser:
        page = open_page(browser, server.url)
        page.get_by_role("tab", name="Inspect").click()
        one_step(page, 40)
        type_step(page, 0, "Enter")
        one_step(page, 0)
        joins: list[float] = []
        page.on("request", lambda r: joins.append(r.timing["startTime"]) if "/queue/join" in r.url else None)
        play = page.locator("#inspect-play")
        play.click()
        from playwright.sync_api import expect

        expect(play).to_have_text("⏸ Pause")
        seen: list[dict] = []
        for _ in range(120):  # the panels as the page shows them, every half second, until Play stops
            seen.append(page.evaluate(PANELS))
            if play.inner_text() == "▶ Play":
                break
            page.wait_for_timeout(500)
        assert play.inner_text() == "▶ Play", seen[-1]
        agreed = [v["box"] for v in seen if len(set(v.values())) == 1]  # moments when every panel agreed
        assert [s for i, s in enumerate(agreed) if i == 0 or s != agreed[i - 1]] == SNAPSHOTS, \
            [tuple(v.values()) for v in seen]
        one_step(page, 40)
        print(f"\n[play] {len(joins)} requests for {len(SNAPSHOTS) - 1} frames")
        assert len(joins) <= 4 * (len(SNAPSHOTS) - 1), joins  # per frame: the heatmaps, their side plot, 2 panels

        play.click()  # at the end: again from the first snapshot
        expect(play).to_have_text("⏸ Pause")
        page.wait_for_function("() => Number(document.querySelector('#inspect-step input[type=number]').value) >= 13",
                               polling=200)
        play.click()  # Pause
        expect(play).to_have_text("▶ Play")
        stopped = one_step(page)
        page.wait_for_timeout(3000)
        assert one_step(page) == stopped < 40  # it stays where it was paused
        assert_no_errors(page)


def test_compare_draws_loss_and_accuracy_on_their_own_axes_and_exports_that_figure(step_app):
    server, ids = step_app
    with chromium() as browser:
        page = open_page(browser, server.url)
        page.get_by_role("tab", name="Compare").click()
        page.get_by_role("button", name="Select all shown").click()
        metric = page.locator("#compare-metric")
        while metric.locator(".token-remove").count():
            metric.locator(".token-remove").first.click()
        metric.locator("input").click()
        for name in ("held-out loss", "held-out exact-match"):
            metric.get_by_role("option", name=name, exact=True).click()
        page.keyboard.press("Escape")
        page.wait_for_function("""() => { const g = document.querySelector('#compare-curves .js-plotly-plot');
            return g && g.data && g.data.length === 4 && g.layout.yaxis2; }""")
        drawn = page.evaluate("""() => { const g = document.querySelector('#compare-curves .js-plotly-plot');
            return {y: g.layout.yaxis.title.text, y2: g.layout.yaxis2.title.text, range2: g.layout.yaxis2.range,
                    x: g.layout.xaxis2.title.text, on: g.data.map(t => [t.name, t.yaxis || 'y', t.line.color])}; }""")
        assert drawn["y"] == "held-out loss" and drawn["y2"] == "held-out exact-match" and drawn["x"] == "step"
        assert drawn["range2"] == [-0.02, 1.02]  # an accuracy's whole range, not squeezed under a loss of 2
        assert {axis for name, axis, _ in drawn["on"] if name.endswith("exact-match")} == {"y2"}
        assert {axis for name, axis, _ in drawn["on"] if name.endswith("held-out loss")} == {"y"}
        colours = {name.split(" · ")[0]: colour for name, _, colour in drawn["on"]}
        assert len(set(colours.values())) == 2  # a colour per run, both measures

        page.get_by_role("button", name="Export selection (config JSON, metrics CSV, figures PNG)").click()
        link = page.locator('#compare-files a[download="curves.png"]')
        link.wait_for()
        png = Image.open(io.BytesIO(page.request.get(link.get_attribute("href")).body())).convert("RGB")
        assert png.width >= 1600, png.size  # a slide's width
        pixels = {colour for _, colour in png.getcolors(png.width * png.height)}
        for colour in colours.values():  # each run's lines in the page's colour of that run
            rgb = tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))
            assert rgb in pixels, (colour, "not drawn in the export")
        assert_no_errors(page)
