"""Interventions on a trained model at inference: knock out attention heads, skip sublayers or whole
blocks, remove or shuffle the positional encoding. Each is a hook on the one model class
(lab/model.py; the positional ones replace the encoding a forward pass reads, `Transformer.pos_override`),
put on for a `with applied(model, spec):` block and taken off after it, so the stored weights never change
and no second model class exists.

- Head knockout (zero or mean ablation): the head's slice of the concatenated head outputs, the input
  of the attention's output projection, is replaced by zeros or by its mean over a held-out set
  (Michel et al. 2019, "Are Sixteen Heads Really Better than One?"; mean ablation as in
  TransformerLens and Wang et al. 2022, "Interpretability in the Wild"). Zeroing every head of a
  sublayer leaves its output as the projection's bias alone.
- Skipping a sublayer: its residual update is removed, and with post-LN the norm after it too, so the
  residual stream passes through unchanged. Skipping a block skips all of its sublayers.
- Positional encoding: "none" makes every encoding a no-op (no vector added, no rotation, no bias);
  "shuffle" gives the T positions of a sequence a fixed random order of position ids, which each
  encoding then uses as if they were the positions (Haviv et al. 2022 study the former).

Head and layer names: "L.H" is decoder self-attention (the only stack of a decoder-only model);
"enc.L.H" and "cross.L.H" address an encoder-decoder's encoder and cross-attention. Layers and heads count
from 0 everywhere; a sentence names a head with `head_name` ("layer 0 head 1"), the row and column labels
of Inspect's importance grid and attention heatmaps.
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Iterator, Literal, Optional

import torch
from torch import Tensor, nn

from lab.fields import ConfigError
from lab.hooks import HookFn, HookPoint, hooks_on
from lab.model import Transformer
from lab.positional import PassEncoding, Placed, PositionalEncoding
from lab.records import CROSS, DEC_SELF, ENC_SELF, AttentionKind
from lab.recurrent import RecurrentLM

KIND_PREFIX: dict[AttentionKind, str] = {DEC_SELF: "", ENC_SELF: "enc.", CROSS: "cross."}
POSITIONAL = ("intact", "none", "shuffle")
MODES = ("zero", "mean")
_HEAD = re.compile(r"^(?:(enc|cross)\.)?(\d+)\.(\d+)$")
_LAYER = re.compile(r"^(?:(enc)\.)?(\d+)$")
KIND_WORDS: dict[AttentionKind, str] = {DEC_SELF: "", ENC_SELF: "encoder self-attention ", CROSS: "cross-attention "}


def head_name(layer: int, head: int, kind: AttentionKind = DEC_SELF) -> str:
    """A head in words, counted from 0 as Inspect labels its rows and columns: "layer 0 head 1",
    "cross-attention layer 1 head 2" (the grid's row "cross layer 1", column "head 2")."""
    return f"{KIND_WORDS[kind]}layer {int(layer)} head {int(head)}"


@dataclass(frozen=True, order=True)
class HeadRef:
    kind: AttentionKind
    layer: int
    head: int

    def __str__(self) -> str:
        return f"{KIND_PREFIX[self.kind]}{self.layer}.{self.head}"

    @property
    def words(self) -> str:
        """"layer 1 head 0": the head in a sentence (`head_name`)."""
        return head_name(self.layer, self.head, self.kind)


@dataclass(frozen=True, order=True)
class LayerRef:
    stack: Literal["enc", "dec"]
    layer: int

    def __str__(self) -> str:
        return f"{'enc.' if self.stack == 'enc' else ''}{self.layer}"


@dataclass(frozen=True)
class Interventions:
    """What to change at inference; the empty spec is the intact model."""

    heads: tuple[HeadRef, ...] = ()
    mode: Literal["zero", "mean"] = "zero"
    skip_attn: tuple[LayerRef, ...] = ()
    skip_ff: tuple[LayerRef, ...] = ()
    skip_block: tuple[LayerRef, ...] = ()
    positional: Literal["intact", "none", "shuffle"] = "intact"
    shuffle_seed: int = 0

    @property
    def empty(self) -> bool:
        return not (self.heads or self.skip_attn or self.skip_ff or self.skip_block) and self.positional == "intact"

    def describe(self) -> list[str]:
        """One line per intervention, for tables and JSON ("knock out head 1.0 (zero)")."""
        out = [f"knock out head {h} ({self.mode})" for h in self.heads]
        out += [f"skip attention of layer {r}" for r in self.skip_attn]
        out += [f"skip feed-forward of layer {r}" for r in self.skip_ff]
        out += [f"skip block {r}" for r in self.skip_block]
        if self.positional != "intact":
            out.append("remove the positional encoding" if self.positional == "none"
                       else "shuffle the positional encoding")
        return out

    def silenced(self, kind: AttentionKind, n_heads: int) -> set[tuple[int, int]]:
        """(layer, head) of every head of attention `kind` whose output this spec removes: knocked out, or in
        a skipped attention sublayer or block. They still attend (their pattern is computed); nothing they
        read reaches the residual stream."""
        stack = "enc" if kind == ENC_SELF else "dec"
        out = {(h.layer, h.head) for h in self.heads if h.kind == kind}
        layers = [r.layer for r in self.skip_block if r.stack == stack]
        if kind != CROSS:  # skipping a block's attention leaves its cross-attention
            layers += [r.layer for r in self.skip_attn if r.stack == stack]
        return out | {(layer, head) for layer in layers for head in range(n_heads)}

    def check(self, model: Transformer | RecurrentLM) -> None:
        """ConfigError naming the field when a head or layer does not exist in `model`."""
        cfg = model.cfg
        if isinstance(model, RecurrentLM):
            self._check_recurrent(model)
            return
        kinds = {DEC_SELF} | ({ENC_SELF, CROSS} if model.encoder is not None else set())
        for h in self.heads:
            if h.kind not in kinds or not (0 <= h.layer < cfg.n_layers and 0 <= h.head < cfg.n_heads):
                raise ConfigError("Heads", f"{h} is not a head of this model (allowed: layer.head with layer "
                                           f"0-{cfg.n_layers - 1} and head 0-{cfg.n_heads - 1}"
                                           f"{', prefixed enc. or cross.' if len(kinds) > 1 else ''})")
        for label, refs in (("Skip attention", self.skip_attn), ("Skip feed-forward", self.skip_ff),
                            ("Skip block", self.skip_block)):
            for r in refs:
                if (r.stack == "enc" and model.encoder is None) or not 0 <= r.layer < cfg.n_layers:
                    raise ConfigError(label, f"{r} is not a layer of this model (allowed: 0-{cfg.n_layers - 1})")
        skips = (("Skip attention", self.skip_attn), ("Skip feed-forward", self.skip_ff), ("Skip block", self.skip_block))
        for label, refs in skips:
            if refs and cfg.residual == "off":  # a skip removes a sublayer's update to the residual stream
                raise ConfigError(label, "this model has no residual connections (Residual connections = off): "
                                         "a sublayer's output is the stream, so there is no update to remove")
        if self.skip_ff and cfg.d_ff == 0:
            raise ConfigError("Skip feed-forward", "this model has no feed-forward sublayers (d_ff = 0)")
        if self.mode not in MODES:
            raise ConfigError("Knockout", f"{self.mode!r} is not one of {', '.join(MODES)}")
        if self.positional not in POSITIONAL:
            raise ConfigError("Positional encoding", f"{self.positional!r} is not one of {', '.join(POSITIONAL)}")


    def _check_recurrent(self, model: RecurrentLM) -> None:
        """A recurrent model has layers to skip, and no heads, sublayers or positional encoding."""
        what = f"an {model.cell.upper()} run" if model.cell in ("lstm", "rnn") else f"a {model.cell.upper()} run"
        if self.heads:
            raise ConfigError("Heads", f"{what} has no attention heads (it reads one token at a time)")
        if self.skip_attn or self.skip_ff:
            raise ConfigError("Skip attention" if self.skip_attn else "Skip feed-forward",
                              f"{what} has no sublayers: skip a whole layer (Skip block) instead")
        if self.positional != "intact":
            raise ConfigError("Positional encoding", f"{what} has no positional encoding: the recurrence itself "
                                                     "orders the tokens")
        for r in self.skip_block:
            if r.stack == "enc" or not 0 <= r.layer < len(model.layers):
                raise ConfigError("Skip block", f"{r} is not a layer of this model (allowed: 0-{len(model.layers) - 1})")


def parse_heads(text: str) -> tuple[HeadRef, ...]:
    """"1.0,1.2 cross.0.1" -> HeadRefs (ConfigError naming "Heads" otherwise)."""
    out = []
    for part in (p for p in re.split(r"[\s,]+", text.strip()) if p):
        m = _HEAD.match(part)
        if m is None:
            raise ConfigError("Heads", f"{part!r} is not a head (allowed: layer.head like 1.0, or enc.1.0 / cross.1.0)")
        kind = {"enc": ENC_SELF, "cross": CROSS, None: DEC_SELF}[m.group(1)]
        out.append(HeadRef(kind, int(m.group(2)), int(m.group(3))))
    return tuple(sorted(set(out)))


def parse_layers(text: str, label: str) -> tuple[LayerRef, ...]:
    """"0,1" or "enc.0" -> LayerRefs (ConfigError naming `label` otherwise)."""
    out = []
    for part in (p for p in re.split(r"[\s,]+", str(text).strip()) if p):
        m = _LAYER.match(part)
        if m is None:
            raise ConfigError(label, f"{part!r} is not a layer (allowed: a layer number like 0, or enc.0)")
        out.append(LayerRef("enc" if m.group(1) else "dec", int(m.group(2))))
    return tuple(sorted(set(out)))


def _blocks(model: Transformer, stack: str) -> nn.ModuleList:
    return model.encoder if stack == "enc" else model.decoder


def _attn(model: Transformer, kind: AttentionKind, layer: int) -> nn.Module:
    block = _blocks(model, "enc" if kind == ENC_SELF else "dec")[layer]
    return block.cross_attn if kind == CROSS else block.self_attn


@torch.no_grad()
def head_means(model: Transformer, batches: list) -> dict[tuple[AttentionKind, int], Tensor]:
    """(kind, layer) -> (n_heads * d_head,) mean over every sample and position of the heads' outputs
    (hook_z, heads side by side) of the intact model on `batches`: what mean ablation puts in."""
    sums: dict[tuple[AttentionKind, int], Tensor] = {}
    counts: dict[tuple[AttentionKind, int], int] = {}
    kinds = [DEC_SELF] + ([ENC_SELF, CROSS] if model.encoder is not None else [])
    hooks = []
    for kind in kinds:
        for layer in range(model.cfg.n_layers):
            def grab(z: Tensor, hook: HookPoint, key: tuple[AttentionKind, int] = (kind, layer)) -> None:
                flat = z.reshape(-1, z.shape[-2] * z.shape[-1])  # (B T, H dh)
                sums[key] = sums.get(key, 0) + flat.sum(0)
                counts[key] = counts.get(key, 0) + flat.shape[0]
            hooks.append((_attn(model, kind, layer).hook_z.name, grab))
    with hooks_on(model.hook_dict, hooks):
        for b in batches:
            model(b.inp, b.src)
    return {k: sums[k] / counts[k] for k in sums}


def _knockout(heads: list[int], mean: Optional[Tensor]) -> HookFn:
    """A hook_z function: the heads' outputs (B, T, H, dh) replaced by zeros, or by their means."""
    def put(z: Tensor, hook: HookPoint) -> Tensor:
        z = z.clone()
        for h in heads:
            z[:, :, h] = 0.0 if mean is None else mean.view(z.shape[2], -1)[h]
        return z
    return put


def _skipped(before: str, output: str, after: str) -> list[tuple[str, HookFn]]:
    """Hook functions skipping a sublayer: its output (hook point `output`) reads zeros, and the stream after
    it (`after`) is the stream before it (`before`), whatever the norm placement and residual setting."""
    seen: list[Tensor] = []
    return [(before, lambda x, hook: seen.append(x) and None), (output, lambda y, hook: torch.zeros_like(y)),
            (after, lambda x, hook: seen.pop())]


def _sublayers(model: Transformer, ref: LayerRef) -> dict[str, tuple[str, str, str]]:
    """name -> the hook points (stream before, sublayer output, stream after) of each sublayer of a block."""
    block = _blocks(model, ref.stack)[ref.layer]
    at = f"{'encoder' if ref.stack == 'enc' else 'blocks'}.{ref.layer}."
    out = {"attn": (at + "hook_resid_pre", at + "hook_attn_out", at + "hook_resid_mid")}
    last = at + "hook_resid_mid"
    if block.cross_attn is not None:
        out["cross"] = (last, at + "hook_cross_attn_out", at + "hook_resid_mid_cross")
        last = at + "hook_resid_mid_cross"
    if block.ff is not None:
        out["ff"] = (last, at + "hook_mlp_out", at + "hook_resid_post")
    return out


def _spec_hooks(model: Transformer, spec: Interventions,
                means: Optional[dict[tuple[AttentionKind, int], Tensor]]) -> list[tuple[str, HookFn]]:
    """`spec`'s heads and skipped sublayers as hook functions on the model's hook points."""
    by_site: dict[tuple[AttentionKind, int], list[int]] = {}
    for h in spec.heads:
        by_site.setdefault((h.kind, h.layer), []).append(h.head)
    hooks = [(_attn(model, kind, layer).hook_z.name, _knockout(heads, None if spec.mode == "zero" else means[(kind, layer)]))
             for (kind, layer), heads in by_site.items()]
    for refs, names in ((spec.skip_attn, ("attn",)), (spec.skip_ff, ("ff",)), (spec.skip_block, ("attn", "cross", "ff"))):
        for r in refs:
            subs = _sublayers(model, r)
            hooks += [fn for name in names if name in subs for fn in _skipped(*subs[name])]
    return hooks


@contextlib.contextmanager
def applied(model: Transformer, spec: Interventions,
            means: Optional[dict[tuple[AttentionKind, int], Tensor]] = None) -> Iterator[Transformer]:
    """The model with `spec`'s hooks on, for the block's duration (`means` from `head_means` for mean
    ablation). The hooks come off however the block ends."""
    spec.check(model)
    if spec.mode == "mean" and spec.heads and means is None:
        raise ValueError("mean ablation needs `means` (head_means over a held-out set)")
    if isinstance(model, RecurrentLM):  # a skipped layer passes its input through (lab/recurrent.py)
        model.skipped = frozenset(r.layer for r in spec.skip_block)
        try:
            yield model
        finally:
            model.skipped = frozenset()
        return
    try:
        with hooks_on(model.hook_dict, _spec_hooks(model, spec, means)):
            if spec.positional != "intact":
                model.pos_override = _moved_positions(model, spec.positional, spec.shuffle_seed)
            yield model
    finally:
        model.pos_override = None  # back to the model's own encoding


def _moved_positions(model: Transformer, how: str, seed: int) -> PassEncoding:
    """What every forward pass reads instead of the model's encoding: nothing ("none": the base encoding adds,
    rotates and biases nothing), or the encoding at a fixed random order of the position ids ("shuffle":
    token i reads position order[i], for its vector, its rotation and its distances alike)."""
    if how == "none":
        return PositionalEncoding(model.cfg)

    def order(t: int) -> Tensor:
        return torch.randperm(t, generator=torch.Generator().manual_seed(seed + t))  # (t,) position ids

    return Placed(model.pos, order)
