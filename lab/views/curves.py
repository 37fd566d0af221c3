"""The curves a run can draw: each choice's label (saying what it was measured on), the record kind and
column it reads, the x-axes, the series colours, and one run's metric as an (x, value) frame."""
from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd

from lab.records import EXACT_MATCH, LOSS, TOKEN_ACC

# Curve choices: label -> (record kind, column); each label says what it was measured on. "(batch)": each
# logged step's own training batch ("train" records); "train ...": a fixed set of samples of the training
# distribution at each evaluation (modular addition's training pairs, the text's first 90%, fresh sequences
# for the generated tasks); "held-out ...": held-out samples at the training lengths, or at the longer ones.
# "train X" and "held-out X" are one measure on the two sets, to overlay (lab/evaluation.py). Which ones mean
# something for a task: lab.tasks.shapes.headline_metrics. Labels of earlier versions still resolve (RENAMED).
class _Curves(dict):
    """The curve choices: a label of an earlier version (RENAMED) finds its curve, but is not offered."""

    def __missing__(self, label: str) -> tuple[str, str]:
        if label in RENAMED:
            return self[RENAMED[label]]
        raise KeyError(label)


CURVES = _Curves({
    "train loss (batch)": ("train", LOSS),
    "train loss": ("eval", "train_loss"),
    "held-out loss": ("eval", LOSS),
    "train exact-match": ("eval", "train_exact_match"),
    "held-out exact-match": ("eval", EXACT_MATCH),
    "train token accuracy": ("eval", "train_token_acc"),
    "held-out token accuracy": ("eval", TOKEN_ACC),
    "train accuracy (predictable positions)": ("eval", "train_predictable_acc"),
    "held-out accuracy (predictable positions)": ("eval", "predictable_acc"),
    "held-out loss (longer lengths)": ("eval", "ood_loss"),
    "held-out exact-match (longer lengths)": ("eval", "ood_exact_match"),
})
RENAMED = {"eval loss": "held-out loss", "exact-match (training lengths)": "held-out exact-match",
           "exact-match (longer lengths)": "held-out exact-match (longer lengths)",
           "token accuracy (training lengths)": "held-out token accuracy",
           "loss (longer lengths)": "held-out loss (longer lengths)"}  # ("train loss" is a label again)
X_AXES = {"step": "step", "time (s)": "elapsed_s", "tokens": "tokens"}
SERIES_COLOURS = ("#4c78a8", "#f58518", "#e45756", "#72b7b2", "#54a24b", "#eeca3b", "#b279a2", "#ff9da6",
                  "#9d755d", "#bab0ac")  # vega's default categorical palette (tableau10)

# Gradio 6.31's LinePlot fixes its colour scale to the series in the value it first draws, then only
# swaps the data: a series that appears later is never drawn. It redraws from scratch when a prop
# such as color_map changes, but an update applies its props one by one with the value last, so that
# redraw still sees the old value. Hence: live plots name every series from the first poll
# (`with_series`), and Compare sends the new curves first and their colour map in a second step.


def with_series(frame: pd.DataFrame, column: str, names: tuple[str, ...], x: str) -> pd.DataFrame:
    """`frame` plus one row without a value for each series in `names` that it lacks (it draws nothing)."""
    present = set(frame[column])
    missing = [n for n in names if n not in present]
    if not missing:
        return frame
    pad = pd.DataFrame({x: [0] * len(missing), "value": [float("nan")] * len(missing), column: missing})
    return pd.concat([frame, pad], ignore_index=True)


def colour_map(names: list[str]) -> dict[str, str]:
    return {n: SERIES_COLOURS[i % len(SERIES_COLOURS)] for i, n in enumerate(dict.fromkeys(names))}


def curve(metrics: pd.DataFrame, metric: str, x: str = "step", smoothing: float = 0.0) -> pd.DataFrame:
    """One metric of one run as columns (x, value); `smoothing` (EMA) applies to the train loss only, one
    noisy batch a step: held-out curves are few points, each an average over many sequences already."""
    kind, col = CURVES[metric]
    if metrics.empty or col not in metrics.columns:
        return pd.DataFrame({"x": [], "value": []})
    df = metrics[metrics["kind"] == kind][[X_AXES[x], col]].dropna()
    df.columns = ["x", "value"]
    if smoothing > 0 and len(df) and kind == "train":
        df["value"] = df["value"].ewm(alpha=1 - smoothing, adjust=True).mean()
    return df.reset_index(drop=True)


def thin(frame: pd.DataFrame, max_points: int, by: Optional[str] = None) -> pd.DataFrame:
    """At most `max_points` evenly spaced rows (per group of `by`), first and last kept, order kept:
    a live plot of a long run stays a fixed size in memory and on the wire."""
    if max_points < 1:
        raise ValueError(f"max_points: {max_points!r} is not a positive integer")
    if by is not None:
        parts = [thin(group, max_points) for _, group in frame.groupby(by, sort=False)]
        return pd.concat(parts) if parts else frame
    if len(frame) <= max_points:
        return frame
    keep = np.unique(np.linspace(0, len(frame) - 1, max_points).round().astype(int))
    return frame.iloc[keep]
