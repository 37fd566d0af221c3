"""Presets and the ablation grid in the app, in-process (no server): a preset's button submits exactly
the preset's configs and opens Compare on them; its progress line and explanation follow the stored
runs; the grid's Launch submits exactly the grid's configs, or nothing when one is invalid.

Training is a fake (tests/test_jobs.py's FakeTrainer), so these stay fast; tests/test_browser_grid.py
runs the real thing in a browser.
"""
from __future__ import annotations

import threading

import gradio as gr
import pytest

import app
from lab.engine.grid import build_grid
from lab.engine.jobs import JobManager
from lab.teach.presets.catalog import PRESETS
from lab.engine.store import RunStore
from tests.helpers import FakeTrainer
from ui.grid import preview_text
from ui.knobs import KNOBS, config_from_values
from ui.compare.render import Asked, Controls, render
from ui.presets import compare_note, compare_said, status
from ui.projector import folded

WAIT_S = 60


@pytest.fixture()
def setup(tmp_path):
    gate = threading.Event()
    store = RunStore(tmp_path / "runs")
    jobs = JobManager(store, max_concurrent=2, train_fn=FakeTrainer(step_s=0, gate=gate))
    demo = app.build_demo(store, jobs)
    yield demo, store, jobs, gate
    gate.set()
    jobs.shutdown(wait=True)


def endpoint(demo, name: str):
    return next(fn for fn in demo.fns.values() if fn.api_name == name).fn


def knob_values(**overrides):
    return [overrides.get(k.url_key, k.default()) for k in KNOBS]


def prop(update, name: str):
    """A property of what a callback returned: a gr.update dict or a component."""
    return update[name] if isinstance(update, dict) else getattr(update, name)


def wait_all(jobs, ids):
    for r in ids:
        jobs.wait(r, timeout=WAIT_S)


def answer(ctx, last, asked, shown=None, picked=(), metric="train loss (batch)"):
    """What Compare's one event sends a page that picked `picked` and holds record `shown` when `asked` (a request
    another tab wrote) fires it: the note is the app's (the last preset's, while exactly its runs are picked)."""
    controls = Controls.of([None] * 4, list(picked), metric, "step", 0.0, True, False)
    return render(ctx, controls, shown or {}, lambda ids: compare_said(ctx, last, ids), Asked.of(asked))


@pytest.mark.parametrize("key", ["hello_sort", "pre_post_ln"])
def test_a_preset_click_submits_exactly_its_configs_and_opens_compare(setup, key):
    demo, store, jobs, gate = setup
    ctx, preset = demo.lab_context, PRESETS[key]
    last, my_runs, text, timer, tabs, asked = endpoint(demo, f"preset_{key}")(["older-run"], "u1")
    ids = last["run_ids"]
    assert last["key"] == key and len(ids) == len(preset.runs)
    assert [store.config(r) for r in ids] == list(preset.runs)  # the very configs, names included
    assert {store.status(r)["owner"] for r in ids} == {"u1"}
    assert my_runs == ids + ["older-run"]
    assert prop(tabs, "selected") == "compare" and prop(timer, "active")
    assert asked["run_ids"] == ids and asked["metrics"] == list(preset.metrics)  # the request Compare answers
    assert text.startswith(f"**{preset.title}**: 0 of {len(ids)} runs done")
    # Compare's one event answers the request: the picker, the preset's curve, grouping on and the note come
    # in one answer, with the views for these runs
    views = answer(ctx, last, asked)
    assert prop(views["pick"], "value") == ids and {r for _, r in prop(views["pick"], "choices")} >= set(ids)
    assert prop(views["metric"], "value") == list(preset.metrics) and prop(views["group"], "value") is True
    assert views["note"] == text and {"curves", "finals", "configs"} <= set(views)
    assert views["shown"]["asked"] == asked["token"]
    # answered once: the next call (the picker's change it caused) leaves the controls as the page now has them
    again = answer(ctx, last, asked, views["shown"], ids, list(preset.metrics))
    assert not {"metric", "group", "note"} & set(again) and "value" not in again.get("pick", {})
    assert compare_note(ctx, last, ids) == text  # Compare's note: while exactly these runs are picked
    assert compare_note(ctx, last, ids[:-1] + ["other"]) == ""  # never above other runs' curves

    gate.set()
    wait_all(jobs, ids)
    text, timer = endpoint(demo, "preset_poll")(last)
    results = {store.config(r).name: store.summary(r) for r in ids}
    explanation = preset.explain(results)
    assert "No final results" not in explanation  # every run's summary was found by its name
    assert text == f"**{preset.title}**: {len(ids)} of {len(ids)} runs done. {folded(explanation)}"  # projector mode's
    assert '<span class="lab-headline">' in folded(explanation)  # marks, else the text as said
    assert compare_note(ctx, last, ids) == text and prop(timer, "active") is False

    text, timer = endpoint(demo, "load_presets")(last)  # reopening the page finds it again
    assert folded(explanation) in text and prop(timer, "active") is False
    tabs, shown_again = endpoint(demo, "preset_show")(last)
    assert prop(tabs, "selected") == "compare" and shown_again["run_ids"] == ids
    assert shown_again["token"] != asked["token"]  # a new request: answered even where the first one was
    views = answer(ctx, last, shown_again, views["shown"])
    assert prop(views["pick"], "value") == ids and folded(explanation) in views["note"]
    assert views["note"] == compare_note(ctx, last, ids) and "curves" in views


