"""Matplotlib figure builders for pictures where the picture is the point (heatmaps, PCA, bars).

Every builder returns a fresh `matplotlib.figure.Figure` (never pyplot's global state, so
threads can draw at once) and uses colour-blind-safe colour maps (viridis, cividis).
"""
from __future__ import annotations

import io
import math
import textwrap
from typing import Collection, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import MaxNLocator

from lab.params import COMPONENTS
from lab.views.analysis import PositionalView
from lab.records import CROSS, DEC_SELF, ENC_SELF

KIND_TITLES = {
    ENC_SELF: "Encoder self-attention",
    DEC_SELF: "Decoder self-attention (masked)",
    CROSS: "Cross-attention (decoder queries, encoder keys)",
}
MAX_TICKS = 24  # past this many tokens, label every k-th one so labels stay readable


def attention_grid(patterns: np.ndarray, q_labels: Sequence[str], k_labels: Sequence[str],
                   title: str = "", silenced: Collection[tuple[int, int]] = ()) -> Figure:
    """A layers x heads grid of heatmaps; patterns: (n_layers, n_heads, Tq, Tk), rows = queries. The
    `silenced` (layer, head) cells, heads whose output an intervention removes, are hatched and labelled.

    Drawn as one mosaic image on one axes (cells separated by blank gaps), token labels on the
    left and bottom edges only: matplotlib lays out each axes' tick labels on every draw, so a grid of
    separate axes renders many times slower (benchmarks/RESULTS.md, "Measurements quoted in the code
    before")."""
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
    for layer, head in sorted(silenced):  # cell corners in mosaic coordinates (pixel centres at integers)
        x0, y0 = head * (tk + gap) - 0.5, layer * (tq + gap) - 0.5
        ax.add_patch(Rectangle((x0, y0), tk, tq, facecolor=(1, 1, 1, 0.55), edgecolor="#c0392b", hatch="//",
                               linewidth=1.5))
        ax.text(x0 + tk / 2, y0 + tq / 2, "output\nremoved", ha="center", va="center", fontsize=8,
                color="#c0392b", fontweight="bold")
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


MAX_HEAD_PANELS = 16  # past this many heads, a relative-pattern figure shows an evenly spaced 16 and says so


def pca_figure(view: PositionalView, title: str = "") -> Figure:
    """The position vectors projected on their first two principal components, one dot per position
    coloured by position, consecutive positions joined by a grey line, the first and last labelled.

    A complete picture in one image: the app draws it as a figure because a native (vega) plot that is
    sent new data and new axis limits at once redrew the new axes around the previous run's points."""
    if view.pca is None:
        raise ValueError(f"pca: a {view.pos!r} encoding has no position vectors to project")
    fig = Figure(figsize=(5.2, 4.2), layout="constrained")
    ax = fig.subplots()
    _draw_pca(fig, ax, view)
    if title:
        fig.suptitle(title, fontsize=9)
    return fig


