"""Label smoothing (train.label_smoothing; Szegedy et al. 2016, sec. 7): the knob added through its
declaration alone. The training loss is (1 - eps) * CE + eps * the mean over the vocabulary of -log p on
scored positions; evaluation stays plain cross-entropy."""
from __future__ import annotations


import pytest
import torch

import lab.cli.main as cli
from lab.config import ConfigError, TrainConfig
from lab.tasks.batches import IGNORE_INDEX, get_task
from lab.trainer import build_model, train
from ui.knobs import BY_URL, config_from_values, query_string, values_from_query
from tests.helpers import tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")

CFG = tiny_config(n_ctx=16, n_symbols=5, steps=15, batch_size=16, warmup=2, eval_every=15, eval_samples=32,
                  snapshots=0, device="cpu")


def test_the_model_loss_is_smoothed_by_hand():
    model = build_model(CFG).eval()
    b = get_task("copy").batch(CFG.task, "decoder", 8, torch.Generator().manual_seed(3))
    out = model(b.inp, b.src, b.tgt, label_smoothing=0.2)
    mask = b.tgt != IGNORE_INDEX  # (B, T)
    logp = out.logits.log_softmax(-1)[mask]  # (N, V)
    nll = -logp.gather(1, b.tgt[mask][:, None]).squeeze(1)  # (N,)
    by_hand = (0.8 * nll - 0.2 * logp.mean(-1)).mean()
    torch.testing.assert_close(out.loss, by_hand)
    # the plain loss is the eps = 0 case of the same formula
    torch.testing.assert_close(model(b.inp, b.src, b.tgt).loss, nll.mean())


def test_training_with_smoothing_differs_reproducibly_and_evaluates_plainly():
    smoothed = tiny_config(CFG, label_smoothing=0.1)
    plain, a, b = train(CFG, threads=1), train(smoothed, threads=1), train(smoothed, threads=1)
    assert a.final_train_loss == b.final_train_loss  # reproducible from the seed
    assert (a.final_eval.loss, a.final_eval.exact_match) == (b.final_eval.loss, b.final_eval.exact_match)
    assert a.final_train_loss != plain.final_train_loss
    assert not torch.equal(a.state_dict["head.weight"], plain.state_dict["head.weight"])
    # evaluation is plain cross-entropy: smoothing's own term is not in the held-out loss
    assert abs(a.final_eval.loss - plain.final_eval.loss) < 0.5


def test_the_declaration_gives_validation_a_flag_a_knob_and_a_share_key():
    with pytest.raises(ConfigError, match=r"train.label_smoothing: 0.6 is out of range \(allowed: from 0.0 to 0.5\)"):
        TrainConfig(label_smoothing=0.6)
    args = cli.build_parser().parse_args(["train", "--label-smoothing", "0.1"])
    assert cli.config_from_args(args).train.label_smoothing == 0.1
    assert BY_URL["label_smoothing"].advanced
    cfg = config_from_values({"train.label_smoothing": 0.15})
    assert "label_smoothing=0.15" in query_string(cfg)
    values, _, problems = values_from_query({"label_smoothing": "0.15"})
    assert not problems and config_from_values(values).train.label_smoothing == 0.15


def test_batched_seeds_smooth_like_solo_runs():
    from lab.batched import train_batched

    cfgs = [tiny_config(CFG, label_smoothing=0.1, seed=s) for s in (0, 1)]
    together = train_batched(cfgs, threads=1)
    for cfg, res in zip(cfgs, together):
        alone = train(cfg, threads=1)
        assert res.final_train_loss == pytest.approx(alone.final_train_loss, rel=1e-4)
        torch.testing.assert_close(res.state_dict["head.weight"], alone.state_dict["head.weight"], atol=1e-5,
                                   rtol=1e-4)
