"""The recurrent baselines (lab/recurrent.py): the stack equals torch's own multi-layer LSTM / GRU with the
same weights, parameter counts equal their closed form and torch's module, the model is causal, and its
loss scores only the answer positions, as the Transformer's does."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lab.config import ModelConfig
from lab.recurrent import CELLS, RecurrentLM, layer_params, recurrent_params
from lab.tasks.shapes import IGNORE_INDEX

VOCAB = 11


def build(cell: str, d: int = 16, layers: int = 2, dropout: float = 0.0, seed: int = 0) -> RecurrentLM:
    torch.manual_seed(seed)
    return RecurrentLM(ModelConfig(d_model=d, n_heads=2, n_layers=layers, dropout=dropout), VOCAB, cell=cell)


def as_torch_stack(model: RecurrentLM) -> nn.RNNBase:
    """torch's own multi-layer module with this model's weights (layer i's tensors renamed *_l{i}): the
    reference the tests compare the stack against."""
    d, L = model.cfg.d_model, len(model.layers)
    ref = CELLS[model.cell](d, d, num_layers=L, batch_first=True, dropout=model.cfg.dropout if L > 1 else 0.0)
    with torch.no_grad():
        for i, layer in enumerate(model.layers):
            for name, p in layer.named_parameters():  # weight_ih_l0, weight_hh_l0, bias_ih_l0, bias_hh_l0
                getattr(ref, name.replace("_l0", f"_l{i}")).copy_(p)
    return ref


@pytest.mark.parametrize("cell", sorted(CELLS))
@pytest.mark.parametrize("layers", [1, 3])
def test_stack_equals_torch_multilayer_module(cell, layers):
    model = build(cell, layers=layers, dropout=0.1).eval()
    ref = as_torch_stack(model).eval()
    idx = torch.randint(0, VOCAB, (4, 9))
    with torch.no_grad():
        h, _ = ref(model.tok_emb(idx))  # (B, T, d)
        expected = model.head(h)
        got = model(idx).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cell", sorted(CELLS))
@pytest.mark.parametrize("d,layers", [(8, 1), (16, 2), (24, 4)])
def test_parameter_count_closed_form_equals_module_and_torch(cell, d, layers):
    model = build(cell, d=d, layers=layers)
    formula = recurrent_params(cell, d, layers, VOCAB)
    assert sum(formula.values()) == model.num_params()
    recurrent = sum(p.numel() for p in model.layers.parameters())
    assert formula["recurrent"] == recurrent == sum(p.numel() for p in as_torch_stack(model).parameters())
    gates = {"rnn": 1, "lstm": 4, "gru": 3}[cell]
    assert layer_params(cell, d) == gates * (2 * d * d + 2 * d)  # written out: W_ih, W_hh, b_ih, b_hh per gate


@pytest.mark.parametrize("cell", sorted(CELLS))
def test_causal_a_later_token_never_changes_an_earlier_logit(cell):
    model = build(cell, layers=2).eval()
    idx = torch.randint(0, VOCAB, (2, 10))
    changed = idx.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % VOCAB
    with torch.no_grad():
        a, b = model(idx).logits, model(changed).logits
    torch.testing.assert_close(a[:, :6], b[:, :6])
    assert not torch.allclose(a[:, 6:], b[:, 6:])


@pytest.mark.parametrize("cell", sorted(CELLS))
def test_loss_scores_only_the_targets_given(cell):
    model = build(cell).eval()
    idx = torch.randint(0, VOCAB, (3, 7))
    targets = torch.full_like(idx, IGNORE_INDEX)
    targets[:, 4:] = idx[:, 4:]
    out = model(idx, targets=targets)
    logits = out.logits[:, 4:].reshape(-1, VOCAB)
    torch.testing.assert_close(out.loss, F.cross_entropy(logits, idx[:, 4:].reshape(-1)))
    assert out.attention == {}


def test_a_skipped_layer_passes_its_input_through():
    model = build("lstm", layers=2).eval()
    idx = torch.randint(0, VOCAB, (2, 5))
    model.skipped = frozenset({1})
    with torch.no_grad():
        got = model(idx).logits
        expected = model.head(model.layers[0](model.tok_emb(idx))[0])
    torch.testing.assert_close(got, expected)


def test_refusals_name_the_field():
    with pytest.raises(ValueError, match="Architecture"):
        build("transformer")
    with pytest.raises(ValueError, match="Architecture"):
        build("gru")(torch.zeros(1, 3, dtype=torch.long), src=torch.zeros(1, 3, dtype=torch.long))


def test_trains_on_a_copy_like_signal():
    """A few hundred Adam steps on 'repeat the previous token' take the loss far below chance (log V)."""
    model = build("lstm", d=32, layers=1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    for _ in range(150):
        idx = torch.randint(0, VOCAB, (32, 12), generator=gen)
        targets = torch.full_like(idx, IGNORE_INDEX)
        targets[:, 1:] = idx[:, :-1]
        loss = model(idx, targets=targets).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.1 * torch.log(torch.tensor(float(VOCAB))).item()


def test_the_transformer_refuses_a_recurrent_architecture():
    """Issue 34 item 10: Transformer(ModelConfig(arch="lstm")) built a decoder-only Transformer without a word."""
    from lab.config import ModelConfig
    from lab.fields import ConfigError
    from lab.model import Transformer

    for arch in ("rnn", "lstm", "gru"):
        with pytest.raises(ConfigError, match=f"model.arch: '{arch}' is a recurrent baseline, not a Transformer"):
            Transformer(ModelConfig(arch=arch, n_heads=1, d_ff=0, norm="none", pos="none"), 10)