def _draw_pca(fig: Figure, ax, view: PositionalView) -> None:
    n = view.pca.shape[0]
    xs = view.pca[:, 0]
    ys = view.pca[:, 1] if view.pca.shape[1] > 1 else np.zeros(n)  # (n,) second component, or a flat line
    sc = ax.scatter(xs, ys, c=np.arange(n), cmap="viridis", s=28, zorder=2)
    ax.plot(xs, ys, color="0.7", lw=0.6, zorder=1)
    for i in {0, n - 1}:
        ax.annotate(str(i), (xs[i], ys[i]), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ev = view.explained
    ax.set_xlabel(f"PC1 ({ev[0]:.0%} of variance)")
    ax.set_ylabel(f"PC2 ({ev[1]:.0%} of variance)" if len(ev) > 1 else "PC2 (none: one dimension)")
    ax.set_title(f"PCA of {n} position vectors", fontsize=10)
    bar = fig.colorbar(sc, ax=ax, label="position")
    bar.ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def positional_figure(view: PositionalView, title: str = "", with_pca: bool = True) -> Figure:
    """PCA of the position vectors (coloured by position) beside their similarity matrix; for
    RoPE and ALiBi, the relative pattern they impose (every head, on one colour scale); for none,
    the explanation. `with_pca=False` leaves the PCA out (the app shows it as its own `pca_figure`)."""
    fig = Figure(figsize=(9, 4) if with_pca else (5.2, 4.2), layout="constrained")
    if view.pca is not None:
        if with_pca:
            ax1, ax2 = fig.subplots(1, 2)
            _draw_pca(fig, ax1, view)
        else:
            ax2 = fig.subplots()
        im = ax2.imshow(view.similarity, cmap="cividis", vmin=-1, vmax=1, interpolation="nearest")
        ax2.set_title("cosine similarity between positions", fontsize=10)
        ax2.set_xlabel("position")
        ax2.set_ylabel("position")
        for axis in (ax2.xaxis, ax2.yaxis):
            axis.set_major_locator(MaxNLocator(integer=True))
        fig.colorbar(im, ax=ax2, shrink=0.85)
    elif view.relative is not None:
        _draw_relative(fig, view, wide=with_pca)
    else:
        ax = fig.subplots()
        ax.axis("off")
        ax.text(0.5, 0.5, textwrap.fill(view.note or "", 70 if with_pca else 40), ha="center", va="center",
                fontsize=11)
    fig.suptitle(title, fontsize=11 if with_pca else 9)
    return fig


def shown_heads(n_heads: int) -> list[int]:
    """The heads a relative-pattern figure draws: all of them, or MAX_HEAD_PANELS evenly spaced ones."""
    if n_heads <= MAX_HEAD_PANELS:
        return list(range(n_heads))
    return sorted({round(i * (n_heads - 1) / (MAX_HEAD_PANELS - 1)) for i in range(MAX_HEAD_PANELS)})


def _draw_relative(fig: Figure, view: PositionalView, wide: bool) -> None:
    """RoPE: one panel (every head shares its pattern). ALiBi: a panel per head, titled with the head's
    slope, all on one colour scale (a colour bar that belongs to one head would mislabel the others);
    the figure says how many heads it shows. `wide`: up to 4 panels a row, else a square-ish grid."""
    rel = view.relative  # (H, n, n)
    n_heads = rel.shape[0]
    same = n_heads > 1 and bool(np.all(rel == rel[:1]))  # RoPE: one pattern for every head
    heads = [0] if same else shown_heads(n_heads)
    cols = min(len(heads), 4) if wide else math.ceil(math.sqrt(len(heads)))
    rows = -(-len(heads) // cols)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    lo, hi = float(rel[heads].min()), float(rel[heads].max())
    is_alibi = view.pos == "alibi"
    for i, ax in enumerate(axes):
        if i >= len(heads):
            fig.delaxes(ax)  # the last row's empty places
            continue
        h = heads[i]
        im = ax.imshow(rel[h], cmap="viridis", vmin=lo, vmax=hi, interpolation="nearest")
        slope = f"\nslope {-rel[h][1, 0]:.2g}" if is_alibi and rel.shape[1] > 1 else ""  # bias(1, 0) = -slope
        ax.set_title("every head" if same else f"head {h}{slope}", fontsize=9 if len(heads) <= 4 else 7)
        ax.tick_params(labelsize=7)
        if i // cols == rows - 1:
            ax.set_xlabel("key position", fontsize=8)
        if i % cols == 0:
            ax.set_ylabel("query position", fontsize=8)
    fig.colorbar(im, ax=list(axes[:len(heads)]), shrink=0.8, label="score bias" if is_alibi else "relative score")
    what = "ALiBi score bias" if is_alibi else "RoPE relative score"
    if same:
        count = f"one pattern shared by all {n_heads} heads"
    elif n_heads == 1:
        count = "its one head"
    elif len(heads) == n_heads:
        count = f"all {n_heads} heads"
    else:
        count = f"{len(heads)} of {n_heads} heads (evenly spaced)"
    fig.supxlabel(f"{what}: {count}", fontsize=8)


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
    colors = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442"]  # Okabe-Ito
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

