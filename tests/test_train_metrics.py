"""Training-set metrics beside the held-out ones (lab/evaluation.py): every evaluation measures loss and
accuracy on samples of the training distribution as well, the store keeps them, they separate from the
held-out ones where a model memorises (modular addition with few training pairs), the batched path gives
them as the solo one does, Compare names every curve by what it was measured on, and the grokking preset
quotes the measured training accuracy."""
from __future__ import annotations

from dataclasses import fields, replace

import pytest
import torch

from lab.batched import train_batched
from lab.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from lab.engine.recorder import record_run
from lab.engine.store import RunStore
from lab.evaluation import TRAIN_SHARE, evaluation_sets, train_samples
from lab.records import EXACT_MATCH, LOSS, PREDICTABLE_ACC, TOKEN_ACC, EvalRecord, StepRecord
from lab.tasks.batches import eval_batches, get_task, text_tokens
from lab.teach.presets.catalog import PRESETS, measured
from lab.textdata import builtin_text
from lab.trainer import train

pytestmark = pytest.mark.usefixtures("one_thread")  # torch at one intra-op thread (tests/conftest.py)

# 20% of the 23 * 23 pairs, no weight decay: a one-layer model fits its training pairs within a few
# hundred steps and stays far worse on the pairs it never saw (Power et al. 2022's memorising phase)
MEMORISE = RunConfig(
    model=ModelConfig(n_layers=1, n_heads=4, d_model=64, d_ff=128, norm="none", pos="none", n_ctx=3),
    task=TaskConfig(name="modular_addition", modulus=23, train_fraction=0.2),
    train=TrainConfig(steps=300, batch_size=128, lr=3e-3, warmup=10, schedule="constant", weight_decay=0.0,
                      eval_every=100, eval_samples=256, snapshots=0, device="cpu"),
)


def test_stored_records_hold_training_metrics_that_part_from_the_held_out_ones(tmp_path):
    store = RunStore(tmp_path / "runs")
    run_id = store.create(MEMORISE)
    record_run(store, run_id, threads=1)
    evals = store.metrics(run_id).query("kind == 'eval'")
    assert list(evals["step"]) == [100, 200, 300]
    for col in ("train_loss", "train_token_acc", "train_exact_match"):
        assert evals[col].notna().all(), evals
    last = evals.iloc[-1]
    assert last["train_exact_match"] > last[EXACT_MATCH] + 0.4, last.to_dict()
    assert last["train_loss"] < 0.5 * last["loss"], last.to_dict()  # memorised: low loss on the seen pairs only
    summary = store.summary(run_id)
    assert summary["train_set"][EXACT_MATCH] == pytest.approx(last["train_exact_match"])
    assert summary["eval"][EXACT_MATCH] == pytest.approx(last[EXACT_MATCH])
    assert evals[PREDICTABLE_ACC].isna().all()  # every scored position of modular addition is predictable


def test_the_training_set_is_the_training_split():
    cfg = MEMORISE.task
    task = get_task(cfg.name)
    seen = {tuple(p) for p in task.pairs(cfg, "train").tolist()}
    unseen = {tuple(p) for p in task.pairs(cfg, "test").tolist()}
    for split, pool in (("train", seen), ("eval", unseen)):
        prompts = {tuple(row[:2]) for b in eval_batches(cfg, "decoder", split, 200) for row in b.inp.tolist()}
        assert prompts <= pool and len(prompts) > 50, split
    text = TaskConfig(name="text", min_len=16, max_len=16)
    train_part = text_tokens(builtin_text(), "train", torch.device("cpu"))
    windows = {tuple(r) for b in eval_batches(text, "decoder", "train", 64) for r in b.inp.tolist()}
    starts = {tuple(train_part[i:i + 15].tolist()) for i in range(train_part.numel() - 15)}
    assert windows <= starts  # windows of the training 90%


