"""TransformerLens's habits on this lab's one model class: `run_with_cache` returns the logits and an
`ActivationCache` of every hook point's activation, `run_with_hooks` runs the model with hook functions that
read or replace them (`fwd_hooks`, for activation patching), both on a batch of token sequences, and
`interventions` turns the keywords of `Run.hooks` into the lab's intervention spec (lab/interventions.py).
The hook points are the model's own (lab/hooks.py, `Transformer.hook_dict`), at TransformerLens's names and
shapes (batch first; L counts layers from 0):
  hook_embed, hook_pos_embed                (B, T, d_model)  token embedding; vector added per position
  blocks.{L}.hook_resid_pre/mid/post        (B, T, d_model)  the residual stream entering, after attention, leaving
  blocks.{L}.ln1/ln2.hook_scale             (B, T, 1)        the norm's divisor
  blocks.{L}.ln1/ln2.hook_normalized        (B, T, d_model)  the normalised stream, before the gain and bias
  blocks.{L}.attn.hook_q/k/v, hook_z        (B, T, n_heads, d_head)  (hook_rot_q/k: after the rotation, RoPE)
  blocks.{L}.attn.hook_attn_scores          (B, n_heads, query, key) scaled, with -inf where masked
  blocks.{L}.attn.hook_pattern              (B, n_heads, query, key) the softmax of the scores
  blocks.{L}.attn.hook_result               (B, T, n_heads, d_model) each head's output through its W_O
  blocks.{L}.hook_attn_out, hook_mlp_out    (B, T, d_model)  the sublayers' outputs
  blocks.{L}.mlp.hook_pre/post              (B, T, d_mlp)    before and after the activation
  ln_final.hook_scale/hook_normalized       the final norm (pre-LN models)
An encoder-decoder adds encoder.{L}.* and encoder.ln_final.* for its encoder, encoder.hook_embed, and
blocks.{L}.cross_attn.*, blocks.{L}.ln_cross.*, blocks.{L}.hook_cross_attn_out and hook_resid_mid_cross.
`cache["pattern", L]`, `cache["z", L]`, `cache["resid_post", L]`, `cache["embed"]`... are short for them,
as in TransformerLens.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Union

import numpy as np
import torch

from lab.config import ConfigError
from lab.hooks import HookFn, HookPoint, hooks_on
from lab.interventions import (MODES, POSITIONAL, HeadRef, Interventions, LayerRef, parse_heads,
                               parse_layers)
from lab.model import Transformer
from lab.records import DEC_SELF
from lab.tasks.batches import Batch

__all__ = ["ActivationCache", "HookFn", "HookPoint", "hooked", "run_with_cache", "run_with_hooks", "interventions"]

IN_ATTN = ("q", "k", "v", "rot_q", "rot_k", "attn_scores", "pattern", "z", "result")
IN_MLP = ("pre", "post", "pre_linear")
IN_BLOCK = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")
SHORT = {**{n: f"blocks.{{}}.attn.hook_{n}" for n in IN_ATTN}, **{n: f"blocks.{{}}.mlp.hook_{n}" for n in IN_MLP},
         **{n: f"blocks.{{}}.hook_{n}" for n in IN_BLOCK}, "cross_pattern": "blocks.{}.cross_attn.hook_pattern",
         "enc_pattern": "encoder.{}.attn.hook_pattern"}
Tokens = Union[Batch, torch.Tensor, np.ndarray, Sequence[Sequence[int]]]
NamesFilter = Union[None, str, Sequence[str], Callable[[str], bool]]


class ActivationCache(dict):
    """Activations of one forward pass by name (a dict of tensors, batch first, in the order the forward
    pass made them), with TransformerLens's shorthand: `cache["pattern", 1]` is
    `cache["blocks.1.attn.hook_pattern"]` (a negative layer counts from the last), `cache["scale", 0, "ln1"]`
    is `cache["blocks.0.ln1.hook_scale"]`, and `cache["embed"]` is `cache["hook_embed"]`."""

    def __init__(self, tensors: dict[str, torch.Tensor], n_layers: int) -> None:
        super().__init__(tensors)
        self.n_layers = n_layers

    def __getitem__(self, key: Any) -> torch.Tensor:
        if isinstance(key, str) and key not in self and f"hook_{key}" in self:
            key = f"hook_{key}"
        elif isinstance(key, tuple):
            key = self._full_name(key)
        return super().__getitem__(key)

    def _full_name(self, key: tuple) -> str:
        if len(key) not in (2, 3) or not isinstance(key[1], int) or (len(key) == 2 and key[0] not in SHORT):
            raise KeyError(f"{key!r}: use (name, layer) with name one of {', '.join(SHORT)}, or (name, layer, "
                           "sublayer) like ('scale', 0, 'ln1')")
        if not -self.n_layers <= key[1] < self.n_layers:
            raise KeyError(f"{key!r}: layer {key[1]} is out of range (this model has layers 0-{self.n_layers - 1})")
        layer = key[1] % self.n_layers
        return SHORT[key[0]].format(layer) if len(key) == 2 else f"blocks.{layer}.{key[2]}.hook_{key[0]}"


def _inputs(model: Transformer, tokens: Tokens, src: Optional[torch.Tensor]) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(decoder input, encoder input) as (B, T) token ids: a Batch's, or `tokens` ([T] or [B, T])."""
    if isinstance(tokens, Batch):
        return tokens.inp, tokens.src
    t = torch.as_tensor(np.asarray(tokens) if not isinstance(tokens, torch.Tensor) else tokens)
    t = t[None] if t.dim() == 1 else t
    if t.dim() != 2 or t.dtype.is_floating_point or t.dtype == torch.bool:
        raise ValueError(f"tokens: expected integer token ids shaped [batch, pos], got {tuple(t.shape)} {t.dtype}")
    if t.numel() and not 0 <= int(t.min()) <= int(t.max()) < model.vocab_size:
        raise ValueError(f"tokens: ids must lie in 0..{model.vocab_size - 1} (this model's vocabulary), got "
                         f"{int(t.min())}..{int(t.max())}")
    if model.encoder is not None and src is None:
        raise ValueError("src: an encoder-decoder model reads two sequences: pass the encoder's tokens as src "
                         "(or a Batch, e.g. run.probe(text).batch)")
    return t.long(), None if src is None else _inputs_src(src)


