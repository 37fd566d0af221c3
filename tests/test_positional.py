"""Positional encodings against their papers' formulas and reference values (docs/SCIENCE.md)."""
from __future__ import annotations

import math

import pytest
import torch

from lab.config import POS_ENCODINGS, ModelConfig
from lab.positional import (
    ALiBi,
    Learned,
    PositionalEncoding,
    Rotary,
    Sinusoidal,
    alibi_slopes,
    build_positional,
    sinusoidal_table,
)

CPU = torch.device("cpu")


# ---- sinusoidal (Vaswani et al. 2017, sec. 3.5) ----------------------------------------------


def sinusoidal(d_model: int = 16, n_ctx: int = 64) -> Sinusoidal:
    return Sinusoidal(ModelConfig(pos="sinusoidal", d_model=d_model, n_heads=2, n_ctx=n_ctx))


def test_sinusoidal_reference_values():
    pe = sinusoidal(16).table(8)
    assert pe.shape == (8, 16)
    assert torch.equal(pe[0], torch.tensor([0.0, 1.0] * 8))
    assert pe[1, 0].item() == pytest.approx(0.841471, abs=1e-6)  # sin 1
    assert pe[1, 1].item() == pytest.approx(0.540302, abs=1e-6)  # cos 1


@pytest.mark.parametrize("d", [16, 64])
def test_sinusoidal_matches_formula_elementwise(d):
    pe = sinusoidal(d, n_ctx=50).table(50)
    for pos in (0, 1, 7, 49):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_sinusoidal_values_bounded():
    pe = sinusoidal(64, n_ctx=512).table(512)
    assert pe.min() >= -1.0 and pe.max() <= 1.0


@pytest.mark.parametrize("k", [1, 2, 5, 17])
def test_sinusoidal_dot_product_depends_on_offset_only(k):
    pe = sinusoidal(32, n_ctx=128).table(128).double()
    dots = torch.stack([pe[p] @ pe[p + k] for p in range(0, 100)])
    assert (dots - dots[0]).abs().max() < 1e-4
    assert dots[0] < pe[0] @ pe[0]  # and it does depend on k: an offset lowers the similarity


def test_sinusoidal_table_beyond_n_ctx_continues_formula():
    enc = sinusoidal(16, n_ctx=32)
    long = enc.table(80)
    assert long.shape == (80, 16)
    assert torch.equal(long[:32], enc.table(32))
    assert torch.allclose(long, sinusoidal_table(80, 16), atol=1e-6)
    assert long[70, 0].item() == pytest.approx(math.sin(70), abs=1e-6)
    assert long[70, 3].item() == pytest.approx(math.cos(70 / 10000 ** (2 / 16)), abs=1e-6)
    x = torch.zeros(2, 40, 16)
    assert torch.allclose(enc.embed(x), long[:40].expand(2, 40, 16))  # embed adds the same values


# ---- learned (GPT-2) -----------------------------------------------------------------------


def test_learned_embed_adds_its_table_and_refuses_beyond_n_ctx():
    enc = Learned(ModelConfig(pos="learned", d_model=8, n_heads=2, n_ctx=10))
    x = torch.randn(3, 6, 8)
    assert torch.equal(enc.embed(x), x + enc.weight[:6])
    assert torch.equal(enc.table(20), enc.weight.detach())
    with pytest.raises(ValueError, match="n_ctx"):
        enc.embed(torch.zeros(1, 11, 8))


# ---- RoPE (Su et al. 2021) ---------------------------------------------------------------------


def rotary(d_head: int = 16, n_heads: int = 2, n_ctx: int = 64) -> Rotary:
    return Rotary(ModelConfig(pos="rope", d_model=d_head * n_heads, n_heads=n_heads, n_ctx=n_ctx))


def rope_scores(rope: Rotary, q0: torch.Tensor, k0: torch.Tensor, n: int) -> torch.Tensor:
    """(H, n, n) scores of the same query q0 and key k0 (H, dh) placed at every position."""
    q = q0[None, :, None, :].expand(1, -1, n, -1).contiguous()  # (1, H, n, dh)
    k = k0[None, :, None, :].expand(1, -1, n, -1).contiguous()
    qr, kr = rope.rotate(q, k)
    return (qr @ kr.transpose(-2, -1))[0]  # (H, n, n): score(m, n)


@pytest.mark.parametrize("n", [32, 100])  # within the cached tables and beyond n_ctx
def test_rope_score_depends_on_offset_only(n):
    torch.manual_seed(0)
    rope = rotary(d_head=16, n_heads=3, n_ctx=64)
    q0 = torch.nn.functional.normalize(torch.randn(3, 16), dim=-1)
    k0 = torch.nn.functional.normalize(torch.randn(3, 16), dim=-1)
    s = rope_scores(rope, q0, k0, n)
    for shift in (1, 3, 10):
        assert torch.allclose(s[:, shift:, shift:], s[:, :-shift, :-shift], atol=1e-5)  # (m+s, n+s) vs (m, n)
    # ...and it does depend on the offset (otherwise the check above is vacuous)
    assert (s[:, 5, 0] - s[:, 5, 5]).abs().max() > 1e-2


def test_rope_preserves_norms_and_position_zero_is_identity():
    torch.manual_seed(1)
    rope = rotary(d_head=8, n_heads=2, n_ctx=32)
    q, k = torch.randn(2, 2, 20, 8), torch.randn(2, 2, 20, 8)
    qr, kr = rope.rotate(q, k)
    assert qr.shape == q.shape and kr.shape == k.shape
    assert torch.allclose(qr.norm(dim=-1), q.norm(dim=-1), atol=1e-5)
    assert torch.allclose(kr.norm(dim=-1), k.norm(dim=-1), atol=1e-5)
    assert torch.equal(qr[:, :, 0], q[:, :, 0]) and torch.equal(kr[:, :, 0], k[:, :, 0])
    assert not torch.allclose(qr[:, :, 1:], q[:, :, 1:], atol=1e-3)


