"""Compare's frames: the numbers its page, its PNG export (ui/compare/tab.py) and the Python API's figures
(lab/api/figures.py) all draw, from one reading of the run store.

`read_selection` checks the picked runs, reads each one's metrics and config once and names them
(lab/views/run_labels.py label_runs); every frame after that is shaped from that `Selection` alone:
the filtered listing and its table, the picker's choices, the overlaid curves (thinned for the page), the
final metrics, the config diff, and seed repeats grouped into a mean curve with a min-max band.
No gradio here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import pandas as pd

from lab.config import RunConfig, declared_fields
from lab.engine.store import LIVE_STATES, RunStore
from lab.views.curves import CURVES, RENAMED, X_AXES, curve, thin
from lab.views.run_labels import CONFIG_PREFIXES, label_groups, label_runs, short_label
from lab.views.seed_groups import group_runs, spread
from lab.views.stability_map import StabilityMap, run_final, stability_map

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
          "final.eval.loss": "held-out loss", "final.eval.predictable_acc": "held-out accuracy (predictable positions)",
          "final.eval.exact_match": "held-out exact-match", "final.ood.exact_match": "held-out exact-match (longer)",
          "final.wall_s": "wall time (s)"}
# induction's headline measure (lab.tasks.shapes.headline_metrics: its exact-match stays near chance for a
# model that copies every repeat): a column only when a picked run measured it
WHEN_MEASURED = ("held-out accuracy (predictable positions)",)
GROUP_METRICS = {k: v for k, v in FINALS.items() if k.startswith("final.") and k != "final.params"
                 and v not in WHEN_MEASURED}
GROUP_COLS = ["group", "runs", "seeds", "finished", *GROUP_METRICS.values()]
BAND_COLS = ["group", "step", "x", "mean", "lo", "hi", "n"]
SMOOTHING = 0.9  # train loss is one noisy batch a step (lengths vary): smoothed unless the user says not


@dataclass(frozen=True)
class Selection:
    """The picked runs as read from the store: the listing (indexed by run id), each run's label in the
    selection's order, and what `read_selection` read of them (each run's metrics and config, once)."""
    listing: pd.DataFrame
    labels: dict[str, str]
    metrics: Mapping[str, pd.DataFrame] = field(default_factory=dict)
    configs: Mapping[str, RunConfig] = field(default_factory=dict)

    @property
    def run_ids(self) -> list[str]:
        return list(self.labels)

    def rows(self) -> dict[str, dict[str, Any]]:
        return {r: self.listing.loc[r].to_dict() for r in self.labels}


def read_selection(store: RunStore, run_ids: Optional[Sequence[str]], listing: Optional[pd.DataFrame] = None,
                   metrics: bool = True, configs: bool = True) -> Selection:
    """The runs `run_ids` (duplicates dropped), read in one go: checked, then each one's metrics and config
    read once (given `metrics`, `configs`), then named. `listing`: the store's listing indexed by run id, if
    the caller has read it. ValueError for an id that is not a stored run (path tricks included)."""
    listing = store.list().set_index("run_id") if listing is None else listing
    for r in run_ids or []:
        store.path(r)  # refuses ids that are not run ids
        if r not in listing.index:
            raise ValueError(f"run_id: {r!r} is not a stored run")
    picked = list(dict.fromkeys(run_ids or []))
    read = {r: store.metrics(r) for r in picked} if metrics else {}
    cfgs = {r: store.config(r) for r in picked} if configs else {}
    return Selection(listing, label_runs({r: listing.loc[r].to_dict() for r in picked}), read, cfgs)


def only(df: pd.DataFrame, filters: Optional[Sequence[Optional[list[str]]]]) -> pd.DataFrame:
    """The listing's rows that pass the filters (one list of allowed values per FILTERS column, or None)."""
    for (col, _), chosen in zip(FILTERS.items(), filters or []):
        if chosen and col in df.columns:
            df = df[df[col].isin(chosen)]
    return df


def run_table(df: pd.DataFrame) -> pd.DataFrame:
    """The stored-runs table of the listing `df`: its columns named as the page names them, newest first."""
    cols = [c for c in TABLE_COLS if c in df.columns]
    out = df[cols].rename(columns=TABLE_COLS)
    for c in ("held-out exact-match", "held-out exact-match (longer)"):
        if c in out.columns:
            out[c] = out[c].map(lambda v: "" if pd.isna(v) else f"{v:.3f}")
    return out.iloc[::-1].reset_index(drop=True)


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


def metric_list(metric: Any) -> list[str]:
    """The curves picked (the Curves control is a multiselect; an API call may send one name): a list of
    CURVES names, at least one; an unknown name is refused with the allowed ones."""
    names = [metric] if isinstance(metric, str) else list(metric or [])
    for m in names:
        if m not in CURVES and m not in RENAMED:
            raise ValueError(f"Curves: {m!r} is not a curve (allowed: {', '.join(CURVES)})")
    return list(dict.fromkeys(RENAMED.get(m, m) for m in names)) or ["train loss (batch)"]


def x_axis(x: Any) -> str:
    """The x-axis by name (step, time (s), tokens); another is refused with the allowed ones."""
    if x not in X_AXES:
        raise ValueError(f"x: {x!r} is not one of {', '.join(X_AXES)}")
    return str(x)


