"""An LSTM run from the Train tab's Start, in Debian's headless Chromium (issue 23: the app's Start works for
the recurrent baselines): the summary says which knobs do not apply, the run trains to completion, Compare
names it by its architecture, and Inspect says plainly that it has no attention while it still answers;
switching Inspect between a Transformer run and the LSTM, back and forth, never leaves the Transformer's
heatmap on screen under the LSTM (nor the LSTM's sentence under the Transformer). What an LSTM does not have
(the Train tab's attention, position and norm knobs; Inspect's head importance, positional intervention and
patching) is greyed out with the reason, and back for a Transformer."""
from __future__ import annotations

import pytest

from tests.browser import WAIT_MS, assert_no_errors, choose, chromium, fill, open_page, wait_finished

pytestmark = pytest.mark.browser  # Chromium driving the real app (tests/conftest.py, the tiers)
STEPS = 150


def test_an_lstm_trains_from_start_and_inspect_says_it_has_no_attention(app_server):
    from playwright.sync_api import expect

    with chromium() as browser:
        page = open_page(browser, app_server.url)
        fill(page, "#steps", str(STEPS))
        page.locator("#start-btn").click()  # first a Transformer of the default architecture
        page.wait_for_function("() => document.querySelector('#run-pick input').value", polling=250)
        transformer = page.locator("#run-pick input").input_value()
        wait_finished(page, app_server, [transformer], WAIT_MS)
        expect(page.locator("#live-attention img")).to_be_visible()  # its latest attention snapshot, beside the curves
        page.locator("#arch").get_by_label("lstm", exact=True).check()
        expect(page.locator("#config-summary")).to_contain_text("A recurrent model (LSTM)")
        # the knobs an LSTM does not read are greyed out, saying why; the ones it reads are not
        for knob in ("#pos input", "#n_heads input[type=number]", "#d_ff input", "#norm input >> nth=0"):
            expect(page.locator(knob)).to_be_disabled()
        expect(page.locator("#pos")).to_contain_text("Not used by a recurrent model (LSTM)")
        expect(page.locator("#n_layers input[type=number]")).to_be_enabled()
        page.locator("#arch").get_by_label("gru", exact=True).check()
        expect(page.locator("#pos")).to_contain_text("Not used by a recurrent model (GRU)")
        page.locator("#arch").get_by_label("decoder", exact=True).check()
        expect(page.locator("#pos input")).to_be_enabled()
        expect(page.locator("#pos")).not_to_contain_text("Not used by")
        page.locator("#arch").get_by_label("lstm", exact=True).check()
        expect(page.locator("#norm input >> nth=0")).to_be_disabled()
        page.locator("#start-btn").click()
        page.wait_for_function("(prev) => { const v = document.querySelector('#run-pick input').value;"
                               " return v && v !== prev; }", arg=transformer, polling=250)
        run_id = page.locator("#run-pick input").input_value()
        assert "-lstm-" in run_id
        wait_finished(page, app_server, [run_id], WAIT_MS)
        page.locator("#progress").get_by_text("Completed").wait_for()
        assert f"after {STEPS} steps" in page.locator("#progress").inner_text()
        expect(page.locator("#live-attention")).to_be_hidden()  # an LSTM has no attention to draw

        page.get_by_role("tab", name="Inspect").click()
        expect(page.locator("#inspect-run input")).to_have_value(f"lstm L2 s0 reverse ({run_id[-6:]})")
        expect(page.locator("#inspect-caption")).to_contain_text("has no attention")
        expect(page.locator("#attn-dec_self")).to_be_hidden()
        expect(page.locator("#answer-table")).to_be_visible()  # the model still answers the probe
        expect(page.locator("#answer-weights-note")).to_contain_text("Final weights")
        # what needs heads or positions is greyed out, saying why, not offered to fail
        expect(page.locator("#importance-btn")).to_be_disabled()
        expect(page.locator("#importance-btn")).to_contain_text("no heads")
        expect(page.locator("#intervene-pos input >> nth=0")).to_be_disabled()
        expect(page.locator("#intervene-pos")).to_contain_text("no positional encoding")
        for button in ("#circuits-make", "#circuits-patch"):
            expect(page.locator(button)).to_be_disabled()

        lstm_label = f"lstm L2 s0 reverse ({run_id[-6:]})"
        tf_label = f"learned pre-LN L2 s0 reverse ({transformer[-6:]})"
        for label in (tf_label, lstm_label, tf_label, lstm_label):  # back and forth: each view its run's
            choose(page, "#inspect-run", label)
            if label == tf_label:
                page.wait_for_function("() => { const i = document.querySelector('#attn-dec_self img');"
                                       " return i && i.complete && i.naturalWidth > 100; }", polling=250)
                expect(page.locator("#inspect-caption")).not_to_contain_text("has no attention")
                for button in ("#importance-btn", "#circuits-make", "#circuits-patch"):
                    expect(page.locator(button)).to_be_enabled()
                expect(page.locator("#intervene-pos input >> nth=0")).to_be_enabled()
            else:
                expect(page.locator("#attn-dec_self")).to_be_hidden()
                expect(page.locator("#inspect-caption")).to_contain_text("has no attention")
                expect(page.locator("#importance-btn")).to_be_disabled()
        assert_no_errors(page)
