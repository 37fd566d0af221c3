"""Parameter counts: a closed form from the config alone, and the same breakdown read off a module.

Counting rule: every trainable tensor once (this model ties no weights); buffers (the sinusoidal
table, RoPE's cos/sin cache, ALiBi's slopes) are not parameters. The closed form needs no torch, so
the server's limits and the time estimates can use it before anything is built; a test checks it
against the module's own count for every config on the ablation axes. Published anchor: BERT-base
(Devlin et al. 2019) has 12 d^2 + 13 d parameters per layer (docs/SCIENCE.md).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from lab.config import GATED, RECURRENT, ModelConfig, RunConfig
from lab.recurrent import recurrent_params
from lab.tasks.batches import get_task

if TYPE_CHECKING:
    import torch

COMPONENTS = ("embeddings", "positional", "attention", "mlp", "norms", "head", "recurrent")


def norm_params(dim: int, norm_type: str = "layernorm") -> int:
    """One norm over `dim` features: LayerNorm's gain and bias (2 dim), RMSNorm's gain (dim)."""
    return 2 * dim if norm_type == "layernorm" else dim


def block_params(d: int, d_ff: int, norm: str, cross: bool = False, *, inner: int = 0, gated: bool = False,
                 norm_type: str = "layernorm", qk_norm: bool = False, d_head: int = 0) -> dict[str, int]:
    """Closed form for one block: attention 4d^2 + 4d per attention (Wq, Wk, Wv, Wo and biases),
    MLP 2 d d_ff + d_ff + d, and 2d per LayerNorm, one per sublayer. With d_ff = 4d and post-LN this
    is BERT's 12 d^2 + 13 d per layer (Devlin et al. 2019).

    The recipe's options: heads of width d_head make `inner` = n_heads * d_head (Wq, Wk, Wv: d x inner
    with biases, Wo: inner x d with a bias: 4 d inner + 3 inner + d); a gated feed-forward layer of
    `d_ff` hidden units has two input matrices (3 d d_ff + 2 d_ff + d); RMSNorm has a gain only (d);
    QK-norm adds two norms of d_head per attention."""
    n = inner or d
    n_attn = 1 + int(cross)
    n_sub = n_attn + int(d_ff > 0)
    qk = 2 * norm_params(d_head, norm_type) if qk_norm else 0
    mlp = (3 * d * d_ff + 2 * d_ff + d) if gated else (2 * d * d_ff + d_ff + d)
    return {
        "attention": n_attn * (4 * d * n + 3 * n + d + qk),
        "mlp": mlp if d_ff > 0 else 0,
        "norms": n_sub * norm_params(d, norm_type) if norm != "none" else 0,
    }


def param_formula(mc: ModelConfig, vocab: int) -> dict[str, int]:
    """Parameter count per component from the config alone (no module is built)."""
    d, L = mc.d_model, mc.n_layers
    if mc.arch in RECURRENT:  # embedding, L recurrent layers, head (lab/recurrent.py)
        return {**dict.fromkeys(COMPONENTS, 0), **recurrent_params(mc.arch, d, L, vocab)}
    enc_dec = mc.arch == "encoder-decoder"
    out = dict.fromkeys(COMPONENTS, 0)
    out["embeddings"] = vocab * d
    # a learned table: a row per position, or per id of the randomized range when that is longer
    out["positional"] = max(mc.n_ctx, mc.pos_range) * d if mc.pos == "learned" else 0
    out["head"] = d * vocab
    options = {"inner": mc.n_heads * mc.d_head, "gated": mc.activation in GATED, "norm_type": mc.norm_type,
               "qk_norm": mc.qk_norm == "on", "d_head": mc.d_head}
    stacks = [(L, True)] + ([(L, False)] if enc_dec else [])  # (blocks, is decoder)
    for n_blocks, is_dec in stacks:
        for key, n in block_params(d, mc.d_ff_hidden, mc.norm, cross=is_dec and enc_dec, **options).items():
            out[key] += n_blocks * n
        if mc.norm == "pre":
            out["norms"] += norm_params(d, mc.norm_type)  # the stack's final norm
    return out


def module_params(model: torch.nn.Module) -> dict[str, int]:
    """The same breakdown counted from a module's own parameters (by name)."""
    out = dict.fromkeys(COMPONENTS, 0)
    for name, p in model.named_parameters():
        if name.startswith("tok_emb."):
            key = "embeddings"
        elif name.startswith("pos."):
            key = "positional"
        elif name.startswith("layers."):  # a recurrent model's layers
            key = "recurrent"
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
