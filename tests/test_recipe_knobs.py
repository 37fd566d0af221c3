"""The recipe's knobs (issue 23): attention scaling, residual connections, head size, norm type, gated
feed-forward layers and QK-norm. Each is checked as the paper's options are: against a hand computation,
the parameter closed form against the module, causality, and the fused attention path against the
explicit one; and the paper's argument for the scaling is measured at initialisation."""
from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from lab.config import ConfigError, ModelConfig
from lab.interventions import Interventions, LayerRef, applied, parse_heads
from lab.model import Attention, Block, FeedForward, Transformer
from lab.params import module_params, param_formula

VOCAB = 11
OPTIONS = {"scale": ["none"], "residual": ["off"], "head_dim": [6, 20], "norm_type": ["rmsnorm"],
           "activation": ["swiglu", "geglu"], "qk_norm": ["on"]}
EACH = [(k, v) for k, vs in OPTIONS.items() for v in vs]


def model(seed: int = 0, **kw) -> Transformer:
    torch.manual_seed(seed)
    base = {"d_model": 24, "n_heads": 2, "n_layers": 2, "d_ff": 48, "n_ctx": 16}
    return Transformer(ModelConfig(**{**base, **kw}), VOCAB).eval()


@pytest.mark.parametrize(("field", "value"), EACH)
@pytest.mark.parametrize("arch", ["decoder", "encoder-decoder"])
@pytest.mark.parametrize("norm", ["pre", "post", "none"])
def test_each_option_parameter_count_closed_form_equals_module(field, value, arch, norm):
    m = model(**{field: value, "arch": arch, "norm": norm})
    assert param_formula(m.cfg, VOCAB) == module_params(m)


@pytest.mark.parametrize(("field", "value"), EACH + [("pos", "rope"), ("pos", "alibi")])
def test_each_option_is_causal_and_its_fused_path_equals_the_explicit_one(field, value):
    kw = {field: value, "pos": "rope"} if field == "head_dim" else {field: value}
    m = model(**kw)
    x = torch.randint(0, VOCAB, (3, 12))
    with torch.no_grad():
        fused, explicit = m(x).logits, m(x, need_weights=True).logits
        later = x.clone()
        later[:, 7:] = (later[:, 7:] + 1) % VOCAB
        changed = m(later).logits
    torch.testing.assert_close(fused, explicit, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(changed[:, :7], fused[:, :7])


def test_every_option_together_in_both_architectures():
    for arch, combo in itertools.product(["decoder", "encoder-decoder"], itertools.product(*OPTIONS.values())):
        m = model(arch=arch, **dict(zip(OPTIONS, combo)))
        x = torch.randint(0, VOCAB, (2, 6))
        out = m(x, x if arch == "encoder-decoder" else None, targets=x)
        assert torch.isfinite(out.loss) and param_formula(m.cfg, VOCAB) == module_params(m)


@pytest.mark.parametrize("d_k", [8, 32, 128])
def test_unscaled_logits_variance_grows_as_d_k_at_initialisation(d_k):
    """Vaswani et al. 2017, sec. 3.2.1, footnote 4: for q, k with independent unit-variance entries, q.k has
    variance d_k, hence the 1/sqrt(d_k). A freshly initialised model with QK-norm (RMSNorm, gain 1) gives
    each head's q and k exactly that: unit mean square. Unscaled, the logits' variance is d_k (within 15%);
    scaled, near 1."""
    torch.manual_seed(d_k)
    x = torch.randn(64, 32, 64)  # (B, T, d_model)
    variances = {}
    for scale in ("none", "sqrt"):
        cfg = ModelConfig(d_model=64, n_heads=1, head_dim=d_k, qk_norm="on", norm_type="rmsnorm", scale=scale)
        attn = Attention(cfg)
        with torch.no_grad():
            q, k, _ = attn.heads(x)
            variances[scale] = attn.logits(q, k).var().item()
    assert variances["none"] == pytest.approx(d_k, rel=0.15)
    assert variances["sqrt"] == pytest.approx(1.0, rel=0.15)


def test_without_scaling_a_large_d_k_saturates_the_softmax():
    """The paper's reason: large dot products push the softmax into regions of tiny gradients. At d_k 128
    the unscaled pattern's entropy is far below the scaled one's."""
    torch.manual_seed(0)
    x = torch.randn(16, 32, 64)
    entropy = {}
    for scale in ("none", "sqrt"):
        attn = Attention(ModelConfig(d_model=64, n_heads=1, head_dim=128, qk_norm="on", norm_type="rmsnorm",
                                     scale=scale))
        with torch.no_grad():
            p = attn.logits(*attn.heads(x)[:2]).softmax(-1)
        entropy[scale] = float(-(p * p.clamp_min(1e-30).log()).sum(-1).mean())
    assert entropy["none"] < 0.5 * entropy["sqrt"] and entropy["sqrt"] > 0.8 * math.log(32)


def test_rmsnorm_equals_its_hand_computation_and_torchs_module():
    m = model(norm_type="rmsnorm")
    norm = m.decoder[0].norms[0]
    assert isinstance(norm, torch.nn.RMSNorm) and not any("bias" in n for n, _ in norm.named_parameters())
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, 24))
        ref = torch.nn.RMSNorm(24, eps=1e-5)
        ref.weight.copy_(norm.weight)
        x = torch.randn(3, 5, 24) * 3 + 1
        hand = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight
        torch.testing.assert_close(norm(x), hand)
        torch.testing.assert_close(ref(x), hand)