def curve_series(sel: Selection, metrics: Sequence[str], x: str, smoothing: float,
                 max_points: Optional[int] = None) -> tuple[dict[str, pd.DataFrame], dict[str, tuple[str, int]]]:
    """One frame (x, value) per run and metric in the selection's order, named by the run's label (and the
    metric, when several are drawn), and for each series (the run's label, the metric's index). With
    `max_points`, long runs are thinned evenly (the page stays light)."""
    series, styles = {}, {}
    for r, label in sel.labels.items():
        for i, metric in enumerate(metrics):
            name = label if len(metrics) == 1 else f"{label} · {metric}"
            series[name] = curve(sel.metrics[r], metric, x, smoothing)
            styles[name] = (label, i)
    if max_points is not None:
        series = {name: thin(df, max_points) for name, df in series.items()}
    return series, styles


def long_curves(series: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """The series as one long frame (x, value, run), for a figure with a line per run."""
    if not series:
        return pd.DataFrame({"x": [], "value": [], "run": pd.Series([], dtype=object)})  # run: nominal, even empty
    return pd.concat([df.assign(run=name) for name, df in series.items()], ignore_index=True)


def final_tables(sel: Selection, diff_only: bool) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Final metrics and the config table (only the fields that differ, given `diff_only`), from the listing
    alone: no metrics are read."""
    listing, labels, run_ids = sel.listing, sel.labels, sel.run_ids
    finals = pd.DataFrame([{"run": labels[r], **{name: listing.loc[r].get(col) for col, name in FINALS.items()}}
                           for r in run_ids], columns=["run", *FINALS.values()])
    finals = finals.round(4).assign(**{"wall time (s)": finals["wall time (s)"].astype(float).round(1)})
    finals = finals.drop(columns=[c for c in WHEN_MEASURED if finals[c].isna().all()])
    cfg_cols = [c for c in listing.columns if c.startswith(CONFIG_PREFIXES)]
    configs = listing.loc[run_ids, cfg_cols] if run_ids else pd.DataFrame(columns=cfg_cols)
    if diff_only and len(configs) > 1:
        configs = configs.loc[:, configs.astype(str).nunique() > 1]
    return finals, configs.rename(index=labels, columns=CONFIG_LABELS).reset_index(names="run")


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


def band(curves: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Mean, min and max over runs, step by step. Each curve has columns step, x, value; only steps that
    every run has reached count, so a band never mixes finished and unfinished runs. x is averaged
    (for a time axis, runs differ). Columns: step, x, mean, lo, hi, n."""
    frames = [c[["step", "x", "value"]].dropna().drop_duplicates("step", keep="last").set_index("step")
              for c in curves]
    if not frames or any(f.empty for f in frames):
        return pd.DataFrame({"step": [], "x": [], "mean": [], "lo": [], "hi": [], "n": []})
    values = pd.concat([f["value"] for f in frames], axis=1, join="inner")
    xs = pd.concat([f["x"] for f in frames], axis=1, join="inner")
    out = pd.DataFrame({"x": xs.mean(axis=1), "mean": values.mean(axis=1), "lo": values.min(axis=1),
                        "hi": values.max(axis=1), "n": values.shape[1]})
    return out.sort_index().rename_axis("step").reset_index()


def seed_groups(sel: Selection, metric: str, x: str, smoothing: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Seed repeats grouped by the other varied config values (lab/views/seed_groups.py group_runs): band curves
    (BAND_COLS) and a table of final metrics per group as 'mean [min, max]' over its runs (GROUP_COLS).
    Groups are named like their runs (lab/views/run_labels.py label_groups)."""
    rows, listing = sel.rows(), sel.listing
    groups = group_runs({r: {c: v for c, v in row.items() if c.startswith(CONFIG_PREFIXES)} for r, row in rows.items()})
    finals = {key: {name: spread(listing.loc[members].get(col, pd.Series(dtype=float)))
                    for col, name in GROUP_METRICS.items()} for key, members in groups.items()}
    names = label_groups(groups, rows)
    bands = [band([run_curve(sel.metrics[r], metric, x, smoothing) for r in members]).assign(group=names[key])
             for key, members in groups.items()]
    table = [{"group": names[key], "runs": len(members),
              "seeds": ", ".join(str(s) for s in sorted(listing.loc[members, "train.seed"])),
              "finished": sum(listing.loc[r, "state"] not in LIVE_STATES for r in members), **finals[key]}
             for key, members in groups.items()]
    return (pd.concat(bands, ignore_index=True)[BAND_COLS] if bands else pd.DataFrame(columns=BAND_COLS),
            pd.DataFrame(table, columns=GROUP_COLS))


def has_seed_groups(table: pd.DataFrame) -> bool:
    """Whether some group of `seed_groups`' table has more than one run (a band worth drawing)."""
    return bool(len(table)) and bool((table["runs"] > 1).any())


def map_measure(metrics: Sequence[str]) -> str:
    """What a stability map is coloured by: the first of the picked curves `metrics` measured on a whole set
    at each evaluation (the held-out set, the training set, the longer lengths), else the held-out loss;
    never one training batch's loss (a post-LN grid once showed 0.0098 where the held-out loss was 0.81)."""
    return next((m for m in metrics if CURVES[m][0] == "eval"), "held-out loss")


def stability(sel: Selection, metric: str) -> Optional[StabilityMap]:
    """The picked runs' stability map for the curve `metric` (lab/views/stability_map.py), or None when they
    do not vary two numeric settings."""
    rows = sel.rows()
    kind, col = CURVES[metric]
    return stability_map(rows, lambda r: run_final(sel.metrics[r], kind, col, str(rows[r].get("state"))))
