"""Compare's views of stored runs as tables (no widgets here): the filtered listing, the picker's choices,
overlaid curves, final metrics, the config diff, and seed repeats grouped into mean curves with min-max
bands. Runs are named alike in the picker, the legend and every table (lab/views/run_labels.py label_runs).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import pandas as pd

from lab.config import declared_fields
from lab.engine.store import LIVE_STATES
from lab.engine.limits import thin
from lab.params import param_breakdown
from lab.engine.grid import band, group_runs, spread
from lab.views.plots import params_figure
from lab.views.curves import CURVES, RENAMED, X_AXES, colour_map, curve
from lab.views.run_labels import CONFIG_PREFIXES, label_groups, label_runs, short_label
from lab.views.stability_map import StabilityMap, run_final, stability_map
from ui.common import AppContext

# the run table's config columns and the filters come from the fields' declarations (lab/config.py)
FIELDS = declared_fields()
FILTERS = {f.key: f.choices for f in FIELDS if f.spec.filter}
FILTER_LABELS = {f.key: f.spec.label for f in FIELDS if f.spec.filter}  # as the Train tab labels them
FILTER_PARAMS = [f.url or f.name for f in FIELDS if f.spec.filter]  # the API's names: task, arch, pos, norm
CONFIG_LABELS = {f.key: f.spec.label for f in FIELDS}
TABLE_COLS = {"run_id": "run", "state": "state", **{f.key: f.spec.column for f in FIELDS if f.spec.column},
              "final.eval.exact_match": "held-out exact-match", "final.ood.exact_match": "held-out exact-match (longer)",
              "final.params": "parameters", "damaged": "problem"}
FINALS = {"state": "state", "final.params": "parameters", "step": "steps",
          "final.train_loss": "train loss (last batch)", "final.train_set.exact_match": "train exact-match",
          "final.eval.loss": "held-out loss", "final.eval.exact_match": "held-out exact-match",
          "final.ood.exact_match": "held-out exact-match (longer)", "final.wall_s": "wall time (s)"}
GROUP_METRICS = {k: v for k, v in FINALS.items() if k.startswith("final.") and k != "final.params"}
GROUP_COLS = ["group", "runs", "seeds", "finished", *GROUP_METRICS.values()]
SMOOTHING = 0.9  # train loss is one noisy batch a step (lengths vary): smoothed unless the user says not


def only(df: pd.DataFrame, filters: Optional[Sequence[Optional[list[str]]]]) -> pd.DataFrame:
    """The listing's rows that pass the filters (one list of allowed values per FILTERS column, or None)."""
    for (col, _), chosen in zip(FILTERS.items(), filters or []):
        if chosen and col in df.columns:
            df = df[df[col].isin(chosen)]
    return df


def filtered(ctx: AppContext, filters: list[Optional[list[str]]]) -> pd.DataFrame:
    return only(ctx.store.list(), filters)


def run_table(df: pd.DataFrame) -> pd.DataFrame:
    cols = [c for c in TABLE_COLS if c in df.columns]
    out = df[cols].rename(columns=TABLE_COLS)
    for c in ("held-out exact-match", "held-out exact-match (longer)"):
        if c in out.columns:
            out[c] = out[c].map(lambda v: "" if pd.isna(v) else f"{v:.3f}")
    return out.iloc[::-1].reset_index(drop=True)  # newest first


def choices(df: pd.DataFrame, selected: Sequence[str] = (), listing: Optional[pd.DataFrame] = None,
            ) -> list[tuple[str, str]]:
    """The picker's choices: the listed runs `df` (newest first; damaged ones left out) by their full label,
    and the selected runs (first when `df` leaves them out; their rows from `listing`, default `df`) by
    their labels among the selection, as the curves and tables name them."""
    every = (df if listing is None else listing).set_index("run_id")
    picked = [r for r in dict.fromkeys(selected or []) if r in every.index]
    labels = label_runs({r: every.loc[r].to_dict() for r in picked})
    listed = df.iloc[::-1].to_dict("records")
    shown = {r["run_id"] for r in listed}
    return [(labels[r], r) for r in picked if r not in shown] + [
        (labels.get(r["run_id"]) or short_label(r), r["run_id"]) for r in listed
        if r["run_id"] in labels or not r.get("damaged")]


