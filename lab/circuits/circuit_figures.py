"""What Inspect's circuits panel draws: head roles over training (heads x snapshot steps, the held-out loss
under it on the same step axis) and the grids of activation patching, as tables a click can pick a cell of.

The scores are head_roles.py's (Olsson et al. 2022's roles), the grids patching.py's (Meng et al. 2022's
causal tracing; NDIF Workbench's patch lens draws the residual grid the same way). Colours are viridis for
a share of attention (0..1) and a diverging blue-red for a restored fraction (1 = the clean answer back,
0 = none of it, below 0 = further from it). The causal cone of a picked residual cell, the cells a patch
there can change (later rows, same or later positions), is outlined. No gradio here.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from pandas.io.formats.style import Styler

from lab.circuits.fourier import Spectrum
from lab.circuits.head_roles import INDUCTION_FORMS, HeadScores, steepest_fall
from lab.circuits.patching import Patching, causal_cone
from lab.interventions import head_name

BLUE, RED, GREY = "#0072B2", "#D55E00", "0.85"
CONE = "box-shadow: inset 0 0 0 3px #D55E00"  # the outline of a cell inside the picked cell's causal cone
PICKED = "box-shadow: inset 0 0 0 4px #000000"


def nearest(series: Sequence[HeadScores], step: Optional[float]) -> HeadScores:
    """The scores at the snapshot step nearest `step` (None: the last)."""
    return series[-1] if step is None else min(series, key=lambda s: abs(s.step - float(step)))


def _edges(steps: Sequence[int]) -> np.ndarray:
    """Cell edges on the step axis: half-way between snapshot steps, half a gap beyond the ends."""
    s = np.asarray(steps, dtype=float)
    if len(s) == 1:
        return np.array([s[0] - 0.5, s[0] + 0.5])
    mid = (s[1:] + s[:-1]) / 2
    return np.concatenate([[s[0] - (mid[0] - s[0])], mid, [s[-1] + (s[-1] - mid[-1])]])


def roles_figure(series: Sequence[HeadScores], losses: Sequence[tuple[int, float]], score: str,
                 at: Optional[int] = None) -> Figure:
    """Heads x snapshot steps of one role's score, the held-out loss under it on the same step axis, and a
    line at step `at` (the step slider's snapshot) through both."""
    steps = [h.step for h in series]
    n_layers, n_heads = series[0].scores[score].shape
    names = [head_name(layer, head) for layer in range(n_layers) for head in range(n_heads)]
    grid = np.stack([h.scores[score].reshape(-1) for h in series], axis=1)  # (heads, steps)
    fig = Figure(figsize=(9.0, 1.2 + 0.3 * len(names) + 2.0), layout="constrained")
    ax, ax_loss = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [max(1.0, 0.3 * len(names)), 2.0]})
    mesh = ax.pcolormesh(_edges(steps), np.arange(len(names) + 1) - 0.5, grid, cmap="viridis", vmin=0.0, vmax=1.0)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_title(f"{score} score of every head at each snapshot (1 = all its attention on the role's key)",
                 fontsize=10)
    fig.colorbar(mesh, ax=ax, shrink=0.9, label="score")
    if losses:
        xs, ys = zip(*sorted(losses))
        ax_loss.plot(xs, ys, color=BLUE, lw=1.6, marker="o", ms=3, label="held-out loss")
        fall = steepest_fall(losses)
        if fall:
            ax_loss.axvspan(fall[0], fall[1], color=GREY, zorder=0, label="its steepest fall")
        ax_loss.legend(fontsize=8, loc="upper right")
    if score == "induction":
        ax.text(1.0, -0.02, f"white dots: above {INDUCTION_FORMS}", transform=ax.transAxes, ha="right", va="top",
                fontsize=8)
        for r, c in zip(*np.nonzero(grid > INDUCTION_FORMS)):
            ax.plot(steps[c], r, "o", color="white", ms=3)
    if at is not None:
        for a in (ax, ax_loss):
            a.axvline(at, color=RED, lw=1.4, ls="--")
        ax_loss.text(at, 1.0, f" step {at}", color=RED, transform=ax_loss.get_xaxis_transform(), va="top",
                     fontsize=9)
    ax_loss.set_xlabel("training step", fontsize=9)
    ax_loss.set_ylabel("held-out loss", fontsize=9)
    ax_loss.grid(alpha=0.3)
    return fig


