"""Compare tab: filter stored runs, pick any number, overlay their curves, diff their configs, and
group seed repeats into a mean curve with a min-max band (the tables: ui/compare_views.py).

Listing reads only each run's small JSON files; metrics are read for the selected runs only. Other
tabs (presets, the ablation grid) open it on their runs through `CompareTab.pick`/`metric`. Every view of
a run's state agrees: while a listed or selected run is live, a timer refreshes the stored-runs table and
redraws the views of the selection until each shows the state the store has.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import gradio as gr
import pandas as pd
from matplotlib.colors import to_hex

from lab.engine.store import LIVE_STATES
from lab.views.plots import bands_figure, curves_figure, to_png
from ui.common import CURVES, X_AXES, AppContext, colour_map, errors_as_messages, with_api_params
from ui.compare_views import (FILTER_LABELS, FILTER_PARAMS, FILTERS, FINALS, GROUP_COLS, SMOOTHING, TABLE_COLS,
                              choices, coloured, compare_frames, filtered, group_frames, only, run_labels, run_table,
                              shows_live)
from ui.publish import build_publish_panel

LIVE_POLL_S = 2.0


@dataclass
class CompareTab:
    """What other tabs drive: the selection, the curve shown, the grouping, a note above the curves."""
    tab: gr.Tab
    pick: gr.Dropdown
    metric: gr.Dropdown
    group: gr.Checkbox
    note: gr.Markdown
    curves: gr.LinePlot

    def opener(self) -> list:
        """Outputs for opening Compare on other runs: send `reset_curves()` to `curves` with the new selection."""
        return [self.pick, self.metric, self.group, self.curves]


def select(ctx: AppContext, run_ids: list[str]) -> dict:
    """The run picker set to `run_ids` (with every listed run as a choice): how other tabs open Compare."""
    return gr.update(choices=choices(ctx.store.list(), run_ids), value=list(run_ids))


def reset_curves() -> Any:
    """An empty curve plot, sent when another tab opens Compare on new runs. Compare is hidden then; with
    a value left from other runs, the plot redraws on showing with the old runs' colour scale, which can
    win over the redraw for the new runs (seen in Chromium: new curves drawn without a stroke)."""
    return gr.LinePlot(value=None)


def series_of(shown: Any) -> list[str]:
    """The "run" series of a curve plot's value (PlotData, or its dict as a client sends it; None for an
    empty plot), in order."""
    if isinstance(shown, dict):
        columns, data = shown.get("columns"), shown.get("data")
    else:
        columns, data = getattr(shown, "columns", None), getattr(shown, "data", None)
    if not columns or "run" not in columns or not data:
        return []
    at = columns.index("run")
    return list(dict.fromkeys(row[at] for row in data))


def any_live(ctx: AppContext, run_ids: Optional[list[str]]) -> bool:
    return any(ctx.store.status(r).get("state") in LIVE_STATES for r in run_ids or [] if ctx.store.exists(r))


def group_views(ctx: AppContext, run_ids: Optional[list[str]], metric: str, x: str, smoothing: float,
                grouped: bool, listing: Optional[pd.DataFrame] = None) -> tuple[gr.Plot, gr.Dataframe]:
    """The grouped view: shown when grouping is on and some group has more than one seed."""
    band_df, table_df = group_frames(ctx, run_ids, metric, x, smoothing, listing) if run_ids else (None, None)
    if not grouped or table_df is None or not (table_df["runs"] > 1).any():
        return gr.Plot(visible=False), gr.Dataframe(value=pd.DataFrame(columns=GROUP_COLS), visible=False)
    fig = bands_figure(band_df, x, metric, title=f"{metric}: mean over seeds, band = min to max")
    colours = {line.get_label(): to_hex(line.get_color()) for ax in fig.axes for line in ax.lines}
    return gr.Plot(value=fig, visible=True), gr.Dataframe(value=coloured(table_df, "group", colours), visible=True)


def live_views(ctx: AppContext, run_ids: Optional[list[str]], metric: str, x: str, smoothing: float,
               diff_only: bool, grouped: bool, filters: Optional[Sequence] = None, redraw: bool = True) -> tuple:
    """One tick of the live timer: curves, final metrics, grouped view, the stored-runs table (`filters`
    applied), and the timer's next state. The views of the selection are redrawn when `redraw` (the page
    still shows a selected run as live) or a selected run is live; the table always.

    The timer stays on while a selected or listed run is live. Only a tick turns it off, and only one that
    found them all finished *before* it read their metrics: a run that ends while a handler reads would
    otherwise leave its curve cut short with nothing left to redraw it. The store is listed once."""
    listing = ctx.store.list()  # read before any metrics
    indexed, shown = listing.set_index("run_id"), only(listing, filters)
    run_labels(ctx, run_ids, indexed)  # refuses ids that are not stored runs, redrawn or not
    live = any(indexed.loc[r, "state"] in LIVE_STATES for r in run_ids or [] if r in indexed.index)
    listed_live = bool(shown["state"].isin(LIVE_STATES).any())
    if live or redraw:
        curves_df, finals_df, *_ = compare_frames(ctx, run_ids or [], metric, x, smoothing, diff_only, False, indexed)
        views = (gr.LinePlot(value=curves_df), coloured(finals_df),
                 *group_views(ctx, run_ids, metric, x, smoothing, grouped, indexed))
    else:
        views = (gr.skip(),) * 4
    return *views, run_table(shown), gr.Timer(active=live or listed_live)


def turn_on(live: bool) -> Any:
    """The live timer's update from a change handler: on while a run is live, else left as it is (an
    active timer's next tick redraws once more and turns it off: see live_views)."""
    return gr.Timer(active=True) if live else gr.skip()


