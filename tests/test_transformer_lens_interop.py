"""The export to TransformerLens (lab/api/lens_export.py), checked against the real TransformerLens 3.9
(requirements-dev.txt) on the same weights.

A notebook written in TransformerLens's idiom runs on this lab's model and on the exported HookedTransformer, for
a pre-LN learned-position decoder and a rotary one trained a few steps by the lab's own trainer: logits, every
activation both caches name alike, the weights, the cache's methods and hooks on hook_pattern and hook_z agree to
1e-5. The caches are compared by the names they share (so the check grows as this lab names more), which must
hold at least the six kinds of `KINDS` in every layer. The other settings TransformerLens expresses exactly
(RMSNorm, no scaling, QK-norm, ALiBi, no norms, attention-only, a custom d_head, relu) are checked the same way on
models perturbed from their initial weights; what it cannot is refused, naming the setting.
"""
from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import sys
import types
from typing import Any

import pytest
import torch

import lab
from lab.api.lens_export import to_transformer_lens

ATOL = 1e-5
RTOL = 1e-5  # only where the values are large: a model without norms has logits in the hundreds
KINDS = ("hook_resid_pre", "attn.hook_z", "hook_attn_out", "hook_mlp_out", "hook_resid_post", "attn.hook_pattern")

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tl() -> types.ModuleType:
    """The real package: a plain import (a missing install fails, never skips), made here rather than at the top
    so that its ~5 s load is paid when these tests run, not whenever the suite is collected."""
    import transformer_lens

    return transformer_lens


def tokens_for(model: Any, batch: int = 4, pos: int = 10) -> torch.Tensor:
    return torch.randint(0, model.cfg.d_vocab, (batch, pos), generator=torch.Generator().manual_seed(3))


def same_cache(ours: Any, theirs: Any, scaled: bool = False) -> set[str]:
    """Assert every activation both caches name alike agrees to 1e-5 (`scaled`: 1e-5 of its largest value,
    see `agree`); the shared names."""
    shared = set(ours.keys()) & set(theirs.keys())
    for name in sorted(shared):
        a, b = ours[name], theirs[name]
        if ".q_norm." in name or ".k_norm." in name:  # TransformerLens norms QK rows (batch*pos*head, d_head)
            a = a.transpose(1, 2).reshape(b.shape)  # ours are (batch, head, pos, d_head)
        agree(a, b, name, scaled)
    return shared


def agree(a: torch.Tensor, b: torch.Tensor, name: str = "", scaled: bool = False) -> None:
    """a and b agree to 1e-5, or with `scaled` to 1e-5 of b's largest magnitude (at least 1): float32 sums
    round to a few units in 1e-7 of the activations they add, and a model with perturbed weights and no
    norms carries activations in the tens, so the same two computations differ by more than 1e-5 on some
    CPUs (their matrix kernels add in other orders)."""
    atol = ATOL * max(1.0, float(b.detach().abs().max())) if scaled and b.numel() else ATOL
    torch.testing.assert_close(a, b, atol=atol, rtol=RTOL, msg=name)


def assert_kinds(shared: set[str], model: Any) -> None:
    """The intersection holds at least the six kinds of KINDS in every layer (hook_mlp_out where there is an MLP)."""
    kinds = [k for k in KINDS if k != "hook_mlp_out" or not model.cfg.attn_only]
    missing = [f"blocks.{L}.{k}" for L in range(model.cfg.n_layers) for k in kinds if f"blocks.{L}.{k}" not in shared]
    assert not missing, missing


def tl_notebook(model: Any, tokens: torch.Tensor) -> tuple[dict[str, Any], Any]:
    """What a course notebook does with a HookedTransformer, every line working on both models: (its numbers
    by name, its cache)."""
    out: dict[str, Any] = {}
    c = model.cfg
    out["cfg"] = torch.tensor([c.d_model, c.d_head, c.n_heads, c.n_layers, c.d_mlp, c.d_vocab, c.n_ctx])
    logits, cache = model.run_with_cache(tokens)
    out["logits"] = logits
    out["pattern_short"] = cache["pattern", 1]
    out["scale_short"] = cache["scale", 0, "ln1"]
    for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_O", "W_in", "W_out", "W_E", "W_U"):
        out[name] = getattr(model, name)
    out["block_W_Q"] = model.blocks[1].attn.W_Q
    out["QK"] = model.blocks[0].attn.W_Q[1] @ model.blocks[0].attn.W_K[1].T  # a head's QK circuit by hand
    parts, labels = cache.decompose_resid(return_labels=True)
    out["decompose"], out["decompose_labels"] = parts, labels
    acc, acc_labels = cache.accumulated_resid(incl_mid=True, return_labels=True)
    out["accumulated"], out["accumulated_labels"] = acc, acc_labels
    out["lens"] = cache.accumulated_resid(apply_ln=True, pos_slice=-1) @ model.W_U
    heads, head_labels = cache.stack_head_results(pos_slice=-1, return_labels=True)
    out["heads"], out["head_labels"] = heads, head_labels
    out["logit_attrs"] = cache.logit_attrs(heads, tokens[:, 0], incorrect_tokens=tokens[:, 1], pos_slice=-1)
    out["apply_ln_mid"] = cache.apply_ln_to_stack(parts[:3], layer=1, mlp_input=True)
    corrupt = tokens.flip(0)  # another batch; layer 1's attention taken from the clean run

    def clean_pattern(pattern, hook):
        return cache[hook.name]
    out["patched"] = model.run_with_hooks(corrupt, fwd_hooks=[("blocks.1.attn.hook_pattern", clean_pattern)])

    def knock_out_head_0(z, hook):
        z[:, :, 0] = 0.0
        return z
    out["knocked"] = model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_z", knock_out_head_0)])
    return out, cache


