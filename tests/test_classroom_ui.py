"""A class in the app, in-process: Start, a preset and a grid attach to the run already on the server and say so;
"Train again with a new seed" and a changed knob train anew; an attached student's Stop and Delete leave the
run to the others; "My own seed" gives each student a seed and Compare one band for the class.

Training is a fake (tests/helpers.py FakeTrainer); tests/test_shared_runs.py checks the engine underneath and
benchmarks/classroom_load.py the real thing with 30 students.
"""
from __future__ import annotations

import threading

import gradio as gr
import pytest

import app
from lab.engine.identity import class_seed
from lab.engine.jobs import JobManager
from lab.engine.limits import Limits
from lab.engine.store import RunStore
from lab.teach.presets.catalog import PRESETS
from tests.helpers import FakeTrainer
from tests.test_ui_presets import endpoint, knob_values, prop, wait_all
from lab.views.compare_frames import read_selection, seed_groups
from ui.knobs import KNOBS

ADA, BOB, CY = "ada0000000000001", "bob0000000000002", "cy00000000000003"
SAME = "same configuration, same seed, so the same result"
SMALL = dict(task="copy", max_len=4, d_model=16, n_heads=2, n_layers=1, steps=20)


@pytest.fixture()
def setup(tmp_path):
    gate = threading.Event()
    store = RunStore(tmp_path / "runs")
    jobs = JobManager(store, max_concurrent=1, train_fn=FakeTrainer(step_s=0, gate=gate),
                      limits=Limits(public=True, max_runs_per_user=10, max_queue=40))
    demo = app.build_demo(store, jobs)
    yield demo, store, jobs, gate
    gate.set()
    jobs.shutdown(wait=True)


def start(demo, who, own=False, **knobs):
    """Start's outputs by name (StartOut's order)."""
    names = ("run_pick", "my_runs", "progress", "timer", "again", "seed", "note")
    return dict(zip(names, endpoint(demo, "start")(*knob_values(**{**SMALL, **knobs}), [], who, own)))


def test_a_second_start_of_the_same_knobs_watches_the_first_run(setup):
    demo, store, jobs, gate = setup
    first = start(demo, ADA)
    run_id = prop(first["run_pick"], "value")
    assert first["note"] == "" and prop(first["again"], "visible") is False
    second = start(demo, BOB)
    assert prop(second["run_pick"], "value") == run_id and second["my_runs"] == [run_id]
    assert "is queued on this server" in second["note"] or "is training on this server" in second["note"]
    assert prop(second["again"], "visible") is True
    gate.set()
    wait_all(jobs, [run_id])
    third = start(demo, CY)
    assert prop(third["run_pick"], "value") == run_id and SAME in third["note"] and "was trained on this server at" \
        in third["note"]
    assert len(store.run_ids()) == 1 and len(jobs.train_fn.calls) == 1

    again = dict(zip(("run_pick", "my_runs", "progress", "timer", "again", "seed", "note"),
                     endpoint(demo, "start_new_seed")(*knob_values(**SMALL), [run_id], CY)))
    new_id = prop(again["run_pick"], "value")
    assert new_id != run_id and again["note"] == "" and store.config(new_id).train.seed == again["seed"] != 0
    assert again["my_runs"] == [new_id, run_id]
    changed = start(demo, CY, lr=0.002)  # any changed knob: a new run
    assert prop(changed["run_pick"], "value") not in (run_id, new_id)


