"""Measures of an attention snapshot that the presets' explanations quote: how much of a head's attention
falls on the previous token (the first half of an induction circuit, Olsson et al. 2022), and which
cross-attention head reads the input reversed (reversal's alignment, Bahdanau et al. 2015). Snapshots are
(layers, heads, Tq, Tk) arrays, as lab/engine/tensors.py loads them; both answer None without one.
"""
from __future__ import annotations

from typing import Any, Optional


def previous_token_share(self_attn: Any, layer: int, head: int) -> Optional[float]:
    """The share of a head's attention on the token just before the query (mean over query positions 1..),
    from a decoder's attention snapshot (layers, heads, T, T); None without one."""
    if self_attn is None or len(getattr(self_attn, "shape", ())) != 4 or self_attn.shape[-1] < 2:
        return None
    t = self_attn.shape[-1]
    return float(self_attn[layer, head, range(1, t), range(t - 1)].mean())


def anti_diagonal(cross: Any) -> Optional[tuple[int, int, float]]:
    """(layer, head, share): the cross-attention head that puts the most weight on input position L-1-t
    for output position t (reversal's alignment), averaged over t; None without a square pattern."""
    if cross is None or len(getattr(cross, "shape", ())) != 4 or cross.shape[-1] != cross.shape[-2]:
        return None
    t = cross.shape[-1]
    share = cross[:, :, range(t), [t - 1 - i for i in range(t)]].mean(-1)  # (layers, heads)
    layer, head = divmod(int(share.argmax()), share.shape[1])
    return layer, head, float(share[layer, head])