def run_labels(ctx: AppContext, run_ids: Optional[list[str]],
               listing: Optional[pd.DataFrame] = None) -> dict[str, str]:
    """run id -> its label in curves and tables (lab/views/run_labels.py label_runs); ValueError for an id that is
    not a stored run."""
    listing = ctx.store.list().set_index("run_id") if listing is None else listing
    for r in run_ids or []:
        ctx.store.path(r)  # refuses ids that are not run ids (path tricks included)
        if r not in listing.index:
            raise ValueError(f"run_id: {r!r} is not a stored run")
    return label_runs({r: listing.loc[r].to_dict() for r in dict.fromkeys(run_ids or [])})


def metric_list(metric: Any) -> list[str]:
    """The curves picked (the Curves control is a multiselect; an API call may send one name): a list of
    CURVES names, at least one; an unknown name is refused with the allowed ones."""
    names = [metric] if isinstance(metric, str) else list(metric or [])
    for m in names:
        if m not in CURVES and m not in RENAMED:
            raise ValueError(f"Curves: {m!r} is not a curve (allowed: {', '.join(CURVES)})")
    return list(dict.fromkeys(RENAMED.get(m, m) for m in names)) or ["train loss (batch)"]


def series_frames(ctx: AppContext, run_ids: list[str], metrics: list[str], x: str, smoothing: float,
                  labels: Optional[dict[str, str]] = None,
                  ) -> tuple[dict[str, pd.DataFrame], dict[str, tuple[str, int]]]:
    """The curves of `run_ids` (each run's metrics read once), one frame (x, value) per run and metric in
    the selection's order, named by the run's label (and the metric, when several are drawn), and for each
    series (the run's label, the metric's index). Long runs are thinned evenly (the page stays light)."""
    labels = run_labels(ctx, run_ids) if labels is None else labels
    points = ctx.jobs.limits.max_live_points
    series, styles = {}, {}
    for r, label in labels.items():
        m = ctx.store.metrics(r)
        for i, metric in enumerate(metrics):
            name = label if len(metrics) == 1 else f"{label} · {metric}"
            series[name] = thin(curve(m, metric, x, smoothing), points)
            styles[name] = (label, i)
    return series, styles


def compare_frames(ctx: AppContext, run_ids: list[str], metric: str, x: str, smoothing: float, diff_only: bool,
                   with_params: bool = True, listing: Optional[pd.DataFrame] = None,
                   ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, Any]:
    """Curves (long format: x, value, run), final metrics, config table and parameter figure (None without
    runs or `with_params`). `listing`: the store's listing indexed by run id, if the caller has read it."""
    listing = ctx.store.list().set_index("run_id") if listing is None else listing
    labels = run_labels(ctx, run_ids, listing)
    run_ids = list(labels)
    series, _ = series_frames(ctx, run_ids, [metric], x, smoothing, labels)
    empty = pd.DataFrame({"x": [], "value": [], "run": pd.Series([], dtype=object)})  # run: nominal, even empty
    curves_df = pd.concat([df.assign(run=name) for name, df in series.items()]) if series else empty
    return (curves_df, *final_tables(ctx, run_ids, diff_only, listing, with_params))


def final_tables(ctx: AppContext, run_ids: list[str], diff_only: bool, listing: pd.DataFrame,
                 with_params: bool) -> tuple[pd.DataFrame, pd.DataFrame, Any]:
    """Final metrics, config table and parameter figure (None unless `with_params`), from the listing
    alone: no metrics are read."""
    labels = run_labels(ctx, run_ids, listing)
    run_ids = list(labels)
    finals = pd.DataFrame([{"run": labels[r], **{name: listing.loc[r].get(col) for col, name in FINALS.items()}}
                           for r in run_ids], columns=["run", *FINALS.values()])
    finals = finals.round(4).assign(**{"wall time (s)": finals["wall time (s)"].astype(float).round(1)})
    cfg_cols = [c for c in listing.columns if c.startswith(CONFIG_PREFIXES)]
    configs = listing.loc[run_ids, cfg_cols] if run_ids else pd.DataFrame(columns=cfg_cols)
    if diff_only and len(configs) > 1:
        configs = configs.loc[:, configs.astype(str).nunique() > 1]
    configs = configs.rename(index=labels, columns=CONFIG_LABELS).reset_index(names="run")
    parts = {labels[r]: param_breakdown(ctx.store.config(r)) for r in run_ids} if with_params else {}
    return finals, configs, params_figure(parts) if parts else None


