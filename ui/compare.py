"""Compare tab: filter stored runs, pick any number, overlay their curves, diff their configs, and
group seed repeats into a mean curve with a min-max band.

Listing reads only each run's small JSON files; metrics are read for the selected runs only. Other
tabs (presets, the ablation grid) open it on their runs through `CompareTab.pick`/`metric`; while a
selected run is live, a timer redraws the curves and groups.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Any, Optional

import gradio as gr
import pandas as pd

from lab.params import param_breakdown
from lab.config import declared_fields
from lab.teach.grid import band, group_runs, varied_columns
from lab.engine.limits import thin
from lab.views.plots import bands_figure, curves_figure, params_figure, to_png
from lab.engine.store import LIVE_STATES
from ui.common import (CURVES, X_AXES, AppContext, colour_map, compact, curve, errors_as_messages, with_api_params, short_label,
                       with_series)

# the run table's config columns and the filters come from the fields' declarations (lab/config.py)
FILTERS = {f.key: f.choices for f in declared_fields() if f.spec.filter}
FILTER_LABELS = {f.key: f.spec.column or f.spec.label for f in declared_fields() if f.spec.filter}
TABLE_COLS = {"run_id": "run", "state": "state", **{f.key: f.spec.column for f in declared_fields() if f.spec.column},
              "final.eval.exact_match": "exact-match", "final.ood.exact_match": "exact-match (longer)",
              "final.params": "params", "damaged": "problem"}
CONFIG_PREFIXES = ("model.", "task.", "train.")
GROUP_METRICS = {"final.train_loss": "train loss", "final.eval.loss": "eval loss",
                 "final.eval.exact_match": "exact-match", "final.ood.exact_match": "exact-match (longer)",
                 "final.wall_s": "wall s"}
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


def filtered(ctx: AppContext, filters: list[Optional[list[str]]]) -> pd.DataFrame:
    df = ctx.store.list()
    for (col, _), chosen in zip(FILTERS.items(), filters):
        if chosen and col in df.columns:
            df = df[df[col].isin(chosen)]
    return df


def run_table(df: pd.DataFrame) -> pd.DataFrame:
    cols = [c for c in TABLE_COLS if c in df.columns]
    out = df[cols].rename(columns=TABLE_COLS)
    for c in ("exact-match", "exact-match (longer)"):
        if c in out.columns:
            out[c] = out[c].map(lambda v: "" if pd.isna(v) else f"{v:.3f}")
    return out.iloc[::-1].reset_index(drop=True)  # newest first


def choices(df: pd.DataFrame) -> list[tuple[str, str]]:
    return [(short_label(r), r["run_id"]) for r in df.iloc[::-1].to_dict("records") if not r.get("damaged")]


def _configs(listing: pd.DataFrame, run_ids: list[str]) -> dict[str, dict[str, Any]]:
    cols = [c for c in listing.columns if c.startswith(CONFIG_PREFIXES)]
    return {r: listing.loc[r, cols].to_dict() for r in run_ids}


def run_labels(ctx: AppContext, run_ids: Optional[list[str]],
               listing: Optional[pd.DataFrame] = None) -> dict[str, str]:
    """run id -> its label in curves and tables, led by what differs between the runs ('rope s1 (a1b2c3)');
    ValueError for an id that is not a stored run."""
    listing = ctx.store.list().set_index("run_id") if listing is None else listing
    for r in run_ids or []:
        ctx.store.path(r)  # refuses ids that are not run ids (path tricks included)
        if r not in listing.index:
            raise ValueError(f"run_id: {r!r} is not a stored run")
    run_ids = list(dict.fromkeys(run_ids or []))
    varied = varied_columns(_configs(listing, run_ids)) if len(run_ids) > 1 else []
    return {r: short_label({"run_id": r, **listing.loc[r].to_dict()}, varied) for r in run_ids}


def compare_frames(ctx: AppContext, run_ids: list[str], metric: str, x: str, smoothing: float, diff_only: bool,
                   with_params: bool = True, listing: Optional[pd.DataFrame] = None,
                   ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, Any]:
    """Curves, final metrics, config table and parameter figure (None without runs or `with_params`: the
    live timer redraws only what changes while runs train). `listing`: the store's listing indexed by run
    id, if the caller has read it already."""
    listing = ctx.store.list().set_index("run_id") if listing is None else listing
    labels = run_labels(ctx, run_ids, listing)
    run_ids = list(labels)
    points = ctx.jobs.limits.max_live_points  # long runs: evenly thinned, so the page stays light
    curves = [thin(curve(ctx.store.metrics(r), metric, x, smoothing), points).assign(run=labels[r]) for r in run_ids]
    empty = pd.DataFrame({"x": [], "value": [], "run": pd.Series([], dtype=object)})  # run: nominal, even empty
    curves_df = pd.concat(curves) if curves else empty
    curves_df = with_series(curves_df, "run", tuple(labels.values()), "x")  # runs without points yet included
    order = pd.Categorical(curves_df["run"], categories=list(labels.values()))
    curves_df = curves_df.iloc[order.argsort(kind="stable")]  # series appear in the selection's order
    finals = pd.DataFrame([{
        "run": labels[r], "state": listing.loc[r, "state"],
        "params": listing.loc[r].get("final.params"), "steps": listing.loc[r].get("step"),
        "train loss": listing.loc[r].get("final.train_loss"),
        "exact-match": listing.loc[r].get("final.eval.exact_match"),
        "exact-match (longer)": listing.loc[r].get("final.ood.exact_match"),
        "wall s": listing.loc[r].get("final.wall_s"),
    } for r in run_ids])
    cfg_cols = [c for c in listing.columns if c.startswith(CONFIG_PREFIXES)]
    configs = listing.loc[run_ids, cfg_cols] if run_ids else pd.DataFrame(columns=cfg_cols)
    if diff_only and len(configs) > 1:
        configs = configs.loc[:, configs.astype(str).nunique() > 1]
    configs = configs.rename(index=labels).reset_index(names="run")
    parts = {labels[r]: param_breakdown(ctx.store.config(r)) for r in run_ids} if with_params else {}
    return curves_df, finals.round(4), configs, params_figure(parts) if parts else None


def run_curve(metrics: pd.DataFrame, metric: str, x: str, smoothing: float) -> pd.DataFrame:
    """One metric of one run as columns (step, x, value), for averaging over runs step by step."""
    kind, col = CURVES[metric]
    if metrics.empty or col not in metrics.columns:
        return pd.DataFrame({"step": [], "x": [], "value": []})
    m = metrics[metrics["kind"] == kind]
    df = pd.DataFrame({"step": m["step"], "x": m[X_AXES[x]], "value": m[col]}).dropna(subset=["value"])
    if smoothing > 0 and len(df):
        df["value"] = df["value"].ewm(alpha=1 - smoothing, adjust=True).mean()
    return df.reset_index(drop=True)


def group_label(key: tuple, n: int) -> str:
    parts = [compact(col, value) for col, value in key] or ["all runs"]
    return " ".join(parts) + f" ({n} seed{'s' if n != 1 else ''})"


def _spread(values: pd.Series) -> str:
    v = pd.to_numeric(values, errors="coerce").dropna()
    if v.empty:
        return ""
    return f"{v.mean():.3f} [{v.min():.3f}, {v.max():.3f}]" if len(v) > 1 else f"{v.iloc[0]:.3f}"


def group_frames(ctx: AppContext, run_ids: list[str], metric: str, x: str, smoothing: float,
                 listing: Optional[pd.DataFrame] = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Seed repeats grouped by the other varied config values: band curves (group, step, x, mean, lo, hi,
    n) and a table of final metrics per group as 'mean [min, max]' over its runs (`listing` as in
    compare_frames)."""
    listing = ctx.store.list().set_index("run_id") if listing is None else listing
    run_labels(ctx, run_ids, listing)  # validates the ids
    run_ids = list(dict.fromkeys(run_ids or []))
    groups = group_runs(_configs(listing, run_ids))
    bands, rows = [], []
    for key, members in groups.items():
        label = group_label(key, len(members))
        curves = [run_curve(ctx.store.metrics(r), metric, x, smoothing) for r in members]
        bands.append(band(curves).assign(group=label))
        rows.append({"group": label, "runs": len(members),
                     "seeds": ", ".join(str(listing.loc[r, "train.seed"]) for r in members),
                     "finished": sum(listing.loc[r, "state"] not in LIVE_STATES for r in members),
                     **{name: _spread(listing.loc[members].get(col, pd.Series(dtype=float)))
                        for col, name in GROUP_METRICS.items()}})
    return (pd.concat(bands, ignore_index=True) if bands else pd.DataFrame(),
            pd.DataFrame(rows, columns=["group", "runs", "seeds", "finished", *GROUP_METRICS.values()]))


