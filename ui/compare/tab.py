"""Compare tab: filter stored runs, pick any number, overlay their curves (one or several metrics),
diff their configs, and group seed repeats into a mean curve with a min-max band. This room lays the tab
out and wires its events; `render` (ui/compare/render.py) turns the controls into the widgets' updates, and
the frames and figures come from lab/views/compare_frames.py and lab/views/compare_figures.py, which the
Export and the Python API (lab/api/figures.py) draw from too.

Every view on the tab is drawn by one handler, `render`, from the controls as they are now: any change
of a control, Refresh, opening the tab and the live timer all fire that one event. Gradio runs one
event at a time per page and, with trigger_mode "always_last", runs it once more with the newest
controls when they changed while it ran, so a view can never be left drawn from the controls before
the last change (a curve switch once left the previous curve's values under the new axis titles, drawn
by a slower second handler). The page's last drawn state is kept in a gr.State, so a call sends only
what changed: an idle page sends nothing, and the picker's labels update without firing it again.

Other tabs (presets, the ablation grid) open it on their runs through `opening` and `CompareTab.opener`:
they write a request that fires the same event, so only that event ever writes the picker, the note and
the curves, and one answer brings all three (ui/compare/render.py `Asked`).
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import gradio as gr
import pandas as pd

from lab.views.compare_figures import export_figures
from lab.views.compare_frames import (FILTER_LABELS, FILTER_PARAMS, FILTERS, FINALS, GROUP_COLS, SMOOTHING,
                                      TABLE_COLS, WHEN_MEASURED, choices, metric_list, only, read_selection)
from lab.views.curves import CURVES, X_AXES
from lab.views.plots import to_png
from ui.common import AppContext, Outputs, errors_as_messages, kept, with_api_params
from ui.compare.class_board import build_publish_panel
from ui.compare.render import LIVE_POLL_S, Asked, Controls, NoteSource, render

DEFAULT_CURVES = ["train loss (batch)"]


@dataclass
class CompareTab:
    """The tab, and what other tabs drive: the request to open it on other runs (`opening`)."""
    tab: gr.Tab
    asked: gr.State

    def opener(self, tabs: gr.Tabs) -> dict[str, Any]:
        """The components that opening Compare on other runs writes, by `Opened`'s field names."""
        return {"tabs": tabs, "asked": self.asked}


@dataclass(frozen=True)
class Opened(Outputs):
    """Compare opened on other runs: the tab bar and the request (`opening`)."""
    tabs: Any = kept()
    asked: Any = kept()


