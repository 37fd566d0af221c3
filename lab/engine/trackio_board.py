"""Publish stored runs to a Trackio project: the class board (issue 16, item 3).

Each run becomes one Trackio run: `trackio.init(project, name, group, config)`, one `trackio.log(...,
step=step)` per metric record of the store (train records as `train/<field>`, eval records as
`eval/<field>`), then `trackio.finish()`. The name is a short label and the run id ("pos=rope seed=1
[20261122-...-a1b2c3]"), so a board row leads back to the run in this app. The config is the run's
flattened config (lab.config.flatten) plus its `run_id` and `state`. Runs of an ablation grid (named by
their axis values, "pos=rope norm=pre seed=1", as lab/engine/grid.py names them) are grouped by those
values without the seed, so seed repeats share a group as they share a band in Compare; `group_by`
(flat config keys) groups by other columns.

A project is local by default (Trackio's folder: $TRACKIO_DIR, else ~/.cache/huggingface/trackio) and
goes to a Hugging Face Space when `space_id` or $LAB_TRACKIO_SPACE is set (Trackio then uses the
Hugging Face token of the process that publishes). Runs that cannot be published as a whole (damaged,
queued or running, interrupted, no metrics, already on a local board) are skipped with the reason.

Trackio is optional (requirements-scale.txt): it is imported inside `publish_runs` only, once there is
something to publish. What Trackio prints is kept in the report, never printed here. The store is
duck-typed (list, status, config, metrics: lab/engine/store.py's RunStore), so this module stays in
the core layer.
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import warnings
from dataclasses import dataclass, field, fields
from typing import Any, Iterator, Mapping, Optional, Protocol, Sequence

import pandas as pd

from lab.config import ConfigError, RunConfig, declared_fields, flatten
from lab.engine.store import FINISHED_STATES
from lab.records import EvalRecord, StepRecord

SPACE_ENV = "LAB_TRACKIO_SPACE"  # a Hugging Face Space ("user/name") to publish to instead of a local project
INSTALL_HINT = "pip install -r requirements-scale.txt"
PUBLISHABLE = ("completed", "stopped", "failed")  # with metrics; "failed" shows its curve up to the failure
_PROJECT = re.compile(r"^[A-Za-z0-9_-]{1,100}$")  # Trackio keeps only these characters in its file names
_RECORD_FIELDS = {"train": [f.name for f in fields(StepRecord) if f.name != "step"],
                  "eval": [f.name for f in fields(EvalRecord) if f.name != "step"]}
_SEED = "train.seed"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Trackio colours its hints
_UNNAMED_LABEL = ("model.n_layers", "model.n_heads", "model.d_model", "train.seed")  # task, pos, norm: in the id
_SEED_GRID_GROUP = ("model.pos", "model.norm", "model.n_layers", "model.n_heads", "model.d_model")


class TrackioMissing(ImportError):
    """Trackio is not installed: publishing needs the optional requirements."""


class RunSource(Protocol):
    """What publishing reads from a run store (lab/engine/store.py's RunStore)."""

    def list(self) -> pd.DataFrame: ...
    def path(self, run_id: str) -> Any: ...
    def config(self, run_id: str) -> Any: ...
    def metrics(self, run_id: str) -> pd.DataFrame: ...


@dataclass(frozen=True)
class Planned:
    """One run ready to publish: its board name, group, config and metric points (step, values)."""

    run_id: str
    name: str
    group: Optional[str]
    config: dict[str, Any]
    points: list[tuple[int, dict[str, float]]]


@dataclass
class PublishReport:
    """What happened: run ids published now, already on the (local) board, (run id, reason) skipped; board
    names of the first two; Trackio's own messages."""

    project: str
    space_id: Optional[str] = None
    published: list[str] = field(default_factory=list)
    already: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)
    messages: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"project": self.project, "space_id": self.space_id, "published": list(self.published),
                "already": list(self.already),
                "skipped": [{"run_id": r, "reason": why} for r, why in self.skipped],
                "names": dict(self.names)}


# ---- names and groups ----------------------------------------------------------------------------
def _shorts() -> dict[str, str]:
    """Flat config key -> its short name in run names ('model.pos' -> 'pos'), for the ablation axes."""
    return {f.key: f.short for f in declared_fields() if f.spec.axis}


