"""Knockouts of a language-model run quote what means something for its task (lab.tasks.shapes.headline_metrics):
a solved induction run's knockout sentence, Inspect's grid and held-out table, and `python -m lab ablate`
give the accuracy on the predictable positions (near 100% here) where they gave exact-match (near 0: it
counts the first token of each repeat, which nothing predicts); a text run's give its loss alone, beside the
unigram baseline; the sequence tasks keep loss, token accuracy and exact-match.
"""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from lab.cli.main import main
from lab.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from lab.engine.store import RunStore
from lab.evaluation import measure
from lab.interventions import HeadRef, Interventions, applied
from lab.tasks.batches import get_task
from lab.tasks.shapes import loss_baselines
from lab.views.analysis import load_model
from lab.views.probe_plots import importance_frame, importance_sentence, metrics_frame
from lab.views.probing import ImportanceMap, ablation_report, held_out, importance_map, quoted
from tests.helpers import trained_run
from ui.inspect.intervention_views import importance_parts
from lab.records import DEC_SELF, EXACT_MATCH, LOSS, PREDICTABLE_ACC, TOKEN_ACC

pytestmark = pytest.mark.usefixtures("one_thread")

# the induction pair of tests/test_one_number.py, 2 layers: solved in a few seconds
INDUCTION = RunConfig(model=ModelConfig(n_layers=2, n_heads=2, d_model=32, d_ff=0, norm="pre", pos="learned", n_ctx=23),
                      task=TaskConfig(name="induction", min_len=12, max_len=12, n_symbols=64),
                      train=TrainConfig(steps=400, batch_size=64, lr=3e-3, warmup=10, schedule="constant",
                                        eval_every=100, snapshots=2, eval_samples=256))
TEXT = RunConfig(model=ModelConfig(n_layers=1, n_heads=2, d_model=32, d_ff=64, n_ctx=15),
                 task=TaskConfig(name="text", min_len=16, max_len=16),
                 train=TrainConfig(steps=60, batch_size=32, lr=3e-3, warmup=5, eval_every=60, snapshots=1,
                                   eval_samples=64))
COPY = RunConfig(model=ModelConfig(n_layers=1, n_heads=2, d_model=32, d_ff=64, n_ctx=32),
                 task=TaskConfig(name="copy", min_len=2, max_len=4), train=TrainConfig(steps=5, eval_samples=64))


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> RunStore:
    return RunStore(tmp_path_factory.mktemp("lm_knockouts") / "runs")


@pytest.fixture(scope="module")
def runs(store) -> dict[str, str]:
    return {"induction": trained_run(store, INDUCTION), "text": trained_run(store, TEXT)}


def model_of(store: RunStore, run_id: str):
    cfg = store.config(run_id)
    return cfg, load_model(cfg, store.load_weights(run_id))


def test_what_each_task_quotes():
    assert quoted("text") == ("loss",)
    assert quoted("induction") == (LOSS, PREDICTABLE_ACC)
    for task in ("copy", "reverse", "modular_addition", "parity"):
        assert quoted(task) == (LOSS, TOKEN_ACC, EXACT_MATCH)


def test_a_solved_induction_runs_knockout_quotes_the_predictable_positions(store, runs):
    cfg, model = model_of(store, runs["induction"])
    summary = store.summary(runs["induction"])
    imp = importance_map(model, cfg)
    # the run is solved where it can be: right on the predictable positions, yet its exact-match stays low
    assert imp.intact_predictable == pytest.approx(summary["eval"][PREDICTABLE_ACC], abs=1e-6)
    assert imp.intact_predictable > 0.9 and imp.intact_exact < 0.5, (imp.intact_predictable, imp.intact_exact)
    top, _ = imp.ranked()[0]
    with applied(model, Interventions(heads=(top,))):  # the top head's cell, measured here directly
        direct = measure(model, held_out(cfg), torch.device("cpu"), get_task("induction").predictable)
    assert imp.predictable[top.layer, top.head] == pytest.approx(direct.predictable_acc, abs=1e-9)
    sentence = imp.sentence(400)
    assert (f"(accuracy on the predictable positions {imp.intact_predictable:.0%} to {direct.predictable_acc:.0%}; "
            f"256 held-out sequences at step 400)") in sentence, sentence
    assert "exact-match" not in sentence
    # Inspect: the grid's cells and note, and the held-out table, say the same
    cells = importance_frame([imp]).data
    assert cells.loc[top.layer, f"head {top.head}"].endswith(f" · {direct.predictable_acc:.0%}")
    note = importance_parts(cfg, model, [imp], 400)["grid_note"]
    assert importance_sentence([imp], 400) in note and "then accuracy on the predictable positions." in note
    assert "exact-match" not in note
    report = ablation_report(model, cfg, Interventions(heads=(top,)))
    assert report["quoted"] == [LOSS, PREDICTABLE_ACC]
    assert report["ablated"]["eval"][PREDICTABLE_ACC] == pytest.approx(direct.predictable_acc, abs=1e-9)
    table = metrics_frame(report)
    assert list(table["held-out metric"]) == ["loss (training lengths)", "accuracy (predictable positions) "
                                              "(training lengths)", "loss (longer lengths)",
                                              "accuracy (predictable positions) (longer lengths)"]
    assert table.iloc[1]["intact"] == f"{summary['eval'][PREDICTABLE_ACC]:.1%}"