def _inputs_src(src: Any) -> torch.Tensor:
    s = torch.as_tensor(src)
    return (s[None] if s.dim() == 1 else s).long()


def _filter(names_filter: NamesFilter) -> Callable[[str], bool]:
    if names_filter is None:
        return lambda name: True
    if isinstance(names_filter, str):
        return lambda name: name == names_filter
    if callable(names_filter):
        return names_filter
    wanted = set(names_filter)
    return lambda name: name in wanted


def _points(model: Any) -> dict[str, HookPoint]:
    if not isinstance(model, Transformer):
        raise ValueError("hooks: a recurrent run (lstm, gru) has no hook points")
    return model.hook_dict


@contextlib.contextmanager
def hooked(model: Transformer, fwd_hooks: Sequence[tuple[str, HookFn]]) -> Iterator[Transformer]:
    """`model` with each (hook point name, function) of `fwd_hooks` on, for the block's duration. A function
    gets (activation, HookPoint) and returns the activation's replacement, or None to leave it as it is."""
    with hooks_on(_points(model), list(fwd_hooks)):
        yield model


@torch.no_grad()
def run_with_cache(model: Transformer, tokens: Tokens, fwd_hooks: Sequence[tuple[str, HookFn]] = (),
                   names_filter: NamesFilter = None, src: Any = None) -> tuple[torch.Tensor, ActivationCache]:
    """(logits (B, T, vocab), ActivationCache) of `model` on `tokens` (a Batch, or token ids [B, T]; an
    encoder-decoder also takes `src`), with `fwd_hooks` applied; the cache holds the activations whose names
    pass `names_filter` (a name, names, or a function of the name), each as the model used it (after the
    hooks' replacements)."""
    points, wanted = _points(model), _filter(names_filter)
    idx, source = _inputs(model, tokens, src)
    cache: dict[str, torch.Tensor] = {}

    def keep(x: torch.Tensor, point: HookPoint) -> None:
        cache[point.name] = x.detach().clone()
    keepers = [(name, keep) for name in points if wanted(name)]
    with hooks_on(points, list(fwd_hooks)), hooks_on(points, keepers):  # the keepers run last: they see replacements
        logits = model(idx, source).logits
    return logits, ActivationCache(cache, model.cfg.n_layers)


@torch.no_grad()
def run_with_hooks(model: Transformer, tokens: Tokens, fwd_hooks: Sequence[tuple[str, HookFn]] = (),
                   src: Any = None) -> torch.Tensor:
    """The logits (B, T, vocab) of one forward pass with `fwd_hooks` on (TransformerLens's run_with_hooks)."""
    idx, source = _inputs(model, tokens, src)
    with hooked(model, fwd_hooks):
        return model(idx, source).logits


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
