"""`python -m lab train|list|show` read a run's final numbers by what means something for its task: a text run
by its loss against the unigram baseline and chance (its exact-match is 0 whatever it learned), an induction
run by its loss and its accuracy on the predictable positions, the sequence tasks by exact-match as before;
the training set's numbers beside the held-out ones, and `train --json` carries "train_set"."""
from __future__ import annotations

import contextlib
import io
import json
import math
import re
from pathlib import Path

import pytest

from lab.cli.main import main, reading
from lab.config import RunConfig, TaskConfig
from lab.engine.store import RunStore
from lab.tasks.shapes import loss_baselines
from lab.records import EXACT_MATCH, LOSS, PREDICTABLE_ACC, TOKEN_ACC

pytestmark = pytest.mark.usefixtures("one_thread")
TINY = ["--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--d-ff", "32", "--batch-size", "8", "--steps", "20",
        "--eval-every", "10", "--eval-samples", "32", "--threads", "1", "--device", "cpu", "--snapshots", "1"]
NUM = r"(\d+\.\d+)"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """Three tiny runs trained in this process: what `train` printed, and the store."""
    runs = tmp_path_factory.mktemp("cli_lm") / "runs"
    out: dict = {"runs": runs}
    for task, json_flag in (("text", []), ("induction", ["--json"]), ("copy", [])):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
            assert main(["train", "--task", task, *TINY, *json_flag, "--runs-dir", str(runs)]) == 0
        out[task] = buf.getvalue()
    return out


def only_run(runs: Path, task: str) -> str:
    store = RunStore(runs)
    return next(r for r in store.list()["run_id"] if store.config(r).task.name == task)


def test_a_text_run_is_read_by_its_loss_against_the_unigram_baseline(trained):
    lines = trained["text"].splitlines()
    run_id = only_run(trained["runs"], "text")
    store = RunStore(trained["runs"])
    cfg, summary = store.config(run_id), store.summary(run_id)
    assert re.fullmatch(rf"{run_id}: completed after 20 steps in {NUM}s; stored in .*{run_id}", lines[0]), lines[0]
    base = loss_baselines(cfg.task)
    held = summary["eval"]["loss"]
    assert lines[1] == (f"Held-out loss {held:.2f} nats a character, {'below' if held < base.unigram else 'above'} "
                        f"the unigram baseline {base.unigram:.2f} nats (a model that ignores context) and "
                        f"{'below' if held < base.chance else 'above'} chance, ln {round(math.exp(base.chance))} = "
                        f"{base.chance:.2f}.")
    assert lines[2].startswith(f"Training-set loss {summary['train_set']['loss']:.2f} nats a character, ")
    assert "exact-match" not in trained["text"] and summary["eval"][EXACT_MATCH] == 0.0  # what it used to quote


def test_train_json_carries_the_training_set_and_induction_its_predictable_accuracy(trained):
    out = json.loads(trained["induction"])
    assert trained["induction"].count("\n") == 1  # --json: one object, no sentences
    summary = json.loads((Path(out["run_dir"]) / "summary.json").read_text())
    assert out["train_set"] == summary["train_set"]
    assert set(out["train_set"]) == {LOSS, TOKEN_ACC, EXACT_MATCH, PREDICTABLE_ACC}
    assert 0 <= out["train_set"][PREDICTABLE_ACC] <= 1 and 0 < out["train_set"][LOSS] < 10
    assert PREDICTABLE_ACC in out["eval"]


def test_a_sequence_task_is_still_read_by_exact_match(trained):
    lines = trained["copy"].splitlines()
    run_id = only_run(trained["runs"], "copy")
    ev = RunStore(trained["runs"]).summary(run_id)["eval"]
    assert lines[1].startswith(f"Held-out exact-match {100 * ev[EXACT_MATCH]:.0f}% (whole answers right), token "
                               f"accuracy {100 * ev[TOKEN_ACC]:.0f}%, loss {ev[LOSS]:.2f} nats a token.")
    assert lines[2].startswith("Training-set exact-match ")


def test_list_shows_each_tasks_headline_and_show_reads_it(trained, capsys):
    runs, store = trained["runs"], RunStore(trained["runs"])
    assert main(["list", "--runs-dir", str(runs)]) == 0
    table = capsys.readouterr().out
    assert "held-out" in table.splitlines()[0] and "final.eval.exact_match" not in table
    for task in ("text", "induction", "copy"):
        run_id = only_run(runs, task)
        ev, row = store.summary(run_id)["eval"], next(line for line in table.splitlines() if run_id in line)
        if task == "text":
            unigram = loss_baselines(store.config(run_id).task).unigram
            assert f"loss {ev['loss']:.3f} (unigram {unigram:.3f})" in row and "exact" not in row
        elif task == "induction":
            assert f"loss {ev[LOSS]:.3f}, predictable acc {ev[PREDICTABLE_ACC]:.3f}" in row and "exact" not in row
        else:
            assert f"exact-match {ev[EXACT_MATCH]:.3f}" in row
    run_id = only_run(runs, "text")
    assert main(["show", run_id, "--json", "--runs-dir", str(runs)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["reading"] == trained["text"].splitlines()[1:]  # the sentences `train` printed
    assert info["summary"]["train_set"]["loss"] > 0


def test_reading_warns_of_overfitting_a_text_run():
    cfg = RunConfig(task=TaskConfig(name="text", min_len=8, max_len=8, text="a" * 120 + "b" * 60 + "c" * 20))
    unigram = loss_baselines(cfg.task).unigram  # 0.64 nats: a and b in the training 90%
    evals = [{"step": 100, "loss": 0.5, "train_loss": 0.5}, {"step": 200, "loss": 2.0, "train_loss": 0.1}]
    summary = {"eval": {LOSS: 2.0, TOKEN_ACC: 0.0, EXACT_MATCH: 0.0},
               "train_set": {LOSS: 0.1, TOKEN_ACC: 1.0, EXACT_MATCH: 1.0}}
    said = reading(cfg, summary, evals)
    assert said[0].startswith(f"Held-out loss 2.00 nats a character, above the unigram baseline {unigram:.2f}")
    assert said[1].startswith("Training-set loss 0.10 nats a character, below the unigram baseline")
    assert said[2].startswith("Overfitting: the held-out loss rose from 0.50 (step 100) to 2.00")
    assert reading(cfg, summary, evals[:1]) == said[:2] and reading(cfg, None) == []
