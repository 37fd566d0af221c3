"""The Transformer: reference equivalence with PyTorch's layers, causality, attention patterns,
fused vs explicit attention, positional hooks inside the model, initial loss, parameter counts."""
from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn as nn

from lab.config import TRANSFORMERS, NORMS, POS_ENCODINGS, ModelConfig, RunConfig, TaskConfig, TrainConfig
from lab.model import IGNORE_INDEX, Block, Transformer
from lab.positional import PositionalEncoding
from lab.tasks.batches import get_task
from lab.trainer import build_model
from lab.records import CROSS, DEC_SELF, ENC_SELF

AXES = list(itertools.product(POS_ENCODINGS, NORMS, TRANSFORMERS))
VOCAB = 11


pytestmark = pytest.mark.usefixtures("one_thread")  # torch at one intra-op thread (tests/conftest.py)


def tiny(pos: str = "none", norm: str = "pre", arch: str = "decoder", **kw) -> ModelConfig:
    base = dict(arch=arch, n_layers=2, n_heads=2, d_model=16, d_ff=32, norm=norm, pos=pos, n_ctx=32)
    return ModelConfig(**{**base, **kw})


def scramble(module: nn.Module, seed: int) -> nn.Module:
    """Random weights of order one everywhere (norm gains and biases too), so any leak shows in the
    output; matrices get std 1/sqrt(fan_in) so activations stay O(1) without normalisation."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "norm" in name and name.endswith("weight"):  # LayerNorm gain: near 1
                p.copy_(1.0 + 0.3 * noise)
            elif p.dim() >= 2 and not name.startswith(("tok_emb", "pos.")):
                p.copy_(noise / math.sqrt(p.shape[-1]))
            else:  # biases, embeddings, learned positions
                p.copy_(0.3 * noise if p.dim() == 1 else noise)
    return module.eval()


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to fp32 rounding: 1e-5, relative to the logit scale where that exceeds 1 (scrambled
    models without normalisation reach logits of ~30, where fp32 rounding alone gives ~2e-5)."""
    assert a.shape == b.shape
    if a.numel() == 0:
        return True
    return (a - b).abs().max().item() <= 1e-5 * max(1.0, b.abs().max().item())


