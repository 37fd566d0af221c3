"""Inspect's circuits panel in Debian's headless Chromium (issue 25's acceptance): a student opens the induction
preset's 2-layer run, moves the Training step slider across the phase change and sees the induction score
appear (in layer 1), then clicks the layer-1 cell of the residual grid at the repeated token and sees the
clean answer restored. What the page shows is read from the page and compared with what the commands print
for the same run (`python -m lab heads`, `python -m lab patch --step`), after a sequence of changes: a step
back and forth, a role switch, another run picked and the first picked again (nothing of the other run stays).

The runs are trained (the preset's own settings) into the store before the app is launched.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lab.config import ModelConfig, TaskConfig, TrainConfig, flatten
from lab.derived import run_config
from lab.teach.presets.catalog import INDUCTION
from lab.views.run_labels import short_label
from tests.browser import SHOTS, assert_no_errors, choose, chromium, open_page, shoot
from tests.helpers import lab, launch_app, trained_run

pytestmark = pytest.mark.browser  # Chromium driving the real app (tests/conftest.py, the tiers)

WAIT_MS = 180_000  # a shared 2-core host
REVERSE = run_config(model=ModelConfig(n_layers=1, n_heads=2, d_model=32, d_ff=64),
                     task=TaskConfig(name="reverse", n_symbols=6, min_len=3, max_len=5),
                     train=TrainConfig(steps=60, batch_size=16, eval_every=30, eval_samples=16, snapshots=2))
MODULAR = run_config(model=ModelConfig(n_layers=1, n_heads=2, d_model=32, d_ff=64, pos="none", norm="none"),
                     task=TaskConfig(name="modular_addition", modulus=31, train_fraction=0.5),
                     train=TrainConfig(steps=60, batch_size=64, eval_every=20, eval_samples=64, snapshots=3))
CELLS = """(sel) => { const e = document.querySelector(sel);
  if (!e || !e.offsetParent) return null;
  return [...e.querySelectorAll('[role=row]')].slice(1).map(r => [...r.querySelectorAll('[role=gridcell]')]
    .map(c => c.innerText.trim())); }"""  # a table's body as the page shows it (null while hidden)
IMG_SRC = "(sel) => document.querySelector(sel + ' img')?.src || null"


@pytest.fixture(scope="module")
def circuits_app(tmp_path_factory):
    from lab.engine.store import RunStore

    folder = tmp_path_factory.mktemp("circuits-app")
    store = RunStore(folder / "runs")
    ids = {"reverse": trained_run(store, REVERSE), "modular": trained_run(store, MODULAR),
           "induction": trained_run(store, INDUCTION)}
    labels = {k: short_label({"run_id": v, **flatten(store.config(v))}) for k, v in ids.items()}
    store.close()
    with launch_app(folder) as server:
        yield server, folder / "runs", ids, labels


def heads(runs: Path, run_id: str) -> dict:
    """What `python -m lab heads RUN_ID --json` prints: scores per head per snapshot step."""
    return json.loads(lab("heads", run_id, "--json", runs_dir=runs).stdout)


def table(page, sel: str) -> list[list[str]]:
    return page.evaluate(CELLS, sel)


def set_step(page, step: int) -> None:
    """Move the Training step slider to `step` (as a release of the slider) and wait for the panel to say it."""
    box = page.locator("#inspect-step input[type=number]")
    box.fill(str(step))
    box.press("Enter")
    page.locator("#circuits-roles-note").get_by_text(f"At step {step},").wait_for()


def scores_at(printed: dict, step: int) -> list[list[str]]:
    """The induction row of each layer at `step`, as the page's table writes it."""
    i = printed["steps"].index(step)
    ind = printed["scores"]["induction"]
    n_heads = sum(1 for name in ind if name.startswith("layer 0 "))
    return [[f"layer {layer}"] + [f"{ind[f'layer {layer} head {h}'][i]:.2f}" for h in range(n_heads)]
            for layer in range(len(ind) // n_heads)]


def test_a_student_watches_the_induction_head_form_and_patches_it(circuits_app, tmp_path: Path):
    server, runs, ids, labels = circuits_app
    printed = heads(runs, ids["induction"])
    steps, crossing = printed["steps"], printed["induction_forms_at"]
    assert crossing is not None and steps.index(crossing) > 0, printed["induction_forms_at"]
    before = steps[steps.index(crossing) - 1]
    with chromium() as browser:
        page = open_page(browser, server.url, WAIT_MS, viewport={"width": 1400, "height": 900})
        page.get_by_role("tab", name="Inspect").click()
        choose(page, "#inspect-run", labels["induction"])
        note = page.locator("#circuits-roles-note")
        note.get_by_text(f"At step {steps[-1]},").wait_for()
        # and the heatmaps have drawn the run: a step typed before would be overwritten by the run's last one
        page.locator("#inspect-caption").get_by_text(f"at step {steps[-1]}.").wait_for()
        assert table(page, "#circuits-roles-table") == scores_at(printed, steps[-1])

        set_step(page, before)  # before the phase change: no induction head
        early = table(page, "#circuits-roles-table")
        assert early == scores_at(printed, before) and max(float(v) for row in early for v in row[1:]) < 0.4
        fig_before = page.evaluate(IMG_SRC, "#circuits-roles-fig")
        set_step(page, crossing)  # across it: the score appears, in layer 1 only
        formed = table(page, "#circuits-roles-table")
        assert formed == scores_at(printed, crossing), (formed, scores_at(printed, crossing))
        assert max(float(v) for v in formed[1][1:]) > 0.4 and max(float(v) for v in formed[0][1:]) < 0.1
        assert page.evaluate(IMG_SRC, "#circuits-roles-fig") != fig_before  # the line moved to the new step
        assert f"first passes 0.4 at step {crossing}" in note.inner_text()

        # the grids at this step: the patch command's for the boxes' inputs and the same weights
        page.locator("#circuits-pair-note").get_by_text(f"Weights at step {crossing}.").wait_for()
        clean = page.locator("#circuits-clean input, #circuits-clean textarea").first.input_value()
        corrupt = page.locator("#circuits-corrupt input, #circuits-corrupt textarea").first.input_value()
        out = json.loads(lab("patch", ids["induction"], "--clean", clean, "--corrupt", corrupt, "--step",
                             str(crossing), "--json", runs_dir=runs).stdout)
        grid = table(page, "#circuits-residual")
        assert np.allclose([[float(v) for v in row[1:]] for row in grid], out["residual"], atol=0.006), grid
        changed = next(i for i, (a, b) in enumerate(zip(clean.split(), corrupt.split())) if a != b)

        page.locator(f"#circuits-residual [data-testid='cell-1-{changed + 1}']").click()  # into layer 1, there
        cell = page.locator("#circuits-cell-note")
        cell.get_by_text("restored").wait_for()
        said = cell.inner_text()
        assert f"into layer 1 at position {changed}" in said and "(the clean answer)" in said, said
        assert f"{out['residual'][1][changed]:.0%} restored" in said and out["residual"][1][changed] > 0.9
        page.locator("#circuits-cell-attn img").wait_for()
        page.set_viewport_size({"width": 1400, "height": 1700})  # the README's picture: scores, grids, the patch
        shoot(page, SHOTS / "circuits.png", top="#circuits-roles-note")
        page.set_viewport_size({"width": 1400, "height": 900})

        page.locator("#circuits-role").get_by_text("previous-token", exact=True).click()
        note.get_by_text("top previous-token score").wait_for()
        assert table(page, "#circuits-roles-table") == [
            [row[0]] + [f"{printed['scores']['previous-token'][f'{row[0]} head {h}'][steps.index(crossing)]:.2f}"
                        for h in range(len(row) - 1)] for row in formed]
        assert said == cell.inner_text()  # a role switch leaves the patch shown

        choose(page, "#inspect-run", labels["reverse"])  # another run: its own inputs, no cell of the first
        page.locator("#circuits-pair-note").get_by_text("step 60").wait_for()
        assert cell.inner_text().strip() == ""
        rev_clean = page.locator("#circuits-clean input, #circuits-clean textarea").first.input_value()
        assert rev_clean != clean and len(table(page, "#circuits-roles-table")) == 1  # one layer

        choose(page, "#inspect-run", labels["induction"])  # back: the end of the run, its task's inputs again
        note.get_by_text(f"At step {steps[-1]},").wait_for()
        # and the heatmaps have drawn the run: a step typed before would be overwritten by the run's last one
        page.locator("#inspect-caption").get_by_text(f"at step {steps[-1]}.").wait_for()
        page.locator("#circuits-pair-note").get_by_text(f"Weights at step {steps[-1]}.").wait_for()
        assert table(page, "#circuits-roles-table")[0][0] == "layer 0"
        assert page.locator("#circuits-clean input, #circuits-clean textarea").first.input_value() == clean
        assert_no_errors(page)

        page.set_viewport_size({"width": 390, "height": 844})  # a phone: nothing wider than the screen
        page.locator("#circuits-residual").scroll_into_view_if_needed()
        assert page.evaluate("document.scrollingElement.scrollWidth") <= 390
        shoot(page, tmp_path / "phone.png", top="#circuits-roles-note")


def test_a_modular_addition_run_shows_its_fourier_picture_at_each_step(circuits_app):
    """Grokking's Fourier picture in the panel: the sentence under the slider reads the `fourier` command's
    numbers at the slider's snapshot, and it leaves with the run."""
    server, runs, ids, labels = circuits_app
    printed = json.loads(lab("fourier", ids["modular"], "--json", runs_dir=runs).stdout)["spectra"]
    with chromium() as browser:
        page = open_page(browser, server.url, WAIT_MS, viewport={"width": 1400, "height": 900})
        page.get_by_role("tab", name="Inspect").click()
        choose(page, "#inspect-run", labels["modular"])
        note = page.locator("#circuits-fourier-note")
        for at in (printed[-1], printed[0]):
            if at is printed[0]:
                page.locator("#inspect-caption").get_by_text(f"at step {printed[-1]['step']}.").wait_for()
                set_step(page, at["step"])
            note.get_by_text(f"At step {at['step']},").wait_for()
            said = note.inner_text()
            assert (f"the 8 strongest frequencies (k = {', '.join(map(str, at['frequencies']))}) hold "
                    f"{at['fraction']:.0%}") in said, (said, at)
            assert page.evaluate(IMG_SRC, "#circuits-fourier")
        choose(page, "#inspect-run", labels["induction"])  # another task: no Fourier picture stays
        page.locator("#circuits-roles-note").get_by_text(f"At step {INDUCTION.train.steps},").wait_for()
        page.wait_for_function("() => !document.querySelector('#circuits-fourier img')", polling=250)
        assert note.inner_text().strip() == ""
        assert_no_errors(page)
