"""What a language-model run's numbers mean: its loss against the unigram baseline and chance (nats), the
accuracy on induction's predictable positions, which metrics each task is read by, and the sentence that
says a text run is overfitting its training text."""
from __future__ import annotations

import math
from dataclasses import fields

import pytest
import torch

from lab.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from lab.evaluation import measure
from lab.model import ModelOutput
from lab.records import EXACT_MATCH, LOSS, PREDICTABLE_ACC, TOKEN_ACC, EvalRecord
from lab.trainer import train
from lab.tasks.batches import IGNORE_INDEX, Batch, get_task
from lab.tasks.shapes import SHAPES, headline_metrics, loss_baselines
from lab.teach.loss_reading import headline_sentence, overfitting_sentence

pytestmark = pytest.mark.usefixtures("one_thread")  # torch at one intra-op thread (tests/conftest.py)
CPU = torch.device("cpu")
# 200 characters: the first 180 train (120 a, 60 b), the last 20 are held out (all c)
TEXT = "a" * 120 + "b" * 60 + "c" * 20
TEXT_TASK = TaskConfig(name="text", min_len=4, max_len=8, text=TEXT)


def test_unigram_baseline_is_the_entropy_of_the_training_text_by_hand():
    hand = -(2 / 3) * math.log(2 / 3) - (1 / 3) * math.log(1 / 3)  # p(a) = 120/180, p(b) = 60/180: c never trains
    b = loss_baselines(TEXT_TASK)
    assert b.unigram == pytest.approx(hand) and b.unigram == pytest.approx(0.6365, abs=1e-4)
    assert b.chance == pytest.approx(math.log(3))  # three characters
    assert loss_baselines(TaskConfig(name="induction", min_len=8, max_len=8, n_symbols=64)).chance == \
        pytest.approx(math.log(64))
    assert loss_baselines(TaskConfig(name="induction", min_len=8, max_len=8)).unigram is None


class Fixed(torch.nn.Module):
    """A model whose predictions are given: logits putting 20 nats on `guess` at every position."""

    def __init__(self, guess: torch.Tensor, vocab: int) -> None:
        super().__init__()
        self.guess, self.vocab = guess, vocab

    def forward(self, idx, src=None, targets=None, need_weights=False):
        return ModelOutput(logits=torch.nn.functional.one_hot(self.guess, self.vocab).float() * 20.0)


def test_induction_accuracy_on_the_predictable_positions_of_a_hand_built_batch():
    # two sequences of 8 tokens; the repeat starts where the targets stop being ignored
    seq = torch.tensor([[5, 6, 7, 5, 6, 7, 5, 6, 7], [1, 2, 3, 4, 2, 3, 4, 2, 3]])
    tgt = seq[:, 1:].clone()
    tgt[0, :2] = IGNORE_INDEX  # row 0 scores targets 2..7: the repeat from seq[3] on, seq[3] = 5 unpredictable
    tgt[1, :3] = IGNORE_INDEX  # row 1 scores targets 3..7: from seq[4] on, seq[4] = 2 unpredictable
    batch = Batch(inp=seq[:, :-1], tgt=tgt)
    sure = get_task("induction").predictable(tgt)
    assert sure.tolist() == [[False, False, False, True, True, True, True, True],
                             [False, False, False, False, True, True, True, True]]
    guess = tgt.clamp(min=0).clone()  # right everywhere ...
    guess[0, 2] = 0  # ... but the unpredictable first token of each repeat
    guess[1, 3] = 0
    guess[1, 6] = 0  # and one predictable token of row 1
    m = measure(Fixed(guess, 10), [batch], CPU, get_task("induction").predictable)
    assert m.predictable_acc == pytest.approx(8 / 9)  # 9 predictable positions, 8 right
    assert m.token_acc == pytest.approx(8 / 11)  # 11 scored positions: the two first tokens count here
    assert m.exact_match == 0.0  # no row right as a whole
    assert measure(Fixed(guess, 10), [batch], CPU).predictable_acc is None  # not asked: not measured


def test_an_induction_copier_is_right_on_every_predictable_position_of_generated_batches():
    cfg = TaskConfig(name="induction", min_len=24, max_len=24, n_symbols=1000)
    task = get_task("induction")
    batch = task.batch(cfg, "decoder", 64, torch.Generator().manual_seed(0))
    inp = batch.inp
    guess = torch.zeros_like(inp)
    for r in range(inp.shape[0]):  # the induction rule: find the current token before, copy what followed it
        for t in range(inp.shape[1]):
            earlier = [j for j in range(t) if inp[r, j] == inp[r, t]]
            guess[r, t] = inp[r, earlier[-1] + 1] if earlier else 0
    m = measure(Fixed(guess, 1000), [batch], CPU, task.predictable)
    assert m.predictable_acc >= 0.99  # (a random token that occurred twice before the repeat misleads it)
    assert m.token_acc < 0.95 and m.exact_match < 0.1  # the first token of each repeat, unpredictable, counts there


def test_headline_metrics_name_what_means_something_for_each_task():
    columns = {f.name for f in fields(EvalRecord)}
    for name in SHAPES:
        head = headline_metrics(name)
        assert head and set(head) <= columns and {"train_" + c for c in head} <= columns, name
    assert headline_metrics("text") == ("loss",)
    assert headline_metrics("induction") == (LOSS, PREDICTABLE_ACC)
    assert headline_metrics("sort")[0] == EXACT_MATCH and TOKEN_ACC not in headline_metrics("modular_addition")


