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

import importlib.util
import types

import pytest
import torch

import lab
from lab.api.lens_export import to_transformer_lens
from tests.lens_notebook import ATOL, RTOL, agree, assert_kinds, perturbed, same_cache, tl_notebook, tokens_for


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tl() -> types.ModuleType:
    """The real package: a plain import (a missing install fails, never skips), made here rather than at the top
    so that its ~5 s load is paid when these tests run, not whenever the suite is collected."""
    import transformer_lens

    return transformer_lens


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


def test_without_transformerlens_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    model = lab.untrained(task="copy")
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "transformer_lens"
                        else find_spec(name, *a))
    with pytest.raises(ImportError, match="pip install transformer-lens"):
        to_transformer_lens(model)
    with pytest.raises(lab.ConfigError, match="model.norm is 'post'"):  # a model it could never take: said first
        to_transformer_lens(lab.untrained(task="copy", norm="post"))
    with pytest.raises(TypeError, match="a lab Transformer or a Run"):
        to_transformer_lens("not a model")
