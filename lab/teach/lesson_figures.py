"""One matplotlib figure per Learn page, drawn live from a `lab.teach.lessons.Subject`, and a caption that
says what the picture shows, written from the measured values (never canned).

`page_figure(key, subject, probe_text)` is the one entry point. Figures are fresh `Figure`s (never
pyplot state) in colour-blind-safe colours (viridis / cividis / PuOr, Okabe-Ito lines), like
lab.views.plots, whose attention grid the heads and cross-attention pages reuse.
"""
from __future__ import annotations

import math

import textwrap
from typing import Callable, Optional, Sequence

import numpy as np
import torch
from matplotlib import colormaps
from matplotlib.figure import Figure

from lab.interventions import head_name
from lab.teach import lesson_circuits, lesson_interventions, lessons
from lab.params import COMPONENTS
from lab.records import CROSS, DEC_SELF, ENC_SELF
from lab.views.analysis import ProbeInput, positional_view
from lab.config import ConfigError
from lab.teach.lesson_pages import PAGE_KEYS
from lab.views.plots import KIND_TITLES, attention_grid

BLUE, ORANGE, GREEN, PINK, SKY, RED = "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00"
MAX_TICKS = 24


def _fig(n: int, height: float = 3.6) -> tuple[Figure, list]:
    fig = Figure(figsize=(4.0 * n + 0.6, height), layout="constrained")
    return fig, list(fig.subplots(1, n, squeeze=False)[0])


