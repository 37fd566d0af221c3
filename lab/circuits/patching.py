"""Activation patching: run a decoder-only model on a clean and a corrupted input, copy one activation from
the clean run into the corrupted one, and measure how much of the clean answer comes back.

Meng et al. 2022 (causal tracing) and Wang et al. 2022 (Interpretability in the Wild) patch this way;
TransformerLens's activation-patching helpers and NDIF Workbench's patch lens draw the same grids. Two
grids, each cell one patch, all other activations the corrupted run's own:
- residual stream: row l < n_layers is the input of block l, row n_layers the last block's output, at one
  position (a layers x positions grid);
- head output: one head's slice of the attention output (the input of the output projection), at every
  position (a layers x heads grid).
The metric is the logit difference at the last position between the clean answer and the corrupted
answer (each input's own top prediction), normalised so 0 is the corrupted run and 1 the clean one:
    restored = (LD_patched - LD_corrupt) / (LD_clean - LD_corrupt).
A row of the residual grid is computed in one batched forward, sample t patching position t; a layer of the
head grid likewise, sample h patching head h. No gradio here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lab.hooks import HookFn, HookPoint, hooks_on
from lab.model import Transformer


@dataclass(frozen=True)
class Patching:
    """The two grids and what they are measured against."""
    clean_answer: int
    corrupt_answer: int
    ld_clean: float
    ld_corrupt: float
    residual: np.ndarray  # (n_layers + 1, T): restored fraction, patching the residual stream at (row, position)
    heads: np.ndarray  # (n_layers, n_heads): restored fraction, patching one head's output at every position


def _decoder(model: Transformer) -> None:
    if model.cfg.arch != "decoder":
        raise ValueError(f"model.arch: patching is measured on decoder-only models; this run is {model.cfg.arch!r}")


def _logit_diff(logits: Tensor, a: int, b: int) -> Tensor:
    """(B,) logit of `a` minus logit of `b` at the last position."""
    return logits[:, -1, a] - logits[:, -1, b]


def _row_point(n_layers: int, row: int) -> str:
    """The hook point of the residual stream's `row`: the input of block `row`, or the last block's output."""
    return f"blocks.{row}.hook_resid_pre" if row < n_layers else f"blocks.{n_layers - 1}.hook_resid_post"


@torch.no_grad()
def capture(model: Transformer, tokens: Tensor) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    """(logits, residual stream rows, head outputs) of one input (1, T): rows[l] (1, T, d) is the input of
    block l and rows[n_layers] the last block's output; heads[l] (1, T, H * d_head) is layer l's head
    outputs side by side (hook_z, the input of its output projection)."""
    n = len(model.decoder)
    rows: list[Tensor] = [torch.empty(0)] * (n + 1)
    heads: list[Tensor] = [torch.empty(0)] * n

    def keep(into: list[Tensor], i: int, flat: bool = False) -> HookFn:
        def fn(x: Tensor, hook: HookPoint) -> None:
            into[i] = (x.flatten(-2) if flat else x).clone()
        return fn
    hooks = [(_row_point(n, r), keep(rows, r)) for r in range(n + 1)]
    hooks += [(f"blocks.{layer}.attn.hook_z", keep(heads, layer, flat=True)) for layer in range(n)]
    with hooks_on(model.hook_dict, hooks):
        logits = model(tokens, None).logits
    return logits, rows, heads


def _put_rows(clean: Tensor, samples: Tensor, positions: Tensor) -> HookFn:
    """A residual-stream hook: sample samples[i] gets the clean stream (1, T, d) at positions[i]."""
    def put(x: Tensor, hook: HookPoint) -> Tensor:
        x = x.clone()
        x[samples, positions] = clean[0, positions]
        return x
    return put


def _put_heads(clean: Tensor, samples: Tensor, heads: Tensor) -> HookFn:
    """A hook_z hook: sample samples[i] gets head heads[i]'s clean output (clean: (1, T, H * d_head)) at
    every position."""
    def put(z: Tensor, hook: HookPoint) -> Tensor:
        z = z.clone()  # (B, T, H, dh)
        z[samples, :, heads] = clean.unflatten(-1, (z.shape[2], -1))[0, :, heads].transpose(0, 1)
        return z
    return put


@torch.no_grad()
def patch(model: Transformer, clean: Tensor, corrupt: Tensor) -> Patching:
    """Both grids for token ids `clean` and `corrupt` (1, T) of the same length."""
    _decoder(model)
    if clean.shape != corrupt.shape or clean.dim() != 2 or clean.shape[0] != 1:
        raise ValueError(f"corrupt: the clean and corrupted inputs must have the same length "
                         f"({clean.shape[-1]} and {corrupt.shape[-1]} tokens)")
    model.eval()
    clean_logits, clean_rows, clean_heads = capture(model, clean)
    corrupt_logits = model(corrupt, None).logits
    a, b = int(clean_logits[0, -1].argmax()), int(corrupt_logits[0, -1].argmax())
    if a == b:
        raise ValueError(f"corrupt: both inputs get the same answer (token {a}), so there is nothing to restore; "
                         "change the corrupted input so that its answer differs")
    ld_clean, ld_corrupt = float(_logit_diff(clean_logits, a, b)), float(_logit_diff(corrupt_logits, a, b))

    def restored(logits: Tensor) -> np.ndarray:
        return ((_logit_diff(logits, a, b) - ld_corrupt) / (ld_clean - ld_corrupt)).numpy()

    n_layers, t, n_heads = len(model.decoder), clean.shape[1], model.cfg.n_heads
    each_position, each_head = torch.arange(t), torch.arange(n_heads)
    residual = np.zeros((n_layers + 1, t))
    for row in range(n_layers + 1):  # a batch of T samples: sample i patches position i
        with hooks_on(model.hook_dict, [(_row_point(n_layers, row), _put_rows(clean_rows[row], each_position,
                                                                              each_position))]):
            residual[row] = restored(model(corrupt.expand(t, -1), None).logits)
    heads = np.zeros((n_layers, n_heads))
    for layer in range(n_layers):  # a batch of H samples: sample h patches head h at every position
        with hooks_on(model.hook_dict, [(f"blocks.{layer}.attn.hook_z",
                                         _put_heads(clean_heads[layer], each_head, each_head))]):
            heads[layer] = restored(model(corrupt.expand(n_heads, -1), None).logits)
    return Patching(a, b, ld_clean, ld_corrupt, residual, heads)


@torch.no_grad()
def patched(model: Transformer, corrupt: Tensor, clean_rows: list[Tensor], clean_heads: list[Tensor], kind: str,
            index: int, positions: list[int], need_weights: bool = False) -> Any:
    """The model's output (logits (1, T, vocab), and attention with `need_weights`) on the corrupted input
    (1, T) with one activation of the clean run (`capture`'s rows and heads) put in: kind "residual" replaces
    the residual stream's row `index` at `positions`, kind "head" replaces the output of head `index` of
    layer positions[0] at every position. One patch, unbatched: what a click on a grid's cell shows."""
    n_layers = len(model.decoder)
    if kind == "head":
        layer = positions[0]
        hook = (f"blocks.{layer}.attn.hook_z", _put_heads(clean_heads[layer], torch.tensor([0]), torch.tensor([index])))
    else:
        idx = torch.tensor(positions, dtype=torch.long)
        hook = (_row_point(n_layers, index), _put_rows(clean_rows[index], torch.zeros_like(idx), idx))
    with hooks_on(model.hook_dict, [hook]):
        return model(corrupt, None, need_weights=need_weights)


def patch_residual(model: Transformer, corrupt: Tensor, clean_rows: list[Tensor], row: int,
                   positions: list[int]) -> Tensor:
    """Logits (1, T, vocab) of the corrupted input (1, T) with the residual stream's `row` (as `capture`
    numbers them) replaced by the clean run's at `positions`: one patch, unbatched."""
    return patched(model, corrupt, clean_rows, [], "residual", row, positions).logits


def causal_cone(n_layers: int, t: int, row: int, position: int) -> np.ndarray:
    """(n_layers + 1, T) mask of the residual-stream cells a patch at (row, position) can change: later rows
    at the same or later positions (causal attention reads only earlier positions)."""
    rows, cols = np.meshgrid(np.arange(n_layers + 1), np.arange(t), indexing="ij")
    return (rows >= row) & (cols >= position)

