"""What Compare shows for its controls, drawn by one function: `render` reads the store once (the listing
first, then the picked runs' metrics and configs, as lab/views/compare_frames.py reads them) and returns the
widgets' updates for the views that differ from what the page shows. The frames and figures themselves
come from lab/views/compare_frames.py and lab/views/compare_figures.py.

The page's state travels in a gr.State (`shown`): fingerprints of the table, the picker's choices, the
views of the selection and the timer. A view is sent when its fingerprint changes, so
- an idle page (nothing live, no control changed) gets nothing: its timer only watches, every WATCH_POLL_S,
  for a run another screen continues (Gradio's timer does not tick in a hidden browser tab);
- the picker's labels change only when they differ, so updating them cannot fire the picker again;
- while a picked run trains, each tick redraws its curves; the tick that finds every run finished
  (read before their metrics) draws the final state and turns the timer off.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, Sequence

import gradio as gr
import pandas as pd

from lab.engine.store import LIVE_STATES
from lab.views.compare_figures import finals_view, groups_view, page_curves, params_png, stability_view
from lab.views.curve_figures import Mark
from lab.views.length_curves import cell_figure, length_cells
from lab.views.compare_frames import (GROUP_COLS, Selection, choices, curve_series, map_measure, metric_list, only,
                                      read_selection, run_table)
from ui.common import AppContext

LIVE_POLL_S = 2.0  # Compare's timer while a run it shows trains: each tick redraws what changed
WATCH_POLL_S = 5.0  # and while nothing shown trains: a run continued from another screen shows within 5 s
# (component, fn(ctx, its value, run ids) -> (the note above the curves, the steps it quotes, marked on them))
NoteSource = tuple[Any, Callable[[AppContext, Any, list[str]], tuple[str, tuple[Mark, ...]]]]


@dataclass(frozen=True)
class Asked:
    """Another tab's request to open Compare on runs (a preset, the grid, Show the last preset): it writes the
    request into a gr.State whose change fires `render`, the one event that writes the picker, the note and
    the curves. The browser runs one call of that event at a time and defers a new trigger until the call
    before has answered, so a request is answered after any redraw already under way, and the picker, the
    note and the curves it sets come in one answer: never one selection's note or curves beside another's
    picks (a preset clicked while a redraw for the runs shown before was on its way left that redraw's note
    above the new runs, or the grid's curves under a preset's run, until a timer tick).
    `token` tells a new request from one the page has answered (the page's record keeps it)."""
    run_ids: tuple[str, ...]
    metrics: Optional[tuple[str, ...]]  # None: the curves as they are
    token: str

    @classmethod
    def of(cls, value: Any) -> Optional["Asked"]:
        """The request in the state's value, or None (nothing asked yet, or anything else)."""
        if not isinstance(value, dict) or not isinstance(value.get("token"), str):
            return None
        metrics = value.get("metrics")
        return cls(tuple(str(r) for r in value.get("run_ids") or ()),
                   None if metrics is None else tuple(metric_list(metrics)), value["token"])

    @staticmethod
    def new(run_ids: Sequence[str], metrics: Optional[Sequence[str]] = None) -> dict:
        """A fresh request's value for the state (JSON-able)."""
        return {"run_ids": list(run_ids), "metrics": None if metrics is None else list(metrics),
                "token": uuid.uuid4().hex}

    def applied(self, c: "Controls") -> "Controls":
        """The controls with the request's runs picked, its curves (if any) and seed repeats grouped."""
        return replace(c, run_ids=tuple(dict.fromkeys(self.run_ids)), metrics=self.metrics or c.metrics,
                       grouped=True)


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
    cell: str = ""  # the configuration whose accuracy by length is drawn ("": the first there is)

    @classmethod
    def of(cls, filters: Sequence[Any], run_ids: Any, metrics: Any, x: Any, smoothing: Any, diff_only: Any,
           grouped: Any, cell: Any = "") -> "Controls":
        return cls(tuple(tuple(f or ()) for f in filters), tuple(dict.fromkeys(run_ids or [])),
                   tuple(metric_list(metrics)), str(x or "step"), float(smoothing or 0.0), bool(diff_only),
                   bool(grouped), cell if isinstance(cell, str) else "")


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _frame_key(df: pd.DataFrame) -> str:
    return df.to_json(orient="split", date_format="iso", default_handler=str)


def draw(ctx: AppContext, c: Controls, sel: Selection, redraw: dict[str, bool], with_params: bool,
         marks: tuple[Mark, ...]) -> dict:
    """The figures and tables `redraw` names (curves, finals, groups, stability), by output name."""
    out: dict = {}
    if redraw["curves"]:
        series, styles = curve_series(sel, c.metrics, c.x, c.smoothing, ctx.jobs.limits.max_live_points)
        out["curves"] = page_curves(series, styles, c.metrics, c.x, marks)
    if redraw["finals"]:
        out["finals"], out["configs"] = finals_view(sel, c.diff_only)
        if with_params:
            fig = params_png(sel)
            out["params"] = gr.Plot(value=fig, visible=fig is not None)
    if redraw["groups"]:
        drawn = groups_view(sel, c.metrics[0], c.x, c.smoothing) if c.grouped and sel.labels else None
        out["bands"] = gr.Plot(value=drawn[0] if drawn else None, visible=drawn is not None)
        out["groups"] = gr.Dataframe(value=drawn[1] if drawn else pd.DataFrame(columns=GROUP_COLS),
                                     visible=drawn is not None)
    if redraw["stability"]:
        fig = stability_view(sel, map_measure(c.metrics))
        out["stability"] = gr.Plot(value=fig, visible=fig is not None)
    return out


def by_length(ctx: AppContext, c: Controls, rows: dict[str, dict[str, Any]], changed: Callable[[str, str], bool]) -> dict:
    """The accuracy-by-length panel (lab/views/length_curves.py): the configurations of the picked runs that
    are scored on longer inputs, and the picked one's curve, each sent when it changed (`changed`: render's
    record). The curve is measured once per run and version of its weights, for every page."""
    cells = length_cells(rows)
    cell = c.cell if c.cell in cells else next(iter(cells), "")
    out: dict = {}
    if changed("cells", _key([list(cells), cell])):
        out["cell"] = gr.update(choices=list(cells), value=cell or None)
    members = cells.get(cell, [])
    if changed("lengths", _key([cell, [(r, rows[r].get("updated_at")) for r in members]])):
        fig = cell_figure(ctx.store, rows, cell, members)
        out["lengths"] = gr.Plot(value=fig, visible=fig is not None)
    return out


def render(ctx: AppContext, c: Controls, shown: dict,
           note: Optional[Callable[[list[str]], tuple[str, tuple[Mark, ...]]]] = None,
           asked: Optional[Asked] = None) -> dict:
    """The views (by output name) that differ from `shown`, plus the new `shown` under "shown". A request
    the page has not answered yet (`asked`) sets the controls it names first: the picker, the curves and
    the grouping are sent with the views drawn for them."""
    opening = asked is not None and shown.get("asked") != asked.token
    if opening:
        c = asked.applied(c)
    listing = ctx.store.list()  # read before any metrics: a run that ends later is redrawn by the next tick
    indexed, listed = listing.set_index("run_id"), only(listing, c.filters)
    states = {r: (indexed.loc[r, "state"], _key(indexed.loc[r].get("step"))) for r in c.run_ids if r in indexed.index}
    live = any(s in LIVE_STATES for s, _ in states.values())
    new, out = dict(shown), {}

    def changed(name: str, key: str) -> bool:
        if shown.get(name) == key:
            return False
        new[name] = key
        return True

    table, picker, selection = run_table(listed), choices(listed, list(c.run_ids), listing), _key([c.run_ids, states])
    text, marks = note(list(c.run_ids)) if note is not None else ("", ())
    redraw = {"curves": changed("curves", _key([selection, c.metrics, c.x, c.smoothing, marks])) or live,
              "finals": changed("finals", _key([selection, c.diff_only])) or live,
              "groups": changed("groups", _key([selection, c.metrics[0], c.x, c.smoothing, c.grouped])) or live,
              "stability": changed("stability", _key([selection, map_measure(c.metrics)])) or live}
    with_params = redraw["finals"] and changed("params", _key(c.run_ids))
    sel = read_selection(ctx.store, c.run_ids, indexed, configs=with_params,  # refuses ids that are not stored runs
                         metrics=redraw["curves"] or (redraw["groups"] and c.grouped) or redraw["stability"])
    if changed("table", _frame_key(table)):
        out["table"] = table
    if changed("choices", _key(picker)) or opening:
        out["pick"] = gr.update(choices=picker, value=list(c.run_ids)) if opening else gr.Dropdown(choices=picker)
    if opening:
        new["asked"] = asked.token
        out["group"] = gr.update(value=True)
        if asked.metrics:
            out["metric"] = gr.update(value=list(c.metrics))
    out.update(draw(ctx, c, sel, redraw, with_params, marks))
    if changed("selection", _key(c.run_ids)) and "selection" in shown:
        out["files"] = gr.File(value=None, visible=False)  # files exported for another selection
    if note is not None and changed("note", text):
        out["note"] = new["note"]
    out.update(by_length(ctx, c, {r: indexed.loc[r].to_dict() for r in c.run_ids if r in indexed.index}, changed))
    # the timer: every LIVE_POLL_S while a run shown trains; else, with runs stored, every WATCH_POLL_S, since
    # another screen may continue one (a page that stopped polling kept showing it "stopped" until Refresh)
    period = LIVE_POLL_S if live or listed["state"].isin(LIVE_STATES).any() else WATCH_POLL_S
    timer = {"active": not listing.empty, "value": period}
    if changed("timer", _key(timer)):
        out["timer"] = gr.update(**timer)  # explicit: a Timer(active=True) equals its default, sent as nothing
    out["shown"] = new
    return out