def select(ctx: AppContext, run_ids: list[str]) -> dict:
    """The run picker set to `run_ids` (with every listed run as a choice): how other tabs open Compare."""
    return gr.update(choices=choices(ctx.store.list()), value=list(run_ids))


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
        return gr.Plot(visible=False), gr.Dataframe(visible=False)
    fig = bands_figure(band_df, x, metric, title=f"{metric}: mean over seeds, band = min to max")
    return gr.Plot(value=fig, visible=True), gr.Dataframe(value=table_df, visible=True)


def live_views(ctx: AppContext, run_ids: Optional[list[str]], metric: str, x: str, smoothing: float,
               diff_only: bool, grouped: bool) -> tuple:
    """One tick of the live timer: curves, final metrics, grouped view, and the timer's next state.

    Only a tick turns the timer off, and only one that found every selected run finished *before* it
    read their metrics: a run that ends while a handler reads would otherwise leave its curve cut short
    with nothing left to redraw it. The store is listed once: liveness, curves and groups all use it."""
    listing = ctx.store.list().set_index("run_id")  # read before any metrics
    live = any(listing.loc[r, "state"] in LIVE_STATES for r in run_ids or [] if r in listing.index)
    curves_df, finals_df, *_ = compare_frames(ctx, run_ids or [], metric, x, smoothing, diff_only, False, listing)
    views = group_views(ctx, run_ids, metric, x, smoothing, grouped, listing)
    return gr.LinePlot(value=curves_df), finals_df, *views, gr.Timer(active=live)