def test_headline_sentences_read_a_language_model_by_its_loss():
    text = headline_sentence(TEXT_TASK, {LOSS: 0.5, EXACT_MATCH: 0.0, TOKEN_ACC: 0.8})
    assert text == ("Held-out loss 0.50 nats a character, below the unigram baseline 0.64 nats (a model that "
                    "ignores context) and below chance, ln 3 = 1.10.")
    ind = TaskConfig(name="induction", min_len=24, max_len=24, n_symbols=1000)
    text = headline_sentence(ind, {LOSS: 0.8, EXACT_MATCH: 0.086, PREDICTABLE_ACC: 0.99}, "training")
    assert text.startswith("Training loss 0.80 nats a token, below chance, ln 1000 = 6.91; 99% right on the "
                           "predictable positions") and "exact-match" not in text
    seq = headline_sentence(TaskConfig(name="sort"), {LOSS: 0.01, EXACT_MATCH: 0.97, TOKEN_ACC: 0.99})
    assert seq == "Held-out exact-match 97% (whole answers right), token accuracy 99%, loss 0.01 nats a token."


def evals(*losses: float, train: float = 0.1) -> list[dict]:
    return [{"step": 50 * (i + 1), "loss": v, "train_loss": train} for i, v in enumerate(losses)]


def test_the_overfitting_sentence_appears_when_held_out_loss_rises_above_the_unigram_baseline():
    base = loss_baselines(TEXT_TASK).unigram  # 0.64
    said = overfitting_sentence(TEXT_TASK, evals(0.9, 0.5, 0.45, 0.7, 2.1))
    assert said.startswith("Overfitting: the held-out loss rose from 0.45 (step 150) to 2.10 nats a character "
                           f"(step 250), above the unigram baseline {base:.2f}"), said
    assert "its loss on the training text is 0.10" in said and "by heart" in said
    assert overfitting_sentence(TEXT_TASK, evals(0.9, 0.5, 0.45, 0.6)) == ""  # rose, but still below the baseline
    assert overfitting_sentence(TEXT_TASK, evals(1.1, 0.9, 0.7)) == ""  # above it, but still falling: untrained
    assert overfitting_sentence(TEXT_TASK, []) == ""
    ind = TaskConfig(name="induction", min_len=8, max_len=8)
    assert overfitting_sentence(ind, evals(0.5, 9.0)) == ""  # the text task only
    old = [{"step": 50, "loss": 0.4}, {"step": 100, "loss": 1.5, "train_loss": float("nan")}]
    assert "Overfitting" in overfitting_sentence(TEXT_TASK, old) and "training text is" not in \
        overfitting_sentence(TEXT_TASK, old)  # a run recorded before training metrics: no training loss quoted


def test_the_upload_note_gives_the_baseline_in_nats(tmp_path):
    textfile = pytest.importorskip("ui.textfile")
    path = tmp_path / "t.txt"
    path.write_text(TEXT, encoding="utf-8")
    _, note = textfile.load_text_file(str(path))
    assert f"unigram baseline {loss_baselines(TEXT_TASK).unigram:.2f} nats a character" in note
    assert "bits" not in note


# 784 characters of prose that never repeats itself: its held-out tenth shares little with the rest
PASTE = ("It was late in the autumn when Maria finally decided to leave the city. She packed two suitcases, "
         "a box of letters from her grandmother, and the small brass clock that had never kept proper time. "
         "The train north was nearly empty; an old man across the aisle read a newspaper from last week and "
         "hummed something that sounded like a waltz. Outside, the fields turned from brown to grey as the "
         "light went out of the sky. She thought about the apartment, the cracked window above the sink, the "
         "neighbour who practised trumpet every Sunday morning. None of it would miss her, she supposed. At "
         "the third station a woman with a basket of apples got on and offered her one without a word. Maria "
         "took it, and for the first time in months she laughed out loud, surprising them both. Snow began.")


def test_a_short_paste_overfits_and_the_sentence_says_so():
    """The issue's case: a paste of a few hundred characters, the default model. Its training loss keeps
    falling while its held-out loss climbs past the unigram baseline (here 2.4 -> 3.2 -> 4.6 by step 300)."""
    cfg = RunConfig(model=ModelConfig(n_ctx=64), task=TaskConfig(name="text", min_len=16, max_len=16, text=PASTE),
                    train=TrainConfig(steps=300, eval_every=100, snapshots=0, device="cpu"))
    records: list = []
    train(cfg, on_record=records.append, threads=1)
    evals = [{"step": r.step, "loss": r.loss, "train_loss": r.train_loss} for r in records if isinstance(r, EvalRecord)]
    base = loss_baselines(cfg.task).unigram
    assert evals[-1]["loss"] > base > evals[-1]["train_loss"], (base, evals)
    said = overfitting_sentence(cfg.task, evals)
    assert said.startswith("Overfitting: the held-out loss rose from") and f"{base:.2f}" in said, said
    assert "above the unigram baseline" in headline_sentence(cfg.task, evals[-1])