def fourier_figure(spectra: Sequence[Spectrum], accuracy: dict[str, Sequence[tuple[int, float]]],
                   at: Optional[int] = None) -> Figure:
    """Grokking's Fourier picture (Nanda et al. 2023) over training, on one step axis: each frequency's share
    of the token embedding's non-constant power at each snapshot, the share of the strongest few, and the
    training and held-out accuracy (`accuracy`: name -> (step, exact-match) points); a line at step `at`."""
    steps = [s.step for s in spectra]
    shares = np.stack([s.power / max(float(s.power.sum()), 1e-12) for s in spectra], axis=1)  # (freqs, steps)
    fig = Figure(figsize=(9.0, 7.2), layout="constrained")
    ax, ax_share, ax_acc = fig.subplots(3, 1, sharex=True, gridspec_kw={"height_ratios": [2.4, 1.2, 1.4]})
    mesh = ax.pcolormesh(_edges(steps), np.arange(shares.shape[0] + 1) + 0.5, shares, cmap="viridis",
                         vmin=0.0, vmax=max(float(shares.max()), 1e-6))
    ax.set_ylabel("frequency k", fontsize=9)
    ax.set_title("the token embedding's power in each frequency of Z_p (share of its non-constant power)",
                 fontsize=10)
    fig.colorbar(mesh, ax=ax, shrink=0.9, label="share")
    top = len(spectra[-1].top)
    ax_share.plot(steps, [s.fraction for s in spectra], color=RED, lw=1.8, marker="o", ms=3)
    ax_share.axhline(top / max(shares.shape[0], 1), color="0.5", ls=":", lw=1.0)
    ax_share.set_ylim(0, 1)
    ax_share.set_ylabel(f"top {top} share", fontsize=9)
    ax_share.grid(alpha=0.3)
    for (name, points), colour in zip(accuracy.items(), (BLUE, "#009E73")):
        if points:
            xs, ys = zip(*sorted(points))
            ax_acc.plot(xs, ys, color=colour, lw=1.6, label=name)
    ax_acc.set_ylim(-0.02, 1.02)
    ax_acc.set_ylabel("exact-match", fontsize=9)
    ax_acc.set_xlabel("training step", fontsize=9)
    ax_acc.legend(fontsize=8, loc="lower right")
    ax_acc.grid(alpha=0.3)
    if at is not None:
        for a in (ax, ax_share, ax_acc):
            a.axvline(at, color=RED if a is not ax_share else "0.2", lw=1.4, ls="--")
    return fig


def _css(value: float, lo: float, hi: float, cmap: str) -> str:
    rgba = colormaps[cmap](float(np.clip((value - lo) / (hi - lo), 0.0, 1.0)))
    luminance = 0.2126 * rgba[0] + 0.7152 * rgba[1] + 0.0722 * rgba[2]
    return f"background-color: {to_hex(rgba)}; color: {'#000000' if luminance > 0.45 else '#ffffff'}"


def roles_frame(scores: HeadScores, score: str) -> Styler:
    """One role's score of every head at one step: rows "layer L", columns "head H" (counted from 0)."""
    s = scores.scores[score]  # (n_layers, n_heads)
    heads = [f"head {h}" for h in range(s.shape[1])]
    frame = pd.DataFrame([[f"layer {layer}"] + [f"{v:.2f}" for v in row] for layer, row in enumerate(s)],
                         columns=["layer"] + heads)
    colours = pd.DataFrame([[_css(v, 0.0, 1.0, "viridis") for v in row] for row in s], columns=heads)
    return frame.style.apply(lambda _: colours, axis=None, subset=heads).hide(axis="index")


def residual_rows(n_layers: int) -> list[str]:
    """The residual grid's row labels: the stream entering each layer, then the last layer's output."""
    return [f"into layer {layer}" for layer in range(n_layers)] + [f"after layer {n_layers - 1}"]


def position_columns(clean: Sequence[str], corrupt: Sequence[str]) -> list[str]:
    """One column per position: "5: 7", or "5: 7/12" where the corrupted input differs."""
    return [f"{t}: {a}" if a == b else f"{t}: {a}/{b}" for t, (a, b) in enumerate(zip(clean, corrupt))]


def _grid(values: np.ndarray, rows: list[str], columns: list[str], first: str,
          outlined: Optional[np.ndarray] = None, picked: Optional[tuple[int, int]] = None) -> Styler:
    frame = pd.DataFrame([[r] + [f"{round(float(v), 2) + 0.0:.2f}" for v in row] for r, row in zip(rows, values)],
                         columns=[first] + columns)
    css = [[_css(v, -1.0, 1.0, "RdBu") + (f"; {CONE}" if outlined is not None and outlined[i, j] else "")
            + (f"; {PICKED}" if picked == (i, j) else "") for j, v in enumerate(row)]
           for i, row in enumerate(values)]
    colours = pd.DataFrame(css, columns=columns)
    return frame.style.apply(lambda _: colours, axis=None, subset=columns).hide(axis="index")


def residual_frame(p: Patching, clean: Sequence[str], corrupt: Sequence[str],
                   picked: Optional[tuple[int, int]] = None) -> Styler:
    """The residual-stream grid (rows x positions), with the causal cone of the `picked` (row, position)."""
    cone = None if picked is None else causal_cone(p.heads.shape[0], p.residual.shape[1], *picked)
    return _grid(p.residual, residual_rows(p.heads.shape[0]), position_columns(clean, corrupt), "residual stream",
                 cone, picked)


def heads_frame(p: Patching, picked: Optional[tuple[int, int]] = None) -> Styler:
    """The head-output grid (layers x heads), the `picked` (layer, head) outlined."""
    n_layers, n_heads = p.heads.shape
    return _grid(p.heads, [f"layer {layer}" for layer in range(n_layers)], [f"head {h}" for h in range(n_heads)],
                 "head output", None, picked)