def make_model(cfg: ModelConfig, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return scramble(Transformer(cfg, VOCAB), seed)


def inputs(arch: str, b: int = 2, t: int = 8, s: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, VOCAB, (b, t), generator=g)
    src = torch.randint(0, VOCAB, (b, s), generator=g) if arch == "encoder-decoder" else None
    return idx, src


# ---- reference equivalence with torch.nn.TransformerEncoderLayer / DecoderLayer ------------


def _copy_attn(theirs: nn.MultiheadAttention, ours) -> None:
    theirs.in_proj_weight.copy_(ours.in_proj.weight)  # rows: Wq, Wk, Wv
    theirs.in_proj_bias.copy_(ours.in_proj.bias)
    theirs.out_proj.weight.copy_(ours.out_proj.weight)
    theirs.out_proj.bias.copy_(ours.out_proj.bias)


def _copy_common(theirs: nn.Module, ours: Block) -> None:
    _copy_attn(theirs.self_attn, ours.self_attn)
    theirs.linear1.weight.copy_(ours.ff.fc1.weight)
    theirs.linear1.bias.copy_(ours.ff.fc1.bias)
    theirs.linear2.weight.copy_(ours.ff.fc2.weight)
    theirs.linear2.bias.copy_(ours.ff.fc2.bias)
    norms = [theirs.norm1, theirs.norm2] + ([theirs.norm3] if hasattr(theirs, "norm3") else [])
    assert len(norms) == len(ours.norms)
    for t, o in zip(norms, ours.norms):
        assert t.eps == o.eps
        t.weight.copy_(o.weight)
        t.bias.copy_(o.bias)


D, H, FF = 16, 4, 40


def _block_pair(norm: str, causal: bool, cross: bool) -> tuple[ModelConfig, Block, nn.Module]:
    """(config, our scrambled Block, torch's reference layer holding the same weights): an encoder
    layer, or with `cross` a decoder layer (cross-attention copied too)."""
    cfg = ModelConfig(d_model=D, n_heads=H, d_ff=FF, activation="relu", norm=norm, pos="none", dropout=0.0)
    torch.manual_seed(0)
    ours = scramble(Block(cfg, causal=causal, cross=cross), seed=2 if cross else 1)
    layer = nn.TransformerDecoderLayer if cross else nn.TransformerEncoderLayer
    theirs = layer(D, H, dim_feedforward=FF, dropout=0.0, activation="relu", batch_first=True,
                   norm_first=(norm == "pre")).eval()
    with torch.no_grad():
        _copy_common(theirs, ours)
        if cross:
            _copy_attn(theirs.multihead_attn, ours.cross_attn)
    return cfg, ours, theirs


BLOCK_CASES = pytest.mark.parametrize("norm,causal,need_weights",
                                      list(itertools.product(["post", "pre"], [False, True], [False, True])))


@BLOCK_CASES
def test_encoder_block_equals_torch_layer(norm, causal, need_weights):
    cfg, ours, theirs = _block_pair(norm, causal, cross=False)
    with torch.no_grad():
        x = torch.randn(3, 7, D)
        mask = nn.Transformer.generate_square_subsequent_mask(7) if causal else None
        want = theirs(x, src_mask=mask)
        got, patterns = ours(x, None, PositionalEncoding(cfg), need_weights)
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    assert (patterns["self"] is not None) == need_weights
    # the comparison is sensitive: the masked and unmasked layers really differ
    with torch.no_grad():
        other = theirs(x, src_mask=None if causal else nn.Transformer.generate_square_subsequent_mask(7))
    assert not torch.allclose(got, other, atol=1e-3)


@BLOCK_CASES
def test_decoder_block_equals_torch_layer(norm, causal, need_weights):
    cfg, ours, theirs = _block_pair(norm, causal, cross=True)
    with torch.no_grad():
        x, memory = torch.randn(3, 7, D), torch.randn(3, 5, D)
        mask = nn.Transformer.generate_square_subsequent_mask(7) if causal else None
        want = theirs(x, memory, tgt_mask=mask)
        got, patterns = ours(x, memory, PositionalEncoding(cfg), need_weights)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    if need_weights:
        assert patterns["self"].shape == (3, H, 7, 7) and patterns["cross"].shape == (3, H, 7, 5)
    with torch.no_grad():  # memory matters: cross-attention is really compared
        other = theirs(x, memory.flip(1) + 1.0, tgt_mask=mask)
    assert not torch.allclose(got, other, atol=1e-3)


def test_norm_none_block_is_plain_residual():
    cfg = ModelConfig(d_model=D, n_heads=H, d_ff=FF, norm="none", pos="none")
    block = scramble(Block(cfg, causal=True, cross=False), seed=3)
    x = torch.randn(2, 5, D)
    pe = PositionalEncoding(cfg)
    with torch.no_grad():
        got, _ = block(x, None, pe, False)
        h = x + block.self_attn(x, None, pe, True, False)[0]
        want = h + block.ff(h)
    assert torch.allclose(got, want, atol=1e-6)
    assert all(isinstance(n, nn.Identity) for n in block.norms)


# ---- causality, attention patterns, fused == explicit ------------------------------------------


@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "explicit"])
@pytest.mark.parametrize("pos, norm, arch", AXES)
def test_causality(pos, norm, arch, need_weights):
    model = make_model(tiny(pos, norm, arch))
    idx, src = inputs(arch)
    B, T = idx.shape
    # one batch holding every variant: row block t has the token at position t changed
    changed = idx.repeat(T, 1)  # (T * B, T)
    for t in range(T):
        changed[t * B:(t + 1) * B, t] = (idx[:, t] + 1) % VOCAB
    with torch.no_grad():
        base = model(idx, src, need_weights=need_weights).logits  # (B, T, V)
        logits = model(changed, None if src is None else src.repeat(T, 1), need_weights=need_weights).logits
    for t in range(1, T):
        got = logits[t * B:(t + 1) * B]
        assert close(got[:, :t], base[:, :t]), f"positions < {t} saw position {t}"
        assert not torch.allclose(got[:, t], base[:, t], atol=1e-3)  # the change itself is visible


@pytest.mark.parametrize("pos, norm, arch", AXES)
def test_attention_patterns(pos, norm, arch):
    cfg = tiny(pos, norm, arch)
    model = make_model(cfg)
    idx, src = inputs(arch, b=2, t=8, s=6)
    with torch.no_grad():
        out = model(idx, src, need_weights=True)
        fused = model(idx, src)
    assert fused.attention == {}  # the fused path returns no patterns
    want_kinds = {DEC_SELF} | ({ENC_SELF, CROSS} if arch == "encoder-decoder" else set())
    assert set(out.attention) == want_kinds
    L, Hh = cfg.n_layers, cfg.n_heads
    dec = out.attention[DEC_SELF]
    assert dec.shape == (L, 2, Hh, 8, 8)
    above = torch.ones(8, 8, dtype=torch.bool).triu(1)
    assert (dec[..., above] == 0).all()  # exactly zero above the diagonal
    assert (dec[..., ~above] > 0).all()
    for kind, shape in {ENC_SELF: (L, 2, Hh, 6, 6), CROSS: (L, 2, Hh, 8, 6), DEC_SELF: dec.shape}.items():
        if kind in out.attention:
            pat = out.attention[kind]
            assert pat.shape == shape
            assert torch.allclose(pat.sum(-1), torch.ones(shape[:-1]), atol=1e-5)
            assert (pat >= 0).all()


