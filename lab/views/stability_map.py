"""The stability map: a grid's final metric as a heatmap over two of its numeric axes (e.g. learning rate x
warmup steps), one panel per value of its other axes (e.g. pre-LN | post-LN), seed repeats averaged, and
the cells whose runs failed, diverged or did not learn marked.

It answers the question learning-rate sweeps are run for: where does a setting train at all? Xiong et al.
2020 (On Layer Normalization in the Transformer Architecture) draw post-LN's failure without warmup this
way, as a region of learning rates; the lab's `stability` preset draws it (lab/teach/presets/stability.py).

`stability_map` reads plain rows (the store's listing: flat config columns and the run's state) and each
run's final values; `stability_plot` draws it with plotly, so the page keeps the drawn numbers on the
plot element (as Compare's curves do: lab/views/curve_figures.py). No torch or gradio here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from lab.config import declared_fields
from lab.views.seed_groups import SEED, varied_columns
from lab.engine.store import LIVE_STATES
from lab.views.run_labels import FIELD_LABELS, compact

MAX_PANELS = 6  # more combinations of the other axes than this: no map (the band table reads better)
NO_LEARNING = 0.9  # a final held-out loss at or above this fraction of the first batch's loss: did not learn


@dataclass(frozen=True)
class RunFinal:
    """What the map needs of one run: its state, its final value of the metric (None: none yet), whether
    its loss went non-finite, and its first and last losses (for "did not learn")."""
    state: str
    value: Optional[float]
    diverged: bool = False
    first_loss: Optional[float] = None
    final_loss: Optional[float] = None

    @property
    def mark(self) -> str:
        """'' for a run that trained; else why its cell is marked."""
        if self.state == "failed":
            return "failed"
        if self.diverged:
            return "diverged"
        if self.first_loss and self.final_loss is not None and self.final_loss >= NO_LEARNING * self.first_loss:
            return "did not learn"
        return ""


@dataclass(frozen=True)
class Cell:
    x: Any
    y: Any
    panel: tuple  # the other axes' values, ((column, value), ...)
    mean: Optional[float]  # over the cell's runs that have a value and no mark (None: none has)
    runs: int
    marks: tuple[str, ...]  # one per marked run
    live: int  # runs still training


@dataclass(frozen=True)
class StabilityMap:
    x: str  # config columns: "train.lr"
    y: str
    panels: tuple[tuple, ...]
    xs: tuple
    ys: tuple
    cells: tuple[Cell, ...]

    def cell(self, panel: tuple, x: Any, y: Any) -> Optional[Cell]:
        return next((c for c in self.cells if c.panel == panel and c.x == x and c.y == y), None)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not (isinstance(v, float) and math.isnan(v))


def _plain(v: Any) -> Any:
    """numpy scalars from a listing -> Python numbers (one key for 3 and 3.0 stays apart from '3')."""
    return v.item() if hasattr(v, "item") else v


CHOICES = {f.key: f.choices for f in declared_fields() if f.choices}  # a text field's values in declared order


def _panel_order(panel: tuple) -> tuple:
    """Panels in the order of their fields' declared choices (pre-LN before post-LN), numbers ascending."""
    return tuple((CHOICES[c].index(v), "") if v in CHOICES.get(c, ()) else (0, str(v)) if not _is_number(v)
                 else (v, "") for c, v in panel)


def stability_map(rows: Mapping[str, Mapping[str, Any]], final: Callable[[str], RunFinal]) -> Optional[StabilityMap]:
    """The map of runs `rows` (run id -> flat config columns), `final(run id)` read only for a map, or None unless their
    configs differ in at least two numeric columns besides the seed, in at most MAX_PANELS combinations of
    the others. x and y: the first two numeric varied columns (the grid's axes first, in their order)."""
    configs = {r: {k: _plain(v) for k, v in row.items() if k.startswith(("model.", "task.", "train."))}
               for r, row in rows.items()}
    if len(configs) < 4:
        return None
    varied = [c for c in varied_columns(configs) if c != SEED]
    numeric = [c for c in varied if all(_is_number(cfg.get(c)) for cfg in configs.values())]
    if len(numeric) < 2:
        return None
    x, y = numeric[:2]
    others = [c for c in varied if c not in (x, y)]
    panels = tuple(sorted(dict.fromkeys(tuple((c, cfg.get(c)) for c in others) for cfg in configs.values()),
                          key=_panel_order))
    if len(panels) > MAX_PANELS:
        return None
    groups: dict[tuple, list[RunFinal]] = {}
    for r, cfg in configs.items():
        groups.setdefault((tuple((c, cfg.get(c)) for c in others), cfg[x], cfg[y]), []).append(final(r))
    cells = []
    for (panel, xv, yv), members in groups.items():
        good = [f.value for f in members if f.value is not None and not f.mark and math.isfinite(f.value)]
        cells.append(Cell(xv, yv, panel, sum(good) / len(good) if good else None, len(members),
                          tuple(f.mark for f in members if f.mark), sum(f.state in LIVE_STATES for f in members)))
    return StabilityMap(x, y, panels, tuple(sorted({c.x for c in cells})), tuple(sorted({c.y for c in cells})),
                        tuple(cells))


