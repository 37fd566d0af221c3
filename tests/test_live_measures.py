"""The Train tab's live view reads a run by what means something for its task (ui/live.py): the accuracy
plot draws the task's headline accuracy on the held-out and training sets (exact-match for sequence tasks,
the predictable positions for induction, the next character for text), and the finished run's line quotes
the same measures (lab/teach/loss_reading.py), never a whole-window exact-match for a language model."""
from __future__ import annotations

from dataclasses import replace

import pytest

from lab.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from tests.helpers import app_context, trained_run
from ui.live import accuracy_of, live_frames, progress_text
from lab.records import EXACT_MATCH, PREDICTABLE_ACC, TOKEN_ACC

BASE = RunConfig(model=ModelConfig(n_layers=1, n_heads=2, d_model=16, d_ff=32, n_ctx=40),
                 task=TaskConfig(name="copy", max_len=4),
                 train=TrainConfig(steps=20, batch_size=8, warmup=0, eval_every=10, eval_samples=16, snapshots=0))


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    with app_context(tmp_path_factory.mktemp("live")) as context:
        yield context


@pytest.mark.parametrize("task, column, series", [
    ({"name": "copy"}, EXACT_MATCH, {"held-out", "train", "held-out, longer lengths"}),
    ({"name": "induction", "min_len": 8, "max_len": 16}, PREDICTABLE_ACC, {"held-out", "train"}),
    ({"name": "text", "min_len": 16, "max_len": 16}, TOKEN_ACC, {"held-out", "train"}),
])
def test_the_accuracy_plot_and_the_result_line_use_the_tasks_own_measure(ctx, task, column, series):
    cfg = replace(BASE, task=TaskConfig(**task))
    run_id = trained_run(ctx.store, cfg)
    assert accuracy_of(task["name"]) == column
    loss, acc = live_frames(ctx, run_id)
    assert set(loss["series"]) == {"train", "held-out"} and set(acc["series"]) == series
    evals = ctx.store.metrics(run_id).query("kind == 'eval'")
    drawn = acc[acc["series"] == "held-out"].dropna()
    assert list(drawn["value"]) == list(evals[column]) and list(drawn["step"]) == list(evals["step"])
    trained = acc[acc["series"] == "train"].dropna()
    assert list(trained["value"]) == list(evals[f"train_{column}"])
    state, text = progress_text(ctx, run_id)
    assert state == "completed" and "Completed" in text
    if task["name"] == "copy":
        assert "exact-match" in text and "On longer inputs" in text
    else:  # a language model: its loss against its baselines, no exact-match
        assert "exact-match" not in text.lower() and "nats" in text and "chance" in text, text
    if task["name"] == "induction":
        assert "predictable positions" in text


def test_the_train_tabs_two_plots_give_each_measure_one_colour(ctx, tmp_path):
    """Issue 34 item 5: the loss plot listed train first and the accuracy plot held-out first, so each plot's
    own palette coloured train and held-out oppositely. Both plots now carry one colour map, set at build,
    naming every series the live frames draw."""
    from lab.engine.store import RunStore
    from ui.app import build_demo

    demo = build_demo(RunStore(tmp_path / "runs"))
    plots = {b.elem_id: b for b in demo.blocks.values() if getattr(b, "elem_id", None) in ("live-loss", "live-acc")}
    loss_map, acc_map = plots["live-loss"].color_map, plots["live-acc"].color_map
    assert loss_map == acc_map and loss_map["train"] != loss_map["held-out"]
    loss, acc = live_frames(ctx, trained_run(ctx.store, BASE))
    assert set(loss["series"]) | set(acc["series"]) <= set(loss_map)