@pytest.mark.parametrize("pos, norm, arch", AXES)
def test_fused_equals_explicit(pos, norm, arch):
    model = make_model(tiny(pos, norm, arch))
    idx, src = inputs(arch, b=3, t=9, s=7)
    with torch.no_grad():
        fused = model(idx, src).logits
        explicit = model(idx, src, need_weights=True).logits
    assert fused.shape == (3, 9, VOCAB)
    assert close(fused, explicit), (fused - explicit).abs().max()


@pytest.mark.parametrize("arch", TRANSFORMERS)
def test_loss_ignores_unscored_positions(arch):
    model = make_model(tiny("learned", "pre", arch))
    idx, src = inputs(arch, b=2, t=6)
    tgt = torch.full_like(idx, IGNORE_INDEX)
    tgt[:, 3:] = idx[:, 3:]
    with torch.no_grad():
        out = model(idx, src, tgt)
        want = nn.functional.cross_entropy(out.logits[:, 3:].reshape(-1, VOCAB), idx[:, 3:].reshape(-1))
    assert out.loss.item() == pytest.approx(want.item(), rel=1e-6)


def test_encoder_decoder_needs_src():
    model = make_model(tiny(arch="encoder-decoder"))
    with pytest.raises(ValueError, match="src"):
        model(torch.zeros(1, 3, dtype=torch.long))


# ---- positional hooks inside the model --------------------------------------------------------


def twins(pos: str, arch: str, norm: str = "pre") -> tuple[Transformer, Transformer]:
    """A model with encoding `pos` and a NoPE model with exactly the same weights."""
    model = make_model(tiny(pos, norm, arch))
    nope = Transformer(tiny("none", norm, arch), VOCAB).eval()
    nope.load_state_dict(model.state_dict())
    return model, nope


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("pos", ["rope", "alibi"])
@pytest.mark.parametrize("arch", TRANSFORMERS)
def test_relative_encodings_are_identity_for_a_single_token(arch, pos, need_weights):
    model, nope = twins(pos, arch)
    idx, src = inputs(arch, t=1, s=1)
    with torch.no_grad():
        assert torch.allclose(model(idx, src, need_weights=need_weights).logits,
                              nope(idx, src, need_weights=need_weights).logits, atol=1e-6)
        idx, src = inputs(arch, t=6, s=5)  # control: with several tokens the encoding matters
        assert not torch.allclose(model(idx, src).logits, nope(idx, src).logits, atol=1e-4)


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("arch", TRANSFORMERS)
def test_rope_does_not_rotate_values(arch, norm, need_weights):
    """With one repeated token every value vector is the same, so attention returns it whatever the
    pattern: RoPE must then agree with NoPE at every position. Rotated values would not."""
    model, nope = twins("rope", arch, norm)
    idx = torch.full((2, 9), 4)
    src = torch.full((2, 7), 6) if arch == "encoder-decoder" else None
    with torch.no_grad():
        got = model(idx, src, need_weights=need_weights).logits
        want = nope(idx, src, need_weights=need_weights).logits
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


@pytest.mark.parametrize("arch", TRANSFORMERS)
def test_alibi_hides_no_absolute_encoding(arch):
    model, nope = twins("alibi", arch)
    assert [(n, p.shape) for n, p in model.named_parameters()] == [(n, p.shape) for n, p in nope.named_parameters()]
    assert model.state_dict().keys() == nope.state_dict().keys()
    extra = {n: b.shape for n, b in model.named_buffers()}.items() - {n: b.shape for n, b in nope.named_buffers()}.items()
    assert dict(extra) == {"pos.slopes": (model.cfg.n_heads,)}  # one slope per head, nothing per position
    # behaviour: with every slope at zero, ALiBi is exactly NoPE at any length
    idx, src = inputs(arch, t=10, s=8)
    with torch.no_grad():
        assert not torch.allclose(model(idx, src).logits, nope(idx, src).logits, atol=1e-4)
        model.pos.slopes.zero_()
        model.pos._cache.clear()
        for nw in (False, True):
            assert torch.allclose(model(idx, src, need_weights=nw).logits, nope(idx, src).logits, atol=1e-5)


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("pos", POS_ENCODINGS)
def test_cross_attention_has_no_positional_hooks(pos, need_weights):
    """Queries and keys of cross-attention come from different sequences: no rotation, no bias, so
    a decoder block cannot tell the order of the encoder memory it reads."""
    cfg = tiny(pos, "pre", "encoder-decoder")
    block = scramble(Block(cfg, causal=True, cross=True), seed=4)
    pe = Transformer(cfg, VOCAB).pos
    x, memory = torch.randn(2, 6, cfg.d_model), torch.randn(2, 9, cfg.d_model)
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out, pats = block(x, memory, pe, need_weights)
        permuted, pats_p = block(x, memory[:, perm], pe, need_weights)
    assert close(out, permuted)
    if need_weights:
        assert torch.allclose(pats["cross"][..., perm], pats_p["cross"], atol=1e-6)