def test_an_attached_students_stop_and_delete_leave_the_run_to_the_others(setup):
    demo, store, jobs, gate = setup
    run_id = prop(start(demo, ADA)["run_pick"], "value")
    start(demo, BOB)
    progress = endpoint(demo, "stop")(run_id, BOB)
    assert jobs.status(run_id).state in ("queued", "running") and "stopped" not in progress.lower()
    assert jobs.holders(run_id) == [ADA]
    with pytest.raises(gr.Error, match="belongs to another user"):
        endpoint(demo, "stop")(run_id, CY)
    # deleting a run that still trains: said before the question (it asked "cannot be undone?", then refused)
    with pytest.raises(gr.Error, match=f"Run shown: {run_id} is (queued|running); press Stop first, then Delete run"):
        endpoint(demo, "delete_ask")(run_id, ADA)
    gate.set()
    wait_all(jobs, [run_id])
    start(demo, CY)  # completed: Cy attaches
    _, question = endpoint(demo, "delete_ask")(run_id, ADA)
    assert question.startswith(f"Remove run **{run_id}** from your runs? 1 other in the class holds it too")
    out = endpoint(demo, "delete")(run_id, [run_id], ADA)  # the first starter leaves; Cy still holds it
    assert "stays on this server" in out[2] and store.exists(run_id) and out[1] == []
    assert endpoint(demo, "delete_ask")(run_id, CY)[1].startswith(f"Delete run **{run_id}** and everything")
    out = endpoint(demo, "delete")(run_id, [run_id], CY)
    assert out[2] == f"🗑️ Deleted run {run_id}." and not store.exists(run_id)


def test_a_preset_clicked_by_a_class_trains_once_and_the_card_says_so(setup):
    demo, store, jobs, gate = setup
    preset = PRESETS["pre_post_ln"]
    firsts = endpoint(demo, "preset_pre_post_ln")([], ADA, False)
    ids = firsts[0]["run_ids"]
    for who in (BOB, CY):
        last, _, text, *_ = endpoint(demo, "preset_pre_post_ln")([], who, False)
        assert last["run_ids"] == ids and "You are watching that run" in text
    assert len(store.run_ids()) == len(preset.runs)
    gate.set()
    wait_all(jobs, ids)
    last, _, text, *_ = endpoint(demo, "preset_pre_post_ln")([], "dee0000000000004", False)
    assert last["run_ids"] == ids and SAME in text and f"{len(ids)} of {len(ids)} runs done" in text
    again = endpoint(demo, "preset_again")(last, [], "dee0000000000004")
    new_ids = again[0]["run_ids"]
    seeds = {store.config(r).train.seed for r in new_ids}
    assert not set(new_ids) & set(ids) and len(seeds) == 1 and seeds != {preset.runs[0].train.seed}
    with pytest.raises(gr.Error, match="No preset has been run"):
        endpoint(demo, "preset_again")({}, [], ADA)


def test_my_own_seed_gives_each_student_a_seed_and_compare_one_class_band(setup):
    demo, store, jobs, gate = setup
    students = [ADA, BOB, CY]
    lasts = [endpoint(demo, "preset_hello_sort")([], who, True)[0] for who in students]
    mine = [last["run_ids"][0] for last in lasts]
    assert len(set(mine)) == 3
    assert [store.config(r).train.seed for r in mine] == [class_seed(w) for w in students]
    assert all(store.status(r)["seed_from"] == "class" for r in mine)
    again = endpoint(demo, "preset_hello_sort")([], BOB, True)[0]  # Bob's second click: his own run again
    assert again["run_ids"] == lasts[1]["run_ids"] and len(store.run_ids()) == 3
    gate.set()
    wait_all(jobs, mine)
    _, asked = endpoint(demo, "preset_show")(lasts[2])  # Compare pools the class's runs
    assert sorted(asked["run_ids"]) == sorted(mine)
    bands, table = seed_groups(read_selection(store, asked["run_ids"]), "train loss (batch)", "step", 0.0)
    assert list(table["group"]) == ["sort (class: 3 students)"] and list(table["runs"]) == [3]
    assert set(bands["group"]) == {"sort (class: 3 students)"}
    plain = endpoint(demo, "start")(*knob_values(**SMALL), [], ADA, False)  # Start's own seed box is apart
    assert store.config(prop(plain[0], "value")).train.seed == next(k for k in KNOBS if k.key == "train.seed").default()


def test_a_grid_attaches_to_the_runs_already_there(setup):
    demo, store, jobs, gate = setup
    grid = endpoint(demo, "grid_launch")
    base = knob_values(**SMALL)
    axes = ["seed", "0, 1", "", "", "", ""]
    first = grid(*base, *axes, [], ADA)
    assert "Launched 2 runs" in first[0]
    second = grid(*base, *["seed", "1, 2", "", "", "", ""], [], BOB)
    assert "1 of the grid's 2 configurations were already" in second[0] and len(store.run_ids()) == 3
