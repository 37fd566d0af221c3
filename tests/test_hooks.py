"""The one hook layer (lab/hooks.py, lab/model.py): TransformerLens's hook point names and shapes on a batch, each
activation recomputed by hand from the one before it and the W_* weights (views of the real parameters),
replacements (patterns included) acting on what follows, the fused attention kernel kept while nothing reads
the scores, and the cache API on token batches with a names filter."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lab.api.cache import run_with_cache, run_with_hooks
from lab.api.configs import make_config
from lab.trainer import build_model

B, T = 4, 9


def model_of(**kw):
    torch.manual_seed(0)
    model = build_model(make_config(d_model=32, n_heads=4, n_layers=2, d_ff=64, **kw)).eval()
    with torch.no_grad():  # away from the init (zero biases, unit gains): every term of the checks counts
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def tokens(model) -> torch.Tensor:
    return torch.randint(0, model.vocab_size, (B, T), generator=torch.Generator().manual_seed(1))


def ln(x: torch.Tensor, norm) -> torch.Tensor:
    x = x - x.mean(-1, keepdim=True)
    return x / (x.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt() * norm.weight + norm.bias


@pytest.mark.parametrize("pos", ["learned", "rope"])
def test_every_activation_follows_from_the_one_before_by_hand(pos):
    model = model_of(pos=pos)
    logits, c = run_with_cache(model, tokens(model))
    d, H, dh = 32, 4, 8
    expected_shapes = {"hook_embed": (B, T, d), "blocks.0.hook_resid_pre": (B, T, d), "blocks.0.attn.hook_q": (B, T, H, dh),
                       "blocks.0.attn.hook_attn_scores": (B, H, T, T), "blocks.0.attn.hook_pattern": (B, H, T, T),
                       "blocks.0.attn.hook_z": (B, T, H, dh), "blocks.0.attn.hook_result": (B, T, H, d),
                       "blocks.0.ln1.hook_scale": (B, T, 1), "blocks.0.mlp.hook_pre": (B, T, 64),
                       "ln_final.hook_normalized": (B, T, d)}
    assert {n: tuple(c[n].shape) for n in expected_shapes} == expected_shapes
    assert ("hook_pos_embed" in c) == (pos == "learned") and ("blocks.0.attn.hook_rot_q" in c) == (pos == "rope")
    assert list(c)[:2] == ["hook_embed", "hook_pos_embed"] if pos == "learned" else list(c)[0] == "hook_embed"
    torch.testing.assert_close(c["embed"], model.W_E[tokens(model)])
    if pos == "learned":
        torch.testing.assert_close(c["blocks.0.hook_resid_pre"], c["hook_embed"] + model.W_pos[:T])
    for layer in range(2):
        blk = model.blocks[layer]
        resid = c["resid_pre", layer]
        normed = c["normalized", layer, "ln1"] * blk.ln1.weight + blk.ln1.bias
        torch.testing.assert_close(normed, ln(resid, blk.ln1))
        torch.testing.assert_close(c["scale", layer, "ln1"], (resid - resid.mean(-1, keepdim=True)).pow(2).mean(
            -1, keepdim=True).add(1e-5).sqrt())
        for n in "qkv":  # x @ W[h] + b[h], head by head
            w, b = getattr(blk.attn, f"W_{n.upper()}"), getattr(blk.attn, f"b_{n.upper()}")
            torch.testing.assert_close(c[n, layer], torch.einsum("btm,hmd->bthd", normed, w) + b)
        q, k = (c["rot_q", layer], c["rot_k", layer]) if pos == "rope" else (c["q", layer], c["k", layer])
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / dh ** 0.5
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        torch.testing.assert_close(c["attn_scores", layer], scores)  # scaled, -inf where masked
        torch.testing.assert_close(c["pattern", layer], scores.softmax(-1))
        torch.testing.assert_close(c["z", layer], torch.einsum("bhqk,bkhd->bqhd", c["pattern", layer], c["v", layer]))
        torch.testing.assert_close(c["result", layer], torch.einsum("bthd,hdm->bthm", c["z", layer], blk.attn.W_O))
        torch.testing.assert_close(c["attn_out", layer], c["result", layer].sum(2) + blk.attn.b_O, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(c["resid_mid", layer], resid + c["attn_out", layer])
        mid = c["normalized", layer, "ln2"] * blk.ln2.weight + blk.ln2.bias
        torch.testing.assert_close(c["pre", layer], mid @ blk.mlp.W_in + blk.mlp.b_in)
        torch.testing.assert_close(c["post", layer], F.gelu(c["pre", layer]))
        torch.testing.assert_close(c["mlp_out", layer], c["post", layer] @ blk.mlp.W_out + blk.mlp.b_out)
        torch.testing.assert_close(c["resid_post", layer], c["resid_mid", layer] + c["mlp_out", layer])
    final = c["ln_final.hook_normalized"] * model.dec_norm.weight + model.dec_norm.bias
    torch.testing.assert_close(logits, final @ model.W_U + model.b_U)


def test_the_weights_are_views_of_the_parameters_and_the_stacks_follow_them():
    model = model_of()
    attn = model.blocks[1].attn
    for w in (attn.W_Q, attn.W_K, attn.W_V, attn.W_O, attn.b_Q, model.blocks[0].mlp.W_in, model.W_E, model.W_U):
        assert w._base is not None or w.untyped_storage().data_ptr() in {
            p.untyped_storage().data_ptr() for p in model.parameters()}, "not a view of a parameter"
    with torch.no_grad():
        attn.W_Q[2, 5, 3] = 7.0  # written through the view: the fused projection holds it
    assert float(attn.in_proj.weight.detach()[2 * 8 + 3, 5]) == 7.0
    assert model.W_Q.shape == (2, 4, 32, 8) and model.W_O.shape == (2, 4, 8, 32) and model.W_in.shape == (2, 32, 64)
    assert torch.equal(model.W_Q[1], attn.W_Q) and float(model.W_Q.detach()[1, 2, 5, 3]) == 7.0


def test_replacing_the_pattern_changes_what_follows_and_nothing_before():
    model = model_of()
    toks = tokens(model)
    _, clean = run_with_cache(model, toks)
    uniform = torch.ones(T, T).tril() / torch.arange(1, T + 1)[:, None]  # each query averages the keys it may see

    def flat(pattern, hook):
        assert hook.name == "blocks.1.attn.hook_pattern" and hook.layer() == 1
        return uniform.expand_as(pattern)
    _, patched = run_with_cache(model, toks, fwd_hooks=[("blocks.1.attn.hook_pattern", flat)])
    assert torch.equal(patched["pattern", 1], uniform.expand_as(patched["pattern", 1]))  # the cache holds what was used
    torch.testing.assert_close(patched["z", 1], torch.einsum("qk,bkhd->bqhd", uniform, clean["v", 1]))
    for name in ("blocks.1.hook_resid_pre", "blocks.1.attn.hook_attn_scores", "blocks.0.hook_resid_post"):
        assert torch.equal(patched[name], clean[name])  # upstream of the replacement: untouched
    assert not torch.allclose(patched["resid_post", 1], clean["resid_post", 1])


def test_with_no_hook_on_attention_runs_the_fused_kernel_and_gives_the_same_logits(monkeypatch):
    model = model_of()
    toks = tokens(model)
    calls = []
    fused = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or fused(*a, **k))
    with torch.no_grad():
        plain = model(toks).logits
    assert len(calls) == 2  # one per layer
    hooked = run_with_hooks(model, toks, [("blocks.0.attn.hook_z", lambda z, hook: None)])  # z: still fused
    assert len(calls) == 4 and torch.equal(hooked, plain)
    read = run_with_hooks(model, toks, [("blocks.0.attn.hook_pattern", lambda p, hook: None)])
    assert len(calls) == 5  # layer 0 computed its pattern by hand, layer 1 fused
    torch.testing.assert_close(read, plain)
    with torch.no_grad():
        assert torch.equal(model(toks).logits, plain) and all(not p.active for p in model.hook_dict.values())


def test_the_cache_takes_token_batches_and_a_names_filter():
    model = model_of()
    toks = tokens(model)
    logits, cache = run_with_cache(model, toks, names_filter=lambda n: n.endswith("hook_pattern"))
    assert list(cache) == ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]
    assert logits.shape == (B, T, model.vocab_size)
    one = run_with_cache(model, toks[2], names_filter="blocks.1.hook_resid_post")[1]  # one sequence: batch of 1
    torch.testing.assert_close(one["resid_post", 1][0], run_with_cache(model, toks)[1]["resid_post", 1][2])
    with pytest.raises(ValueError, match="0..10"):
        run_with_cache(model, toks + 100)
    with pytest.raises(KeyError, match="not a hook point"):
        run_with_hooks(model, toks, [("blocks.0.attn.hook_nope", lambda x, hook: None)])
    # TransformerLens's habits on the model itself: run_with_cache, run_with_hooks, and hooks() for a block
    same_logits, same = model.run_with_cache(toks, names_filter="blocks.1.hook_resid_post")
    torch.testing.assert_close(same_logits, logits)
    torch.testing.assert_close(same["resid_post", 1], run_with_cache(model, toks)[1]["resid_post", 1])
    zero_z = [("blocks.1.attn.hook_z", lambda z, hook: z * 0)]
    with model.hooks(zero_z):
        with torch.no_grad():
            inside = model(toks).logits
    torch.testing.assert_close(inside, model.run_with_hooks(toks, zero_z))
    assert not torch.allclose(inside, logits) and all(not p.active for p in model.hook_dict.values())


def test_the_config_has_transformerlens_names_and_a_heads_circuits_give_its_scores_and_output():
    model = model_of()
    c = model.cfg
    assert (c.d_model, c.d_head, c.n_heads, c.n_layers, c.d_mlp, c.d_vocab, c.n_ctx) == (
        32, 8, 4, 2, 64, model.vocab_size, model.W_pos.shape[0])
    assert (c.act_fn, c.normalization_type, c.positional_embedding_type, c.attn_only) == ("gelu", "LN", "standard", False)
    attn = model.blocks[0].attn
    with torch.no_grad():  # without the biases, the circuits are the whole story of the scores and the output
        attn.in_proj.bias.zero_()
    _, cache = run_with_cache(model, tokens(model))
    x = cache["normalized", 0, "ln1"] * model.blocks[0].ln1.weight + model.blocks[0].ln1.bias  # (B, T, d)
    scores = torch.einsum("bqm,hmn,bkn->bhqk", x, attn.QK, x) / c.d_head ** 0.5
    keep = torch.ones(T, T, dtype=torch.bool).tril()
    torch.testing.assert_close(cache["attn_scores", 0][..., keep], scores[..., keep], atol=1e-5, rtol=1e-4)
    written = torch.einsum("bhqk,bkm,hmn->bqhn", cache["pattern", 0], x, attn.OV)  # (B, T, H, d)
    torch.testing.assert_close(cache["result", 0], written, atol=1e-5, rtol=1e-4)
    assert model.QK.shape == (2, 4, 32, 32) and torch.equal(model.OV[0], attn.OV)
