"""What Compare shows for its controls, drawn by one function: `render` reads the store once (the listing
first, then the picked runs' metrics) and returns the views that differ from what the page shows.

The page's state travels in a gr.State (`shown`): fingerprints of the table, the picker's choices, the
views of the selection and the timer. A view is sent when its fingerprint changes, so
- an idle page (nothing live, no control changed) gets nothing and its timer is off;
- the picker's labels change only when they differ, so updating them cannot fire the picker again;
- while a picked run trains, each tick redraws its curves; the tick that finds every run finished
  (read before their metrics) draws the final state and turns the timer off.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import gradio as gr
import pandas as pd
from matplotlib.colors import to_hex

from lab.engine.store import LIVE_STATES
from lab.views.curve_figures import curves_plot
from lab.views.plots import bands_figure
from lab.views.curves import colour_map
from ui.common import AppContext
from lab.views.stability_map import stability_plot
from ui.compare.views import (GROUP_COLS, choices, coloured, final_tables, group_frames, metric_list, only,
                              run_labels, run_table, series_frames, stability)

NoteSource = tuple[Any, Callable[[AppContext, Any, list[str]], str]]  # (component, fn(ctx, value, run ids))


@dataclass(frozen=True)
class Controls:
    """Compare's controls as the page holds them."""
    filters: tuple[tuple[str, ...], ...]
    run_ids: tuple[str, ...]
    metrics: tuple[str, ...]
    x: str
    smoothing: float
    diff_only: bool
    grouped: bool

    @classmethod
    def of(cls, filters: Sequence[Any], run_ids: Any, metrics: Any, x: Any, smoothing: Any, diff_only: Any,
           grouped: Any) -> "Controls":
        return cls(tuple(tuple(f or ()) for f in filters), tuple(dict.fromkeys(run_ids or [])),
                   tuple(metric_list(metrics)), str(x or "step"), float(smoothing or 0.0), bool(diff_only),
                   bool(grouped))


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _frame_key(df: pd.DataFrame) -> str:
    return df.to_json(orient="split", date_format="iso", default_handler=str)


def curves_view(ctx: AppContext, c: Controls, labels: dict[str, str]) -> Any:
    """The overlaid curves: a line per run and metric, a colour per run (as in every table), a dash per
    metric when several are drawn."""
    series, styles = series_frames(ctx, list(labels), list(c.metrics), c.x, c.smoothing, labels)
    colours = colour_map(list(labels.values()))
    by_series = {name: colours[run] for name, (run, _) in styles.items()}
    dashes = {name: ("solid", "dash", "dot", "dashdot")[i % 4] for name, (_, i) in styles.items()}
    if len(c.metrics) == 1:
        return curves_plot(series, c.x, c.metrics[0], by_series, title="Selected runs", dashes=dashes)
    # several curves: they are named in the title and the legend (a y-axis title that long covers the plot)
    return curves_plot(series, c.x, "", by_series, title=" / ".join(c.metrics), dashes=dashes)


def group_view(ctx: AppContext, c: Controls, listing: pd.DataFrame) -> tuple[Any, Any]:
    """The seed-band figure and the group table: shown when grouping is on and some group has more than one
    seed (the first curve picked is the one averaged)."""
    metric = c.metrics[0]
    band_df, table_df = group_frames(ctx, list(c.run_ids), metric, c.x, c.smoothing, listing) if c.run_ids else (
        None, None)
    if not c.grouped or table_df is None or not (table_df["runs"] > 1).any():
        return gr.Plot(visible=False), gr.Dataframe(value=pd.DataFrame(columns=GROUP_COLS), visible=False)
    fig = bands_figure(band_df, c.x, metric, title=f"{metric}: mean over seeds, band = min to max")
    colours = {line.get_label(): to_hex(line.get_color()) for ax in fig.axes for line in ax.lines}
    return gr.Plot(value=fig, visible=True), gr.Dataframe(value=coloured(table_df, "group", colours), visible=True)


def stability_view(ctx: AppContext, c: Controls, listing: pd.DataFrame) -> Any:
    """The stability map of the first curve's final values, shown when the picked runs vary two numeric
    settings (e.g. learning rate x warmup, a panel per norm placement); hidden otherwise."""
    m = stability(ctx, list(c.run_ids), c.metrics[0], listing) if c.run_ids else None
    if m is None:
        return gr.Plot(value=None, visible=False)
    return gr.Plot(value=stability_plot(m, c.metrics[0], "loss" in c.metrics[0]), visible=True)


def render(ctx: AppContext, c: Controls, shown: dict, note: Optional[Callable[[list[str]], str]] = None) -> dict:
    """The views (by output name) that differ from `shown`, plus the new `shown` under "shown"."""
    listing = ctx.store.list()  # read before any metrics: a run that ends later is redrawn by the next tick
    indexed, listed = listing.set_index("run_id"), only(listing, c.filters)
    labels = run_labels(ctx, list(c.run_ids), indexed)  # refuses ids that are not stored runs
    picked = list(labels)
    states = {r: (indexed.loc[r, "state"], _key(indexed.loc[r].get("step"))) for r in picked}
    live = any(s in LIVE_STATES for s, _ in states.values())
    new, out = dict(shown), {}

    def changed(name: str, key: str) -> bool:
        if shown.get(name) == key:
            return False
        new[name] = key
        return True

    table = run_table(listed)
    if changed("table", _frame_key(table)):
        out["table"] = table
    picker = choices(listed, list(c.run_ids), listing)
    if changed("choices", _key(picker)):
        out["pick"] = gr.Dropdown(choices=picker)
    selection = _key([c.run_ids, states])
    if changed("curves", _key([selection, c.metrics, c.x, c.smoothing])) or live:
        out["curves"] = curves_view(ctx, c, labels)
    if changed("finals", _key([selection, c.diff_only])) or live:
        with_params = changed("params", _key(c.run_ids))
        finals, configs, fig = final_tables(ctx, picked, c.diff_only, indexed, with_params)
        out["finals"], out["configs"] = coloured(finals), configs
        if with_params:
            out["params"] = gr.Plot(value=fig, visible=fig is not None)
    if changed("groups", _key([selection, c.metrics[0], c.x, c.smoothing, c.grouped])) or live:
        out["bands"], out["groups"] = group_view(ctx, c, indexed)
    if changed("stability", _key([selection, c.metrics[0]])) or live:
        out["stability"] = stability_view(ctx, c, indexed)
    if changed("selection", _key(c.run_ids)) and "selection" in shown:
        out["files"] = gr.File(value=None, visible=False)  # files exported for another selection
    if note is not None and changed("note", note(picked)):
        out["note"] = new["note"]
    active = live or bool(listed["state"].isin(LIVE_STATES).any())
    if changed("timer", _key(active)):
        out["timer"] = gr.update(active=active)  # explicit: a Timer(active=True) equals its default, sent as nothing
    out["shown"] = new
    return out