def test_a_text_runs_knockout_quotes_its_loss_and_the_unigram_baseline(store, runs):
    cfg, model = model_of(store, runs["text"])
    imp = importance_map(model, cfg)
    unigram = loss_baselines(cfg.task).unigram
    assert imp.unigram == pytest.approx(unigram) and imp.beside() is None and imp.predictable is None
    top, _ = imp.ranked()[0]
    sentence = imp.sentence(60)
    assert sentence == (f"knocking out layer 0 head {top.head} raises held-out loss from {imp.intact_loss:.2f} to "
                        f"{imp.loss[0, top.head]:.2f} nats a character (the unigram baseline, a model that ignores "
                        f"context: {unigram:.2f}; 64 held-out sequences at step 60)")
    assert imp.intact_loss == pytest.approx(store.summary(runs["text"])["eval"]["loss"], abs=1e-6)
    cells = importance_frame([imp]).data
    assert all("·" not in str(v) and "%" not in str(v) for v in cells.iloc[0, 1:])  # the loss change alone
    assert str(cells.loc[0, f"head {top.head}"]).startswith("★ ")  # the head the sentence names
    note = importance_parts(cfg, model, [imp], 60)["grid_note"]
    assert "exact-match" not in note and "knocked out (zero). The ★ cell is that head. Click" in note
    table = metrics_frame(ablation_report(model, cfg, Interventions(heads=(top,))))
    assert list(table["held-out metric"]) == ["loss (training lengths)"]  # no longer lengths, no exact-match


def test_sequence_tasks_keep_exact_match_and_token_accuracy():
    model = load_model(COPY)
    report = ablation_report(model, COPY, Interventions(heads=(HeadRef(DEC_SELF, 0, 1),)))
    assert [r.split(" (")[0] for r in metrics_frame(report)["held-out metric"]] == \
        ["loss", "token accuracy", "exact-match"] * 2
    imp = importance_map(model, COPY)
    assert "(exact-match " in imp.sentence() and imp.beside()[0] == "exact-match"
    old = ImportanceMap(DEC_SELF, imp.loss, imp.exact, imp.intact_loss, imp.intact_exact, "zero", 64)
    assert old.sentence() == imp.sentence()  # a map made without its task reads as before
    assert metrics_frame({k: v for k, v in report.items() if k != "quoted"}).equals(metrics_frame(report))


def test_ablate_on_the_command_line(store, runs, capsys):
    root = str(store.root)
    assert main(["ablate", runs["text"], "--heads", "0.0", "--runs-dir", root]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if "loss" in line)
    assert header.split() == ["loss"]  # no token accuracy or exact-match column for text
    assert main(["ablate", runs["induction"], "--heads", "1.0", "--runs-dir", root]) == 0
    out = capsys.readouterr().out
    assert "acc (predictable)" in out and "exact-match" not in out
    cfg, model = model_of(store, runs["induction"])
    assert main(["ablate", runs["induction"], "--importance", "--json", "--runs-dir", root]) == 0
    got = json.loads(capsys.readouterr().out)
    imp = importance_map(model, cfg)
    np.testing.assert_allclose(got[PREDICTABLE_ACC], imp.predictable, atol=1e-9)
    assert got["intact"][PREDICTABLE_ACC] == pytest.approx(imp.intact_predictable)
    assert "accuracy on the predictable positions" in got["sentence"]
    assert main(["ablate", runs["induction"], "--importance", "--runs-dir", root]) == 0
    table = capsys.readouterr().out
    assert "accuracy on the predictable positions with each head knocked out" in table
    assert "exact-match" not in table
    assert main(["ablate", runs["text"], "--importance", "--runs-dir", root]) == 0
    table = capsys.readouterr().out
    assert table.count("with each head knocked out") == 1 and "nats a character" in table


def test_reports_of_other_tasks_are_unchanged_in_shape():
    cfg = replace(COPY, task=replace(COPY.task, name="reverse"))
    report = ablation_report(load_model(cfg), cfg, Interventions(heads=(HeadRef(DEC_SELF, 0, 0),)))
    assert set(report["intact"]["eval"]) == {LOSS, TOKEN_ACC, EXACT_MATCH}
