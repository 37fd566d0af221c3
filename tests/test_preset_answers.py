"""Every preset's explanation answers its own question with the number it measured (the step, the
head, the share), read from the runs' curves and attention, not only from their final summaries."""
from __future__ import annotations

import numpy as np

from lab.teach.attention_measures import anti_diagonal
from lab.teach.presets.catalog import PRESETS, measured
from lab.records import EXACT_MATCH, LOSS, TOKEN_ACC


def summ(loss: float, em: float, train_loss: float | None = None, ood_em: float = 0.0) -> dict:
    return {"train_loss": loss if train_loss is None else train_loss, "steps": 100, "wall_s": 1.0,
            "eval": {LOSS: loss, TOKEN_ACC: 0.5, EXACT_MATCH: em},
            "ood": {LOSS: loss, TOKEN_ACC: 0.5, EXACT_MATCH: ood_em}, "stopped": False}


def curve(key: str, values: list[float], every: int) -> list[dict]:
    return [{"step": every * (i + 1), key: v} for i, v in enumerate(values)]


def test_sort_says_at_which_step_it_was_solved():
    evals = curve(EXACT_MATCH, [0.1, 0.6, 0.97, 1.0, 1.0], 25)
    text = PRESETS["hello_sort"].explain({"sort": measured(summ(0.0002, 1.0), evals)})
    assert "Solved by step 100 of 300" in text, text


def test_induction_says_when_the_two_layer_loss_dropped():
    evals = curve("loss", [4.1, 4.0, 3.0, 0.9, 0.6], 50)
    text = PRESETS["induction"].explain({"1 layer": measured(summ(2.2, 0.0)), "2 layers": measured(summ(0.6, 0.0),
                                                                                                     evals)})
    assert "from step 200 of 800 on" in text and "0.60" in text and "2.20" in text, text


def test_encoder_decoder_names_the_anti_diagonal_head_and_its_share():
    t = 4
    cross = np.full((2, 3, t, t), 1 / t, dtype=np.float32)  # (layers, heads, Tq, Tk): uniform everywhere
    cross[1, 2] = 0.1 / (t - 1)
    cross[1, 2, range(t), [t - 1 - i for i in range(t)]] = 0.9  # one head reads L-1-t
    assert anti_diagonal(cross) == (1, 2, np.float32(0.9))
    text = PRESETS["encoder_decoder"].explain({"encoder-decoder": measured(summ(0.01, 1.0), attention={"cross": cross})})
    assert "layer 1 head 2 puts 90% of output position t's cross-attention on input position L-1-t" in text, text


def test_grokking_says_when_test_accuracy_jumped_after_training_fitted():
    wd = measured(summ(0.5, 0.99, train_loss=0.01), curve(EXACT_MATCH, [0.02, 0.05, 0.4, 0.95, 0.99], 440),
                  train=[(100, 2.0), (550, 0.25), (900, 0.01)])
    no = measured(summ(2.0, 0.3, train_loss=0.01))
    text = PRESETS["grokking"].explain({"weight decay 1.0": wd, "weight decay 0": no})
    assert "passed 90% at step 1760, 1210 steps after training loss fell below 0.3 (step 550)" in text, text


def test_without_curves_the_explanations_still_read_well():
    """A caller with summaries only (an old client, a run without metrics) gets the sentences without steps."""
    assert PRESETS["hello_sort"].explain({"sort": summ(0.0002, 1.0)}).startswith("Solved: ")
    assert anti_diagonal(None) is None and anti_diagonal(np.zeros((1, 1, 2, 3))) is None
