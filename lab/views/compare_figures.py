"""Compare's figures and styled tables, drawn from its frames (lab/views/compare_frames.py): the page's
interactive curves (plotly, lab/views/curve_figures.py) and stability map, its tables with each run's (or
group's) colour beside its name, and the matplotlib figures that Compare's Export writes as PNG files
(ui/compare/tab.py) and the Python API returns (lab/api/figures.py): the curves, the parameters per
component and the seed repeats' bands, titled alike wherever they are drawn. No gradio here.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import pandas as pd
from matplotlib.colors import to_hex
from matplotlib.figure import Figure

from lab.params import param_breakdown
from lab.views.compare_frames import (Selection, curve_series, final_tables, has_seed_groups, seed_groups, stability)
from lab.views.curve_figures import DASHES, CurveChart, Mark, chart_of, curves_plot
from lab.views.curve_figures import curves_png as chart_png
from lab.views.curves import colour_map
from lab.views.plots import bands_figure, params_figure
from lab.views.stability_map import stability_plot

def curve_chart(series: Mapping[str, pd.DataFrame], styles: Mapping[str, tuple[str, int]],
                metrics: Sequence[str], x: str, title: Optional[str] = None,
                marks: Sequence[Mark] = ()) -> CurveChart:
    """Compare's curves (`curve_series`) as one chart, the page's and the export's: a colour per run (as in
    every table), a dash per metric, a panel per kind of measure; titled by the metrics unless `title`; with
    the steps a preset's sentence quotes (`marks`) while the x-axis is the step."""
    colours = colour_map([run for run, _ in styles.values()])
    return chart_of(series, {name: metrics[i] for name, (_, i) in styles.items()},
                    {name: colours[run] for name, (run, _) in styles.items()},
                    {name: DASHES[i % len(DASHES)] for name, (_, i) in styles.items()}, x,
                    " / ".join(metrics) if title is None else title, tuple(marks) if x == "step" else ())


def page_curves(series: Mapping[str, pd.DataFrame], styles: Mapping[str, tuple[str, int]],
                metrics: Sequence[str], x: str, marks: Sequence[Mark] = ()) -> Any:
    """The page's curves (plotly)."""
    return curves_plot(curve_chart(series, styles, metrics, x, marks=marks))


def curves_png(series: Mapping[str, pd.DataFrame], styles: Mapping[str, tuple[str, int]], metrics: Sequence[str],
               x: str, title: Optional[str] = None, marks: Sequence[Mark] = ()) -> Figure:
    """The page's curves as a matplotlib figure at slide size: what Compare's Export writes as curves.png."""
    return chart_png(curve_chart(series, styles, metrics, x, title, marks))


def bands_png(bands: pd.DataFrame, metric: str, x: str, title: Optional[str] = None) -> Figure:
    """The seed groups' mean curves with their min-max bands (`seed_groups`)."""
    return bands_figure(bands, x, metric, title=f"{metric}: mean over seeds, band = min to max" if title is None
                        else title)


def params_png(sel: Selection) -> Optional[Figure]:
    """Parameters per component, a bar per picked run (its config read: `read_selection`); None without runs."""
    parts = {sel.labels[r]: param_breakdown(config) for r, config in sel.configs.items()}
    return params_figure(parts) if parts else None


def coloured(table: pd.DataFrame, column: str = "run", colours: Optional[dict[str, str]] = None) -> Any:
    """`table` (a pandas Styler of it) with a bar in each series' colour beside its name in `column` (default:
    the curves' colours of the runs), numbers formatted. A plot's legend can be cut (the curves' is one row,
    cut at a phone's width; the band figure shrinks), the table's names are not."""
    colours = colour_map(list(table[column])) if colours is None else colours

    def bar(col: pd.Series) -> list[str]:
        return [f"box-shadow: inset 5px 0 0 {colours[v]}" if col.name == column and v in colours else "" for v in col]

    def number(fmt: str) -> Any:
        def show(v: Any) -> str:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                return str(v)
            return "" if pd.isna(v) else fmt.format(v)
        return show

    formats = {"parameters": "{:,.0f}", "steps": "{:.0f}", "wall time (s)": "{:.1f}"}
    return table.style.apply(bar, axis=0).format({c: number(formats.get(c, "{:.4g}")) for c in table.columns})


def finals_view(sel: Selection, diff_only: bool) -> tuple[Any, pd.DataFrame]:
    """The final metrics coloured by run, and the config table (`final_tables`)."""
    finals, configs = final_tables(sel, diff_only)
    return coloured(finals), configs


def groups_view(sel: Selection, metric: str, x: str, smoothing: float) -> Optional[tuple[Figure, Any]]:
    """The seed groups' band figure and their table coloured as the figure's lines, or None when no group
    has more than one run."""
    bands, table = seed_groups(sel, metric, x, smoothing)
    if not has_seed_groups(table):
        return None
    fig = bands_png(bands, metric, x)
    colours = {line.get_label(): to_hex(line.get_color()) for ax in fig.axes for line in ax.lines}
    return fig, coloured(table, "group", colours)


def stability_view(sel: Selection, metric: str) -> Optional[Any]:
    """The stability map of `metric`'s final values (plotly), or None when the runs do not vary two numeric
    settings (lab/views/stability_map.py)."""
    m = stability(sel, metric) if sel.labels else None
    return None if m is None else stability_plot(m, metric, "loss" in metric)


def export_figures(sel: Selection, metrics: Sequence[str], x: str, smoothing: float, grouped: bool,
                   max_points: Optional[int] = None) -> dict[str, Figure]:
    """What Compare's Export writes as PNG, by file name: the curves as the page draws them, the parameters
    per component and, with seed repeats grouped, their bands."""
    series, styles = curve_series(sel, metrics, x, smoothing, max_points)
    figures = {"curves.png": curves_png(series, styles, metrics, x)}
    params = params_png(sel)
    if params is not None:
        figures["parameters.png"] = params
    if grouped:
        bands, table = seed_groups(sel, metrics[0], x, smoothing)
        if has_seed_groups(table):
            figures["bands.png"] = bands_png(bands, metrics[0], x)
    return figures