@pytest.mark.parametrize(("activation", "act"), [("swiglu", F.silu), ("geglu", F.gelu)])
def test_gated_feed_forward_equals_its_hand_computation(activation, act):
    cfg = ModelConfig(d_model=24, n_heads=2, d_ff=48, activation=activation)
    torch.manual_seed(1)
    ff = FeedForward(cfg).eval()
    h = cfg.d_ff_hidden
    assert h == 32 and ff.fc1.weight.shape == (2 * h, 24) and ff.fc2.weight.shape == (24, h)  # 2/3 of d_ff
    W, V = ff.fc1.weight[:h], ff.fc1.weight[h:]
    b, c = ff.fc1.bias[:h], ff.fc1.bias[h:]
    x = torch.randn(2, 5, 24)
    with torch.no_grad():
        hand = (act(x @ W.T + b) * (x @ V.T + c)) @ ff.fc2.weight.T + ff.fc2.bias
        torch.testing.assert_close(ff(x), hand)
    dense = 2 * 24 * 48
    assert abs(3 * 24 * h - dense) / dense < 0.01  # the weights stay about 2 d d_ff


@pytest.mark.parametrize("norm", ["pre", "post", "none"])
def test_a_block_without_residual_connections_equals_its_hand_computation(norm):
    cfg = ModelConfig(d_model=24, n_heads=2, d_ff=48, residual="off", norm=norm)
    torch.manual_seed(2)
    block = Block(cfg, causal=True, cross=False).eval()
    x = torch.randn(2, 6, 24)
    ln1, ln2 = block.norms
    with torch.no_grad():
        got, _ = block(x, None, None, False)
        attn = lambda h: block.self_attn(h, None, None, True, False)[0]  # noqa: E731
        if norm == "pre":
            h = attn(ln1(x))
            hand = block.ff(ln2(h))
        elif norm == "post":
            h = ln1(attn(x))
            hand = ln2(block.ff(h))
        else:
            hand = block.ff(attn(x))
        torch.testing.assert_close(got, hand)
        with_residual = Block(replace(cfg, residual="on"), causal=True, cross=False).eval()
        with_residual.load_state_dict(block.state_dict())
        assert not torch.allclose(with_residual(x, None, None, False)[0], got)


def test_head_size_sets_the_projections_and_a_knockout_zeroes_that_heads_slice():
    m = model(head_dim=20, n_heads=3)  # 3 x 20 = 60 != d_model 24: allowed once d_head is set
    attn = m.decoder[0].self_attn
    assert attn.in_proj.weight.shape == (3 * 60, 24) and attn.out_proj.weight.shape == (24, 60)
    x = torch.randint(0, VOCAB, (2, 8))
    seen = {}
    with torch.no_grad(), applied(m, Interventions(heads=parse_heads("0.1"))):  # the knockout's hook first
        handle = attn.out_proj.register_forward_pre_hook(lambda mod, args: seen.__setitem__("in", args[0].clone()))
        m(x)
        handle.remove()
    assert seen["in"].shape[-1] == 60
    assert torch.all(seen["in"][..., 20:40] == 0) and seen["in"][..., :20].abs().sum() > 0


def test_configs_that_cannot_work_are_refused_naming_the_field():
    with pytest.raises(ConfigError, match="model.d_model"):
        ModelConfig(d_model=30, n_heads=4)  # no d_head given: d_model must split into the heads
    assert ModelConfig(d_model=30, n_heads=4, head_dim=8).d_head == 8
    with pytest.raises(ConfigError, match="model.pos"):
        ModelConfig(pos="rope", head_dim=7)
    for bad in ({"scale": "half"}, {"residual": "maybe"}, {"norm_type": "batchnorm"}, {"qk_norm": "yes"}):
        with pytest.raises(ConfigError, match="model." + next(iter(bad))):
            ModelConfig(**bad)
    m = model(residual="off")
    with pytest.raises(ConfigError, match="Skip block"):
        with applied(m, Interventions(skip_block=(LayerRef("dec", 0),))):
            pass
