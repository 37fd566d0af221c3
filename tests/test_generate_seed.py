"""Inspect's Generate (ui/inspect/interventions.py): above temperature 0 each click draws a new sample, and the note beside
it names the seed it used; with that seed in the Sample seed box the same sample comes back on every click.
Temperature 0 is greedy: one answer, whatever the seed. (Every click used to sample with seed 0, so at
temperature 0.8 it returned the same "sample" each time.)

The run is a model trained for a few steps only: its next-token distribution is close to uniform, so two
samples of 20 tokens drawn with different seeds differ (the chance they agree is far below 1e-12).
"""
from __future__ import annotations

import re

import gradio as gr
import pytest

from lab.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from lab.engine.recorder import record_run
from tests.helpers import app_context, app_with_run
from ui.common import errors_as_messages
from ui.inspect.interventions import panel_update
from ui.inspect.intervention_views import MapCache

pytestmark = pytest.mark.usefixtures("one_thread")
BARELY = RunConfig(model=ModelConfig(n_layers=1, n_heads=2, d_model=32, d_ff=64, pos="learned"),
                   task=TaskConfig(name="copy", max_len=4),
                   train=TrainConfig(steps=5, batch_size=16, warmup=0, eval_every=5, snapshots=1))
PROMPT = "3 1 2"
SEED_USED = re.compile(r"with seed \*\*(\d+)\*\*")


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    with app_context(tmp_path_factory.mktemp("generate")) as context:
        yield context


@pytest.fixture(scope="module")
def run(ctx) -> str:
    run_id = ctx.store.create(BARELY)
    record_run(ctx.store, run_id, threads=1)
    return run_id


def click(ctx, cache: MapCache, run_id: str, temperature: float, seed=None) -> dict:
    """Generate pressed with the run already shown: the page's outputs by name."""
    shown = panel_update(ctx, cache, "run", "", run_id, "sampled", "")["shown"]
    return panel_update(ctx, cache, "generate", shown, run_id, "sampled", "", prompt=PROMPT, temperature=temperature,
                        n_tokens=20, seed=seed)


def test_each_click_draws_a_new_sample_and_names_its_seed(ctx, run):
    cache = MapCache()
    first, second = click(ctx, cache, run, 0.8), click(ctx, cache, run, 0.8)
    assert len(first["gen_out"].split()) == 20
    assert first["gen_out"] != second["gen_out"]
    seeds = [int(SEED_USED.search(o["gen_note"]).group(1)) for o in (first, second)]
    assert seeds[0] != seeds[1] and "type it into Sample seed" in first["gen_note"]
    # the seed the note names gives that very sample back
    again = click(ctx, cache, run, 0.8, seed=seeds[0])
    assert again["gen_out"] == first["gen_out"] and f"seed **{seeds[0]}** (from Sample seed)" in again["gen_note"]


def test_a_seed_gives_the_same_sample_on_every_click(ctx, run):
    cache = MapCache()
    samples = {click(ctx, cache, run, 1.2, seed=7)["gen_out"] for _ in range(3)}
    assert len(samples) == 1
    assert click(ctx, cache, run, 1.2, seed=8)["gen_out"] not in samples  # another seed, another sample


def test_temperature_zero_is_greedy_and_ignores_the_seed(ctx, run):
    cache = MapCache()
    outs = [click(ctx, cache, run, 0, seed=s) for s in (None, 1, 2, None)]
    assert len({o["gen_out"] for o in outs}) == 1
    assert all(o["gen_note"].startswith("Greedy (temperature 0)") and "seed **" not in o["gen_note"] for o in outs)


def test_a_bad_seed_is_refused_naming_the_box(ctx, run):
    cache = MapCache()
    page = errors_as_messages(lambda seed: click(ctx, cache, run, 0.8, seed=seed))
    for bad in (-1, 1.5, 2**32, "abc", float("nan")):
        with pytest.raises(gr.Error) as err:
            page(bad)
        assert str(err.value.message).startswith("Sample seed: "), (bad, err.value.message)
    assert page("")["gen_note"].startswith("Sampled at temperature 0.8 with seed")  # empty text: a new seed


def test_a_run_change_clears_the_sample_and_its_seed(ctx, run):
    cache = MapCache()
    assert click(ctx, cache, run, 0.8)["gen_note"]
    other = ctx.store.create(BARELY)
    record_run(ctx.store, other, threads=1)
    out = panel_update(ctx, cache, "run", "", other, "sampled", "")
    assert out["gen_out"] == "" and out["gen_note"] == ""


def test_a_run_with_a_single_attention_snapshot_gets_a_step_slider(ctx, run):
    """The run above keeps one snapshot: Inspect's step slider (a slider needs minimum < maximum) showed an
    error toast instead of the run."""
    from ui.inspect.attention import final_slider, step_slider

    assert ctx.store.snapshot_steps(run) == [5]
    for slider in (step_slider(ctx, run), final_slider(ctx, run)):
        assert slider.minimum < slider.maximum and slider.value == 5 and slider.interactive is False


@pytest.mark.browser
def test_generate_in_chromium_new_samples_and_a_seed_that_reproduces_one(tmp_path):
    """The page: two clicks show two samples and name two seeds; the first seed typed into Sample seed brings
    the first sample back (its first 19 tokens when 19 are asked for: each click below changes what is shown,
    so the test sees every answer arrive); temperature 0 shows the greedy answer, whatever the seed."""
    from playwright.sync_api import expect

    from tests.browser import assert_no_errors, chromium, fill, open_page

    with app_with_run(tmp_path, BARELY) as (server, _), chromium() as browser:
        page = open_page(browser, server.url)
        page.get_by_role("tab", name="Inspect").click()
        expect(page.locator("#generate-btn")).to_be_visible()
        page.locator("#answer-table").wait_for(state="visible")  # the run's first draw is done: none clears a sample
        page.wait_for_timeout(1000)
        fill(page, "#generate-prompt", PROMPT)
        output, note = page.locator("#generate-output textarea"), page.locator("#generate-seed-note")

        def generate(temperature: str, n: int, seed: str = "") -> tuple[list[str], str]:
            """Set the controls, press Generate, wait for a new sample: (its tokens, the note beside it)."""
            fill(page, "#generate-temperature", temperature)
            fill(page, "#generate-n", str(n))
            fill(page, "#generate-seed", seed)
            before = output.input_value()
            page.locator("#generate-btn").click()
            page.wait_for_function("([sel, old]) => document.querySelector(sel).value !== old",
                                   arg=["#generate-output textarea", before], polling=200)
            page.wait_for_timeout(300)  # the note arrives with the sample
            return output.input_value().split(), note.inner_text()

        (first, note1), (second, note2) = generate("0.8", 20), generate("0.8", 20)
        assert len(first) == 20 and first != second
        seed1, seed2 = (re.search(r"with seed (\d+)", n).group(1) for n in (note1, note2))
        assert seed1 != seed2 and "type it into Sample seed" in note1
        shorter = generate("0.8", 19, seed1)[0]
        assert shorter == first[:19], (shorter, first)
        again, note3 = generate("0.8", 20, seed1)
        assert again == first and f"with seed {seed1} (from Sample seed)" in note3, (again, first, note3)
        greedy, note4 = generate("0", 20, seed1)
        assert note4.startswith("Greedy (temperature 0)")
        assert generate("0", 19, "5")[0] == greedy[:19] and generate("0", 20)[0] == greedy
        assert_no_errors(page)