def _labels(ax, labels: Sequence[str], axis: str) -> None:
    step = max(1, -(-len(labels) // MAX_TICKS))
    idx = list(range(0, len(labels), step))
    (ax.set_xticks if axis == "x" else ax.set_yticks)(idx, [labels[i] for i in idx], fontsize=7)


def _heat(fig: Figure, ax, data: np.ndarray, title: str, rows: Sequence[str] = (), cols: Sequence[str] = (),
          cmap: str = "viridis", vmin: Optional[float] = None, vmax: Optional[float] = None) -> None:
    cm = colormaps[cmap].with_extremes(bad="0.8")  # masked (NaN) cells: grey
    im = ax.imshow(data, cmap=cm, vmin=vmin, vmax=vmax, aspect="auto", interpolation="nearest")
    ax.set_title(title, fontsize=10)
    if rows:
        _labels(ax, list(rows), "y")
    if cols:
        _labels(ax, list(cols), "x")
    fig.colorbar(im, ax=ax, shrink=0.8)


def _symmetric(*arrays: np.ndarray) -> float:
    return float(max(np.nanmax(np.abs(a)) for a in arrays)) or 1.0


def _text(message: str) -> Figure:
    fig, (ax,) = _fig(1, 2.4)
    ax.axis("off")
    ax.text(0.5, 0.5, textwrap.fill(message, 80), ha="center", va="center", fontsize=11)
    return fig


# ---- the pages ---------------------------------------------------------------------------
def embedding(s: lessons.Subject, probe: ProbeInput) -> tuple[Figure, str]:
    table, labels, sim = lessons.embedding_table(s)
    fig, (a1, a2) = _fig(2)
    _heat(fig, a1, table, f"E: {table.shape[0]} tokens x d_model {table.shape[1]}", rows=labels, cmap="PuOr",
          vmin=-_symmetric(table), vmax=_symmetric(table))
    a1.set_xlabel("dimension")
    _heat(fig, a2, sim, "cosine similarity of token vectors", rows=labels, cols=labels, cmap="PuOr", vmin=-1, vmax=1)
    off = np.abs(sim[~np.eye(len(sim), dtype=bool)])
    chance = np.sqrt(2 / np.pi / table.shape[1])  # E|cos| of two random directions in d dimensions (large d)
    return fig, (f"Mean |similarity| between different tokens: {off.mean():.2f} (largest {off.max():.2f}); "
                 f"random vectors of {table.shape[1]} numbers would give about {chance:.2f}.")


def positional(s: lessons.Subject, probe: ProbeInput) -> tuple[Figure, str]:
    pb = lessons.positions_beyond(s)
    fig, (a1, a2, a3) = _fig(3)
    view = positional_view(s.cfg, s.weights, pb.n_ctx)  # every panel over the same positions: the whole table
    if view.similarity is not None:
        _heat(fig, a1, view.similarity, f"this model ({view.pos}): cosine similarity", cmap="PuOr", vmin=-1, vmax=1)
        a1.set_xlabel("position")
        a1.set_ylabel("position")
    elif view.relative is not None:
        what = "bias of head 0" if view.pos == "alibi" else "relative score"
        _heat(fig, a1, view.relative[0], f"this model ({view.pos}): {what}")
        a1.set_xlabel("key position")
        a1.set_ylabel("query position")
    else:
        a1.axis("off")
        a1.text(0.5, 0.5, textwrap.fill(view.note or "", 36), ha="center", va="center", fontsize=9)
    if pb.sin_next is not None:
        a2.plot(np.arange(len(pb.sin_next)), pb.sin_next, color=BLUE, label="sinusoidal (formula)")
    a2.plot(np.arange(len(pb.learned_next)), pb.learned_next, color=ORANGE, label="learned table")
    for ax in (a2, a3):
        ax.axvline(pb.train_len - 0.5, color="0.3", ls="--", lw=1, label="training length")
        ax.axvline(pb.n_ctx - 0.5, color="0.3", ls=":", lw=1, label="n_ctx (end of the table)")
        ax.set_xlabel("position t")
        ax.grid(alpha=0.3)
    right = len(pb.sin_next) if pb.sin_next is not None else pb.n_ctx  # both line panels share one x-range
    for ax in (a2, a3):
        ax.set_xlim(-1, right)
    a2.set_title("similarity of position t to t+1", fontsize=10)
    a2.legend(fontsize=7)
    a3.plot(np.arange(len(pb.learned_moved)), pb.learned_moved, color=ORANGE)
    a3.set_title(textwrap.fill(f"learned: how far each row moved in training ({pb.learned_source})", 50), fontsize=9)
    inside, past = pb.learned_moved[:pb.train_len], pb.learned_moved[pb.train_len:]
    sin = "" if pb.sin_next is None else (f"Sinusoidal neighbours stay equally similar everywhere "
                                          f"({pb.sin_next.min():.3f} to {pb.sin_next.max():.3f}). ")
    if not (s.trained and s.cfg.model.pos == "learned"):
        moved = "The learned table shown is untrained, so no row has moved: pick a trained learned-PE run."
    elif len(past) and past.max() == 0:
        moved = (f"Learned rows inside the training length moved by up to {inside.max():.2f}; the "
                 f"{len(past)} rows past it did not move at all: they are still their random initial values.")
    else:
        moved = (f"Learned rows inside the training length moved by up to {inside.max():.2f}; past it by at most "
                 f"{past.max() if len(past) else 0:.2g}.")
    return fig, sin + moved


def qkv(s: lessons.Subject, probe: ProbeInput) -> tuple[Figure, str]:
    a = lessons.first_layer_attention(s, probe)
    fig, axes = _fig(3)
    lim = _symmetric(a.q[0], a.k[0], a.v[0])
    for ax, name, m in zip(axes, ("queries Q", "keys K", "values V"), (a.q[0], a.k[0], a.v[0])):
        _heat(fig, ax, m, f"{name} ({head_name(0, 0)})", rows=a.labels, cmap="PuOr", vmin=-lim, vmax=lim)
        ax.set_xlabel("d_k")
    return fig, (f"{len(a.labels)} tokens, each with a query, key and value of d_k = {a.q.shape[2]} numbers in each "
                 f"of {a.q.shape[0]} heads. Largest |entry|: Q {np.abs(a.q).max():.2f}, K {np.abs(a.k).max():.2f}, "
                 f"V {np.abs(a.v).max():.2f}.")


def scaling(s: lessons.Subject, probe: ProbeInput) -> tuple[Figure, str]:
    spread, a = lessons.dot_product_spread(), lessons.first_layer_attention(s, probe)
    fig, (a1, a2, a3) = _fig(3)
    a1.loglog(spread["d_k"], spread["unscaled"], "o-", color=RED, label="q·k")
    a1.loglog(spread["d_k"], spread["scaled"], "o-", color=BLUE, label="q·k / √d_k")
    dk = a.q.shape[2]
    a1.axvline(dk, color="0.3", ls="--", lw=1, label=f"this model: d_k = {dk}")
    a1.set_xlabel("d_k")
    a1.set_ylabel("std of the score (solid)", fontsize=8)
    a1.set_title("random unit-variance q, k", fontsize=9)
    ent = a1.twinx()  # the softmax's entropy over 16 keys: ln 16 is uniform, 0 one-hot
    ent.semilogx(spread["d_k"], spread["entropy_unscaled"], "s--", color=RED, alpha=0.6, ms=3)
    ent.semilogx(spread["d_k"], spread["entropy_scaled"], "s--", color=BLUE, alpha=0.6, ms=3)
    ent.set_ylim(0, math.log(spread["keys"]) * 1.05)
    ent.set_ylabel(f"softmax entropy, {spread['keys']} keys (dashed)", fontsize=7)
    a1.legend(fontsize=7, loc="upper left")
    a1.grid(alpha=0.3)
    i = int(np.argmin(np.abs(spread["d_k"] - dk)))
    peak, peak_raw = a.pattern.max(-1).mean(), a.unscaled.max(-1).mean()
    own = abs(peak - peak_raw) >= 0.1  # the model's own q, k are large enough for the scaling to show
    scaled, unscaled = (a.pattern, a.unscaled) if own else a.unit
    how = "" if own else " (q, k at unit variance)"
    _heat(fig, a2, scaled[0], f"with the scaling{how}", rows=a.labels, cols=a.labels, vmin=0, vmax=1)
    _heat(fig, a3, unscaled[0], f"scaling removed{how}", rows=a.labels, cols=a.labels, vmin=0, vmax=1)
    top = len(spread["d_k"]) - 1
    text = (f"At d_k = {spread['d_k'][i]}, random scores spread {spread['unscaled'][i]:.1f} unscaled against "
            f"{spread['scaled'][i]:.2f} scaled; a softmax over {spread['keys']} random keys keeps "
            f"{spread['entropy_scaled'][i]:.2f} nats of entropy scaled, {spread['entropy_unscaled'][i]:.2f} unscaled "
            f"(at d_k = {spread['d_k'][top]}: {spread['entropy_scaled'][top]:.2f} against "
            f"{spread['entropy_unscaled'][top]:.2f}; uniform is ln {spread['keys']} = {math.log(spread['keys']):.2f}). "
            f"In this model the largest weight per row averages {peak:.2f}; "
            f"without the scaling it would be {peak_raw:.2f}.")
    if own:
        return fig, text
    u, u_raw = a.unit[0].max(-1).mean(), a.unit[1].max(-1).mean()
    return fig, text + (f" Its queries and keys are still small (untrained), so the pictures show them rescaled "
                        f"to unit variance, as the paper's argument assumes: {u:.2f} with the scaling, "
                        f"{u_raw:.2f} without, where softmax saturates on one key.")


def mask(s: lessons.Subject, probe: ProbeInput) -> tuple[Figure, str]:
    a, leak = lessons.first_layer_attention(s, probe), lessons.causal_leak(s, probe)
    fig, (a1, a2, a3) = _fig(3)
    _heat(fig, a1, np.where(a.future, np.nan, a.scores[0]), "scores + mask (grey = -inf)", rows=a.labels, cols=a.labels)
    _heat(fig, a2, a.pattern[0], "weights after softmax", rows=a.labels, cols=a.labels, vmin=0, vmax=1)
    for ax in (a1, a2):
        ax.set_xlabel("key")
        ax.set_ylabel("query")
    x = np.arange(len(leak.masked))
    a3.bar(x - 0.2, leak.unmasked, 0.4, color=RED, label="without the mask")
    a3.bar(x + 0.2, leak.masked, 0.4, color=BLUE, label="with the mask")
    a3.axvline(leak.changed, color="0.3", ls="--", lw=1, label=f"token {leak.changed} changed")
    a3.set_yscale("symlog", linthresh=1e-4)
    a3.set_ylim(0, 3 * max(leak.masked.max(initial=0), leak.unmasked.max(initial=0), 1e-4))  # no bar cut off
    _labels(a3, [str(i) for i in x], "x")
    a3.set_xlabel("output position")
    a3.set_title("largest change of the output logits", fontsize=10)
    a3.legend(fontsize=7, ncols=2, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    masked = float(leak.masked[:leak.changed].max(initial=0.0))
    unmasked = float(leak.unmasked[:leak.changed].max(initial=0.0))
    above = float(a.pattern[0][a.future].max(initial=0.0))
    return fig, (f"The largest weight above the diagonal is {above:g}. Changing token {leak.changed} moved the "
                 f"outputs before it by {'exactly 0' if masked == 0 else f'up to {masked:.2g}'} with the mask, "
                 f"and by up to {unmasked:.2g} without it.")


def softmax(s: lessons.Subject, probe: ProbeInput) -> tuple[Figure, str]:
    a = lessons.first_layer_attention(s, probe)
    i = len(a.labels) - 1
    scores, weights = a.scores[0, i], a.pattern[0, i]
    visible = ~a.future[i]
    fig, (a1, a2) = _fig(2)
    x = np.arange(len(scores))
    a1.bar(x[visible], scores[visible], color=BLUE)
    a1.set_title(f"scores s of query {i} ('{a.labels[i]}')", fontsize=10)
    a2.bar(x, weights, color=GREEN)
    a2.set_title(f"weights softmax(s): sum = {weights.sum():.3f}", fontsize=10)
    for ax in (a1, a2):
        _labels(ax, a.labels, "x")
        ax.set_xlabel("key")
        ax.grid(alpha=0.3, axis="y")
    j = int(np.argmax(weights))
    return fig, (f"The largest score (key {j}, '{a.labels[j]}', {scores[j]:.2f}) gets {weights[j]:.0%} of the "
                 f"weight; {visible.sum()} keys are visible to this query and the weights sum to {weights.sum():.3f}.")


def heads(s: lessons.Subject, probe: ProbeInput) -> tuple[Figure, str]:
    pats = lessons.patterns(s, probe)
    kind = ENC_SELF if ENC_SELF in pats else DEC_SELF
    labels = probe.src_labels if kind == ENC_SELF else probe.dec_labels
    p = pats[kind]
    fig = attention_grid(p, labels, labels, KIND_TITLES[kind])
    entropy = -(p * np.log(np.clip(p, 1e-12, 1.0))).sum(-1).mean(-1)  # (L, H): mean over queries
    lo = np.unravel_index(np.argmin(entropy), entropy.shape)
    return fig, (f"{KIND_TITLES[kind]}: {p.shape[0]} layers x {p.shape[1]} heads. The most focused head is "
                 f"{head_name(lo[0], lo[1])} (mean entropy {entropy[lo]:.2f} nats; uniform over the keys would be up to "
                 f"{np.log(p.shape[-1]):.2f}).")


def norm(s: lessons.Subject, probe: ProbeInput) -> tuple[Figure, str]:
    r = lessons.norm_placement(s.cfg)
    fig, axes = _fig(3)
    layers = np.arange(r.n_layers)
    for ax, init, title in zip(axes[:2], ("xavier", "lab"), ("Xavier init (Xiong et al.)", "this lab's init (GPT-2)")):
        ax.plot(layers, r.grad[(init, "pre")], "o-", color=BLUE, label="pre-LN")
        ax.plot(layers, r.grad[(init, "post")], "s-", color=ORANGE, label="post-LN")
        ax.set_title(f"gradient norm per layer, {title}", fontsize=9)
        ax.set_xlabel("layer")
        ax.set_ylim(bottom=0)
    depth = np.arange(r.n_layers + 1)
    for norm_, color in (("pre", BLUE), ("post", ORANGE)):
        axes[2].plot(depth, r.stream[("xavier", norm_)], "o-", color=color, label=f"{norm_}-LN, Xavier")
        axes[2].plot(depth, r.stream[("lab", norm_)], ":", color=color, label=f"{norm_}-LN, lab init")
    axes[2].set_title("RMS of the residual stream", fontsize=10)
    axes[2].set_xlabel("after layer (0 = the embeddings)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    g, grows = r.grad, r.stream[("xavier", "pre")]
    return fig, (f"{r.n_layers} layers, one backward pass. Xavier init: the last layer's gradient is "
                 f"{g[('xavier', 'post')][-1]:.2f} with post-LN and {g[('xavier', 'pre')][-1]:.2f} with pre-LN, whose "
                 f"residual stream grows from {grows[0]:.2f} to {grows[-1]:.2f} (post-LN keeps it at 1). Lab init: "
                 f"{g[('lab', 'post')][-1]:.3f} against {g[('lab', 'pre')][-1]:.3f}" + _alike(g[("lab", "post")][-1],
                                                                                    g[("lab", "pre")][-1]))


def _alike(post: float, pre: float) -> str:
    ratio = post / pre if pre > 0 else float("inf")
    if 0.8 <= ratio <= 1.25:
        return "; its small residual branches make the two placements start alike."
    return f": post-LN's last layer gets {ratio:.1f}x pre-LN's gradient."


def ff(s: lessons.Subject, probe: ProbeInput) -> tuple[Figure, str]:
    units = lessons.ff_units(s, probe)
    if units is None:
        return _text("This model is attention-only (d_ff = 0): its blocks have no feed-forward network. "
                     "Pick another run, or the untrained default model."), "Attention-only model: nothing to draw."
    z, act = units
    fig, (a1, a2) = _fig(2)
    _heat(fig, a1, act, f"hidden units after {s.cfg.model.activation.upper()} (layer 0)", rows=probe.dec_labels,
          cmap="cividis")
    a1.set_xlabel(f"unit (d_ff = {z.shape[1]})")
    a2.hist(z.ravel(), bins=60, color=SKY, density=True)
    a2.set_xlabel("W1 x + b1")
    a2.set_title("inputs of the hidden units, and φ", fontsize=10)
    xs = np.linspace(z.min(), z.max(), 200)
    phi = torch.nn.functional.gelu if s.cfg.model.activation == "gelu" else torch.relu
    twin = a2.twinx()
    twin.plot(xs, phi(torch.from_numpy(xs)).numpy(), color=RED, label="φ")
    twin.set_ylabel("φ(z)", color=RED)
    return fig, (f"{(z > 0).mean():.0%} of the {z.size} unit inputs are positive (active); the largest output is "
                 f"{act.max():.2f}.")


def cross(s: lessons.Subject, probe: ProbeInput) -> tuple[Figure, str]:
    try:
        ed = lessons.as_encoder_decoder(s)
    except ConfigError as exc:
        return _text(f"The chosen model is {s.cfg.model.arch}-only, so it has no cross-attention; and an untrained "
                     f"encoder-decoder cannot be built for its task, {s.cfg.task.name}, to draw one instead ({exc}). "
                     "Pick an encoder-decoder run, e.g. from the Original encoder-decoder preset."), \
            f"No cross-attention to draw: the chosen model is {s.cfg.model.arch}-only."
    probe = probe if ed is s else ed.probe()
    p = lessons.patterns(ed, probe)[CROSS]
    fig = attention_grid(p, probe.dec_labels, probe.src_labels, KIND_TITLES[CROSS])
    n = p.shape[-1]
    rows = min(p.shape[2], n)
    anti = (p[:, :, :rows].argmax(-1) == (n - 1 - np.arange(rows))).mean(-1)  # (L, H) rows on the anti-diagonal
    best = np.unravel_index(np.argmax(anti), anti.shape)
    note = "" if ed is s else f"Shown: {ed.source}. "
    return fig, (f"{note}The head closest to the anti-diagonal (output i reads input n-1-i) is "
                 f"{head_name(best[0], best[1])}: {anti[best]:.0%} of its rows.")


def output(s: lessons.Subject, probe: ProbeInput) -> tuple[Figure, str]:
    probs, labels, tgt = lessons.next_token_probs(s, probe)
    layers, parts = lessons.params_by_layers(s.cfg)
    fig, (a1, a2) = _fig(2)
    _heat(fig, a1, probs, "p(next token) at each position", rows=probe.dec_labels, cols=labels, vmin=0, vmax=1)
    scored = np.flatnonzero(tgt >= 0)
    a1.scatter(tgt[scored], scored, s=16, facecolors="none", edgecolors=RED, linewidths=1.2)
    a1.set_xlabel("next token")
    bottom = np.zeros(len(layers))
    for comp, color in zip(COMPONENTS, (BLUE, ORANGE, GREEN, PINK, SKY, RED)):
        a2.bar(layers, parts[comp], bottom=bottom, color=color, label=comp)
        bottom += parts[comp]
    built = s.model().num_params()
    a2.plot([s.cfg.model.n_layers], [built], "o", color="black", ms=7, label="model built")
    a2.set_xlabel("number of layers")
    a2.set_title("parameters (closed form)", fontsize=10)
    a2.legend(fontsize=7)
    per_layer = int(bottom[1] - bottom[0])
    right = float(probs[scored, tgt[scored]].mean()) if len(scored) else float("nan")
    return fig, (f"{built:,} parameters at {s.cfg.model.n_layers} layers (formula: "
                 f"{int(bottom[s.cfg.model.n_layers - 1]):,}); each extra layer adds {per_layer:,}. Mean probability "
                 f"of the right answer: {right:.2f}.")


DRAW: dict[str, Callable[[lessons.Subject, ProbeInput], tuple[Figure, str]]] = {
    "embedding": embedding, "positional": positional, "qkv": qkv, "scaling": scaling, "mask": mask,
    "softmax": softmax, "heads": heads, "norm": norm, "ff": ff, "cross": cross, "output": output,
    "interventions": lesson_interventions.interventions, "circuits": lesson_circuits.circuits,
}


def shown_on_page(key: str, subject: lessons.Subject) -> str:
    """The page's "model shown" line: the chosen model, or what the page builds from it instead (page 8's
    pre-LN and post-LN models are fresh ones at least LN_MIN_LAYERS deep)."""
    n = max(subject.cfg.model.n_layers, lessons.LN_MIN_LAYERS)
    if key == "norm" and n != subject.cfg.model.n_layers:
        return (f"fresh, untrained pre-LN and post-LN models {n} layers deep (the page needs at least "
                f"{lessons.LN_MIN_LAYERS} for a trend; the chosen model has {subject.cfg.model.n_layers}), with its "
                f"task, width and heads; the chosen model is {subject.source}")
    return subject.source


def page_figure(key: str, subject: lessons.Subject, probe_text: str = "") -> tuple[Figure, str]:
    """The page's figure and a caption of what it shows (the model shown comes first)."""
    if key not in DRAW:
        raise KeyError(f"page: {key!r} is not a Learn page (allowed: {', '.join(PAGE_KEYS)})")
    fig, caption = DRAW[key](subject, subject.probe(probe_text))
    return fig, caption
