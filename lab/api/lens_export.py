"""A trained model as TransformerLens's `HookedTransformer` (Nanda & Bloom 2022, TransformerLens 2.x and 3.x),
with the same weights and the same logits, for a notebook that goes on with TransformerLens's own tools.

The weights map one to one, by the names this lab's model already gives them (lab/model.py, views of its
parameters): per block `attn.W_Q`, `W_K`, `W_V` (n_heads, d_model, d_head), `b_Q`, `b_K`, `b_V`, `W_O`
(n_heads, d_head, d_model), `b_O`, `mlp.W_in`, `b_in`, `W_out`, `b_out`, the norms' gains and biases as `ln1`,
`ln2`, `ln_final` (`w`, `b`), the embedding `W_E` (every token id of the task's vocabulary), the learned
positions `W_pos`, and the unembedding `W_U` with a zero `b_U` (this lab's head has no bias). Nothing is folded
or centred. A model TransformerLens cannot compute exactly is refused, naming the setting and why: post-LN
(TransformerLens's blocks normalise before each sublayer), sinusoidal, ALiBi or no positional encoding
(TransformerLens 3.9's standard, rotary, shortformer and alibi types are not these encodings), QK-norm,
gated feed-forward layers (TransformerLens adds the value bias after the gating), residual connections off,
encoder-decoder and recurrent models. TransformerLens 4.x has no HookedTransformer; its
`TransformerBridge.boot_native` is not supported here (the export says so).
"""
from __future__ import annotations

import warnings
from typing import Any

import torch

from lab.config import ConfigError
from lab.model import Transformer


def _refusals(model: Any) -> list[tuple[str, str]]:
    """(setting, why) for each setting TransformerLens's HookedTransformer cannot compute exactly."""
    if not isinstance(model, Transformer):
        return [("model.arch", f"{model.cfg.arch} is a recurrent baseline: TransformerLens builds Transformers only")]
    cfg, out = model.cfg, []
    if cfg.arch != "decoder":
        out.append(("model.arch", "an encoder-decoder: HookedTransformer is decoder-only"))
    if cfg.norm == "post":
        out.append(("model.norm", "post-LN: TransformerLens's blocks normalise before each sublayer (pre-LN)"))
    if cfg.pos not in ("learned", "rope"):
        out.append(("model.pos", f"{cfg.pos!r}: TransformerLens computes learned ('standard') and rotary positions "
                                 "exactly, not this encoding"))
    if cfg.qk_norm == "on":
        out.append(("model.qk_norm", "QK-norm: HookedTransformer has no norm on queries and keys"))
    if cfg.activation in ("swiglu", "geglu"):
        out.append(("model.activation", f"{cfg.activation}: TransformerLens's gated layer adds the value bias after "
                                        "the gating, this lab's before it"))
    if cfg.residual != "on":
        out.append(("model.residual", "off: TransformerLens's blocks always add to the residual stream"))
    return out


def lens_config(model: Transformer) -> dict[str, Any]:
    """The HookedTransformerConfig keywords of `model` (TransformerLens's names for its settings)."""
    cfg = model.cfg
    return {"n_layers": cfg.n_layers, "d_model": cfg.d_model, "n_ctx": cfg.n_ctx, "d_head": cfg.d_head,
            "n_heads": cfg.n_heads, "d_mlp": cfg.d_mlp if cfg.d_ff else None, "attn_only": cfg.attn_only,
            "d_vocab": model.vocab_size, "act_fn": cfg.act_fn, "normalization_type": cfg.normalization_type,
            "eps": 1e-5, "use_attn_scale": cfg.scale == "sqrt", "use_attn_result": True,  # hook_result, as here
            "positional_embedding_type": cfg.positional_embedding_type,
            **({"rotary_dim": cfg.d_head, "rotary_base": 10000, "rotary_adjacent_pairs": False}
               if cfg.pos == "rope" else {}),
            "default_prepend_bos": False, "device": "cpu", "seed": None}


def lens_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """The model's weights under HookedTransformer's parameter names (copies)."""
    sd: dict[str, torch.Tensor] = {"embed.W_E": model.W_E, "unembed.W_U": model.W_U, "unembed.b_U": model.b_U}
    if model.cfg.pos == "learned":
        sd["pos_embed.W_pos"] = model.W_pos
    for i, block in enumerate(model.blocks):
        at = f"blocks.{i}."
        for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
            sd[at + "attn." + name] = getattr(block.attn, name)
        if block.mlp is not None:
            for name in ("W_in", "b_in", "W_out", "b_out"):
                sd[at + "mlp." + name] = getattr(block.mlp, name)
        for ln in ("ln1", "ln2"):
            norm = getattr(block, ln)
            if norm is not None and hasattr(norm, "weight"):
                sd[f"{at}{ln}.w"] = norm.weight
                if getattr(norm, "bias", None) is not None:
                    sd[f"{at}{ln}.b"] = norm.bias
    if hasattr(model.dec_norm, "weight"):
        sd["ln_final.w"] = model.dec_norm.weight
        if getattr(model.dec_norm, "bias", None) is not None:
            sd["ln_final.b"] = model.dec_norm.bias
    return {k: v.detach().clone().contiguous() for k, v in sd.items()}


def to_transformer_lens(model: Any) -> Any:
    """A `transformer_lens.HookedTransformer` with `model`'s weights (a lab Transformer, or a `Run`: its trained
    model), in eval mode: its logits and activations equal this lab's on the same token ids. ConfigError names
    each setting it cannot express; ImportError when transformer-lens is missing or has no HookedTransformer."""
    model = getattr(model, "model", model) if not isinstance(model, Transformer) else model
    refused = _refusals(model)
    if refused:
        raise ConfigError(refused[0][0], "TransformerLens cannot compute this model exactly: "
                          + "; ".join(f"{field} is {why}" for field, why in refused))
    try:
        import transformer_lens
    except ImportError:
        raise ImportError("to_transformer_lens needs TransformerLens 2.x or 3.x: pip install 'transformer-lens<4'") from None
    if not hasattr(transformer_lens, "HookedTransformer"):
        raise ImportError(f"to_transformer_lens: TransformerLens {getattr(transformer_lens, '__version__', '4.x')} has "
                          "no HookedTransformer (removed in 4.0): pip install 'transformer-lens<4'")
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    with warnings.catch_warnings():  # 3.x's notice that 4.0 drops HookedTransformer: the docstring says so
        warnings.filterwarnings("ignore", message="HookedTransformer is deprecated", category=DeprecationWarning)
        lens = HookedTransformer(HookedTransformerConfig(**lens_config(model)))
    missing, unexpected = lens.load_state_dict(lens_state_dict(model), strict=False)
    buffers = {name for name, _ in lens.named_buffers()}
    if unexpected or set(missing) - buffers:
        raise RuntimeError(f"to_transformer_lens: weights that did not map: missing {sorted(set(missing) - buffers)}, "
                           f"unexpected {sorted(unexpected)}")
    return lens.eval()
