"""Parameter counts: a closed form from the config alone, and the same breakdown read off a module.

Counting rule: every trainable tensor once (this model ties no weights); buffers (the sinusoidal
table, RoPE's cos/sin cache, ALiBi's slopes) are not parameters. The closed form needs no torch, so
the server's limits and the time estimates can use it before anything is built; a test checks it
against the module's own count for every config on the ablation axes. Published anchor: BERT-base
(Devlin et al. 2019) has 12 d^2 + 13 d parameters per layer (docs/SCIENCE.md).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from lab.config import ModelConfig, RunConfig
from lab.tasks import get_task

if TYPE_CHECKING:
    import torch

COMPONENTS = ("embeddings", "positional", "attention", "mlp", "norms", "head")


def block_params(d: int, d_ff: int, norm: str, cross: bool = False) -> dict[str, int]:
    """Closed form for one block: attention 4d^2 + 4d per attention (Wq, Wk, Wv, Wo and biases),
    MLP 2 d d_ff + d_ff + d, and 2d per LayerNorm, one per sublayer. With d_ff = 4d and post-LN this
    is BERT's 12 d^2 + 13 d per layer (Devlin et al. 2019)."""
    n_attn = 1 + int(cross)
    n_sub = n_attn + int(d_ff > 0)
    return {
        "attention": n_attn * (4 * d * d + 4 * d),
        "mlp": (2 * d * d_ff + d_ff + d) if d_ff > 0 else 0,
        "norms": n_sub * 2 * d if norm != "none" else 0,
    }


def param_formula(mc: ModelConfig, vocab: int) -> dict[str, int]:
    """Parameter count per component from the config alone (no module is built)."""
    d, L = mc.d_model, mc.n_layers
    enc_dec = mc.arch == "encoder-decoder"
    out = dict.fromkeys(COMPONENTS, 0)
    out["embeddings"] = vocab * d
    out["positional"] = mc.n_ctx * d if mc.pos == "learned" else 0
    out["head"] = d * vocab
    stacks = [(L, True)] + ([(L, False)] if enc_dec else [])  # (blocks, is decoder)
    for n_blocks, is_dec in stacks:
        for key, n in block_params(d, mc.d_ff, mc.norm, cross=is_dec and enc_dec).items():
            out[key] += n_blocks * n
        if mc.norm == "pre":
            out["norms"] += 2 * d  # the stack's final LayerNorm
    return out


def module_params(model: torch.nn.Module) -> dict[str, int]:
    """The same breakdown counted from a module's own parameters (by name)."""
    out = dict.fromkeys(COMPONENTS, 0)
    for name, p in model.named_parameters():
        if name.startswith("tok_emb."):
            key = "embeddings"
        elif name.startswith("pos."):
            key = "positional"
        elif name.startswith("head."):
            key = "head"
        elif ".self_attn." in name or ".cross_attn." in name:
            key = "attention"
        elif ".ff." in name:
            key = "mlp"
        elif ".norms." in name or name.startswith(("enc_norm.", "dec_norm.")):
            key = "norms"
        else:
            raise KeyError(f"parameter {name!r} belongs to no component")
        out[key] += p.numel()
    return out


def param_breakdown(cfg: RunConfig) -> dict[str, int]:
    return param_formula(cfg.model, get_task(cfg.task.name).vocab_size(cfg.task))


# ---- models and inputs -----------------------------------------------------------------
