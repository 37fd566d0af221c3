"""Accuracy against input length: where a model that learned lengths min_len..max_len stops being right.

Delétang et al. 2023 ("Neural Networks and the Chomsky Hierarchy") score a model on lengths beyond its training
ones: a model that learned the task's algorithm stays right as the input grows, one that fitted its training
lengths falls to chance just past them. The length-generalization map (lab/teach/presets/chomsky.py) reads one
number per cell, the accuracy over all longer lengths; this room measures the curve behind it, one point per
length, on a run's held-out batches (the same fixed sequences its evaluations measure: lab/tasks/batches.py
`eval_batches`), from its final weights (`accuracy_by_length`, which the Python API's `Run.accuracy_by_length`
returns), and draws it for one configuration's runs: each seed, their mean, the training lengths shaded
(their Figure 2 draws this curve per task). Compare draws it for any picked runs of a task scored on longer
inputs, each run measured once per version of its weights for every page (`LengthCache`). No gradio here.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import pandas as pd
import torch

from lab.config import RunConfig
from lab.engine.store import RunStore
from lab.engine.storefs import DamagedRunError, RunNotFoundError
from lab.evaluation import measure
from lab.tasks.batches import eval_batches, get_task
from lab.views.run_labels import CONFIG_PREFIXES, label_groups
from lab.views.seed_groups import group_runs

PER_LENGTH = 64  # held-out sequences measured at each length


@dataclass(frozen=True)
class LengthAccuracy:
    """A run's held-out accuracy at one input length."""

    length: int
    trained: bool  # a training length (else one of the longer ones the run never saw)
    token_acc: float
    exact_match: float


@torch.no_grad()
def accuracy_by_length(model: torch.nn.Module, cfg: RunConfig, per_length: int = PER_LENGTH) -> list[LengthAccuracy]:
    """The model's held-out token accuracy and exact-match at each training length and each longer length of
    `cfg`'s task, shortest first (language-model tasks included; a task without longer lengths gives only its
    training ones)."""
    task, device = get_task(cfg.task.name), next(model.parameters()).device
    out = []
    for split, trained in (("eval", True), ("ood", False)):
        lengths = task.lengths(cfg.task, split)
        if not lengths:
            continue
        # one batch per length, in order: eval_batches spreads n samples evenly over the split's lengths
        batches = eval_batches(cfg.task, cfg.model.arch, split, per_length * len(lengths), batch_size=per_length)
        assert len(batches) == len(lengths)
        for length, batch in zip(lengths, batches):
            m = measure(model, [batch], device)
            out.append(LengthAccuracy(length, trained, m.token_acc, m.exact_match))
    return out


LENGTH_COLS = ["run", "seed", "length", "trained", "token_acc", "exact_match"]
MEASURED = "completed"  # the runs measured: finished, with their final weights


def scored_longer(row: Mapping[str, Any]) -> bool:
    """Whether a run (its listing row) is scored on inputs longer than its training ones."""
    try:
        return bool(get_task(str(row.get("task.name"))).has_ood)
    except (KeyError, ValueError):
        return False


def length_cells(rows: Mapping[str, Mapping[str, Any]]) -> dict[str, list[str]]:
    """The configurations among runs `rows` (run id -> listing row) whose task is scored on longer inputs,
    named as Compare names its seed groups (lab/views/run_labels.py `label_groups`) -> their completed runs,
    in the order given."""
    usable = {r: row for r, row in rows.items() if row.get("state") == MEASURED and scored_longer(row)}
    if not usable:
        return {}
    groups = group_runs({r: {c: v for c, v in row.items() if str(c).startswith(CONFIG_PREFIXES)}
                         for r, row in usable.items()})
    names = label_groups(groups, usable) if len(usable) > 1 else {}
    return {names.get(key) or str(usable[members[0]].get("name") or members[0]): members
            for key, members in groups.items()}


class LengthCache:
    """A run's accuracy by length by (run id, version of its weights), shared by every page (thread-safe, the
    `size` most recent kept). `measured` counts the measurements actually made (tests check the sharing)."""

    def __init__(self, size: int = 256) -> None:
        self._lock, self._size = threading.Lock(), size
        self._entries: OrderedDict[tuple[str, str], list[LengthAccuracy]] = OrderedDict()
        self.measured = 0

    def get(self, store: RunStore, run_id: str, version: str, per_length: int = PER_LENGTH) -> list[LengthAccuracy]:
        from lab.views.analysis import load_model

        key = (run_id, version)
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
        cfg = store.config(run_id)
        weights, _ = store.weights_at(run_id, None)
        try:
            model = load_model(cfg, weights)
        except RuntimeError as exc:  # weights of another shape than the config's model
            raise DamagedRunError(f"run_id: {run_id!r}: its weights do not fit its config's model") from exc
        rows = accuracy_by_length(model, cfg, per_length)  # outside the lock
        with self._lock:
            self.measured += 1
            self._entries[key] = rows
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
        return rows


