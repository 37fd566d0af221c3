"""The steps a preset's sentence quotes are marked on its curves, as a person sees them in Chromium (issue 34
item 6): the induction preset, fully trained (the session's one training of its runs, tests/trained_once.py,
loaded as a lesson bundle), opens Compare with a dotted line and its words at the step where the 2-layer loss
stays below half the 1-layer's and where its induction head formed, the steps its sentence names. The marks
stand only on the preset's own runs: taking one away takes them away, and picking it again (typed into the
picker, with Enter) brings them back. A projector-width screenshot of the result is kept for looking at.
"""
from __future__ import annotations

import re

import pytest

from lab.teach.presets.catalog import PRESETS
from tests.browser import assert_no_errors, chromium, open_page, shoot, wait_curves
from tests.helpers import launch_app
from tests.trained_once import bundled

pytestmark = [pytest.mark.browser, pytest.mark.shares_training("induction 2 layers")]

WAIT_MS = 180_000
# the words of the plot's annotations, as drawn (plotly's SVG text)
MARK_WORDS = """(sel) => [...document.querySelectorAll(sel + ' g.annotation text')].map(t => t.textContent)"""
# the dotted vertical lines' x positions in data units, as the plot holds them
MARK_LINES = """(sel) => { const g = document.querySelector(sel + ' .js-plotly-plot');
    return g && g.layout ? (g.layout.shapes || []).filter(s => s.x0 === s.x1 && (s.line || {}).dash === 'dot')
        .map(s => s.x0) : []; }"""


@pytest.fixture(scope="module")
def induction_lesson(tmp_path_factory, trained_folder):
    folder = tmp_path_factory.mktemp("marks")
    bundle = bundled(list(PRESETS["induction"].runs), folder / "bundles", trained_folder)
    with launch_app(folder, {"LAB_BUNDLE": bundle}) as server:
        yield server


def test_the_induction_preset_marks_the_steps_its_sentence_quotes(induction_lesson, tmp_path):
    server = induction_lesson
    with chromium() as browser:
        page = open_page(browser, server.url + "/?projector=1", WAIT_MS, viewport={"width": 1280, "height": 720})
        page.get_by_role("tab", name="Presets").click()
        page.locator("#preset-induction").click()  # the bundle's runs, at once: nothing trains
        note = page.locator("#compare-note")
        note.locator(".lab-headline").wait_for(timeout=WAIT_MS)  # projector mode: the headline, the rest folded
        note.locator(".lab-headline").click()
        note.get_by_text("formed at step").wait_for(timeout=WAIT_MS)
        text = note.inner_text()
        below = int(re.search(r"from step ([\d,]+) of", text).group(1).replace(",", ""))
        formed = int(re.search(r"formed at step ([\d,]+)", text).group(1).replace(",", ""))
        want = [f"2 layers below half the 1-layer loss: step {below:,}", f"induction head formed: step {formed:,}"]
        wait_curves(page, "#compare-curves", 2, points=3)
        page.wait_for_function(f"(sel) => ({MARK_WORDS})(sel).length >= 2", arg="#compare-curves", timeout=WAIT_MS)
        assert page.evaluate(MARK_WORDS, "#compare-curves") == want
        lines = page.evaluate(MARK_LINES, "#compare-curves")
        assert sorted(set(lines)) == sorted({below, formed}) and len(lines) >= 2 * len(set(lines)), lines
        shoot(page, tmp_path / "induction-projector.png", top="#compare-note")  # looked at, not kept

        # one of the preset's runs taken away: its sentence and marks no longer stand on these curves
        assert page.locator("#compare-pick .token").count() == 2
        page.locator("#compare-pick .token-remove").first.click()
        page.wait_for_function(f"(sel) => ({MARK_WORDS})(sel).length === 0", arg="#compare-curves", timeout=WAIT_MS)
        assert "formed at step" not in note.inner_text()
        # and typed back (Enter picks the first match): exactly the preset's runs again, the marks again
        picker = page.locator("#compare-pick input")
        picker.click()
        picker.fill("layer")
        picker.press("Enter")
        page.wait_for_function(f"(sel) => ({MARK_WORDS})(sel).length >= 2", arg="#compare-curves", timeout=WAIT_MS)
        assert page.evaluate(MARK_WORDS, "#compare-curves") == want
        assert_no_errors(page)
    assert "Traceback" not in server.log_path.read_text()