def run_curve(metrics: pd.DataFrame, metric: str, x: str, smoothing: float) -> pd.DataFrame:
    """One metric of one run as columns (step, x, value), for averaging over runs step by step (smoothed
    as `curve` smooths: the train loss only)."""
    kind, col = CURVES[metric]
    if metrics.empty or col not in metrics.columns:
        return pd.DataFrame({"step": [], "x": [], "value": []})
    m = metrics[metrics["kind"] == kind]
    df = pd.DataFrame({"step": m["step"], "x": m[X_AXES[x]], "value": m[col]}).dropna(subset=["value"])
    if smoothing > 0 and len(df) and kind == "train":
        df["value"] = df["value"].ewm(alpha=1 - smoothing, adjust=True).mean()
    return df.reset_index(drop=True)


def group_frames(ctx: AppContext, run_ids: list[str], metric: str, x: str, smoothing: float,
                 listing: Optional[pd.DataFrame] = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Seed repeats grouped by the other varied config values: band curves (group, step, x, mean, lo, hi,
    n) and a table of final metrics per group as 'mean [min, max]' over its runs (`listing` as in
    compare_frames). Groups are named like their runs (lab/views/run_labels.py label_groups)."""
    listing = ctx.store.list().set_index("run_id") if listing is None else listing
    run_labels(ctx, run_ids, listing)  # validates the ids
    rows = {r: listing.loc[r].to_dict() for r in dict.fromkeys(run_ids or [])}
    groups = group_runs({r: {c: v for c, v in row.items() if c.startswith(CONFIG_PREFIXES)} for r, row in rows.items()})
    names = label_groups(groups, rows)
    bands, table = [], []
    for key, members in groups.items():
        curves = [run_curve(ctx.store.metrics(r), metric, x, smoothing) for r in members]
        bands.append(band(curves).assign(group=names[key]))
        table.append({"group": names[key], "runs": len(members),
                      "seeds": ", ".join(str(s) for s in sorted(listing.loc[members, "train.seed"])),
                      "finished": sum(listing.loc[r, "state"] not in LIVE_STATES for r in members),
                      **{name: spread(listing.loc[members].get(col, pd.Series(dtype=float)))
                         for col, name in GROUP_METRICS.items()}})
    return (pd.concat(bands, ignore_index=True) if bands else pd.DataFrame(),
            pd.DataFrame(table, columns=GROUP_COLS))


def stability(ctx: AppContext, run_ids: list[str], metric: str, listing: pd.DataFrame) -> Optional[StabilityMap]:
    """The picked runs' stability map for the curve `metric` (lab/views/stability_map.py), or None when they do
    not vary two numeric settings; metrics are read only for a map."""
    rows = {r: listing.loc[r].to_dict() for r in dict.fromkeys(run_ids)}
    kind, col = CURVES[metric]
    return stability_map(rows, lambda r: run_final(ctx.store.metrics(r), kind, col, str(rows[r].get("state"))))


def shows_live(*tables: Any) -> bool:
    """Whether a table on the page (the final metrics, the groups) still shows a run as live: a state in
    LIVE_STATES, or a group with fewer runs finished than it has."""
    for t in tables:
        if isinstance(t, pd.DataFrame) and "state" in t.columns and t["state"].isin(LIVE_STATES).any():
            return True
        if isinstance(t, pd.DataFrame) and {"runs", "finished"} <= set(t.columns) and len(t) and (
                pd.to_numeric(t["finished"], errors="coerce") < pd.to_numeric(t["runs"], errors="coerce")).any():
            return True
    return False


def coloured(table: pd.DataFrame, column: str = "run", colours: Optional[dict[str, str]] = None) -> Any:
    """`table` with a bar in each series' colour beside its name in `column` (default: the curves' colours
    of the runs), numbers formatted. A plot's legend can be cut (the curves' is one row, cut at a phone's
    width; the band figure shrinks), the table's names are not."""
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