LENGTHS = LengthCache()


def length_frame(store: RunStore, rows: Mapping[str, Mapping[str, Any]], run_ids: Sequence[str],
                 cache: LengthCache = LENGTHS) -> pd.DataFrame:
    """The runs' accuracy at each length, a row per run and length (LENGTH_COLS); `rows`: their listing rows,
    whose update time versions the weights. A run without final weights to read is left out."""
    out = []
    for r in run_ids:
        try:
            measured = cache.get(store, r, str(rows[r].get("updated_at")))
        except (RunNotFoundError, DamagedRunError):  # no final weights to measure (deleted, damaged): left out
            continue
        out += [{"run": r, "seed": rows[r].get("train.seed"), "length": a.length, "trained": a.trained,
                 "token_acc": a.token_acc, "exact_match": a.exact_match} for a in measured]
    return pd.DataFrame(out, columns=LENGTH_COLS)


def length_figure(frame: pd.DataFrame, title: str) -> Any:
    """A plotly figure: each seed's token accuracy against input length (thin, with markers), their mean (thick),
    the training lengths shaded, and a title that says what the longer lengths kept; `frame` as `length_frame`
    gives it."""
    import plotly.graph_objects as go

    fig = go.Figure()
    trained = frame[frame["trained"]]["length"]
    if len(trained):
        fig.add_vrect(x0=trained.min() - 0.5, x1=trained.max() + 0.5, fillcolor="rgba(0,0,0,0.07)", line_width=0,
                      annotation_text="training lengths", annotation_position="bottom left")
    for (_, seed), g in frame.groupby(["run", "seed"], sort=False):
        g = g.sort_values("length")
        fig.add_trace(go.Scatter(x=g["length"].tolist(), y=g["token_acc"].tolist(), name=f"seed {seed}",
                                 mode="lines+markers", line={"width": 1}, marker={"size": 5}, opacity=0.75,
                                 hovertemplate=f"seed {seed}<br>length %{{x}}<br>token accuracy %{{y:.1%}}<extra></extra>"))
    mean = frame.groupby("length")["token_acc"].mean()
    fig.add_trace(go.Scatter(x=mean.index.tolist(), y=mean.tolist(), name="mean over seeds", mode="lines",
                             line={"color": "black", "width": 3},
                             hovertemplate="mean<br>length %{x}<br>token accuracy %{y:.1%}<extra></extra>"))
    fig.update_xaxes(title={"text": "input length", "standoff": 6})  # ticks as the width allows (a phone's too)
    fig.update_yaxes(title={"text": "token accuracy (held out)", "standoff": 6}, range=[-0.02, 1.02], tickformat=".0%")
    said = "<br>".join(f"<sup>{line}</sup>" for line in summary(frame).split("; "))  # short lines: a phone's width
    fig.update_layout(title={"text": f"{title}<br>{said}", "x": 0, "xanchor": "left"},
                      template="plotly_white", height=400, margin={"l": 10, "r": 10, "t": 80, "b": 10},
                      legend={"orientation": "h", "yanchor": "top", "y": -0.2, "x": 0}, hovermode="closest")
    return fig


def summary(frame: pd.DataFrame) -> str:
    """'lengths 1-10: 100%; longer lengths 11-20: 52% (mean over 2 seeds)'."""
    parts = []
    for trained, what in ((True, "lengths"), (False, "longer lengths")):
        part = frame[frame["trained"] == trained]
        if len(part):
            parts.append(f"{what} {part['length'].min()}-{part['length'].max()}: {part['token_acc'].mean():.0%}")
    n = frame["run"].nunique()
    return "; ".join(parts) + f" (mean over {n} seed{'s' if n != 1 else ''})"


def cell_figure(store: RunStore, rows: Mapping[str, Mapping[str, Any]], name: str, run_ids: Sequence[str],
                cache: LengthCache = LENGTHS) -> Any:
    """The figure for the configuration `name` and its runs, or None without a run to measure."""
    frame = length_frame(store, rows, run_ids, cache)
    return length_figure(frame, name) if len(frame) else None
