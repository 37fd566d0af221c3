"""TransformerLens's habits on this lab's one model class: `run_with_cache` returns the logits and an
`ActivationCache` of every layer's attention pattern and residual stream, and `interventions` turns the
keywords of `Run.hooks` into the lab's intervention spec (lab/interventions.py), which puts hooks on the model
for a `with` block and takes them off after it.

Cache keys follow TransformerLens's names: "blocks.{L}.attn.hook_pattern" (1, n_heads, query, key),
"blocks.{L}.hook_resid_pre" and "blocks.{L}.hook_resid_post" (1, T, d_model), "ln_final.hook_normalized"
(the stream the unembedding reads); an encoder-decoder adds "encoder.{L}.attn.hook_pattern" and
"blocks.{L}.cross_attn.hook_pattern". `cache["pattern", L]` is short for the first, as in TransformerLens.
"""
from __future__ import annotations

import re
from typing import Any, Iterable

import torch

from lab.config import ConfigError
from lab.interventions import (MODES, POSITIONAL, HeadRef, Interventions, LayerRef, parse_heads,
                               parse_layers)
from lab.model import Transformer
from lab.tasks import Batch

SHORT = {"pattern": "blocks.{}.attn.hook_pattern", "resid_pre": "blocks.{}.hook_resid_pre",
         "resid_post": "blocks.{}.hook_resid_post", "cross_pattern": "blocks.{}.cross_attn.hook_pattern",
         "enc_pattern": "encoder.{}.attn.hook_pattern"}


class ActivationCache(dict):
    """Activations of one forward pass by name (a dict of tensors, batch first), with TransformerLens's
    shorthand: `cache["pattern", 1]` is `cache["blocks.1.attn.hook_pattern"]`; a negative layer counts from
    the last."""

    def __init__(self, tensors: dict[str, torch.Tensor], n_layers: int) -> None:
        super().__init__(tensors)
        self.n_layers = n_layers

    def __getitem__(self, key: Any) -> torch.Tensor:
        if isinstance(key, tuple):
            if len(key) != 2 or key[0] not in SHORT or not isinstance(key[1], int):
                raise KeyError(f"{key!r}: use (name, layer) with name one of {', '.join(SHORT)}")
            key = SHORT[key[0]].format(key[1] % self.n_layers)
        return super().__getitem__(key)


@torch.no_grad()
def run_with_cache(model: Transformer, batch: Batch) -> tuple[torch.Tensor, ActivationCache]:
    """(logits (B, T, vocab), ActivationCache) of `model` on `batch`, hooks (interventions) included."""
    if not isinstance(model, Transformer):
        raise ValueError("run_with_cache: a recurrent run (lstm, gru) has no attention or residual stream")
    cache: dict[str, torch.Tensor] = {}
    handles = []
    for i, block in enumerate(model.decoder):
        handles.append(block.register_forward_pre_hook(
            lambda mod, args, i=i: cache.__setitem__(f"blocks.{i}.hook_resid_pre", args[0].detach().clone())))
        handles.append(block.register_forward_hook(
            lambda mod, args, out, i=i: cache.__setitem__(f"blocks.{i}.hook_resid_post", out[0].detach().clone())))
    handles.append(model.dec_norm.register_forward_hook(
        lambda mod, args, out: cache.__setitem__("ln_final.hook_normalized", out.detach().clone())))
    try:
        out = model(batch.inp, batch.src, need_weights=True)
    finally:
        for h in handles:
            h.remove()
    names = {"dec_self": "blocks.{}.attn.hook_pattern", "cross": "blocks.{}.cross_attn.hook_pattern",
             "enc_self": "encoder.{}.attn.hook_pattern"}
    for kind, stacked in out.attention.items():  # (layers, B, heads, Tq, Tk)
        for layer in range(stacked.shape[0]):
            cache[names[kind].format(layer)] = stacked[layer].float()
    return out.logits, ActivationCache(dict(sorted(cache.items(), key=lambda kv: _order(kv[0]))),
                                       model.cfg.n_layers)


def _order(name: str) -> tuple[int, int, int]:
    """Encoder first, then layer by layer in the order a forward pass reaches them, the final norm last."""
    m = re.search(r"\.(\d+)\.", name)
    within = ("hook_resid_pre", ".attn.hook_pattern", "cross_attn.hook_pattern", "hook_resid_post")
    return (0 if name.startswith("encoder") else 1 if m else 2, int(m.group(1)) if m else 0,
            next((i for i, w in enumerate(within) if name.endswith(w)), 0))


def _heads(heads: Any) -> tuple[HeadRef, ...]:
    """"1.0 1.2", ["1.0", "cross.0.1"] or [(1, 0), (1, 2)] -> HeadRefs (ConfigError naming "Heads")."""
    if isinstance(heads, str):
        return parse_heads(heads)
    out: list[HeadRef] = []
    for h in heads:
        if isinstance(h, HeadRef):
            out.append(h)
        elif isinstance(h, str):
            out.extend(parse_heads(h))
        elif isinstance(h, (tuple, list)) and len(h) == 2 and all(isinstance(x, int) for x in h):
            out.append(HeadRef("dec_self", int(h[0]), int(h[1])))
        else:
            raise ConfigError("Heads", f"{h!r} is not a head (allowed: (layer, head) or 'layer.head' like '1.0')")
    return tuple(sorted(set(out)))


def _layers(layers: Any, label: str) -> tuple[LayerRef, ...]:
    """0, [0, 1], "0,1" or "enc.0" -> LayerRefs (ConfigError naming `label`)."""
    if isinstance(layers, int):
        layers = [layers]
    if isinstance(layers, str):
        return parse_layers(layers, label)
    out: list[LayerRef] = []
    for item in layers if isinstance(layers, Iterable) else [layers]:
        out.extend(parse_layers(str(item), label))
    return tuple(sorted(set(out)))


def interventions(heads: Any = (), mode: str = "zero", skip_attn: Any = (), skip_ff: Any = (),
                  skip_block: Any = (), positional: str = "intact") -> Interventions:
    """The intervention spec `Run.hooks` applies, from its keywords (see there)."""
    if mode not in MODES:
        raise ConfigError("mode", f"{mode!r} is not one of {', '.join(MODES)}")
    if positional not in POSITIONAL:
        raise ConfigError("positional", f"{positional!r} is not one of {', '.join(POSITIONAL)}")
    return Interventions(heads=_heads(heads), mode=mode, skip_attn=_layers(skip_attn, "Skip attention"),
                         skip_ff=_layers(skip_ff, "Skip feed-forward"), skip_block=_layers(skip_block, "Skip block"),
                         positional=positional)
