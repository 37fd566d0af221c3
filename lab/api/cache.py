"""TransformerLens's habits on this lab's one model class: `run_with_cache` returns the logits and an
`ActivationCache` of the decoder's activations, `hooked` runs the model with hook functions that read or
replace them (`fwd_hooks`, for activation patching), and `interventions` turns the keywords of `Run.hooks`
into the lab's intervention spec (lab/interventions.py). Every hook is put on for a `with` block (or one
forward pass) and taken off after it, however it ends.

Hook points, TransformerLens's names and shapes (batch first; L counts layers from 0):
  blocks.{L}.hook_resid_pre    (B, T, d_model)   the residual stream entering block L (embedding + positions at 0)
  blocks.{L}.attn.hook_z       (B, T, n_heads, d_head)  each head's output, before the output projection
  blocks.{L}.hook_attn_out     (B, T, d_model)   the attention sublayer's output
  blocks.{L}.hook_mlp_out      (B, T, d_model)   the feed-forward sublayer's output (models with d_ff > 0)
  blocks.{L}.hook_resid_post   (B, T, d_model)   the stream leaving block L
  ln_final.hook_normalized     (B, T, d_model)   what the unembedding reads (the final norm's output)
The cache also holds blocks.{L}.attn.hook_pattern (B, n_heads, query, key), read-only, and for an
encoder-decoder encoder.{L}.attn.hook_pattern and blocks.{L}.cross_attn.hook_pattern.
`cache["pattern", L]`, `cache["z", L]`, `cache["resid_post", L]`... are short for them, as in TransformerLens.
"""
from __future__ import annotations

import contextlib
import re
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Optional, Sequence

import torch
from torch import nn

from lab.config import ConfigError
from lab.interventions import (MODES, POSITIONAL, HeadRef, Interventions, LayerRef, parse_heads,
                               parse_layers)
from lab.model import Transformer
from lab.records import CROSS, DEC_SELF, ENC_SELF, AttentionKind
from lab.tasks.batches import Batch

SHORT = {"pattern": "blocks.{}.attn.hook_pattern", "resid_pre": "blocks.{}.hook_resid_pre",
         "z": "blocks.{}.attn.hook_z", "attn_out": "blocks.{}.hook_attn_out", "mlp_out": "blocks.{}.hook_mlp_out",
         "resid_post": "blocks.{}.hook_resid_post", "cross_pattern": "blocks.{}.cross_attn.hook_pattern",
         "enc_pattern": "encoder.{}.attn.hook_pattern"}
HookFn = Callable[[torch.Tensor, "HookPoint"], Optional[torch.Tensor]]


class HookPoint(NamedTuple):
    """What a hook function gets beside the activation (TransformerLens's `hook`): its name and layer."""

    name: str
    layer: Optional[int]


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
            if not -self.n_layers <= key[1] < self.n_layers:
                raise KeyError(f"{key!r}: layer {key[1]} is out of range (this model has layers 0-{self.n_layers - 1})")
            key = SHORT[key[0]].format(key[1] % self.n_layers)
        return super().__getitem__(key)


def _sites(model: Transformer) -> dict[str, tuple[nn.Module, str, Optional[int]]]:
    """Hook point -> (module, how its activation is reached, layer)."""
    out: dict[str, tuple[nn.Module, str, Optional[int]]] = {}
    for i, block in enumerate(model.decoder):
        out[f"blocks.{i}.hook_resid_pre"] = (block, "input", i)
        out[f"blocks.{i}.attn.hook_z"] = (block.self_attn.out_proj, "z", i)
        out[f"blocks.{i}.hook_attn_out"] = (block.self_attn, "first output", i)
        if block.ff is not None:
            out[f"blocks.{i}.hook_mlp_out"] = (block.ff, "output", i)
        out[f"blocks.{i}.hook_resid_post"] = (block, "first output", i)
    out["ln_final.hook_normalized"] = (model.dec_norm, "output", None)
    return out