def opening(run_ids: Sequence[str], metrics: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """Compare opened on `run_ids`, by `Opened`'s field names: the tab selected, and a request for the runs,
    the curves `metrics` (None: as they are) and grouping on. The tab's one event answers it (its change
    fires that event): the picker, the note and the views for these runs come in one answer, after any
    redraw already under way for the runs shown before (ui/compare/render.py `Asked`)."""
    return {"tabs": gr.Tabs(selected="compare"), "asked": Asked.new(run_ids, metrics)}


def export(ctx: AppContext, run_ids: list[str], metric: Any, x: str, smoothing: float,
           grouped: bool = True) -> gr.File:
    """The selection's configs (JSON), metrics (CSV) and figures (PNG, lab/views/compare_figures.py
    export_figures): the curves as Compare draws them, with the same axis titles, the parameters per
    component and, with seed repeats grouped, the bands. Each run's metrics and config are read once."""
    if not run_ids:
        raise gr.Error("Select at least one run to export.")
    metrics = metric_list(metric)
    sel = read_selection(ctx.store, run_ids)
    folder = tempfile.mkdtemp(prefix="lab-export-")
    files = [os.path.join(folder, "configs.json"), os.path.join(folder, "metrics.csv")]
    pd.Series({r: config.to_dict() for r, config in sel.configs.items()}).to_json(files[0], indent=2)
    pd.concat([m.assign(run_id=r) for r, m in sel.metrics.items()]).to_csv(files[1], index=False)
    for name, fig in export_figures(sel, metrics, x, smoothing, grouped, ctx.jobs.limits.max_live_points).items():
        files.append(os.path.join(folder, name))
        with open(files[-1], "wb") as fh:
            fh.write(to_png(fig))
    return gr.File(value=files, visible=True)


@dataclass
class Page:
    """The tab's components: its controls, its views, and what only the events use."""
    tab: gr.Tab
    note: gr.Markdown
    filters: list[gr.Dropdown]
    refresh: gr.Button
    table: gr.Dataframe
    pick: gr.Dropdown
    all_btn: gr.Button
    metric: gr.Dropdown
    xaxis: gr.Radio
    smooth: gr.Slider
    diff_only: gr.Checkbox
    group: gr.Checkbox
    views: dict[str, Any]  # render's outputs by name (ui/compare/render.py)
    export_btn: gr.Button
    files: gr.File
    asked: gr.State  # another tab's request to open the tab on runs (`opening`)

    @property
    def controls(self) -> list[Any]:
        """render's inputs in `Controls.of`'s order (the page's state follows them)."""
        return [*self.filters, self.pick, self.metric, self.xaxis, self.smooth, self.diff_only, self.group,
                self.views["cell"]]


def _selection_controls() -> tuple[list[gr.Dropdown], gr.Button, gr.Dataframe, gr.Dropdown, gr.Button]:
    """The filters, the stored-runs table and the run picker."""
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
    return filters, refresh, table, pick, all_btn


def _curve_controls() -> tuple[gr.Dropdown, gr.Radio, gr.Slider, gr.Checkbox, gr.Checkbox]:
    """The curves drawn, the x-axis, the smoothing, the config diff and the seed grouping."""
    with gr.Row():
        metric = gr.Dropdown(list(CURVES), value=DEFAULT_CURVES, multiselect=True, label="Curves",
                             elem_id="compare-metric", min_width=260,
                             info="Pick several to overlay them (e.g. train and held-out accuracy).")
        xaxis = gr.Radio(list(X_AXES), value="step", label="x-axis", min_width=200, elem_id="compare-xaxis")
        smooth = gr.Slider(0, 0.99, value=SMOOTHING, step=0.01, label="Smoothing (batch loss)",
                           elem_id="compare-smoothing", min_width=200, info="0 shows each step's own batch loss.")
        with gr.Column(min_width=200):
            diff_only = gr.Checkbox(value=True, label="Configuration: differences only", elem_id="compare-diff")
            group = gr.Checkbox(value=True, label="Group seed repeats", elem_id="compare-group",
                                info="Runs that differ only in their seed: mean curve and min-max band.")
    return metric, xaxis, smooth, diff_only, group


# what /compare returns, in this order (a script reads them by position)
OUTPUTS = ("table", "pick", "curves", "finals", "configs", "params", "stability", "bands", "groups", "files", "timer",
           "note", "shown", "metric", "group", "cell", "lengths")


def _views() -> dict[str, Any]:
    """The views that render draws, by its output names (the note, the table, the picker and the files are
    laid out elsewhere and added by the caller), top to bottom."""
    views = {
        "stability": gr.Plot(label="Stability map", show_label=False, visible=False, elem_id="compare-stability"),
        "bands": gr.Plot(label="Seed repeats: mean and min-max band", show_label=False, visible=False,
                         elem_id="compare-bands"),
        "groups": gr.Dataframe(pd.DataFrame(columns=GROUP_COLS), interactive=False, visible=False,
                               label="Final metrics by group: mean [min, max] over seeds", elem_id="compare-groups"),
        "curves": gr.Plot(label="Selected runs", show_label=False, elem_id="compare-curves")}
    with gr.Accordion("Accuracy by input length", open=True, elem_id="compare-lengths-panel"):
        views["cell"] = gr.Dropdown([], value="", label="Configuration", elem_id="compare-cell", allow_custom_value=True,
                                    info="Picked runs whose task is scored on inputs longer than its training ones "
                                         "(finished runs; a configuration's seeds together).")
        views["lengths"] = gr.Plot(label="Accuracy by input length", show_label=False, visible=False,
                                   elem_id="compare-lengths")
    views |= {
        "finals": gr.Dataframe(pd.DataFrame(columns=["run", *(c for c in FINALS.values() if c not in WHEN_MEASURED)]),
                               label="Final metrics",
                               interactive=False, elem_id="compare-finals"),
        "configs": gr.Dataframe(pd.DataFrame(columns=["run"]), label="Configuration", interactive=False,
                                elem_id="compare-configs"),
        "params": gr.Plot(label="Parameters per component", show_label=False, visible=False,
                          elem_id="compare-params")}
    return views


def _lay_out(ctx: AppContext) -> Page:
    """The tab and its components, top to bottom."""
    with gr.Tab("Compare", id="compare") as tab:
        gr.Markdown("Pick any number of stored runs to overlay their curves and see what differs between them.")
        note = gr.Markdown("", elem_id="compare-note")
        filters, refresh, table, pick, all_btn = _selection_controls()
        metric, xaxis, smooth, diff_only, group = _curve_controls()
        views = _views()
        export_btn = gr.Button("Export selection (config JSON, metrics CSV, figures PNG)", size="sm")
        files = gr.File(label="Exported files", file_count="multiple", interactive=False, visible=False,
                        elem_id="compare-files")
        views.update(table=table, pick=pick, files=files, note=note, timer=gr.Timer(LIVE_POLL_S, active=False),
                     shown=gr.State({}), metric=metric, group=group)  # shown: what the page shows now (ui/compare/render.py)
        asked = gr.State({})
        views = {name: views[name] for name in OUTPUTS}  # the /compare endpoint's outputs, in the API's order
        build_publish_panel(ctx, pick)
    return Page(tab, note, filters, refresh, table, pick, all_btn, metric, xaxis, smooth, diff_only, group, views,
                export_btn, files, asked)


def _wire_render(ctx: AppContext, page: Page, note_source: Optional[NoteSource]) -> None:
    """One event draws every view (see the module's docstring): any control, Refresh, the tab, the timer, and
    another tab's request to open it on runs."""
    outputs = page.views
    note_input = [note_source[0]] if note_source else []
    note_fn: Optional[Callable] = note_source[1] if note_source else None
    n = len(page.controls)

    @errors_as_messages
    def on_change(*args: Any) -> dict:
        *fs, run_ids, metrics, x, smoothing, diff, grouped, cell, state, asked = args[:n + 2]
        controls = Controls.of(fs, run_ids, metrics, x, smoothing, diff, grouped, cell)
        note_value = args[n + 2] if note_fn else None
        views = render(ctx, controls, state if isinstance(state, dict) else {},
                       (lambda ids: note_fn(ctx, note_value, ids)) if note_fn else None, Asked.of(asked))
        return {outputs[name]: value for name, value in views.items()}

    triggers = [c.change for c in page.controls] + [page.refresh.click, page.tab.select, outputs["timer"].tick,
                                                    page.asked.change]
    gr.on(triggers,
          with_api_params(on_change, FILTER_PARAMS + ["run_ids", "metric", "x", "smoothing", "diff_only", "grouped",
                                                      "cell", "shown", "asked"] + (["last_preset"] if note_fn else [])),
          inputs=[*page.controls, outputs["shown"], page.asked, *note_input], outputs=list(outputs.values()),
          api_name="compare",
          trigger_mode="always_last", show_progress="hidden")


def _wire_buttons(ctx: AppContext, page: Page) -> None:
    """Select all shown, and Export: endpoints a script calls too (/select_all, /export)."""
    @errors_as_messages
    def on_all(*fs: Any) -> Any:
        return gr.Dropdown(value=[r for _, r in choices(only(ctx.store.list(), list(fs)))])

    page.all_btn.click(with_api_params(on_all, FILTER_PARAMS), inputs=page.filters, outputs=page.pick,
                       api_name="select_all")
    page.export_btn.click(with_api_params(errors_as_messages(lambda *a: export(ctx, *a)),
                                          ["run_ids", "metric", "x", "smoothing", "grouped"]),
                          inputs=[page.pick, page.metric, page.xaxis, page.smooth, page.group], outputs=page.files,
                          api_name="export")


def build_compare_tab(ctx: AppContext, note_source: Optional[NoteSource] = None) -> CompareTab:
    """The tab. `note_source`: (a component, fn(ctx, its value, run ids) -> markdown) for the note above
    the curves, e.g. the last preset's explanation while its runs are the ones picked."""
    page = _lay_out(ctx)
    _wire_render(ctx, page, note_source)
    _wire_buttons(ctx, page)
    return CompareTab(page.tab, page.asked)