def test_only_compares_one_event_writes_its_picker_note_and_curves(setup):
    """Two events writing the picker, the note or the curves can answer in either order: a preset's opening
    once put the second preset's runs in the picker under a redraw's note for the first (CI, issue 34 item 9).
    Other tabs write a request instead (ui/compare/render.py `Asked`); only Select all shown sets the picker."""
    demo, *_ = setup
    by_id = {block._id: block for block in demo.blocks.values()}
    ids = {getattr(block, "elem_id", None): i for i, block in by_id.items()}
    watched = {ids["compare-pick"]: "picker", ids["compare-note"]: "note", ids["compare-curves"]: "curves"}
    writers: dict[str, set[str]] = {name: set() for name in watched.values()}
    for fn in demo.fns.values():
        for block in fn.outputs:
            if block._id in watched:
                writers[watched[block._id]].add(fn.api_name)
    assert writers == {"picker": {"compare", "select_all"}, "note": {"compare"}, "curves": {"compare"}}


def test_preset_status_copes_with_anything_the_browser_sends(setup):
    demo, store, *_ = setup
    ctx = demo.lab_context
    for junk in (None, [], "x", {"key": "nope"}, {"key": "hello_sort", "run_ids": "../etc"}):
        assert status(ctx, junk)[0] in ("", "**Hello, sort**: its runs are gone (deleted?). Click the preset to "
                                            "run it again.")
    with pytest.raises(gr.Error, match="No preset has been run"):
        endpoint(demo, "preset_show")({})
    assert not store.root.exists() or not any(store.root.iterdir())


def test_every_preset_card_shows_question_reference_and_the_estimate_for_this_server(setup):
    from ui.common import AppContext
    from ui.presets import cards

    _, store, jobs, _ = setup
    for p, text in zip(PRESETS.values(), cards(AppContext(store, jobs))):
        assert p.title in text and p.question in text and p.reference in text
        until = "until it is done" if len(p.runs) == 1 else f"until all {len(p.runs)} runs are done"
        assert "⏱ About" in text and until in text, text  # the wait if clicked now...
        assert "a first guess: nothing has trained on this server yet" in text, text  # ...and what it rests on


GRID = ("PE", "rope, alibi", "seed", "1, 2", "", "")


def test_grid_launch_submits_exactly_the_grid(setup):
    demo, store, jobs, gate = setup
    knobs = knob_values(task="copy", max_len=4, d_model=32, n_heads=2, steps=20)
    text, my_runs, tabs, asked = endpoint(demo, "grid_launch")(*knobs, *GRID, [], "u2")
    ids = asked["run_ids"]
    expected = build_grid(config_from_values({"task.name": "copy", "task.max_len": 4, "model.d_model": 32,
                                              "model.n_heads": 2, "train.steps": 20}),
                          [("PE", "rope, alibi"), ("seed", "1, 2")])
    assert [store.config(r) for r in ids] == expected
    assert [store.config(r).name for r in ids] == ["pos=rope seed=1", "pos=rope seed=2", "pos=alibi seed=1",
                                                   "pos=alibi seed=2"]
    assert my_runs == ids and prop(tabs, "selected") == "compare" and asked["metrics"] is None
    views = answer(demo.lab_context, {}, asked, metric="held-out loss")  # the curves as they are, grouped
    assert prop(views["pick"], "value") == ids and prop(views["group"], "value") is True and "metric" not in views
    assert text.startswith("✅ **Launched 4 runs**")
    preview = endpoint(demo, "grid_preview")(*knobs, *GRID)
    assert preview.startswith("**4 runs.** About") and "until all are done" in preview, preview
    gate.set()
    wait_all(jobs, ids)


@pytest.mark.parametrize(("grid", "message"), [
    (("heads", "2, 3", "", "", "", ""), "Grid axis heads: heads=3 is invalid: d_model: 64 is not divisible by Heads"),
    (("PE", "rope, alibi", "seed", "1, 1", "", ""), "Grid axis seed: '1' is listed twice"),
    (("seed", " ".join(map(str, range(11))), "norm", "pre post none", "", ""), "grid: 11 x 3 = 33 runs"),
])
def test_an_invalid_grid_launches_nothing(setup, grid, message):
    demo, store, *_ = setup
    knobs = knob_values()
    assert preview_text(demo.lab_context, tuple(knobs), grid).startswith("⚠️ **" + message.split(":")[0] + "**")
    with pytest.raises(gr.Error) as err:
        endpoint(demo, "grid_launch")(*knobs, *grid, [], "u1")
    assert err.value.message.startswith(message) and "\n" not in err.value.message
    with pytest.raises(gr.Error) as err:  # a bad knob is named as on Start
        endpoint(demo, "grid_launch")(*knob_values(steps=0), "seed", "1, 2", "", "", "", "", [], "u1")
    assert err.value.message.startswith("Steps: 0 is out of range")  # by its label, as the knob reads
    assert not store.root.exists() or not any(store.root.iterdir()), "an invalid grid created a run folder"