def grid_values(flat: Mapping[str, Any]) -> Optional[list[tuple[str, str]]]:
    """A grid run's (flat key, value) pairs read from its name ('pos=rope seed=1'), or None when the name
    is not one that only restates axis values of this config (a preset's or a person's own name)."""
    keys = {short: key for key, short in _shorts().items()}
    parts = [p.partition("=") for p in str(flat.get("name") or "").split()]
    if not parts or any(not eq or k not in keys or str(flat.get(keys[k])) != v for k, eq, v in parts):
        return None
    return [(keys[k], v) for k, _, v in parts]


def _describe(flat: Mapping[str, Any], keys: Sequence[str]) -> str:
    shorts = _shorts()
    return " ".join(f"{shorts.get(k, k)}={flat.get(k)}" for k in keys)


def run_label(flat: Mapping[str, Any]) -> str:
    """A short label: the run's own name (a grid's axis values, a preset's name), else the values its run
    id does not already carry ('layers=2 heads=4 d_model=64 seed=0')."""
    return str(flat.get("name") or "").strip() or _describe(flat, _UNNAMED_LABEL)


def board_name(flat: Mapping[str, Any], run_id: str) -> str:
    """'pos=rope seed=1 [20261122-025300-copy-rope-pre-a1b2c3]': readable, and unique by its run id."""
    return f"{run_label(flat)} [{run_id}]"


def run_group(flat: Mapping[str, Any], group_by: Optional[Sequence[str]] = None) -> Optional[str]:
    """The board group: `group_by`'s values when given; for a grid run its axis values without the seed
    (seed repeats together; a seed-only grid: the config they share); else None."""
    if group_by:
        return _describe(flat, group_by)
    values = grid_values(flat)
    if values is None:
        return None
    rest = [k for k, _ in values if k != _SEED]
    return _describe(flat, rest) if rest else _describe(flat, _SEED_GRID_GROUP)


def check_group_by(group_by: Optional[Sequence[str]]) -> Optional[list[str]]:
    """Validated flat config keys; ConfigError naming `group_by` for an unknown one."""
    if not group_by:
        return None
    known = set(flatten_keys())
    for key in group_by:
        if key not in known:
            raise ConfigError("group_by", f"{key!r} is not a config column (e.g. model.pos, model.norm, "
                              "model.n_layers, train.seed)")
    return list(group_by)


def flatten_keys() -> list[str]:
    return list(flatten(RunConfig()))


def check_project(project: Any) -> str:
    if not isinstance(project, str) or not _PROJECT.match(project):
        raise ConfigError("project", f"{project!r} is not a valid project name (allowed: letters, digits, "
                          "'-' and '_'; 1 to 100 characters)")
    return project


# ---- reading the store ---------------------------------------------------------------------------
def _number(value: Any) -> Optional[float]:
    """A finite Python number, or None (missing, NaN, infinite: Trackio cannot plot those)."""
    if value is None or isinstance(value, (bool, str)):
        return None
    value = value.item() if hasattr(value, "item") else value
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value if isinstance(value, (int, float)) else None


def metric_points(frame: pd.DataFrame) -> list[tuple[int, dict[str, float]]]:
    """One (step, {'train/loss': ..., ...}) per metric record of the store, in the store's order."""
    points = []
    for row in frame.to_dict("records"):
        kind = row.get("kind")
        if kind not in _RECORD_FIELDS:
            continue
        values = {f"{kind}/{name}": _number(row.get(name)) for name in _RECORD_FIELDS[kind]}
        points.append((int(row["step"]), {k: v for k, v in values.items() if v is not None}))
    return points


def plan_runs(store: RunSource, run_ids: Sequence[str], group_by: Optional[Sequence[str]] = None
              ) -> tuple[list[Planned], list[tuple[str, str]]]:
    """Read every run (no Trackio needed): the ones to publish, and (run id, reason) for the others."""
    rows = {r["run_id"]: r for r in store.list().to_dict("records")}
    planned: list[Planned] = []
    skipped: list[tuple[str, str]] = []
    for run_id in dict.fromkeys(run_ids):
        try:
            reason, item = _plan_one(store, rows, run_id, group_by)
        except (ValueError, OSError) as exc:  # a bad id, or a run damaged or deleted while we read it
            reason, item = " ".join(str(exc).split()), None
        if item is None:
            skipped.append((run_id, reason))
        else:
            planned.append(item)
    return planned, skipped