def test_the_training_set_is_half_the_held_out_one_and_fixed():
    sets = evaluation_sets(MEMORISE, torch.device("cpu"))
    count = {k: sum(b.inp.shape[0] for b in v) for k, v in sets.items()}
    assert count == {"eval": 256, "ood": 0, "train": 256 // TRAIN_SHARE} and train_samples(1) == 1
    again = evaluation_sets(MEMORISE, torch.device("cpu"))["train"]
    assert all(torch.equal(a.inp, b.inp) for a, b in zip(sets["train"], again))  # the same every evaluation


def test_batched_runs_get_the_training_metrics_of_solo_runs():
    cfgs = [replace(MEMORISE, train=replace(MEMORISE.train, steps=40, eval_every=20, seed=s)) for s in (0, 1)]
    got: list[list] = [[], []]
    train_batched(cfgs, [got[0].append, got[1].append], threads=1)
    for cfg, recs in zip(cfgs, got):
        solo: list = []
        train(cfg, on_record=solo.append, threads=1)
        a = [r for r in solo if isinstance(r, EvalRecord)]
        b = [r for r in recs if isinstance(r, EvalRecord)]
        assert [r.step for r in a] == [r.step for r in b] == [20, 40]
        for x, y in zip(a, b):
            assert y.train_loss == pytest.approx(x.train_loss, rel=1e-4, abs=1e-5)
            assert y.train_exact_match == pytest.approx(x.train_exact_match, abs=2 / 128 + 1e-9)


def test_every_curve_says_what_it_was_measured_on():
    from lab.views import curves as common
    columns = {"train": {f.name for f in fields(StepRecord)}, "eval": {f.name for f in fields(EvalRecord)}}
    for label, (kind, col) in common.CURVES.items():
        assert col in columns[kind], label
        assert label.startswith(("train ", "held-out ")), label  # what it was measured on, first
    assert common.CURVES["train loss (batch)"] == ("train", "loss")
    for label, (kind, col) in common.CURVES.items():  # each training curve has its held-out twin to overlay
        if kind == "eval" and col.startswith("train_"):
            assert common.CURVES[label.replace("train ", "held-out ", 1)] == ("eval", col[len("train_"):])
    assert common.CURVES["eval loss"] == common.CURVES["held-out loss"]  # labels of earlier versions resolve
    assert "eval loss" not in list(common.CURVES)  # but are not offered
    assert {m for p in PRESETS.values() for m in p.metrics} <= set(common.CURVES)


def grok_run(test_acc: list[float], train_acc: list[float], every: int = 110) -> dict:
    evals = [{"step": every * (i + 1), EXACT_MATCH: t, "train_exact_match": a}
             for i, (t, a) in enumerate(zip(test_acc, train_acc))]
    last = evals[-1]
    return measured({"train_loss": 0.001, "steps": every * len(evals), "wall_s": 1.0, "stopped": False,
                     "eval": {LOSS: 0.1, TOKEN_ACC: last[EXACT_MATCH], EXACT_MATCH: last[EXACT_MATCH]},
                     "train_set": {LOSS: 0.001, TOKEN_ACC: last["train_exact_match"],
                                   EXACT_MATCH: last["train_exact_match"]}, "ood": None},
                    evals, train=[(100, 2.0), (500, 0.01)])


def test_grokking_quotes_the_measured_training_accuracy():
    wd = grok_run([0.02, 0.05, 0.2, 0.6, 0.95, 1.0], [0.4, 0.9, 0.97, 1.0, 1.0, 1.0])
    no = grok_run([0.02, 0.05, 0.06, 0.07, 0.07, 0.08], [0.5, 0.8, 0.9, 0.92, 0.93, 0.94])
    text = PRESETS["grokking"].explain({"weight decay 1.0": wd, "weight decay 0": no})
    assert "Training accuracy ended (accuracy on the training pairs 100% with weight decay, 94% without)" in text
    assert ("test accuracy passed 90% at step 550, 220 steps after training accuracy reached 97% (step 330, test "
            "accuracy then 20%)") in text, text
    assert "jumps" in text, text
    both = grok_run([0.02, 0.05, 0.06, 0.07, 0.07, 0.08], [0.5, 1.0, 1.0, 1.0, 1.0, 0.98])
    text = PRESETS["grokking"].explain({"weight decay 1.0": wd, "weight decay 0": both})
    assert text.startswith("Both fitted their training pairs (accuracy on the training pairs 100% with weight "
                           "decay, 98% without)"), text