def turn_on(live: bool) -> Any:
    """The live timer's update from a change handler: on while a selected run is live, else left as it
    is (an active timer's next tick redraws once more and turns it off: see live_views)."""
    return gr.Timer(active=True) if live else gr.skip()


def export(ctx: AppContext, run_ids: list[str], metric: str, x: str, smoothing: float) -> list[str]:
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
    return files


def build_compare_tab(ctx: AppContext) -> CompareTab:
    with gr.Tab("Compare", id="compare") as tab:
        gr.Markdown("Pick any number of stored runs to overlay their curves and see what differs between them.")
        note = gr.Markdown("", elem_id="compare-note")
        with gr.Row():
            filters = [gr.Dropdown(list(vals), multiselect=True, label=FILTER_LABELS[col], value=[], scale=1)
                       for col, vals in FILTERS.items()]
            refresh = gr.Button("Refresh", size="sm", scale=0, elem_id="compare-refresh")
        table = gr.Dataframe(label="Stored runs", interactive=False, max_height=260, elem_id="runs-table")
        with gr.Row():
            pick = gr.Dropdown([], multiselect=True, label="Runs to compare", scale=4, elem_id="compare-pick",
                               allow_custom_value=True)
            all_btn = gr.Button("Select all shown", size="sm", scale=0)
        with gr.Row():
            metric = gr.Dropdown(list(CURVES), value="train loss", label="Curve", elem_id="compare-metric")
            xaxis = gr.Radio(list(X_AXES), value="step", label="x-axis")
            smooth = gr.Slider(0, 0.95, value=0.0, step=0.05, label="Smoothing (EMA)")
            diff_only = gr.Checkbox(value=True, label="Config: differences only")
            group = gr.Checkbox(value=True, label="Group seed repeats", elem_id="compare-group",
                                info="Runs that differ only in their seed: mean curve and min-max band.")
        bands = gr.Plot(label="Seed repeats: mean and min-max band", visible=False, elem_id="compare-bands")
        groups = gr.Dataframe(label="Final metrics by group: mean [min, max] over seeds", interactive=False,
                              visible=False, elem_id="compare-groups")
        curves = gr.LinePlot(x="x", y="value", color="run", height=340, elem_id="compare-curves",
                             title="Selected runs")
        finals = gr.Dataframe(label="Final metrics", interactive=False, elem_id="compare-finals")
        configs = gr.Dataframe(label="Configuration", interactive=False)
        params = gr.Plot(label="Parameters per component")
        with gr.Row():
            export_btn = gr.Button("Export selection (config JSON, metrics CSV, figures PNG)", size="sm")
        files = gr.File(label="Exported files", file_count="multiple", interactive=False)
        timer = gr.Timer(LIVE_POLL_S, active=False)

    @errors_as_messages
    def on_refresh(*fs: Any):
        df = filtered(ctx, list(fs))
        return run_table(df), gr.Dropdown(choices=choices(df))

    listing_triggers = [refresh.click, tab.select] + [f.change for f in filters]
    fnames = [c.split(".")[1] for c in FILTERS]
    gr.on(listing_triggers, with_api_params(on_refresh, fnames), inputs=filters, outputs=[table, pick], api_name="list_runs")

    @errors_as_messages
    def on_all(*fs: Any):
        return gr.Dropdown(value=[r for _, r in choices(filtered(ctx, list(fs)))])

    all_btn.click(with_api_params(on_all, fnames), inputs=filters, outputs=pick, api_name="select_all")
    settings = [pick, metric, xaxis, smooth, diff_only]
    snames = ["run_ids", "metric", "x", "smoothing", "diff_only"]

    @errors_as_messages
    def on_compare(run_ids: list[str], metric: str, x: str, smoothing: float, diff_only: bool):
        starts = turn_on(any_live(ctx, run_ids))  # read before the frames: see live_views
        curves_df, *rest = compare_frames(ctx, run_ids, metric, x, smoothing, diff_only)
        return gr.LinePlot(value=curves_df, x_title=x, y_title=metric), *rest, starts

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

    @errors_as_messages
    def on_groups(run_ids: list[str], metric: str, x: str, smoothing: float, grouped: bool):
        starts = turn_on(any_live(ctx, run_ids))  # read before the frames: see live_views
        return *group_views(ctx, run_ids, metric, x, smoothing, grouped), starts

    group_inputs = [pick, metric, xaxis, smooth, group]
    gr.on([c.change for c in group_inputs], with_api_params(on_groups, snames[:4] + ["group"]), inputs=group_inputs,
          outputs=[bands, groups, timer], api_name="compare_groups", trigger_mode="always_last")

    @errors_as_messages
    def on_tick(run_ids: list[str], metric: str, x: str, smoothing: float, diff_only: bool, grouped: bool):
        return live_views(ctx, run_ids, metric, x, smoothing, diff_only, grouped)

    timer.tick(on_tick, inputs=settings + [group], outputs=[curves, finals, bands, groups, timer],
               api_name="compare_live", show_progress="hidden")
    export_btn.click(with_api_params(errors_as_messages(lambda *a: export(ctx, *a)), snames[:4]), inputs=[pick, metric, xaxis, smooth],
                     outputs=files, api_name="export")
    return CompareTab(tab, pick, metric, group, note, curves)
