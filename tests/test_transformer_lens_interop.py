"""A notebook written in TransformerLens's idiom runs on this lab's model and on the real TransformerLens 3.9's
HookedTransformer holding the same weights (lab/api/lens_export.py), for a pre-LN learned-position model and a
rotary one, trained a few steps: logits, every cached activation, the weights, the cache's methods and a patching
hook on hook_pattern agree to 1e-5. What TransformerLens cannot compute exactly is refused, naming the setting."""
from __future__ import annotations

import pytest
import torch

import lab
from lab.api.lens_export import to_transformer_lens

ATOL = 1e-5


def tl_notebook(model, tokens: torch.Tensor) -> dict:
    """What a course notebook does with a HookedTransformer: every line works on both models."""
    out = {}
    c = model.cfg
    out["cfg"] = torch.tensor([c.d_model, c.d_head, c.n_heads, c.n_layers, c.d_mlp, c.d_vocab, c.n_ctx])
    logits, cache = model.run_with_cache(tokens)
    out["logits"] = logits
    out.update({f"cache:{name}": cache[name] for name in cache.keys()})
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
    return out


@pytest.fixture(scope="module", params=["learned", "rope"])
def trained(request, tmp_path_factory):
    run = lab.train(task="copy", d_model=32, n_heads=4, n_layers=2, d_mlp=64, pos=request.param, steps=30,
                    batch_size=16, eval_every=30, eval_samples=16, threads=1, runs_dir=tmp_path_factory.mktemp("tl"),
                    progress=False)
    return run


def test_a_transformerlens_notebook_gives_the_same_numbers_on_both(trained):
    import transformer_lens  # the real package (requirements-dev.txt), imported here: it takes seconds to load

    ours = trained.model
    theirs = to_transformer_lens(trained)
    assert isinstance(theirs, transformer_lens.HookedTransformer)
    tokens = torch.randint(0, ours.cfg.d_vocab, (6, 12), generator=torch.Generator().manual_seed(3))
    a, b = tl_notebook(ours, tokens), tl_notebook(theirs, tokens)
    assert set(a) == set(b), sorted(set(a) ^ set(b))  # the same activations cached, by the same names
    assert sum(k.startswith("cache:") for k in a) >= 18 * 2  # every hook point of both layers and more
    for key in a:
        if key.endswith("_labels"):
            assert a[key] == b[key], key
        else:
            torch.testing.assert_close(a[key].float(), b[key].float(), atol=ATOL, rtol=1e-4, msg=key)


def test_what_transformerlens_cannot_compute_is_refused_naming_the_setting():
    for keywords, field in (({"norm": "post"}, "model.norm"), ({"pos": "sinusoidal"}, "model.pos"),
                            ({"pos": "alibi"}, "model.pos"), ({"arch": "encoder-decoder", "task": "reverse"}, "model.arch"),
                            ({"arch": "lstm"}, "model.arch"), ({"qk_norm": "on"}, "model.qk_norm"),
                            ({"activation": "swiglu"}, "model.activation"), ({"residual": "off"}, "model.residual")):
        with pytest.raises(lab.ConfigError) as err:
            to_transformer_lens(lab.untrained(**{"task": "copy", **keywords}))
        assert err.value.field == field and "TransformerLens cannot compute" in str(err.value), keywords