def _plan_one(store: RunSource, rows: Mapping[str, Mapping[str, Any]], run_id: str,
              group_by: Optional[Sequence[str]]) -> tuple[str, Optional[Planned]]:
    row = rows.get(run_id)
    if row is None:
        store.path(run_id)  # raises for an id that is not a valid one
        return "does not exist in this run store", None
    if row.get("damaged"):
        return f"damaged: {row['damaged']}", None
    state = row.get("state")
    if state in ("queued", "running"):
        return f"still {state}; publish it once it has finished", None
    if state not in PUBLISHABLE:
        return (f"{state} at step {row.get('step')} before it finished; continue it (python -m lab resume "
                f"{run_id}) or publish the runs that finished"), None
    points = metric_points(store.metrics(run_id))
    if not points:
        return f"{state} with no metrics recorded", None
    flat = flatten(store.config(run_id))
    config = json.loads(json.dumps(flat, default=str))  # what Trackio stores: JSON values
    config.update(run_id=run_id, state=state)
    return "", Planned(run_id, board_name(flat, run_id), run_group(flat, group_by), config, points)


def finished_run_ids(store: RunSource) -> list[str]:
    """Every completed or stopped run in the store, oldest first (what `publish --all` sends)."""
    frame = store.list()
    return [r for r, s in zip(frame["run_id"], frame["state"]) if s in FINISHED_STATES]  # what `--all` publishes


# ---- sending to Trackio --------------------------------------------------------------------------
def import_trackio() -> Any:
    try:
        import trackio
    except ImportError:
        raise TrackioMissing(f"publishing needs Trackio, which is not installed: {INSTALL_HINT}") from None
    return trackio


@contextlib.contextmanager
def _captured(messages: list[str]) -> Iterator[None]:
    """Keep what Trackio prints and warns in `messages` (stdout belongs to the caller: `--json`)."""
    out = io.StringIO()
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out):
        warnings.simplefilter("always")
        try:
            yield
        finally:
            text = _ANSI.sub("", out.getvalue())
            messages.extend(line.strip() for line in text.splitlines() if line.strip())
            messages.extend(str(w.message) for w in caught)


def _on_board(trackio: Any, project: str) -> set[str]:
    """Run names already in a local project (none when the project does not exist yet)."""
    try:
        return {run.name for run in trackio.Api().runs(project)}
    except ValueError:
        return set()


def publish_runs(store: RunSource, run_ids: Sequence[str], project: str, space_id: Optional[str] = None,
                 group_by: Optional[Sequence[str]] = None) -> PublishReport:
    """Publish the runs (a selection, a whole grid: their ids) to Trackio `project`, locally or to
    `space_id` (default $LAB_TRACKIO_SPACE). Skipped runs carry their reason; a run already on a local
    board under the same name is not sent twice (`already`). TrackioMissing when Trackio is not installed and
    something is to be sent; ConfigError for a bad project name or `group_by` key."""
    check_project(project)
    group_by = check_group_by(group_by)
    space = space_id or os.environ.get(SPACE_ENV) or None
    report = PublishReport(project=project, space_id=space)
    planned, report.skipped = plan_runs(store, run_ids, group_by)
    if not planned:
        return report
    trackio = import_trackio()
    with _captured(report.messages):
        existing = _on_board(trackio, project) if space is None else set()
    for item in planned:
        if item.name in existing:
            report.already.append(item.run_id)
            report.names[item.run_id] = item.name
            continue
        try:
            with _captured(report.messages):
                trackio.init(project=project, name=item.name, group=item.group, config=item.config,
                             space_id=space, embed=False, auto_log_cpu=False, auto_log_gpu=False)
                try:
                    for step, values in item.points:
                        trackio.log(values, step=step)
                finally:
                    trackio.finish()
        except Exception as exc:  # a Space that cannot be reached or created, no token: say so, go on
            report.skipped.append((item.run_id, f"Trackio refused it: {type(exc).__name__}: {exc}"))
            continue
        report.published.append(item.run_id)
        report.names[item.run_id] = item.name
    return report