@pytest.fixture(scope="module", params=["learned", "rope"])
def trained(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> lab.Run:
    """40 steps at a learning rate of 1e-2 without warmup: weights well off their initial values (up to ~0.2),
    logits up to ~4, the copy task's loss already falling."""
    return lab.train(task="copy", d_model=32, n_heads=2, n_layers=2, d_mlp=64, pos=request.param, steps=40, warmup=0,
                     lr=1e-2, batch_size=16, eval_every=40, eval_samples=16, threads=1,
                     runs_dir=tmp_path_factory.mktemp("tl"), progress=False)


def test_a_transformerlens_notebook_gives_the_same_numbers_on_both(trained: lab.Run, tl: types.ModuleType) -> None:
    ours = trained.model
    theirs = to_transformer_lens(trained)  # the Run; its model works too
    assert isinstance(theirs, tl.HookedTransformer)
    tokens = tokens_for(ours)
    (a, cache_a), (b, cache_b) = tl_notebook(ours, tokens), tl_notebook(theirs, tokens)
    assert set(a) == set(b)
    for key in a:
        if key.endswith("_labels"):
            assert a[key] == b[key], key
        else:
            torch.testing.assert_close(a[key].float(), b[key].float(), atol=ATOL, rtol=RTOL, msg=key)
    assert_kinds(same_cache(cache_a, cache_b), ours)
    assert set(cache_a.keys()) == set(cache_b.keys())  # every activation either side caches, the other does too


def perturbed(seed: int = 0, **keywords: Any) -> Any:
    """An untrained model of `keywords` with every weight moved off its initial value (biases and gains included)."""
    model = lab.untrained(**{"task": "copy", "d_model": 32, "n_heads": 2, "n_layers": 2, "d_ff": 64, **keywords})
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g))
    return model


@pytest.mark.parametrize("keywords", [
    {"norm_type": "rmsnorm"}, {"scale": "none"}, {"qk_norm": "on", "norm_type": "rmsnorm", "pos": "rope"},
    {"pos": "alibi", "n_heads": 4}, {"norm": "none", "activation": "relu"}, {"d_ff": 0, "activation": "swiglu"},
    {"head_dim": 12, "pos": "rope", "norm_type": "rmsnorm", "scale": "none"}, {"pos_range": 64},  # randomized
], ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_each_setting_transformerlens_expresses_gives_the_same_numbers(keywords: dict, tl: types.ModuleType) -> None:
    ours = perturbed(**keywords)
    theirs = to_transformer_lens(ours)
    tokens = tokens_for(ours)
    logits_a, cache_a = ours.run_with_cache(tokens)
    logits_b, cache_b = theirs.run_with_cache(tokens)
    agree(logits_a, logits_b, "logits", scaled=True)
    assert_kinds(same_cache(cache_a, cache_b, scaled=True), ours)


@pytest.mark.parametrize("keywords, field", [
    ({"norm": "post"}, "model.norm"), ({"pos": "sinusoidal"}, "model.pos"), ({"pos": "none"}, "model.pos"),
    ({"pos": "alibi", "n_heads": 3, "d_model": 48}, "model.pos"),  # TransformerLens's slopes differ from 3 heads on
    ({"arch": "encoder-decoder", "task": "reverse"}, "model.arch"), ({"arch": "lstm"}, "model.arch"),
    ({"arch": "gru"}, "model.arch"), ({"qk_norm": "on"}, "model.qk_norm"),  # QK-norm with LayerNorm
    ({"activation": "swiglu"}, "model.activation"), ({"activation": "geglu"}, "model.activation"),
    ({"residual": "off"}, "model.residual"),
])
def test_what_transformerlens_cannot_compute_is_refused_naming_the_setting(keywords: dict, field: str) -> None:
    with pytest.raises(lab.ConfigError) as err:
        to_transformer_lens(lab.untrained(**{"task": "copy", **keywords}))
    assert err.value.field == field and "TransformerLens cannot compute" in str(err.value), str(err.value)
    assert f"{field} is " in str(err.value)  # the setting, then why


def test_without_transformerlens_or_with_4x_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    model = lab.untrained(task="copy")
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "transformer_lens"
                        else find_spec(name, *a))
    with pytest.raises(ImportError, match="pip install transformer-lens"):
        to_transformer_lens(model)
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    # TransformerLens 4.x (checked against 4.3.0): its module raises ImportError for the removed HookedTransformer
    four = types.ModuleType("transformer_lens")
    four.__spec__ = importlib.machinery.ModuleSpec("transformer_lens", None)

    def removed(name: str) -> Any:
        raise ImportError(f"{name!r} was removed in TransformerLens 4.0.", name=name)
    four.__getattr__ = removed  # type: ignore[method-assign]
    monkeypatch.setitem(sys.modules, "transformer_lens", four)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "4.3.0")
    with pytest.raises(ImportError, match=r"needs TransformerLens 2\.x or 3\.x.*4\.3\.0.*pip install transformer-lens"):
        to_transformer_lens(model)
    with pytest.raises(TypeError, match="a lab Transformer or a Run"):
        to_transformer_lens("not a model")
