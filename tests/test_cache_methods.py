"""The cache's methods that split the residual stream into parts (TransformerLens 3.9's names and
conventions): the parts add up to the stream they decompose, the final norm's cached scale turns them into
logit attributions that add up to the logit, and a post-LN model refuses them saying why."""
from __future__ import annotations

import pytest
import torch

from lab.api.cache import run_with_cache
from lab.api.configs import make_config
from lab.trainer import build_model

B, T = 3, 7


def cached(**kw):
    torch.manual_seed(0)
    model = build_model(make_config(d_model=32, n_heads=4, n_layers=2, d_ff=64, **kw)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    toks = torch.randint(0, model.vocab_size, (B, T), generator=torch.Generator().manual_seed(2))
    logits, cache = run_with_cache(model, toks)
    return model, toks, logits, cache


def test_the_parts_add_up_to_the_stream_they_decompose():
    model, _, _, cache = cached()
    final = cache["resid_post", 1]
    parts, labels = cache.decompose_resid(return_labels=True)
    assert labels == ["embed", "pos_embed", "0_attn_out", "0_mlp_out", "1_attn_out", "1_mlp_out"]
    torch.testing.assert_close(parts.sum(0), final)
    torch.testing.assert_close(cache.decompose_resid(layer=1, mlp_input=True).sum(0), cache["resid_mid", 1])
    acc, labels = cache.accumulated_resid(incl_mid=True, return_labels=True)
    assert labels == ["0_pre", "0_mid", "1_pre", "1_mid", "final_post"] and acc.shape == (5, B, T, 32)
    torch.testing.assert_close(acc[-1], final)
    heads, labels = cache.stack_head_results(incl_remainder=True, return_labels=True)
    assert labels == [f"L{i}H{h}" for i in range(2) for h in range(4)] + ["remainder"]
    torch.testing.assert_close(heads.sum(0), final)
    torch.testing.assert_close(heads[4:8].sum(0) + model.blocks[1].attn.b_O, cache["attn_out", 1])
    last = cache.stack_head_results(pos_slice=-1)  # one position: its axis goes
    assert last.shape == (8, B, 32)
    torch.testing.assert_close(last, heads[:8, :, -1])


def test_logit_attributions_add_up_to_the_logit_through_the_final_norms_scale():
    model, toks, logits, cache = cached()
    parts = cache.decompose_resid(pos_slice=-1)  # (components, B, d)
    answer, wrong = toks[:, 0], toks[:, 1]
    attrs = cache.logit_attrs(parts, answer, pos_slice=-1)  # (components, B): the scale at that position too
    final = cache["resid_post", 1][:, -1]
    centred = (final - final.mean(-1, keepdim=True)) / cache["ln_final.hook_scale"][:, -1]
    torch.testing.assert_close(attrs.sum(0), (centred * model.W_U.T[answer]).sum(-1))
    # the norm's gain and bias are what is left out: with them, the logit itself
    torch.testing.assert_close((centred * model.dec_norm.weight + model.dec_norm.bias) @ model.W_U,
                               logits[:, -1])
    diff = cache.logit_attrs(parts, answer, incorrect_tokens=wrong, pos_slice=-1)
    torch.testing.assert_close(diff, attrs - cache.logit_attrs(parts, wrong, pos_slice=-1))
    # the logit lens: each accumulated stream through the whole final norm
    lens = cache.accumulated_resid(apply_ln=True, pos_slice=-1)
    torch.testing.assert_close(lens[-1] @ model.W_U, logits[:, -1])


def test_a_post_ln_model_refuses_them_saying_why():
    _, _, _, cache = cached(norm="post")
    for call in (cache.decompose_resid, cache.accumulated_resid, cache.stack_head_results):
        with pytest.raises(ValueError, match="post-LN"):
            call()
    with pytest.raises(ValueError, match="not the sum of its parts"):
        cache.apply_ln_to_stack(torch.zeros(1, B, T, 32))
