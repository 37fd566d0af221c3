"""Inspect's attention heatmaps on a phone (390 x 844, Chromium): each picture is wider than the screen and
scrolls sideways in its own box, and every part of it can be reached. (The box centred its picture with
flexbox: the overflow spilled out on both sides, and the left part, ~157 px, could not be scrolled to.)

Screenshots of the heatmap scrolled fully left, at 1400 x 900 and at 390 x 844, are saved in
LAB_SHOTS_DIR if it is set (else in the test's temporary folder): not README pictures.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from lab.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from tests.browser import assert_no_errors, chromium, open_page, shoot
from tests.helpers import app_with_run
from lab.records import CROSS, DEC_SELF, ENC_SELF

pytestmark = pytest.mark.browser  # Chromium driving the real app (tests/conftest.py, the tiers)
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1400, "height": 900}
KINDS = (ENC_SELF, DEC_SELF, CROSS)  # an encoder-decoder run draws all three
ENCDEC = RunConfig(
    model=ModelConfig(arch="encoder-decoder", n_layers=2, n_heads=2, d_model=32, d_ff=64, n_ctx=32),
    task=TaskConfig(name="reverse", min_len=4, max_len=8),
    train=TrainConfig(steps=40, eval_every=20),
)
# Each heatmap's scrolling box (the matplotlib figure's container) and its picture, after scrolling the box
# fully to one side: their left and right edges and the box's scroll range.
EDGES = """([sel, side]) => {
  const img = document.querySelector(sel + ' img');
  const box = img.closest('.matplotlib');
  box.scrollLeft = side === 'left' ? 0 : box.scrollWidth;
  const b = box.getBoundingClientRect(), i = img.getBoundingClientRect();
  return {boxLeft: b.left, boxRight: b.left + box.clientWidth, imgLeft: i.left, imgRight: i.right,
          imgWidth: i.width, scrollable: box.scrollWidth > box.clientWidth, scrollLeft: box.scrollLeft};
}"""


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory):
    with app_with_run(tmp_path_factory.mktemp("phone_heatmap"), ENCDEC) as (server, run_id):
        yield server


def shots_dir(tmp_path: Path) -> Path:
    return Path(os.environ["LAB_SHOTS_DIR"]) if os.environ.get("LAB_SHOTS_DIR") else tmp_path


def open_inspect(browser, url: str, viewport: dict):
    page = open_page(browser, url, viewport=viewport)
    page.get_by_role("tab", name="Inspect").click()
    for kind in KINDS:
        page.wait_for_function(f"() => {{ const i = document.querySelector('#attn-{kind} img'); "
                               "return i && i.complete && i.naturalWidth > 0; }", polling=250)
    page.wait_for_timeout(500)  # layout settles
    return page


def test_every_heatmap_can_be_scrolled_to_both_edges_on_a_phone(app, tmp_path):
    with chromium() as browser:
        page = open_inspect(browser, app.url, PHONE)
        for kind in KINDS:
            right = page.evaluate(EDGES, [f"#attn-{kind}", "right"])
            assert right["scrollable"] and right["imgWidth"] > PHONE["width"] - 40, right  # wider than the screen
            assert right["imgRight"] <= right["boxRight"] + 1, right  # its right edge can be reached
            left = page.evaluate(EDGES, [f"#attn-{kind}", "left"])
            assert left["scrollLeft"] == 0
            assert left["imgLeft"] >= left["boxLeft"] - 1, f"{kind}: the picture's left part is out of reach: {left}"
        page.locator("#attn-enc_self").evaluate("e => e.scrollIntoView({block: 'start'})")
        shoot(page, shots_dir(tmp_path) / "inspect-heatmap-390x844.png", top="#attn-enc_self")
        assert_no_errors(page)


def test_heatmaps_stay_whole_and_centred_on_a_desktop(app, tmp_path):
    with chromium() as browser:
        page = open_inspect(browser, app.url, DESKTOP)
        for kind in KINDS:
            edges = page.evaluate(EDGES, [f"#attn-{kind}", "left"])
            assert edges["imgLeft"] >= edges["boxLeft"] - 1 and edges["imgRight"] <= edges["boxRight"] + 1, edges
            margin_left, margin_right = edges["imgLeft"] - edges["boxLeft"], edges["boxRight"] - edges["imgRight"]
            assert abs(margin_left - margin_right) <= 2, f"{kind}: not centred: {edges}"
        shoot(page, shots_dir(tmp_path) / "inspect-heatmap-1400x900.png", top="#attn-enc_self")
        assert_no_errors(page)
