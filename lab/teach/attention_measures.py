"""Measures of a trained run that the presets' explanations quote, and the sentences that quote them: how much
of a head's attention falls on the previous token (the first half of an induction circuit, Olsson et al.
2022), which cross-attention head reads the input reversed (reversal's alignment, Bahdanau et al. 2015), and
which head's knockout raises the held-out loss most (Michel et al. 2019).

Snapshots are (layers, heads, Tq, Tk) arrays, as lab/engine/tensors.py loads them; the attention measures
answer None without one. The knockout comes from `lab.views.probing.knockout_summary`, the function behind
Inspect's importance map and Learn's interventions page, on the run's own held-out set, so the card quotes the
same numbers as they do. Heads are named as Inspect labels them, counted from 0 (`head_name`).
"""
from __future__ import annotations

from typing import Any, Optional

from lab.interventions import head_name
from lab.records import DEC_SELF
from lab.views.probing import measured_on, median_ratio

SHARE_NAMED = 0.5  # a layer-0 head with at least this share on the previous token is called a previous-token head


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


def anti_diagonal_words(cross: Any) -> str:
    """Where output position t looks in the input, in words: the anti-diagonal head named as Inspect's
    cross-attention map labels it ("layer 1 head 2 puts 90% of ..."), or the pattern alone without a snapshot."""
    best = anti_diagonal(cross)
    if best is None:
        return "output position t reads input position L-1-t, an anti-diagonal"
    return (f"{head_name(best[0], best[1])} puts {100 * best[2]:.0f}% of output position t's cross-attention on "
            "input position L-1-t, an anti-diagonal (on the probe input, at the last attention snapshot)")


def _number(x: float) -> str:
    """As the presets write a number: 0.41, 2.2, 0.0003."""
    return f"{x:.2g}" if abs(x) < 0.01 else f"{x:.2f}"


def knockout_sentence(result: dict[str, Any]) -> str:
    """" Knocking out (zeroing) layer 0 head 1, which puts 89% of its attention on the previous token, raises
    its held-out loss from 0.79 to 8.02, 18x as much as the median head (+0.41; click its cell in Inspect). ..."
    from a run's measured result (lab.teach.presets.catalog.measured: its "knockout", "attention" and "steps"); "" without
    a knockout. A ratio only where the median head's knockout changes the loss measurably (`median_ratio`)."""
    k = result.get("knockout") or {}
    if not k:
        return ""
    share = previous_token_share((result.get("attention") or {}).get(DEC_SELF), k["layer"], k["index"])
    which = (f", which puts {100 * share:.0f}% of its attention on the previous token," if k["layer"] == 0
             and share is not None and share >= SHARE_NAMED else "")
    median = k["median_rise"]
    ratio = median_ratio(k["rise"], median)
    if ratio is not None:
        than = f", {ratio:.0f}x" if ratio >= 10 else f", {ratio:.1f}x"
        than += f" as much as the median head (+{_number(median)}; click its cell in Inspect)."
    else:
        than = (f" (+{_number(k['rise'])}), while the median head's knockout changes it by "
                f"{'+' if median >= 0 else '-'}{_number(abs(median))}, too little for a ratio (click its cell in "
                "Inspect).")
    where = ""
    if k.get("n"):
        steps = result.get("steps")
        where = (f" Both losses are measured on {measured_on(int(k['n']), int(steps) if steps else None)} (the "
                 "final weights)" + ("; the attention share on the probe input at the last snapshot." if which else "."))
    return (f" Knocking out (zeroing) {head_name(k['layer'], k['index'])}{which} raises its held-out loss from "
            f"{_number(k['intact'])} to {_number(k['ablated'])}" + than + where)