def _handle(module: nn.Module, how: str, fn: HookFn, point: HookPoint, heads: int) -> Any:
    """Put `fn` on `module` so that it sees the activation and may return its replacement (None keeps it)."""
    if how == "input":
        return module.register_forward_pre_hook(
            lambda mod, args: None if (new := fn(args[0], point)) is None else (new, *args[1:]))
    if how == "z":  # the heads' outputs concatenated: shown per head, (B, T, H, d_head)
        def z_hook(mod: nn.Module, args: tuple) -> Optional[tuple]:
            flat = args[0]
            new = fn(flat.unflatten(-1, (heads, -1)), point)
            return None if new is None else (new.flatten(-2), *args[1:])
        return module.register_forward_pre_hook(z_hook)
    if how == "first output":
        return module.register_forward_hook(
            lambda mod, args, out: None if (new := fn(out[0], point)) is None else (new, *out[1:]))
    return module.register_forward_hook(lambda mod, args, out: fn(out, point))


@contextlib.contextmanager
def hooked(model: Transformer, fwd_hooks: Sequence[tuple[str, HookFn]]) -> Iterator[Transformer]:
    """`model` with each (hook point name, function) of `fwd_hooks` on, for the block's duration. A function
    gets (activation, HookPoint) and returns the activation's replacement, or None to leave it as it is."""
    if not isinstance(model, Transformer):
        raise ValueError("hooks: a recurrent run (lstm, gru) has no hook points")
    sites = _sites(model)
    handles = []
    try:
        for name, fn in fwd_hooks:
            if name not in sites:
                why = " (patterns are read from the cache, not replaced)" if name.endswith("hook_pattern") else ""
                raise KeyError(f"{name!r} is not a hook point of this model{why}; allowed: "
                               f"{', '.join(n for n in sites if n.startswith(('blocks.0.', 'ln_')))}"
                               + (f" and the same for layers 1-{model.cfg.n_layers - 1}" if model.cfg.n_layers > 1
                                  else ""))
            module, how, layer = sites[name]
            handles.append(_handle(module, how, fn, HookPoint(name, layer), model.cfg.n_heads))
        yield model
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def run_with_cache(model: Transformer, batch: Batch,
                   fwd_hooks: Sequence[tuple[str, HookFn]] = ()) -> tuple[torch.Tensor, ActivationCache]:
    """(logits (B, T, vocab), ActivationCache) of `model` on `batch`, with interventions and `fwd_hooks`
    applied; the cache holds each activation as the model used it (after the hooks' replacements)."""
    if not isinstance(model, Transformer):
        raise ValueError("run_with_cache: a recurrent run (lstm, gru) has no attention or residual stream")
    cache: dict[str, torch.Tensor] = {}

    def keep(x: torch.Tensor, point: HookPoint) -> None:
        cache[point.name] = x.detach().clone()
    keepers = [(name, keep) for name in _sites(model)]
    with hooked(model, list(fwd_hooks)), hooked(model, keepers):  # the keepers run last: they see replacements
        out = model(batch.inp, batch.src, need_weights=True)
    names: dict[AttentionKind, str] = {DEC_SELF: "blocks.{}.attn.hook_pattern", CROSS: "blocks.{}.cross_attn.hook_pattern",
                                       ENC_SELF: "encoder.{}.attn.hook_pattern"}
    for kind, stacked in out.attention.items():  # (layers, B, heads, Tq, Tk)
        for layer in range(stacked.shape[0]):
            cache[names[kind].format(layer)] = stacked[layer].float()
    return out.logits, ActivationCache(dict(sorted(cache.items(), key=lambda kv: _order(kv[0]))),
                                       model.cfg.n_layers)


@torch.no_grad()
def run_with_hooks(model: Transformer, batch: Batch, fwd_hooks: Sequence[tuple[str, HookFn]]) -> torch.Tensor:
    """The logits (B, T, vocab) of one forward pass with `fwd_hooks` on (TransformerLens's run_with_hooks)."""
    with hooked(model, fwd_hooks):
        return model(batch.inp, batch.src).logits


def _order(name: str) -> tuple[int, int, int]:
    """Encoder first, then layer by layer in the order a forward pass reaches them, the final norm last."""
    m = re.search(r"\.(\d+)\.", name)
    within = ("hook_resid_pre", ".attn.hook_pattern", ".attn.hook_z", "hook_attn_out", "cross_attn.hook_pattern",
              "hook_mlp_out", "hook_resid_post")
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
            out.append(HeadRef(DEC_SELF, int(h[0]), int(h[1])))
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
