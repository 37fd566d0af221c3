"""What every tab shares: the app context, error handling that never shows a traceback, and
the conversions from stored metrics to the long-format frames that `gr.LinePlot` draws."""
from __future__ import annotations

import functools
import inspect
import logging
import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional

import gradio as gr
import pandas as pd

from lab.config import ConfigError, declared_fields, in_words
from lab.engine.jobs import JobManager
from lab.engine.limits import valid_owner
from lab.engine.store import RunIdError, RunStore
from lab.teach.grid import AXES

log = logging.getLogger("lab.app")
TERMINAL = ("completed", "stopped", "failed", "interrupted")


@dataclass(frozen=True)
class AppContext:
    store: RunStore
    jobs: JobManager


def errors_as_messages(fn: Callable) -> Callable:
    """Turn any exception in a callback into a one-line message (gr.Error), never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except ConfigError as exc:  # the field by its label, as the knob beside it reads
            what, message = in_words(exc)
            raise gr.Error(_one_line(ValueError(f"{what}: {message}")), print_exception=False) from None
        except (ValueError, KeyError, FileNotFoundError) as exc:
            raise gr.Error(_one_line(exc), print_exception=False) from None
        except Exception as exc:  # unexpected: log it for the operator, say it plainly to the user
            log.exception("callback %s failed", fn.__name__)
            raise gr.Error(f"Something went wrong ({type(exc).__name__}): {_one_line(exc)}",
                           print_exception=False) from None

    return wrapper


def with_api_params(fn: Callable, names: list[str]) -> Callable:
    """Give a *args callback real parameter names, so the API (gradio_client) shows them."""
    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]

    if inspect.isgeneratorfunction(fn):  # gradio streams a generator's outputs: the wrapper must be one too
        @functools.wraps(fn)
        def wrapper(*args: Any) -> Any:
            yield from fn(*args)
    else:
        @functools.wraps(fn)
        def wrapper(*args: Any) -> Any:
            return fn(*args)

    wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    return wrapper


def _one_line(exc: BaseException) -> str:
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    return " ".join(text.split())[:500] or type(exc).__name__


LABEL_FORMATS: dict[str, Callable[[Any], str]] = {  # config column -> its compact form in a label
    "model.pos": str, "model.norm": lambda v: f"{v}-LN", "model.n_layers": lambda v: f"L{v}",
    "model.n_heads": lambda v: f"h{v}", "model.d_model": lambda v: f"d{v}", "train.seed": lambda v: f"s{v}",
    "model.arch": lambda v: "enc-dec" if v == "encoder-decoder" else "dec", "task.name": str,
}
FIELD_LABELS = {f.key: f.spec.label for f in declared_fields()}  # other columns: their label in the UI
CONFIG_PREFIXES = ("model.", "task.", "train.")
# the order of a label's parts: the task, the architecture, the ablation axes, other fields; the seed last
LABEL_ORDER = ("task.name", "model.arch", *(a.field for a in AXES.values() if a.field != "train.seed"))
LEGEND_CHARS = 30  # vega cuts legend labels at 160 px: about 30 characters of its 10 px font
GROUP_CHARS = 40  # group names: a table cell and the band figure's legend


def _text(value: Any) -> str:
    """A config value as text: 1 for 1.0, 0.003 for 3e-3, '?' for a value the run lacks (NaN)."""
    if isinstance(value, float):
        return "?" if math.isnan(value) else str(int(value)) if value.is_integer() else f"{value:g}"
    return str(value)


def compact(column: str, value: Any) -> str:
    """One config value as a label part: 'rope', 'post-LN', 'L2', 's1'; other fields by their UI label:
    'learning rate 0.01', 'warmup steps 0', 'd_ff 0'."""
    fmt = LABEL_FORMATS.get(column)
    if fmt is not None:
        return fmt(_text(value))
    label = FIELD_LABELS.get(column, column.split(".")[-1])
    if label[:1].isupper() and label[1:2].islower():  # "Learning rate" -> "learning rate"; "LR floor" stays
        label = label[0].lower() + label[1:]
    return f"{label} {_text(value)}"


def own_name(row: dict[str, Any]) -> str:
    """The run's own name ('1 layer', 'sort'); '' without one, or for a name that only restates config
    values, as the ablation grid names its runs ('pos=rope seed=1': such runs read as their values)."""
    name = str(row.get("name") or "").strip()
    fields = {a.short: a.field for a in AXES.values()}
    parts = [p.partition("=") for p in name.split()]
    if all(k in fields and v == _text(row.get(fields[k])) for k, _, v in parts):
        return ""
    return name


def short_label(row: dict[str, Any], varied: Optional[list[str]] = None) -> str:
    """A run's label, ending in its id's tail: with `varied` (config columns) their values ('rope s1
    (a1b2c3)'); else its own name ('1 layer (a1b2c3)'); else PE, norm, layers, seed and task. Runs shown
    together are labelled by `label_runs`."""
    tail = f"({str(row['run_id'])[-6:]})"
    if varied:
        return " ".join([compact(c, row.get(c)) for c in varied] + [tail])
    if own_name(row):
        return f"{own_name(row)} {tail}"
    cols = ("model.pos", "model.norm", "model.n_layers", "train.seed", "task.name")
    arch = " enc-dec" if row.get("model.arch") == "encoder-decoder" else ""
    return " ".join(compact(c, row.get(c)) for c in cols) + f"{arch} {tail}"


def _ordered(columns: list[str]) -> list[str]:
    first = {c: i for i, c in enumerate(LABEL_ORDER)}
    return sorted(columns, key=lambda c: (c == "train.seed", first.get(c, len(first))))  # stable: config order


def _varied(rows: Mapping[Any, Mapping[str, Any]], columns: Optional[list[str]] = None) -> list[str]:
    """The config columns (or of `columns`) whose values differ among `rows`, in label order."""
    cols = columns if columns is not None else list(
        dict.fromkeys(c for row in rows.values() for c in row if c.startswith(CONFIG_PREFIXES)))
    return _ordered([c for c in cols if len({_text(row.get(c)) for row in rows.values()}) > 1])


def _telling(rows: Mapping[Any, Mapping[str, Any]], columns: list[str]) -> list[str]:
    """The fewest of `columns`, taken in order, that tell `rows` apart: a column counts when it splits
    runs that the columns before it left together."""
    groups, chosen = [list(rows)], []
    for c in columns:
        if all(len(g) == 1 for g in groups):
            break
        split = []
        for g in groups:
            by_value: dict[str, list] = {}
            for r in g:
                by_value.setdefault(_text(rows[r].get(c)), []).append(r)
            split.extend(by_value.values())
        if len(split) > len(groups):
            chosen.append(c)
            groups = split
    return chosen


def _fields(rows: Mapping[Any, Mapping[str, Any]], columns: list[str], tail: Callable[[Any], str],
            budget: int) -> tuple[list[str], bool]:
    """Which of `columns` (those that differ among the runs shown) label `rows`: the ones that tell them
    apart, then more while every label fits `budget` characters; and whether some are left out ('…')."""
    chosen = _telling(rows, columns) or columns[:1]
    for c in columns:
        trial = [k for k in columns if k in chosen or k == c]
        if c not in chosen and all(len(_parts(rows[r], trial, len(trial) < len(columns), tail(r))) <= budget
                                   for r in rows):
            chosen = trial
    return chosen, len(chosen) < len(columns)


def _parts(row: Mapping[str, Any], columns: list[str], more: bool, tail: str = "") -> str:
    """'rope s1 … (a1b2c3)': the row's values in `columns`, '…' if `more` were left out, then `tail`."""
    return " ".join([compact(c, row.get(c)) for c in columns] + (["…"] if more else []) + [tail]).strip()


def _naming(rows: Mapping[str, Mapping[str, Any]]) -> tuple[dict[str, list[str]], list[str], list[str], bool]:
    """How runs shown together are named: run ids by own name ('' for none), the config columns that differ
    among them, and the columns (and whether some are left out) that label the runs without a name."""
    varied = _varied(rows)
    names: dict[str, list[str]] = {}
    for r, row in rows.items():
        names.setdefault(own_name(row), []).append(r)
    unnamed = {r: rows[r] for r in names.get("", [])}
    cols, more = _fields(unnamed, varied, lambda r: f"({r[-6:]})", LEGEND_CHARS) if unnamed and varied else ([], False)
    return names, varied, cols, more


def label_runs(rows: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Labels of runs shown together (run id -> its listing row: flat config and name), each ending in its
    id's tail, the same in the picker, the legend and every table. A run alone: `short_label`. Else a run
    with its own name: the name (and what tells it from runs of the same name); the others: their values
    of the config fields that differ among the runs shown, the fewest that tell them apart first, more
    while a label fits the legend, '…' when some are left out."""
    if len(rows) <= 1:
        return {r: short_label({**row, "run_id": r}) for r, row in rows.items()}
    names, varied, cols, more = _naming(rows)
    out = {}
    for name, members in names.items():
        sub = {r: rows[r] for r in members}
        if name:  # a name of its own; runs of the same name (one preset run twice) add what tells them apart
            told = _telling(sub, _varied(sub, varied)) if len(members) > 1 else []
            out.update({r: f"{name} " + _parts(rows[r], told, False, f"({r[-6:]})") for r in members})
        elif cols:
            out.update({r: _parts(rows[r], cols, more, f"({r[-6:]})") for r in members})
        else:  # every run the same config: the id tells them apart
            out.update({r: short_label({**rows[r], "run_id": r, "name": ""}) for r in members})
    return {r: out[r] for r in rows}


def label_groups(groups: Mapping[tuple, list[str]], rows: Mapping[str, Mapping[str, Any]]) -> dict[tuple, str]:
    """Names of groups of seed repeats (key: ((column, value), ...) of the config fields that differ
    between groups, as lab.teach.grid.group_runs; `rows`: their runs' listing rows), their runs' labels
    without the seed: the runs' own name when they share one, the same fields for runs without a name
    ('rope pre-LN (2 seeds)' for 'rope pre-LN s1 (a1b2c3)'), else the values that tell the groups apart."""
    names, _, cols, more = _naming(rows) if len(rows) > 1 else ({}, [], [], False)
    keys = {key: dict(key) for key in groups}
    columns = _varied(keys, _ordered([c for c, _ in next(iter(groups), ())]))
    owns = {key: {own_name(rows[r]) for r in members} for key, members in groups.items()}
    shared = [next(iter(n)) for n in owns.values() if len(n) == 1 and "" not in n]
    told, other = _fields(keys, columns, lambda key: "", GROUP_CHARS) if columns else ([], False)
    out = {}
    for key, members in groups.items():
        name = next(iter(owns[key])) if len(owns[key]) == 1 else ""
        if name and shared.count(name) == 1:
            label = name
        elif owns[key] == {""} and [c for c in cols if c != "train.seed"]:  # named as its runs are, less the seed
            label = _parts(rows[members[0]], [c for c in cols if c != "train.seed"], more)
        else:
            label = _parts(keys[key], told, other)
        out[key] = f"{label or 'all runs'} ({len(members)} seed{'s' if len(members) != 1 else ''})"
    return out


# Curve choices: label -> (record kind, column); each label says what it was measured on. "(batch)": each
# logged step's own training batch ("train" records); "train ...": a fixed set of samples of the training
# distribution at each evaluation (modular addition's training pairs, the text's first 90%, fresh sequences
# for the generated tasks); "held-out ...": held-out samples at the training lengths, or at the longer ones.
# "train X" and "held-out X" are one measure on the two sets, to overlay (lab/evaluation.py). Which ones mean
# something for a task: lab.taskshapes.headline_metrics. Labels of earlier versions still resolve (RENAMED).
class _Curves(dict):
    """The curve choices: a label of an earlier version (RENAMED) finds its curve, but is not offered."""

    def __missing__(self, label: str) -> tuple[str, str]:
        if label in RENAMED:
            return self[RENAMED[label]]
        raise KeyError(label)


CURVES = _Curves({
    "train loss (batch)": ("train", "loss"),
    "train loss": ("eval", "train_loss"),
    "held-out loss": ("eval", "loss"),
    "train exact-match": ("eval", "train_exact_match"),
    "held-out exact-match": ("eval", "exact_match"),
    "train token accuracy": ("eval", "train_token_acc"),
    "held-out token accuracy": ("eval", "token_acc"),
    "train accuracy (predictable positions)": ("eval", "train_predictable_acc"),
    "held-out accuracy (predictable positions)": ("eval", "predictable_acc"),
    "held-out loss (longer lengths)": ("eval", "ood_loss"),
    "held-out exact-match (longer lengths)": ("eval", "ood_exact_match"),
})
RENAMED = {"eval loss": "held-out loss", "exact-match (training lengths)": "held-out exact-match",
           "exact-match (longer lengths)": "held-out exact-match (longer lengths)",
           "token accuracy (training lengths)": "held-out token accuracy",
           "loss (longer lengths)": "held-out loss (longer lengths)"}  # ("train loss" is a label again)
X_AXES = {"step": "step", "time (s)": "elapsed_s", "tokens": "tokens"}
SERIES_COLOURS = ("#4c78a8", "#f58518", "#e45756", "#72b7b2", "#54a24b", "#eeca3b", "#b279a2", "#ff9da6",
                  "#9d755d", "#bab0ac")  # vega's default categorical palette (tableau10)

# Gradio 6.31's LinePlot fixes its colour scale to the series in the value it first draws, then only
# swaps the data: a series that appears later is never drawn. It redraws from scratch when a prop
# such as color_map changes, but an update applies its props one by one with the value last, so that
# redraw still sees the old value. Hence: live plots name every series from the first poll
# (`with_series`), and Compare sends the new curves first and their colour map in a second step.


def with_series(frame: pd.DataFrame, column: str, names: tuple[str, ...], x: str) -> pd.DataFrame:
    """`frame` plus one row without a value for each series in `names` that it lacks (it draws nothing)."""
    present = set(frame[column])
    missing = [n for n in names if n not in present]
    if not missing:
        return frame
    pad = pd.DataFrame({x: [0] * len(missing), "value": [float("nan")] * len(missing), column: missing})
    return pd.concat([frame, pad], ignore_index=True)


def colour_map(names: list[str]) -> dict[str, str]:
    return {n: SERIES_COLOURS[i % len(SERIES_COLOURS)] for i, n in enumerate(dict.fromkeys(names))}


def curve(metrics: pd.DataFrame, metric: str, x: str = "step", smoothing: float = 0.0) -> pd.DataFrame:
    """One metric of one run as columns (x, value); `smoothing` (EMA) applies to the train loss only, one
    noisy batch a step: held-out curves are few points, each an average over many sequences already."""
    kind, col = CURVES[metric]
    if metrics.empty or col not in metrics.columns:
        return pd.DataFrame({"x": [], "value": []})
    df = metrics[metrics["kind"] == kind][[X_AXES[x], col]].dropna()
    df.columns = ["x", "value"]
    if smoothing > 0 and len(df) and kind == "train":
        df["value"] = df["value"].ewm(alpha=1 - smoothing, adjust=True).mean()
    return df.reset_index(drop=True)


MY_RUNS_KEPT = 50  # run ids a browser remembers (as the Train tab keeps them)


def remember_runs(runs: Any, new_ids: list[str]) -> list[str]:
    """The browser's "my runs" list with `new_ids` first (a BrowserState may hold anything: keep strings)."""
    old = [r for r in (runs if isinstance(runs, list) else [])[:200] if isinstance(r, str) and r not in new_ids]
    return (list(new_ids) + old)[:max(MY_RUNS_KEPT, len(new_ids))]


def is_run_id(ctx: AppContext, value: Any) -> bool:
    """Whether `value` is a well-formed run id (it may not exist)."""
    try:
        ctx.store.path(value)
    except RunIdError:
        return False
    return True


def acting_owner(ctx: AppContext, who: Any) -> Optional[str]:
    """The owner whose runs a stop or delete may touch: the caller's token on a public server
    (ownership enforced), None (anybody's) on a local one."""
    if not ctx.jobs.limits.public:
        return None
    if not valid_owner(who):
        raise ConfigError("owner", "this shared server needs your user token to stop or delete a run; reload the page")
    return who


@contextmanager
def permission() -> Iterator[None]:
    """Someone else's run: a one-line message, not an unexpected-error report."""
    try:
        yield
    except PermissionError as exc:
        raise gr.Error(" ".join(str(exc).split()), print_exception=False) from None
