"""TransformerLens's habits on this lab's one model class (`Transformer.run_with_cache`, `run_with_hooks` and
`hooks` call these): `run_with_cache` returns the logits and an `ActivationCache` of every hook point's
activation, `run_with_hooks` runs the model with hook functions that read or replace them (`fwd_hooks`, for
activation patching), both on a batch of token sequences (Nanda & Bloom 2022, TransformerLens). The hook
points are the model's own (lab/hooks.py, `Transformer.hook_dict`), at TransformerLens's names and shapes
(batch first; L counts layers from 0):
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
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import numpy as np
import torch

from lab.hooks import HookFn, HookPoint, hooks_on
from lab.tasks.batches import Batch

IN_ATTN = ("q", "k", "v", "rot_q", "rot_k", "attn_scores", "pattern", "z", "result")
IN_MLP = ("pre", "post", "pre_linear")
IN_BLOCK = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")
SHORT = {**{n: f"blocks.{{}}.attn.hook_{n}" for n in IN_ATTN}, **{n: f"blocks.{{}}.mlp.hook_{n}" for n in IN_MLP},
         **{n: f"blocks.{{}}.hook_{n}" for n in IN_BLOCK}, "cross_pattern": "blocks.{}.cross_attn.hook_pattern",
         "enc_pattern": "encoder.{}.attn.hook_pattern"}
Tokens = Union[Batch, torch.Tensor, np.ndarray, Sequence[Sequence[int]]]
NamesFilter = Union[None, str, Sequence[str], Callable[[str], bool]]


PosSlice = Union[None, int, slice, Sequence[int], torch.Tensor]


def _at(x: torch.Tensor, pos_slice: PosSlice, dim: int) -> torch.Tensor:
    """TransformerLens's Slice: None keeps every position, an int picks one (dropping the dimension), a slice
    or a list of positions picks those."""
    if pos_slice is None:
        return x
    if isinstance(pos_slice, int):
        return x.select(dim, pos_slice)
    if isinstance(pos_slice, slice):
        return x[(slice(None),) * (dim % x.dim()) + (pos_slice,)]
    return x.index_select(dim, torch.as_tensor(pos_slice, dtype=torch.long))


class ActivationCache(dict):
    """Activations of one forward pass by name (a dict of tensors, batch first, in the order the forward
    pass made them), with TransformerLens's shorthand: `cache["pattern", 1]` is
    `cache["blocks.1.attn.hook_pattern"]` (a negative layer counts from the last), `cache["scale", 0, "ln1"]`
    is `cache["blocks.0.ln1.hook_scale"]`, and `cache["embed"]` is `cache["hook_embed"]`; and its methods
    that split the residual stream into parts (`accumulated_resid`, `decompose_resid`, `stack_head_results`),
    put them through the final norm's cached scale (`apply_ln_to_stack`) and attribute logits to them
    (`logit_attrs`), as TransformerLens 3.9's do. They need a pre-LN model: with post-LN the stream is
    normalised after every sum, so it is not the sum of the parts."""

    def __init__(self, tensors: dict[str, torch.Tensor], model: Any) -> None:
        super().__init__(tensors)
        self.model = model
        self.n_layers = model.cfg.n_layers

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

    # ---- the residual stream in parts (pre-LN models) ---------------------------------------------------
    def _pre_ln(self, what: str) -> None:
        cfg = self.model.cfg
        if cfg.norm == "post":
            raise ValueError(f"{what}: this model is post-LN (Vaswani et al. 2017): each block normalises the "
                             "stream after its sum, so the stream is not the sum of its parts and their "
                             "attributions are not defined; a pre-LN run has them")
        if cfg.arch != "decoder" or cfg.residual != "on":
            raise ValueError(f"{what}: defined for decoder-only models with residual connections (this run: "
                             f"arch {cfg.arch}, residual {cfg.residual})")

    def _layer(self, layer: Optional[int]) -> int:
        return self.n_layers if layer is None or layer == -1 else layer

    def accumulated_resid(self, layer: Optional[int] = None, incl_mid: bool = False, apply_ln: bool = False,
                          pos_slice: PosSlice = None, mlp_input: bool = False,
                          return_labels: bool = False) -> Any:
        """The residual stream entering each block up to `layer` (default: all, and the stream the
        unembedding reads, "final_post"), with the stream after attention too (`incl_mid`): (components,
        batch, pos, d_model), labels "0_pre", "0_mid", ..., "final_post". `apply_ln`: through the final norm,
        recomputed for each component (the logit lens), or the cached scale of the norm at `layer`."""
        self._pre_ln("accumulated_resid")
        layer = self._layer(layer)
        parts, labels = [], []
        for i in range(layer + 1):
            if i == self.n_layers:
                parts.append(self["resid_post", self.n_layers - 1])
                labels.append("final_post")
                continue
            parts.append(self["resid_pre", i])
            labels.append(f"{i}_pre")
            if (incl_mid and i < layer) or (mlp_input and i == layer):
                parts.append(self["resid_mid", i])
                labels.append(f"{i}_mid")
        stack = torch.stack([_at(p, pos_slice, -2) for p in parts])
        if apply_ln:
            stack = (torch.stack([self.model.dec_norm(c) for c in stack]) if layer == self.n_layers
                     else self.apply_ln_to_stack(stack, layer, mlp_input, pos_slice))
        return (stack, labels) if return_labels else stack

    def decompose_resid(self, layer: Optional[int] = None, mlp_input: bool = False, mode: str = "all",
                        apply_ln: bool = False, pos_slice: PosSlice = None, incl_embeds: bool = True,
                        return_labels: bool = False) -> Any:
        """The residual stream entering `layer` (default: what the unembedding reads) as the sum of its parts:
        the embedding, the positions' vectors, and each earlier sublayer's output (`mode` "attn" or "mlp" for
        one kind): (components, batch, pos, d_model), labels "embed", "pos_embed", "0_attn_out", ..."""
        self._pre_ln("decompose_resid")
        layer = self._layer(layer)
        parts: list[torch.Tensor] = []
        labels: list[str] = []
        if incl_embeds:
            for name, label in (("hook_embed", "embed"), ("hook_pos_embed", "pos_embed")):
                if name in self:
                    parts.append(self[name])
                    labels.append(label)
        with_mlp = mode != "attn" and self.model.cfg.d_ff > 0
        for i in range(layer):
            if mode != "mlp":
                parts.append(self["attn_out", i])
                labels.append(f"{i}_attn_out")
            if with_mlp:
                parts.append(self["mlp_out", i])
                labels.append(f"{i}_mlp_out")
        if mlp_input and mode != "mlp":
            parts.append(self["attn_out", layer])
            labels.append(f"{layer}_attn_out")
        stack = torch.stack([_at(p, pos_slice, -2) for p in parts])
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, mlp_input, pos_slice)
        return (stack, labels) if return_labels else stack

    def stack_head_results(self, layer: int = -1, return_labels: bool = False, incl_remainder: bool = False,
                           pos_slice: PosSlice = None, apply_ln: bool = False) -> Any:
        """Each head's output (z through its slice of W_O) for the layers before `layer` (default: all):
        (n_heads * layers, batch, pos, d_model), labels "L0H0", "L0H1", ...; `incl_remainder` adds the rest of
        the stream (embeddings, biases, feed-forward layers) as one last component."""
        self._pre_ln("stack_head_results")
        layer = self._layer(layer)
        parts, labels = [], []
        for i in range(layer):
            name = f"blocks.{i}.attn.hook_result"
            result = self[name] if name in self else torch.einsum("...hd,hdm->...hm", self["z", i],
                                                                  self.model.blocks[i].attn.W_O)
            parts.append(_at(result, pos_slice, -3))  # (batch, pos, heads, d_model)
            labels += [f"L{i}H{h}" for h in range(self.model.cfg.n_heads)]
        stack = torch.cat(parts, dim=-2).movedim(-2, 0) if parts else torch.zeros(
            0, *_at(self["hook_embed"], pos_slice, -2).shape)
        if incl_remainder:
            rest = _at(self["resid_post", layer - 1], pos_slice, -2) - stack.sum(0)
            stack = torch.cat([stack, rest[None]])
            labels.append("remainder")
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, False, pos_slice)
        return (stack, labels) if return_labels else stack

    def apply_ln_to_stack(self, residual_stack: torch.Tensor, layer: Optional[int] = None,
                          mlp_input: bool = False, pos_slice: PosSlice = None) -> torch.Tensor:
        """Each component centred (LayerNorm) and divided by the cached scale of the norm that reads the
        stream at `layer` (default: the final norm; `mlp_input`: the block's second norm), as TransformerLens
        does: the norm's gain and bias are left out, so the components still add up."""
        self._pre_ln("apply_ln_to_stack")
        cfg, layer = self.model.cfg, self._layer(layer)
        if cfg.norm == "none":
            return residual_stack
        if cfg.norm_type == "layernorm":
            residual_stack = residual_stack - residual_stack.mean(-1, keepdim=True)
        name = "ln_final.hook_scale" if layer == self.n_layers else f"blocks.{layer}.ln{2 if mlp_input else 1}.hook_scale"
        return residual_stack / _at(self[name], pos_slice, -2)

    def logit_attrs(self, residual_stack: torch.Tensor, tokens: Any, incorrect_tokens: Any = None,
                    pos_slice: PosSlice = None) -> torch.Tensor:
        """How much each component of `residual_stack` pushes the logit of `tokens` (minus that of
        `incorrect_tokens`): the component through the final norm's scale (`apply_ln_to_stack`), dotted with
        the token's column of W_U. `tokens`: token ids shaped like the stack's batch (and position) axes."""
        directions = self.model.W_U.T[torch.as_tensor(tokens)]  # tokens' shape + (d_model,)
        if incorrect_tokens is not None:
            if torch.as_tensor(incorrect_tokens).shape != torch.as_tensor(tokens).shape:
                raise ValueError("incorrect_tokens: must have the shape of tokens")
            directions = directions - self.model.W_U.T[torch.as_tensor(incorrect_tokens)]
        return (self.apply_ln_to_stack(residual_stack, None, False, pos_slice) * directions).sum(-1)


def _inputs(model: Any, tokens: Tokens, src: Optional[torch.Tensor]) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
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
    if not hasattr(model, "hook_dict"):
        raise ValueError("hooks: a recurrent run (rnn, lstm, gru) has no hook points")
    return model.hook_dict


@contextlib.contextmanager
def hooked(model: Any, fwd_hooks: Sequence[tuple[str, HookFn]]) -> Iterator[Any]:
    """`model` with each (hook point name, function) of `fwd_hooks` on, for the block's duration. A function
    gets (activation, HookPoint) and returns the activation's replacement, or None to leave it as it is."""
    with hooks_on(_points(model), list(fwd_hooks)):
        yield model


@torch.no_grad()
def run_with_cache(model: Any, tokens: Tokens, fwd_hooks: Sequence[tuple[str, HookFn]] = (),
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
    return logits, ActivationCache(cache, model)


@torch.no_grad()
def run_with_hooks(model: Any, tokens: Tokens, fwd_hooks: Sequence[tuple[str, HookFn]] = (),
                   src: Any = None) -> torch.Tensor:
    """The logits (B, T, vocab) of one forward pass with `fwd_hooks` on (TransformerLens's run_with_hooks)."""
    idx, source = _inputs(model, tokens, src)
    with hooked(model, fwd_hooks):
        return model(idx, source).logits
