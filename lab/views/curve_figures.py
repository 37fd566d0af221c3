"""Interactive curve figures (plotly) for overlaid runs: one line per series, the axis titles, the colours
and the data in one object.

Why plotly and not the app's native line plot: a plotly figure travels whole and is drawn whole (the
browser calls `Plotly.react` with data, titles and colours together), so a picture can never pair the
new axis titles with the previous data. Gradio 6.31's native line plot applies a changed title or
colour map with an asynchronous full redraw that captures the data from before the same update: after
a curve or x-axis switch, Compare showed the new titles over the previous curve's values. The page keeps
the drawn data on the plot element (`gd.data`), so browser tests read exactly what a person sees.

plotly is imported inside the builder: `import lab` stays light for notebooks and the CLI.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional

import pandas as pd

HEIGHT = 300  # the plot area; the legend below adds a row per series (a phone shows one series a row)
LEGEND_ROW = 20


def _number(v: Any) -> Optional[float]:
    """A plot coordinate: None for a missing value (plotly leaves a gap), else a float."""
    f = float(v)
    return None if math.isnan(f) else f


def curves_plot(series: Mapping[str, pd.DataFrame], x_title: str, y_title: str, colours: Mapping[str, str],
                title: str = "", dashes: Optional[Mapping[str, str]] = None) -> Any:
    """A plotly Figure with one line per entry of `series` (name -> frame with columns x, value), in the
    mapping's order, coloured by `colours` (name -> CSS colour) and dashed by `dashes` (name -> 'solid',
    'dash', 'dot'). A series without points still appears in the legend, so every picked run is named."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for name, df in series.items():
        fig.add_trace(go.Scatter(
            x=[_number(v) for v in df["x"]], y=[_number(v) for v in df["value"]], name=name, mode="lines",
            line={"color": colours.get(name), "width": 2, "dash": (dashes or {}).get(name, "solid")},
            hovertemplate=f"{name}<br>{x_title} %{{x}}<br>{y_title} %{{y:.4g}}<extra></extra>",
            showlegend=True))
    fig.update_layout(  # margins grow to fit the axis labels and the legend (a phone's 390 px included)
        title={"text": title, "font": {"size": 14}, "x": 0, "xanchor": "left", "y": 0.98, "yanchor": "top"},
        height=HEIGHT + LEGEND_ROW * min(len(series), 20), template="plotly_white", margin={"l": 10, "r": 10, "t": 36 if title else 10, "b": 10},
        xaxis={"title": {"text": x_title, "standoff": 6}, "automargin": True},
        yaxis={"title": {"text": y_title, "standoff": 6, "font": {"size": 12}}, "automargin": True},
        legend={"orientation": "h", "yanchor": "top", "y": -0.22, "x": 0, "font": {"size": 11}},
        hovermode="closest")
    if not series:
        fig.add_annotation(text="Pick runs above to draw their curves.", showarrow=False, x=0.5, y=0.5,
                           xref="paper", yref="paper")
    return fig


def warm_up() -> None:
    """Draw and serialise one figure, so plotly loads the modules it imports on first use (narwhals among
    them, about 3,000 modules in 0.5 s) before a server answers anyone: two of Compare's first requests
    loading them at once in two threads failed with Python's import _DeadlockError, shown as an error."""
    fig = curves_plot({"warm-up": pd.DataFrame({"x": [0.0, 1.0], "value": [1.0, 0.0]})}, "step", "loss",
                      {"warm-up": "#000000"}, title="warm-up", dashes={"warm-up": "dash"})
    curves_plot({}, "step", "loss", {})  # and the empty plot's note
    fig.to_plotly_json()
