"""Overlaid curves as one chart (`CurveChart`) drawn alike on the page (plotly) and in Compare's Export and
the Python API (matplotlib, at slide size): a panel per kind of measure (the losses; the accuracies, 0 to
1, on their own labelled axis, never flattened under a loss), a colour per run and a dash per measure.

Why plotly on the page and not the app's native line plot: a plotly figure travels whole and is drawn
whole (the browser calls `Plotly.react` with data, titles and colours together), so a picture can never
pair the new axis titles with the previous data. Gradio 6.31's native line plot applies a changed title or
colour map with an asynchronous full redraw that captures the data from before the same update: after
a curve or x-axis switch, Compare showed the new titles over the previous curve's values. The page keeps
the drawn data on the plot element (`gd.data`), so browser tests read exactly what a person sees.

plotly is imported inside the builder: `import lab` stays light for notebooks and the CLI.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import pandas as pd
from matplotlib.figure import Figure

HEIGHT = 300  # the plot area of one panel; the legend below adds a row per series (a phone shows one a row)
PANEL_HEIGHT = 220  # each panel after the first
LEGEND_ROW = 20
DASHES = ("solid", "dash", "dot", "dashdot")  # a dash per measure when several are drawn
LINESTYLES = {"solid": "-", "dash": "--", "dot": ":", "dashdot": "-."}  # the same dashes in matplotlib
EXPORT_WIDTH_IN = 16  # the exported figure: 16 in at lab.views.plots.to_png's 110 dpi, 1,760 px (a slide)
KINDS = ("loss", "accuracy")  # the panels, top to bottom
MARK_COLOUR = "#444444"  # a marked step's line and words


def measure_kind(metric: str) -> str:
    """"loss" for a loss curve, else "accuracy" (exact-match, token accuracy: a share, 0 to 1)."""
    return "loss" if "loss" in metric else "accuracy"


@dataclass(frozen=True)
class Panel:
    """One panel of a chart: its y-axis title and the series drawn in it."""
    y_title: str
    names: tuple[str, ...]
    share: bool  # values from 0 to 1 (accuracies): the axis shows that whole range


@dataclass(frozen=True)
class Mark:
    """A step a sentence quotes, drawn on the curves as a dotted vertical line across every panel with its
    words at the top ("test accuracy passes 90%: step 1,760")."""
    x: float
    text: str


@dataclass(frozen=True)
class CurveChart:
    """Overlaid curves: `series` (name -> frame with columns x, value) in `panels`, coloured by `colours` and
    dashed by `dashes` (name -> 'solid', 'dash', 'dot', 'dashdot'), with the steps `marks` marked."""
    series: Mapping[str, pd.DataFrame]
    panels: tuple[Panel, ...]
    colours: Mapping[str, str]
    dashes: Mapping[str, str]
    x_title: str
    title: str
    marks: tuple[Mark, ...] = ()


def chart_of(series: Mapping[str, pd.DataFrame], measures: Mapping[str, str], colours: Mapping[str, str],
             dashes: Mapping[str, str], x_title: str, title: str, marks: tuple[Mark, ...] = ()) -> CurveChart:
    """The chart of `series`, each in the panel of its measure's kind (`measures`: name -> measure): a panel's
    axis is titled by its one measure, or by the kind when it holds several (the legend names them)."""
    panels = []
    for kind in KINDS:
        names = tuple(n for n in series if measure_kind(measures[n]) == kind)
        if names:
            used = list(dict.fromkeys(measures[n] for n in names))
            panels.append(Panel(used[0] if len(used) == 1 else kind, names, kind == "accuracy"))
    return CurveChart(series, tuple(panels), colours, dashes, x_title, title, marks)


def _number(v: Any) -> Optional[float]:
    """A plot coordinate: None for a missing value (plotly leaves a gap), else a float."""
    f = float(v)
    return None if math.isnan(f) else f


def curves_plot(chart: CurveChart) -> Any:
    """A plotly Figure of `chart`: its panels stacked on one x-axis (titled under the last). A series without
    points still appears in the legend, so every picked run is named."""
    from plotly.subplots import make_subplots
    import plotly.graph_objects as go

    rows = max(1, len(chart.panels))
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.1 if rows > 1 else 0.0)
    for row, panel in enumerate(chart.panels, 1):
        for name in panel.names:
            df = chart.series[name]
            fig.add_trace(go.Scatter(
                x=[_number(v) for v in df["x"]], y=[_number(v) for v in df["value"]], name=name, mode="lines",
                line={"color": chart.colours.get(name), "width": 2, "dash": chart.dashes.get(name, "solid")},
                hovertemplate=f"{name}<br>{chart.x_title} %{{x}}<br>{panel.y_title} %{{y:.4g}}<extra></extra>",
                showlegend=True), row=row, col=1)
        fig.update_yaxes(title={"text": panel.y_title, "standoff": 6, "font": {"size": 12}}, automargin=True,
                         range=[-0.02, 1.02] if panel.share else None, row=row, col=1)
    for mark in chart.marks:  # across every panel; the words once, at the top of the first
        fig.add_vline(x=mark.x, line={"color": MARK_COLOUR, "width": 1.5, "dash": "dot"}, row="all", col=1)
        fig.add_annotation(x=mark.x, y=1, xref="x", yref="y domain", text=mark.text, showarrow=False,
                           xanchor="left", yanchor="top", xshift=4, font={"size": 11, "color": MARK_COLOUR},
                           bgcolor="rgba(255,255,255,0.8)")
    fig.update_xaxes(title={"text": chart.x_title, "standoff": 6}, automargin=True, row=rows, col=1)
    fig.update_layout(  # margins grow to fit the axis labels and the legend (a phone's 390 px included)
        title={"text": chart.title, "font": {"size": 14}, "x": 0, "xanchor": "left", "y": 0.98, "yanchor": "top"},
        height=HEIGHT + PANEL_HEIGHT * (rows - 1) + LEGEND_ROW * min(len(chart.series), 20), template="plotly_white",
        margin={"l": 10, "r": 10, "t": 36 if chart.title else 10, "b": 10},
        legend={"orientation": "h", "yanchor": "top", "y": -0.22 / rows, "x": 0, "font": {"size": 11}},
        hovermode="closest")
    if not chart.series:
        fig.add_annotation(text="Pick runs above to draw their curves.", showarrow=False, x=0.5, y=0.5,
                           xref="paper", yref="paper")
    return fig


def curves_png(chart: CurveChart) -> Figure:
    """`chart` as the page draws it (the same panels, axis titles, colours and dashes), as a matplotlib figure
    at slide size (EXPORT_WIDTH_IN), for Compare's Export and the Python API."""
    rows = max(1, len(chart.panels))
    fig = Figure(figsize=(EXPORT_WIDTH_IN, 3.4 * rows + 1.6), layout="constrained")
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]
    for ax, panel in zip(axes, chart.panels):
        for name in panel.names:
            df = chart.series[name]
            ax.plot(df["x"], df["value"], color=chart.colours.get(name), lw=2.2, label=name,
                    linestyle=LINESTYLES[chart.dashes.get(name, "solid")])
        ax.set_ylabel(panel.y_title, fontsize=14)
        if panel.share:
            ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=12)
    for mark in chart.marks:
        for ax in axes:
            ax.axvline(mark.x, color=MARK_COLOUR, lw=1.5, ls=":")
        axes[0].text(mark.x, 0.98, f" {mark.text}", transform=axes[0].get_xaxis_transform(), va="top", ha="left",
                     fontsize=12, color=MARK_COLOUR, backgroundcolor=(1, 1, 1, 0.8))
    axes[-1].set_xlabel(chart.x_title, fontsize=14)
    axes[0].set_title(chart.title, fontsize=16, loc="left")
    if not chart.series:
        axes[0].text(0.5, 0.5, "No runs to draw.", ha="center", va="center", transform=axes[0].transAxes)
    elif len(chart.series) <= 24:
        handles = [h for ax in axes for h in ax.get_lines()]
        fig.legend(handles=handles, loc="outside lower center", ncols=min(4, len(handles)), fontsize=12,
                   frameon=False)
    return fig


def warm_up() -> None:
    """Draw and serialise one figure, so plotly loads the modules it imports on first use (narwhals among
    them, about 3,000 modules in 0.5 s) before a server answers anyone: two of Compare's first requests
    loading them at once in two threads failed with Python's import _DeadlockError, shown as an error."""
    line = pd.DataFrame({"x": [0.0, 1.0], "value": [1.0, 0.0]})
    series = {"loss": line, "accuracy": line}
    fig = curves_plot(chart_of(series, {n: n for n in series}, {n: "#000000" for n in series},
                               {"loss": "dash", "accuracy": "solid"}, "step", "warm-up"))
    curves_plot(chart_of({}, {}, {}, {}, "step", ""))  # and the empty plot's note
    fig.to_plotly_json()
