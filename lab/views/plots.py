"""Matplotlib figure builders for pictures where the picture is the point (heatmaps, PCA, bars).

Every builder returns a fresh `matplotlib.figure.Figure` (never pyplot's global state, so
threads can draw at once) and uses colour-blind-safe colour maps (viridis, cividis).
"""
from __future__ import annotations

import io
import textwrap
from typing import Optional, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from lab.params import COMPONENTS
from lab.views.analysis import PositionalView

KIND_TITLES = {
    "enc_self": "Encoder self-attention",
    "dec_self": "Decoder self-attention (masked)",
    "cross": "Cross-attention (decoder queries, encoder keys)",
}
MAX_TICKS = 24  # past this many tokens, label every k-th one so labels stay readable


def attention_grid(patterns: np.ndarray, q_labels: Sequence[str], k_labels: Sequence[str],
                   title: str = "") -> Figure:
    """A layers x heads grid of heatmaps; patterns: (n_layers, n_heads, Tq, Tk), rows = queries.

    Drawn as one mosaic image on one axes (cells separated by blank gaps), token labels on the
    left and bottom edges only: matplotlib lays out each axes' tick labels on every draw, and a
    4 x 8 grid of separate axes took ~10 s to render where the mosaic takes ~0.4 s."""
    n_layers, n_heads, tq, tk = patterns.shape
    mosaic, gap = attention_mosaic(patterns)
    cell = min(2.6, max(1.6, 0.11 * max(tq, tk)))
    left, right, bottom, top_ = 0.75, 1.15, 0.8, 0.7  # margins in inches, fixed: a layout engine doubles the draw
    w, h = max(5.0, left + cell * n_heads + right), bottom + cell * n_layers + top_  # >= 5 in: room for the title
    fig = Figure(figsize=(w, h))
    ax = fig.add_axes((left / w, bottom / h, cell * n_heads / w, cell * n_layers / h))
    cax = fig.add_axes(((left + cell * n_heads + 0.5) / w, (bottom + 0.15 * cell * n_layers) / h, 0.12 / w,
                        0.7 * cell * n_layers / h))
    im = ax.imshow(mosaic, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    kx, qy = _tick_index(k_labels), _tick_index(q_labels)
    ax.set_xticks([h * (tk + gap) + i for h in range(n_heads) for i in kx],
                  [k_labels[i] for _ in range(n_heads) for i in kx], fontsize=7, rotation=90)
    ax.set_yticks([layer * (tq + gap) + i for layer in range(n_layers) for i in qy],
                  [q_labels[i] for _ in range(n_layers) for i in qy], fontsize=7)
    ax.tick_params(length=0)
    ax.set_xlabel("key (the token attended to)", fontsize=9)
    ax.set_ylabel("query (the token attending)", fontsize=9)
    top = ax.secondary_xaxis("top")
    top.set_ticks([h * (tk + gap) + (tk - 1) / 2 for h in range(n_heads)], [f"head {h}" for h in range(n_heads)],
                  fontsize=9)
    right = ax.secondary_yaxis("right")
    right.set_ticks([layer * (tq + gap) + (tq - 1) / 2 for layer in range(n_layers)],
                    [f"layer {layer}" for layer in range(n_layers)], fontsize=9, rotation=90, va="center")
    for axis in (ax, top, right):
        axis.tick_params(length=0)
        for spine in axis.spines.values():
            spine.set_visible(False)
    fig.colorbar(im, cax=cax, label="attention weight")
    fig.suptitle(title, fontsize=11, y=1 - 0.12 / h, va="top")
    return fig


def attention_mosaic(patterns: np.ndarray) -> tuple[np.ndarray, int]:
    """(n_layers, n_heads, Tq, Tk) -> one (n_layers*Tq + gaps, n_heads*Tk + gaps) image with NaN gaps
    between the cells, and the gap; the block of (layer, head) starts at (layer*(Tq+gap), head*(Tk+gap))."""
    n_layers, n_heads, tq, tk = patterns.shape
    gap = max(1, round(0.15 * max(tq, tk)))
    mosaic = np.full((n_layers * tq + (n_layers - 1) * gap, n_heads * tk + (n_heads - 1) * gap), np.nan,
                     dtype=np.float32)  # NaN gaps draw as background
    for layer in range(n_layers):
        for head in range(n_heads):
            r, c = layer * (tq + gap), head * (tk + gap)
            mosaic[r:r + tq, c:c + tk] = patterns[layer, head]  # (Tq, Tk) block at (layer, head)
    return mosaic, gap


def _tick_index(labels: Sequence[str]) -> list[int]:
    """Every token's index, or every k-th past MAX_TICKS tokens so labels stay readable."""
    return list(range(0, len(labels), max(1, -(-len(labels) // MAX_TICKS))))


def positional_figure(view: PositionalView, title: str = "", with_pca: bool = True) -> Figure:
    """PCA of the position vectors (coloured by position) beside their similarity matrix; for
    RoPE and ALiBi, the relative pattern they impose; for none, the explanation.
    `with_pca=False` draws the similarity matrix alone (the app shows the PCA as a native plot)."""
    fig = Figure(figsize=(9, 4) if with_pca else (5.2, 4.2), layout="constrained")
    if view.pca is not None and not with_pca:
        ax2 = fig.subplots()
        im = ax2.imshow(view.similarity, cmap="cividis", vmin=-1, vmax=1, interpolation="nearest")
        ax2.set_title("cosine similarity between positions", fontsize=10)
        ax2.set_xlabel("position")
        ax2.set_ylabel("position")
        fig.colorbar(im, ax=ax2, shrink=0.85)
    elif view.pca is not None:
        ax1, ax2 = fig.subplots(1, 2)
        n = view.pca.shape[0]
        ys = view.pca[:, 1] if view.pca.shape[1] > 1 else np.zeros(n)
        sc = ax1.scatter(view.pca[:, 0], ys, c=np.arange(n), cmap="viridis", s=28)
        ax1.plot(view.pca[:, 0], ys, color="0.7", lw=0.6, zorder=0)
        ev = view.explained
        ax1.set_xlabel(f"PC1 ({ev[0]:.0%} of variance)")
        ax1.set_ylabel(f"PC2 ({ev[1]:.0%} of variance)" if len(ev) > 1 else "")
        ax1.set_title("PCA of position vectors", fontsize=10)
        fig.colorbar(sc, ax=ax1, label="position")
        im = ax2.imshow(view.similarity, cmap="cividis", vmin=-1, vmax=1, interpolation="nearest")
        ax2.set_title("cosine similarity between positions", fontsize=10)
        ax2.set_xlabel("position")
        ax2.set_ylabel("position")
        fig.colorbar(im, ax=ax2)
    elif view.relative is not None:
        same = bool(np.all(view.relative == view.relative[:1]))  # RoPE: one pattern for every head
        heads = 1 if same else min(4 if with_pca else 2, view.relative.shape[0])
        axes = fig.subplots(1, heads, squeeze=False)[0]
        label = "score bias" if view.pos == "alibi" else "relative score"
        for h, ax in enumerate(axes):
            im = ax.imshow(view.relative[h], cmap="viridis", interpolation="nearest")
            ax.set_title("every head" if same else f"head {h}", fontsize=9)
            ax.set_xlabel("key position")
            if h == 0:
                ax.set_ylabel("query position")
        fig.colorbar(im, ax=list(axes), shrink=0.8, label=label)
    else:
        ax = fig.subplots()
        ax.axis("off")
        ax.text(0.5, 0.5, textwrap.fill(view.note or "", 70 if with_pca else 40), ha="center", va="center",
                fontsize=11)
    fig.suptitle(title, fontsize=11 if with_pca else 9)
    return fig


MAX_PARAM_BARS = 12  # past this many runs, runs with the same breakdown share one bar


def params_figure(breakdowns: dict[str, dict[str, int]]) -> Figure:
    """Stacked horizontal bars: parameters per component for each run. With more than
    MAX_PARAM_BARS runs, runs whose breakdowns are equal (same shapes, other seeds or PEs without
    parameters) share one bar labelled with the first run and how many more it stands for."""
    if len(breakdowns) > MAX_PARAM_BARS:
        same: dict[tuple, list[str]] = {}
        for name, parts in breakdowns.items():
            same.setdefault(tuple(parts.get(c, 0) for c in COMPONENTS), []).append(name)
        breakdowns = {(names[0] if len(names) == 1 else f"{names[0]} +{len(names) - 1} same"): breakdowns[names[0]]
                      for names in same.values()}
    names = list(breakdowns)
    fig = Figure(figsize=(8, 1.2 + 0.45 * len(names)), layout="constrained")
    ax = fig.subplots()
    left = np.zeros(len(names))
    colors = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00"]  # Okabe-Ito
    for comp, color in zip(COMPONENTS, colors):
        vals = np.array([breakdowns[n].get(comp, 0) for n in names], dtype=float)
        ax.barh(names, vals, left=left, color=color, label=comp)
        left += vals
    ax.set_xlabel("parameters")
    # the legend spans exactly the axes' width (mode="expand"), in two rows of three, so long run labels on
    # the y-axis can never push it past the figure's right edge (it was clipped there when centred)
    ax.legend(ncols=3, fontsize=8, loc="lower left", bbox_to_anchor=(0.0, 1.02, 1.0, 0.2), mode="expand",
              borderaxespad=0.0, frameon=False)
    ax.invert_yaxis()
    return fig


def curves_figure(df: pd.DataFrame, x: str, y: str, color: str, title: str = "",
                  band: Optional[tuple[str, str]] = None) -> Figure:
    """Line per `color` group of a long-format frame (for PNG export of the compare curves)."""
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.subplots()
    for name, g in df.groupby(color, sort=False):
        g = g.sort_values(x)
        line, = ax.plot(g[x], g[y], label=str(name), lw=1.4)
        if band is not None:
            ax.fill_between(g[x], g[band[0]], g[band[1]], color=line.get_color(), alpha=0.2)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(title)
    if df[color].nunique() <= 12:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def bands_figure(df: pd.DataFrame, x_label: str, y_label: str, title: str = "") -> Figure:
    """Mean curve per group with its min-max band (fill_between): columns group, x, mean, lo, hi.
    Groups without points yet are left out; with none at all, the figure says so."""
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.subplots()
    drawn = df.dropna(subset=["mean"]) if len(df) else df
    for name, g in (drawn.groupby("group", sort=False) if len(drawn) else []):
        g = g.sort_values("x")
        line, = ax.plot(g["x"], g["mean"], label=str(name), lw=1.6)
        ax.fill_between(g["x"], g["lo"], g["hi"], color=line.get_color(), alpha=0.2, lw=0)
    if not len(drawn):
        ax.text(0.5, 0.5, "No points yet: the runs are queued or starting.", ha="center", va="center",
                transform=ax.transAxes)
    elif drawn["group"].nunique() <= 12:
        ax.legend(fontsize=8)
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    return fig


def to_png(fig: Figure, dpi: int = 110) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()

