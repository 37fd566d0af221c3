"""The Learn page on circuits forming: every head's induction and previous-token scores at each snapshot
step of the chosen run, beside its held-out loss on the same step axis, and a caption that says when the
top induction score first passed 0.4 and where the loss fell fastest (Olsson et al. 2022's phase change).

The scores are lab/circuits/head_roles.py's, the same numbers `python -m lab heads` prints; the run's
history comes from the Subject (ui/learn.py reads it from the store), so nothing here touches the store.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
from matplotlib.figure import Figure

from lab.circuits.head_roles import INDUCTION_FORMS, HeadScores, crossing_step, steepest_fall
from lab.interventions import head_name
from lab.teach import lessons
from lab.views.analysis import ProbeInput

RED, BLUE = "#D55E00", "#0072B2"


def _message(text: str) -> tuple[Figure, str]:
    fig = Figure(figsize=(8, 2.2), layout="constrained")
    ax = fig.subplots()
    ax.axis("off")
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=11, wrap=True)
    return fig, text


def circuits(s: lessons.Subject, probe: ProbeInput) -> tuple[Figure, str]:
    """Induction and previous-token scores (heads x snapshot steps) and the held-out loss against step."""
    if s.cfg.model.arch != "decoder":
        return _message("Head roles are measured on decoder-only Transformers; this run is "
                        f"{s.cfg.model.arch}. Pick a decoder run, e.g. the Induction heads preset's.")
    series, losses = s.history() if s.history else ([], [])
    if len(series) < 2:
        return _message("This page needs a trained run with weight snapshots (each run keeps them at its "
                        "attention snapshot steps): pick a finished run, e.g. the Induction heads preset's 2-layer run.")
    steps = [h.step for h in series]
    n_layers, n_heads = series[0].scores["induction"].shape
    names = [head_name(layer, head) for layer in range(n_layers) for head in range(n_heads)]
    fig = Figure(figsize=(12.6, 0.9 + 0.32 * len(names) + 2.2), layout="constrained")
    ax_ind, ax_prev, ax_loss = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1, 1, 1.2]})
    for ax, name in ((ax_ind, "induction"), (ax_prev, "previous-token")):
        grid = np.stack([h.scores[name].reshape(-1) for h in series], axis=1)  # (heads, steps)
        im = ax.imshow(grid, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
        ax.set_yticks(range(len(names)), names, fontsize=7)
        ax.set_xticks(range(len(steps)), [str(v) for v in steps], fontsize=7, rotation=90)
        ax.set_xlabel("snapshot step", fontsize=9)
        ax.set_title(f"{name} score", fontsize=10)
        for r in range(grid.shape[0]):
            for c in range(grid.shape[1]):
                ax.text(c, r, f"{grid[r, c]:.2f}", ha="center", va="center", fontsize=6,
                        color="white" if grid[r, c] < 0.5 else "black")
    fig.colorbar(im, ax=[ax_ind, ax_prev], shrink=0.8, label="share of attention on the role's key")
    formed = crossing_step(series)
    fall = steepest_fall(losses)
    if losses:
        xs, ys = zip(*sorted(losses))
        ax_loss.plot(xs, ys, color=BLUE, lw=1.6, marker="o", ms=3)
    if formed is not None:
        ax_loss.axvline(formed, color=RED, ls="--", lw=1.2, label=f"top induction score > {INDUCTION_FORMS}")
        ax_loss.legend(fontsize=8)
    if fall:
        ax_loss.axvspan(fall[0], fall[1], color="0.85", zorder=0)
    ax_loss.set_xlabel("step", fontsize=9)
    ax_loss.set_ylabel("held-out loss", fontsize=9)
    ax_loss.set_title("held-out loss (grey: its steepest fall)", fontsize=10)
    ax_loss.grid(alpha=0.3)
    return fig, caption(series, formed, fall)


def caption(series: list[HeadScores], formed: Optional[int], fall: Optional[tuple[int, int, float, float]]) -> str:
    """What the page's figure shows, from the measured scores and losses."""
    layer, head, top = series[-1].top("induction")
    start = max(float(series[0].scores["induction"].max()), 0.0)
    text = (f"Measured on {series[0].half} random tokens repeated once, at {len(series)} steps. The top induction "
            f"score went from {start:.2f} at step {series[0].step} to {top:.2f} at step {series[-1].step} "
            f"({head_name(layer, head)}). ")
    if formed is None:
        text += f"No head passed {INDUCTION_FORMS}: no induction head formed in this run. "
    else:
        text += f"It first passed {INDUCTION_FORMS} at step {formed}. "
    if fall:
        text += (f"The held-out loss fell fastest between steps {fall[0]} and {fall[1]} ({fall[2]:.2f} to "
                 f"{fall[3]:.2f}).")
    return text
