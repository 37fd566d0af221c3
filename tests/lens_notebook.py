"""What a course notebook does with a TransformerLens model, and how two models' numbers are compared: shared by
the export's checks against TransformerLens 3.9 (tests/test_transformer_lens_interop.py) and 4.3 (the script
tests/test_transformer_lens_4x.py runs in a virtual environment of its own). No pytest here: the script imports it.
"""
from __future__ import annotations

from typing import Any

import torch

import lab

ATOL = 1e-5
RTOL = 1e-5  # only where the values are large: a model without norms has logits in the hundreds
KINDS = ("hook_resid_pre", "attn.hook_z", "hook_attn_out", "hook_mlp_out", "hook_resid_post", "attn.hook_pattern")


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


def perturbed(seed: int = 0, **keywords: Any) -> Any:
    """An untrained model of `keywords` with every weight moved off its initial value (biases and gains included)."""
    model = lab.untrained(**{"task": "copy", "d_model": 32, "n_heads": 2, "n_layers": 2, "d_ff": 64, **keywords})
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g))
    return model
