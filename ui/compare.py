"""Compare tab: filter stored runs, pick any number, overlay their curves, diff their configs.

Listing reads only each run's small JSON files; metrics are read for the selected runs only.
"""
from __future__ import annotations

import os
import tempfile
from typing import Any, Optional

import gradio as gr
import pandas as pd

from lab.analysis import param_breakdown
from lab.config import ARCHS, NORMS, POS_ENCODINGS, TASK_NAMES
from lab.plots import curves_figure, params_figure, to_png
from ui.common import CURVES, X_AXES, AppContext, colour_map, curve, friendly, named, short_label

FILTERS = {"task.name": TASK_NAMES, "model.arch": ARCHS, "model.pos": POS_ENCODINGS, "model.norm": NORMS}
TABLE_COLS = {"run_id": "run", "state": "state", "task.name": "task", "model.arch": "arch", "model.pos": "PE",
              "model.norm": "norm", "model.n_layers": "layers", "model.n_heads": "heads", "model.d_model": "d_model",
              "train.steps": "steps", "train.seed": "seed", "final.eval.exact_match": "exact-match",
              "final.ood.exact_match": "exact-match (longer)", "final.params": "params", "damaged": "problem"}
CONFIG_PREFIXES = ("model.", "task.", "train.")


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


def run_labels(ctx: AppContext, run_ids: Optional[list[str]],
               listing: Optional[pd.DataFrame] = None) -> dict[str, str]:
    """run id -> its label in curves and tables; ValueError for an id that is not a stored run."""
    listing = ctx.store.list().set_index("run_id") if listing is None else listing
    for r in run_ids or []:
        ctx.store.path(r)  # refuses ids that are not run ids (path tricks included)
        if r not in listing.index:
            raise ValueError(f"run_id: {r!r} is not a stored run")
    return {r: short_label({"run_id": r, **listing.loc[r].to_dict()}) for r in run_ids or []}


def compare_frames(ctx: AppContext, run_ids: list[str], metric: str, x: str, smoothing: float,
                   diff_only: bool) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, Any]:
    listing = ctx.store.list().set_index("run_id")
    labels = run_labels(ctx, run_ids, listing)
    run_ids = list(run_ids or [])
    curves = [curve(ctx.store.metrics(r), metric, x, smoothing).assign(run=labels[r]) for r in run_ids]
    empty = pd.DataFrame({"x": [], "value": [], "run": pd.Series([], dtype=object)})  # run: nominal, even empty
    curves_df = pd.concat(curves) if curves else empty
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
    parts = {labels[r]: param_breakdown(ctx.store.config(r)) for r in run_ids}
    return curves_df, finals.round(4), configs, params_figure(parts) if parts else None


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


def build_compare_tab(ctx: AppContext) -> gr.Tab:
    with gr.Tab("Compare", id="compare") as tab:
        gr.Markdown("Pick any number of stored runs to overlay their curves and see what differs between them.")
        with gr.Row():
            filters = [gr.Dropdown(list(vals), multiselect=True, label=col.split(".")[1], value=[], scale=1)
                       for col, vals in FILTERS.items()]
            refresh = gr.Button("Refresh", size="sm", scale=0, elem_id="compare-refresh")
        table = gr.Dataframe(label="Stored runs", interactive=False, max_height=260, elem_id="runs-table")
        with gr.Row():
            pick = gr.Dropdown([], multiselect=True, label="Runs to compare", scale=4, elem_id="compare-pick",
                               allow_custom_value=True)
            all_btn = gr.Button("Select all shown", size="sm", scale=0)
        with gr.Row():
            metric = gr.Dropdown(list(CURVES), value="train loss", label="Curve")
            xaxis = gr.Radio(list(X_AXES), value="step", label="x-axis")
            smooth = gr.Slider(0, 0.95, value=0.0, step=0.05, label="Smoothing (EMA)")
            diff_only = gr.Checkbox(value=True, label="Config: differences only")
        curves = gr.LinePlot(x="x", y="value", color="run", height=340, elem_id="compare-curves",
                             title="Selected runs")
        finals = gr.Dataframe(label="Final metrics", interactive=False)
        configs = gr.Dataframe(label="Configuration", interactive=False)
        params = gr.Plot(label="Parameters per component")
        with gr.Row():
            export_btn = gr.Button("Export selection (config JSON, metrics CSV, figures PNG)", size="sm")
        files = gr.File(label="Exported files", file_count="multiple", interactive=False)

    @friendly
    def on_refresh(*fs: Any):
        df = filtered(ctx, list(fs))
        return run_table(df), gr.Dropdown(choices=choices(df))

    listing_triggers = [refresh.click, tab.select] + [f.change for f in filters]
    fnames = [c.split(".")[1] for c in FILTERS]
    gr.on(listing_triggers, named(on_refresh, fnames), inputs=filters, outputs=[table, pick], api_name="list_runs")

    @friendly
    def on_all(*fs: Any):
        return gr.Dropdown(value=[r for _, r in choices(filtered(ctx, list(fs)))])

    all_btn.click(named(on_all, fnames), inputs=filters, outputs=pick, api_name="select_all")
    settings = [pick, metric, xaxis, smooth, diff_only]
    snames = ["run_ids", "metric", "x", "smoothing", "diff_only"]

    @friendly
    def on_compare(run_ids: list[str], metric: str, x: str, smoothing: float, diff_only: bool):
        curves_df, *rest = compare_frames(ctx, run_ids, metric, x, smoothing, diff_only)
        return gr.LinePlot(value=curves_df, x_title=x, y_title=metric), *rest

    @friendly
    def on_colours(run_ids: list[str]):
        # a second step, once the new curves are in: see the note in ui/common.py
        return gr.LinePlot(color_map=colour_map(list(run_labels(ctx, run_ids).values())))

    gr.on([c.change for c in settings], on_compare, inputs=settings, outputs=[curves, finals, configs, params],
          api_name="compare", trigger_mode="always_last").success(
        on_colours, inputs=pick, outputs=curves, api_name="compare_colours", show_progress="hidden")
    export_btn.click(named(friendly(lambda *a: export(ctx, *a)), snames[:4]), inputs=[pick, metric, xaxis, smooth], outputs=files,
                     api_name="export")
    return tab