def export(ctx: AppContext, run_ids: list[str], metric: str, x: str, smoothing: float) -> gr.File:
    if not run_ids:
        raise gr.Error("Select at least one run to export.")
    folder = tempfile.mkdtemp(prefix="lab-export-")
    configs = {r: ctx.store.config(r).to_dict() for r in run_ids}
    pd.Series(configs).to_json(os.path.join(folder, "configs.json"), indent=2)
    frames = [ctx.store.metrics(r).assign(run_id=r) for r in run_ids]
    pd.concat(frames).to_csv(os.path.join(folder, "metrics.csv"), index=False)
    curves_df, _, _, pfig = compare_frames(ctx, run_ids, metric, x, smoothing, False)
    files = [os.path.join(folder, n) for n in ("configs.json", "metrics.csv", "curves.png", "parameters.png")]
    with open(files[2], "wb") as fh:
        fh.write(to_png(curves_figure(curves_df, "x", "value", "run", title=f"{metric} vs {x}")))
    with open(files[3], "wb") as fh:
        fh.write(to_png(pfig))
    return gr.File(value=files, visible=True)


def build_compare_tab(ctx: AppContext) -> CompareTab:
    with gr.Tab("Compare", id="compare") as tab:
        gr.Markdown("Pick any number of stored runs to overlay their curves and see what differs between them.")
        note = gr.Markdown("", elem_id="compare-note")
        with gr.Row():
            filters = [gr.Dropdown(list(vals), multiselect=True, label=FILTER_LABELS[col], value=[], min_width=160)
                       for col, vals in FILTERS.items()]
            refresh = gr.Button("Refresh", size="sm", scale=0, elem_id="compare-refresh")
        table = gr.Dataframe(pd.DataFrame(columns=list(TABLE_COLS.values())), label="Stored runs", interactive=False,
                             max_height=260, elem_id="runs-table")
        with gr.Row():
            pick = gr.Dropdown([], multiselect=True, label="Runs to compare", scale=4, elem_id="compare-pick",
                               allow_custom_value=True, min_width=240)
            all_btn = gr.Button("Select all shown", size="sm", scale=0)
        with gr.Row():
            metric = gr.Dropdown(list(CURVES), value="train loss", label="Curve", elem_id="compare-metric",
                                 min_width=200)
            xaxis = gr.Radio(list(X_AXES), value="step", label="x-axis", min_width=200)
            smooth = gr.Slider(0, 0.99, value=SMOOTHING, step=0.01, label="Smoothing (train loss)",
                               elem_id="compare-smoothing", min_width=200, info="0 shows each step's own batch loss.")
            with gr.Column(min_width=200):
                diff_only = gr.Checkbox(value=True, label="Configuration: differences only")
                group = gr.Checkbox(value=True, label="Group seed repeats", elem_id="compare-group",
                                    info="Runs that differ only in their seed: mean curve and min-max band.")
        bands = gr.Plot(label="Seed repeats: mean and min-max band", show_label=False, visible=False,
                        elem_id="compare-bands")
        groups = gr.Dataframe(pd.DataFrame(columns=GROUP_COLS), interactive=False, visible=False,
                              label="Final metrics by group: mean [min, max] over seeds", elem_id="compare-groups")
        curves = gr.LinePlot(x="x", y="value", color="run", height=340, elem_id="compare-curves",
                             title="Selected runs", y_title="train loss", x_title="step")
        finals = gr.Dataframe(pd.DataFrame(columns=["run", *FINALS.values()]), label="Final metrics",
                              interactive=False, elem_id="compare-finals")
        configs = gr.Dataframe(pd.DataFrame(columns=["run"]), label="Configuration", interactive=False,
                               elem_id="compare-configs")
        params = gr.Plot(label="Parameters per component", show_label=False, visible=False, elem_id="compare-params")
        export_btn = gr.Button("Export selection (config JSON, metrics CSV, figures PNG)", size="sm")
        files = gr.File(label="Exported files", file_count="multiple", interactive=False, visible=False,
                        elem_id="compare-files")
        timer = gr.Timer(LIVE_POLL_S, active=False)
        build_publish_panel(ctx, pick)

    @errors_as_messages
    def on_refresh(*args: Any):
        *fs, run_ids = args
        for r in run_ids or []:
            ctx.store.path(r)  # refuses ids that are not run ids (a deleted run is only left out)
        listing = ctx.store.list()
        df = only(listing, fs)
        return run_table(df), gr.Dropdown(choices=choices(df, run_ids, listing))

    def on_listed(shown: Any):  # the table lists a live run: the timer keeps it (and the rest) current
        return turn_on(shows_live(shown))

    gr.on([refresh.click, tab.select, pick.change] + [f.change for f in filters],
          with_api_params(on_refresh, FILTER_PARAMS + ["run_ids"]), inputs=[*filters, pick], outputs=[table, pick],
          api_name="list_runs", trigger_mode="always_last", show_progress="hidden").success(
        on_listed, inputs=table, outputs=timer, api_name="list_runs_live", api_visibility="private",
        show_progress="hidden")

    @errors_as_messages
    def on_all(*fs: Any):
        return gr.Dropdown(value=[r for _, r in choices(filtered(ctx, list(fs)))])

    all_btn.click(with_api_params(on_all, FILTER_PARAMS), inputs=filters, outputs=pick, api_name="select_all")
    settings = [pick, metric, xaxis, smooth, diff_only]
    snames = ["run_ids", "metric", "x", "smoothing", "diff_only"]

    @errors_as_messages
    def on_compare(run_ids: list[str], metric: str, x: str, smoothing: float, diff_only: bool):
        starts = turn_on(any_live(ctx, run_ids))  # read before the frames: see live_views
        curves_df, finals_df, configs_df, fig = compare_frames(ctx, run_ids, metric, x, smoothing, diff_only)
        return (gr.LinePlot(value=curves_df, x_title=x, y_title=metric), coloured(finals_df), configs_df,
                gr.Plot(value=fig, visible=fig is not None), starts)

    @errors_as_messages
    def on_colours(shown: Any):
        # A second step, once the new curves are in (see the note in ui/common.py). The colours are for
        # the series the plot now holds, not for the selection: a newer selection may already be in the
        # picker while its curves are on their way, and a colour map naming series the plot lacks draws
        # them without a stroke, with no later change of the map to redraw them.
        return gr.LinePlot(color_map=colour_map(series_of(shown)))

    gr.on([c.change for c in settings], on_compare, inputs=settings, outputs=[curves, finals, configs, params, timer],
          api_name="compare", trigger_mode="always_last").success(
        on_colours, inputs=curves, outputs=curves, api_name="compare_colours", show_progress="hidden")
    def on_new_selection():  # files exported for another selection are not this one's
        return gr.File(value=None, visible=False)

    pick.change(on_new_selection, outputs=files, api_name="export_clear", api_visibility="private",
                show_progress="hidden")

    @errors_as_messages
    def on_groups(run_ids: list[str], metric: str, x: str, smoothing: float, grouped: bool):
        starts = turn_on(any_live(ctx, run_ids))  # read before the frames: see live_views
        return *group_views(ctx, run_ids, metric, x, smoothing, grouped), starts

    group_inputs = [pick, metric, xaxis, smooth, group]
    gr.on([c.change for c in group_inputs], with_api_params(on_groups, snames[:4] + ["group"]), inputs=group_inputs,
          outputs=[bands, groups, timer], api_name="compare_groups", trigger_mode="always_last")

    @errors_as_messages
    def on_tick(*args: Any):
        run_ids, metric, x, smoothing, diff_only, grouped, *fs, shown_finals, shown_groups = args
        return live_views(ctx, run_ids, metric, x, smoothing, diff_only, grouped, fs,
                          redraw=shows_live(shown_finals, shown_groups))

    timer.tick(with_api_params(on_tick, snames + ["grouped"] + FILTER_PARAMS + ["finals", "groups"]),
               inputs=[*settings, group, *filters, finals, groups], outputs=[curves, finals, bands, groups, table, timer],
               api_name="compare_live", show_progress="hidden")
    export_btn.click(with_api_params(errors_as_messages(lambda *a: export(ctx, *a)), snames[:4]),
                     inputs=[pick, metric, xaxis, smooth], outputs=files, api_name="export")
    return CompareTab(tab, pick, metric, group, note, curves)