def cell_text(c: Optional[Cell]) -> str:
    """What a cell says: its mean (and how many runs), or why it has none."""
    if c is None:
        return ""
    if c.marks and len(c.marks) == c.runs:  # "did not learn" in two lines: a phone's cell is about 70 px wide
        return "✕ " + c.marks[0].replace("did not ", "did not<br>") + (f" ({c.runs})" if c.runs > 1 else "")
    text = "training…" if c.mean is None and c.live else "" if c.mean is None else f"{c.mean:.3g}"
    if c.marks:
        text += f"<br>✕ {len(c.marks)} of {c.runs}<br>{c.marks[0]}"
    elif c.runs > 1 and c.mean is not None:
        text += f"<br>n={c.runs}"
    return text


def _value(v: Any) -> str:
    """An axis tick: 0.003 as '0.003', 3.0 as '3' (a category: each value one column, evenly spaced)."""
    return f"{v:g}" if isinstance(v, float) else str(v)


def panel_title(panel: tuple) -> str:
    return ", ".join(compact(c, v) for c, v in panel) or "all runs"


def stability_plot(m: StabilityMap, metric: str, lower_is_better: bool) -> Any:
    """A plotly figure: a heatmap per panel, one under another (a phone's width holds one panel's cells, not
    two side by side), one colour scale for all (so panels compare), each cell's mean written in it, a cell
    without a mean grey with its reason written."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    values = [c.mean for c in m.cells if c.mean is not None]
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    xs, ys = [_value(v) for v in m.xs], [_value(v) for v in m.ys]
    n = len(m.panels)
    fig = make_subplots(rows=n, cols=1, subplot_titles=[panel_title(p) for p in m.panels], vertical_spacing=0.35 / n,
                        shared_xaxes=True)
    for i, panel in enumerate(m.panels):
        cells = [[m.cell(panel, xv, yv) for xv in m.xs] for yv in m.ys]  # (ys, xs): rows are y values
        fig.add_trace(go.Heatmap(
            x=xs, y=ys, z=[[c.mean if c else None for c in row] for row in cells],
            text=[[cell_text(c) if c and c.mean is not None else "" for c in row] for row in cells],
            texttemplate="%{text}", textfont={"size": 11}, coloraxis="coloraxis", name=panel_title(panel),
            xgap=2, ygap=2, hovertemplate=f"{panel_title(panel)}<br>%{{x}}, %{{y}}<br>{metric} %{{z:.4g}}<extra></extra>"),
            row=i + 1, col=1)
        for yi, row in enumerate(cells):  # a cell without a mean has no colour: its reason is written on grey
            for xi, c in enumerate(row):
                if c is None or c.mean is None:  # at the categories' serial numbers (plotly's rule for category axes)
                    fig.add_annotation(x=xi, y=yi, text=cell_text(c) or "no run", showarrow=False, row=i + 1, col=1,
                                       font={"size": 11, "color": "#b03a2e" if c and c.marks else "#555555"},
                                       bgcolor="#eeeeee", borderpad=4)
    better = "lower is better" if lower_is_better else "higher is better"
    measured = "training set" if metric.startswith("train") else "held-out set"
    fig.update_layout(  # short lines: a phone's 390 px shows the whole title
        title={"text": f"Stability map: final {metric}<br><span style='font-size:11px'>on the whole {measured} at "
                       f"the last evaluation;<br>mean over seeds, {better}; ✕ failed, diverged<br>or did not learn "
                       "(final held-out loss at least 0.9<br>of the first batch's)</span>", "font": {"size": 13},
               "x": 0, "xanchor": "left", "yref": "container", "y": 1, "yanchor": "top", "pad": {"t": 16}},
        coloraxis={"colorscale": "Viridis", "reversescale": lower_is_better, "cmin": lo, "cmax": hi,
                   "colorbar": {"title": {"text": metric, "side": "right"}, "thickness": 12}},
        height=160 + n * (60 + 40 * len(m.ys)), template="plotly_white", margin={"l": 10, "r": 10, "t": 160, "b": 10})
    fig.update_xaxes(type="category", automargin=True)
    fig.update_xaxes(title_text=FIELD_LABELS.get(m.x, m.x), row=n, col=1)
    fig.update_yaxes(type="category", automargin=True, title_text=FIELD_LABELS.get(m.y, m.y))
    return fig


def run_final(metrics: Any, kind: str, column: str, state: str) -> RunFinal:
    """A run's RunFinal from its metrics frame (the store's: kind, step, loss, ... columns): the metric's
    last recorded value, NaN kept (a loss that went NaN is the run's final value, not the last finite one
    before it), non-finite batch losses as diverged, the first batch loss and the last held-out loss."""
    if metrics is None or metrics.empty:
        return RunFinal(state, None)
    train, evals = metrics[metrics["kind"] == "train"], metrics[metrics["kind"] == "eval"]
    rows = metrics[metrics["kind"] == kind]
    value = None
    if column in rows.columns and len(rows):
        # an evaluation that left this metric out (NaN beside a finite loss) did not measure it
        skipped = rows[column].isna() & rows["loss"].map(lambda v: math.isfinite(float(v)))
        measured = rows[column][~skipped]
        value = float(measured.iloc[-1]) if len(measured) else None
    losses = [float(v) for v in train["loss"]] if "loss" in train.columns else []
    held = [float(v) for v in evals["loss"]] if "loss" in evals.columns else []
    diverged = any(not math.isfinite(v) for v in losses + held[-1:])
    return RunFinal(state, value, diverged, losses[0] if losses else None,
                    held[-1] if held else (losses[-1] if losses else None))