@pytest.mark.parametrize("pos", ["sinusoidal", "rope", "alibi", "none"])
def test_non_learned_encodings_run_beyond_n_ctx(pos):
    model = make_model(tiny(pos, "pre", "decoder", n_ctx=8))
    idx, _ = inputs("decoder", t=12)
    with torch.no_grad():
        fused = model(idx).logits
        explicit = model(idx, need_weights=True).logits
    assert fused.shape == (2, 12, VOCAB)
    assert torch.allclose(fused, explicit, atol=1e-5)


# ---- initial loss ----------------------------------------------------------------------------


INITIAL_LOSS_CASES = [
    (task, arch)
    for task in ("reverse", "addition", "modular_addition", "histogram", "induction")
    for arch in TRANSFORMERS
    if not (task == "induction" and arch == "encoder-decoder")  # induction is decoder-only
]


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("task, arch", INITIAL_LOSS_CASES)
def test_initial_loss_is_near_ln_vocab(task, arch, norm):
    tc = TaskConfig(name=task, min_len=4, max_len=6, modulus=23)
    cfg = RunConfig(model=ModelConfig(arch=arch, norm=norm, n_layers=2, n_heads=2, d_model=32, d_ff=64, n_ctx=64),
                    task=tc, train=TrainConfig(seed=3))
    model = build_model(cfg)
    t = get_task(task)
    b = t.batch(tc, arch, 256, torch.Generator().manual_seed(0))
    with torch.no_grad():
        loss = model(b.inp, b.src, b.tgt).loss.item()
    assert abs(loss - math.log(t.vocab_size(tc))) < 0.3, (loss, math.log(t.vocab_size(tc)))


# ---- parameter counts --------------------------------------------------------------------------


def expected_params(cfg: ModelConfig, vocab: int) -> int:
    """Closed form. Counting rule: every parameter tensor once (nothing is tied here)."""
    d, ff = cfg.d_model, cfg.d_ff
    ln = 2 * d if cfg.norm != "none" else 0
    attn = 4 * d * d + 4 * d  # in_proj (3d x d + 3d) and out_proj (d x d + d)
    mlp = 2 * d * ff + ff + d if ff else 0
    n_sub = 1 + (1 if ff else 0)
    enc_block = attn + mlp + n_sub * ln
    dec_block = enc_block + (attn + ln if cfg.arch == "encoder-decoder" else 0)
    final = 2 * d if cfg.norm == "pre" else 0  # pre-LN ends each stack with a LayerNorm
    stacks = cfg.n_layers * dec_block + final
    if cfg.arch == "encoder-decoder":
        stacks += cfg.n_layers * enc_block + final
    positional = cfg.n_ctx * d if cfg.pos == "learned" else 0
    return vocab * d + positional + stacks + vocab * d  # embedding, positions, blocks, head (no bias)


@pytest.mark.parametrize("d_ff", [0, 24])
@pytest.mark.parametrize("pos, norm, arch", AXES)
def test_parameter_count_matches_closed_form(pos, norm, arch, d_ff):
    cfg = tiny(pos, norm, arch, d_ff=d_ff, n_layers=3, n_ctx=20)
    model = Transformer(cfg, VOCAB)
    assert model.num_params() == expected_params(cfg, VOCAB)


def test_bert_base_layer_anchor():
    """BERT-base (d 768, 12 heads, d_ff 3072, post-LN, GELU): 12 d^2 + 13 d = 7,087,872 per layer."""
    cfg = ModelConfig(d_model=768, n_heads=12, d_ff=3072, norm="post", activation="gelu", n_ctx=512)
    with torch.device("meta"):
        block = Block(cfg, causal=False, cross=False)
    assert sum(p.numel() for p in block.parameters()) == 12 * 768**2 + 13 * 768 == 7_087_872
