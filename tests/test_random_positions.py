"""Randomized positions (Ruoss et al. 2023, "Randomized Positional Encodings Boost Length Generalization of
Transformers"; docs/SCIENCE.md): in training, the ids of a sequence of T tokens are an ordered random subset
of 0..L-1, read alike by the embedding and every layer of one pass; at evaluation the real positions 0..T-1.
Each encoding reads a given id as its formula says it reads that position."""
from __future__ import annotations

import pytest
import torch

import lab
from lab.config import ModelConfig, RunConfig, TaskConfig
from lab.fields import ConfigError
from lab.model import Transformer
from lab.positional import ALiBi, Learned, Placed, Rotary, Sinusoidal, random_ids, sinusoidal_table

CPU = torch.device("cpu")


def config(pos: str, span: int = 64, **kw) -> ModelConfig:
    return ModelConfig(pos=pos, pos_range=span, n_ctx=16, d_model=16, n_heads=2, d_ff=32, **kw)


def test_training_ids_are_an_ordered_random_subset_of_the_range():
    torch.manual_seed(0)
    draw = random_ids(40)
    seen = set()
    for _ in range(200):
        ids = draw(8)
        assert ids.shape == (8,) and ids.dtype == torch.long
        assert torch.all(ids[1:] > ids[:-1])  # distinct and increasing
        assert 0 <= int(ids.min()) and int(ids.max()) < 40
        seen.update(ids.tolist())
    assert seen == set(range(40))  # every id of the range is trained, not only 0..7
    with pytest.raises(ValueError, match="Randomized positions"):
        draw(41)


def test_each_encoding_reads_a_given_id_as_the_position_it_names():
    """embed / rotate / attn_bias at ids p equal the encoding at 0..max(p) read at rows p."""
    ids = torch.tensor([0, 3, 4, 9, 20])
    x = torch.randn(2, 5, 16)
    sin = Sinusoidal(config("sinusoidal"))
    torch.testing.assert_close(sin.embed(x, ids), x + sinusoidal_table(21, 16)[ids])
    learned = Learned(config("learned"))
    assert learned.weight.shape == (64, 16)  # a row per id of the range, not n_ctx's 16
    torch.testing.assert_close(learned.embed(x, ids), x + learned.weight[ids])
    rope = Rotary(config("rope"))
    q, k = torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    long_q, long_k = torch.zeros(2, 2, 21, 8), torch.zeros(2, 2, 21, 8)
    long_q[:, :, ids], long_k[:, :, ids] = q, k  # the same vectors at positions p of a longer sequence
    rq, rk = rope.rotate(long_q, long_k)
    got_q, got_k = rope.rotate(q, k, ids)
    torch.testing.assert_close(got_q, rq[:, :, ids])
    torch.testing.assert_close(got_k, rk[:, :, ids])
    alibi = ALiBi(config("alibi"))
    bias = alibi.attn_bias(5, 5, True, CPU, ids)  # (H, 5, 5)
    slopes = alibi.slopes
    dist = (ids[:, None] - ids[None, :]).abs().float()
    expected = (-slopes[:, None, None] * dist).masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(bias, expected)


@pytest.mark.parametrize("pos", ["sinusoidal", "learned", "rope", "alibi"])
def test_evaluation_reads_the_real_positions_and_training_the_drawn_ones(pos):
    """An evaluating model with a range gives the logits of the same weights without one; a training pass
    gives the logits of the same pass at the ids drawn for it, the same ids in every layer."""
    torch.manual_seed(1)
    model = Transformer(config(pos, n_layers=2), 7)
    plain = Transformer(config(pos, span=0, n_layers=2), 7)
    state = model.state_dict()
    if pos == "learned":
        state = {**state, "pos.weight": state["pos.weight"][:16]}
    plain.load_state_dict(state)
    idx = torch.randint(0, 7, (3, 12))
    model.eval()
    plain.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(idx).logits, plain(idx).logits)
        model.train()  # dropout is 0: training differs only by its positions
        torch.manual_seed(5)
        trained_pass = model(idx).logits
        torch.manual_seed(5)
        ids = random_ids(64)(12)
        model.eval()
        model.pos_override = Placed(model.pos, lambda t: ids)
        torch.testing.assert_close(trained_pass, model(idx).logits)
        model.pos_override = None
        assert not torch.allclose(trained_pass, model(idx).logits)  # the drawn ids changed something


def test_the_parameter_count_holds_a_learned_row_per_id_of_the_range():
    from lab.params import param_breakdown
    from lab.trainer import build_model

    for span in (0, 64):
        cfg = RunConfig(model=ModelConfig(pos="learned", pos_range=span, n_ctx=40, d_model=16, n_heads=2, d_ff=32),
                        task=TaskConfig(name="copy", max_len=8, ood_len=12))
        model = build_model(cfg)
        assert param_breakdown(cfg)["positional"] == model.pos.weight.numel() == max(40, span) * 16
        assert sum(param_breakdown(cfg).values()) == model.num_params()


def test_training_reaches_the_rows_beyond_the_training_length():
    """A learned table's rows past the sequence length get gradient only with randomized positions."""
    for span, reached in ((0, False), (64, True)):
        torch.manual_seed(0)
        model = Transformer(config("learned", span=span), 7).train()
        idx = torch.randint(0, 7, (4, 8))
        for _ in range(5):
            model(idx, targets=idx).loss.backward()
        grad = model.pos.weight.grad  # (rows, d)
        assert bool(grad[8:].abs().sum() > 0) is reached
        assert grad[:8].abs().sum() > 0


def test_the_config_refuses_what_cannot_be_randomized_naming_the_field():
    with pytest.raises(ConfigError, match="model.pos_range.*'none'"):
        ModelConfig(pos="none", pos_range=64)
    with pytest.raises(ConfigError, match=r"model.pos_range: 10 is shorter than the longest sequence.*at least 32"):
        RunConfig(model=ModelConfig(pos="rope", pos_range=10, n_ctx=64), task=TaskConfig(name="copy", max_len=8))
    with pytest.raises(ConfigError, match="model.pos_range"):
        RunConfig.from_dict({"model": {"pos_range": -1}})
    assert ModelConfig(arch="lstm", pos_range=64).pos_range == 64  # a recurrent model reads no positions


def test_a_run_with_randomized_positions_trains_and_repeats_exactly(tmp_path):
    """The draws come from the seeded generator, as dropout's masks: the same config gives the same weights."""
    runs = [lab.train(task="reverse", d_model=16, n_heads=2, n_layers=1, d_mlp=32, pos="rope", pos_range=48,
                      max_len=6, steps=20, eval_every=20, eval_samples=16, batch_size=8, threads=1,
                      runs_dir=tmp_path / str(i), progress=False) for i in range(2)]
    a, b = (r.model.state_dict() for r in runs)
    assert runs[0].config.model.pos_range == 48
    assert all(torch.equal(a[k], b[k]) for k in a)