@pytest.mark.parametrize("n", [12, 50])
def test_rope_rotates_pairs_by_roformer_frequencies(n):
    """Split-halves layout: the pair (x_i, x_{i + dh/2}) turns by m * 10000^(-2i/dh) at position m."""
    dh = 8
    rope = rotary(d_head=dh, n_heads=1, n_ctx=16)
    for i in range(dh // 2):
        e = torch.zeros(1, 1, n, dh)
        e[..., i] = 1.0
        rot, _ = rope.rotate(e, e)
        theta = 10000 ** (-2 * i / dh)
        m = torch.arange(n, dtype=torch.float64)
        assert torch.allclose(rot[0, 0, :, i].double(), torch.cos(m * theta), atol=1e-5)
        assert torch.allclose(rot[0, 0, :, i + dh // 2].double(), torch.sin(m * theta), atol=1e-5)
        others = [j for j in range(dh) if j not in (i, i + dh // 2)]
        assert rot[0, 0, :, others].abs().max() == 0


def test_rope_relative_pattern_is_toeplitz():
    pat = rotary(d_head=8, n_heads=2).relative_pattern(10)
    assert pat.shape == (2, 10, 10)
    assert torch.allclose(pat[:, 1:, 1:], pat[:, :-1, :-1], atol=1e-6)
    assert torch.allclose(pat[:, 0, 0], torch.ones(2))


# ---- ALiBi (Press et al. 2021) ---------------------------------------------------------------------

SLOPES = {
    1: [2**-8],
    2: [2**-4, 2**-8],
    3: [2**-4, 2**-8, 2**-2],
    4: [2**-2, 2**-4, 2**-6, 2**-8],
    6: [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3],
    8: [2.0 ** -k for k in range(1, 9)],
    12: [2.0 ** -k for k in range(1, 9)] + [2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5],
}


@pytest.mark.parametrize("n", sorted(SLOPES))
def test_alibi_slopes_match_official_code(n):
    got = alibi_slopes(n)
    assert len(got) == n
    assert got == pytest.approx(SLOPES[n], rel=1e-12, abs=0)


def test_alibi_slopes_buffer_used_by_module():
    enc = ALiBi(ModelConfig(pos="alibi", d_model=24, n_heads=6))
    assert enc.slopes.tolist() == pytest.approx(SLOPES[6], rel=1e-6)


@pytest.mark.parametrize("n_heads", [1, 3, 4])
def test_alibi_causal_bias(n_heads):
    enc = ALiBi(ModelConfig(pos="alibi", d_model=4 * n_heads, n_heads=n_heads))
    t = 7
    bias = enc.attn_bias(t, t, True, CPU)
    assert bias.shape == (n_heads, t, t)
    for h, m in enumerate(SLOPES[n_heads]):
        for i in range(t):
            for j in range(t):
                if j <= i:
                    assert bias[h, i, j].item() == pytest.approx(-m * (i - j), rel=1e-6, abs=1e-12)
                else:
                    assert bias[h, i, j].item() == float("-inf")
    assert torch.equal(enc.attn_bias(t, t, True, CPU), bias)  # cached result is the same


def test_alibi_non_causal_bias_is_symmetric_distance():
    enc = ALiBi(ModelConfig(pos="alibi", d_model=8, n_heads=2))
    bias = enc.attn_bias(5, 5, False, CPU)
    dist = (torch.arange(5)[:, None] - torch.arange(5)[None, :]).abs().float()
    assert torch.allclose(bias, -torch.tensor(SLOPES[2])[:, None, None] * dist)
    assert torch.isfinite(bias).all()


def test_alibi_adds_nothing_to_the_residual_stream():
    enc = ALiBi(ModelConfig(pos="alibi", d_model=8, n_heads=2))
    x = torch.randn(2, 5, 8)
    q, k = torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 4)
    assert torch.equal(enc.embed(x), x)
    qr, kr = enc.rotate(q, k)
    assert torch.equal(qr, q) and torch.equal(kr, k)
    assert enc.table(5) is None
    assert list(enc.parameters()) == []


# ---- the base class and the registry ------------------------------------------------------------


@pytest.mark.parametrize("pos", POS_ENCODINGS)
def test_hooks_shapes_for_every_encoding(pos):
    cfg = ModelConfig(pos=pos, d_model=16, n_heads=2, n_ctx=32)
    enc = build_positional(cfg)
    assert isinstance(enc, PositionalEncoding) and enc.name == pos
    x = torch.randn(2, 9, 16)
    assert enc.embed(x).shape == x.shape
    q, k = torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8)
    qr, kr = enc.rotate(q, k)
    assert qr.shape == q.shape and kr.shape == k.shape
    bias = enc.attn_bias(9, 9, True, CPU)
    assert bias is None or bias.shape == (2, 9, 9)
    table = enc.table(9)
    assert table is None or table.shape == (9, 16)
    pattern = enc.relative_pattern(9)
    assert pattern is None or pattern.shape == (2, 9, 9)
    assert (table is None) or (pattern is None)  # an encoding is absolute or relative, not both


def test_none_is_a_no_op():
    enc = PositionalEncoding(ModelConfig(pos="none", d_model=8, n_heads=2))
    x, q, k = torch.randn(1, 4, 8), torch.randn(1, 2, 4, 4), torch.randn(1, 2, 4, 4)
    assert enc.embed(x) is x
    assert enc.rotate(q, k) == (q, k)
    assert enc.attn_bias(4, 4, True, CPU) is None
