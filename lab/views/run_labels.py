"""Run labels: how runs shown together are named, the same in the picker, the legend, every table and
the band figure's groups. A run alone reads as its own name or its main knobs; runs together read as the
config values that tell them apart (the fewest first, more while a label fits the legend), each ending in
its id's tail so two runs never share a label."""
from __future__ import annotations

import math
import re
from typing import Any, Callable, Mapping, Optional

import pandas as pd

from lab.config import RECURRENT, declared_fields
from lab.engine.grid import AXES

LABEL_FORMATS: dict[str, Callable[[Any], str]] = {  # config column -> its compact form in a label
    "model.pos": str, "model.norm": lambda v: f"{v}-LN", "model.n_layers": lambda v: f"L{v}",
    "model.n_heads": lambda v: f"h{v}", "model.d_model": lambda v: f"d{v}", "train.seed": lambda v: f"s{v}",
    "model.arch": lambda v: {"encoder-decoder": "enc-dec", "decoder": "dec"}.get(v, v), "task.name": str,
    "train.lr": lambda v: f"lr {v}", "train.warmup": lambda v: f"warmup {v}",
}
FIELD_LABELS = {f.key: f.spec.label for f in declared_fields()}  # other columns: their label in the UI
CONFIG_PREFIXES = ("model.", "task.", "train.")
# the order of a label's parts: the task, the architecture, the ablation axes, other fields; the seed last
LABEL_ORDER = tuple(dict.fromkeys(("task.name", "model.arch",
                                   *(a.field for a in AXES.values() if a.field != "train.seed"))))
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


def without_seed(name: str, seed: Any) -> str:
    """A run's own name less a trailing mention of its seed ('LSTM | parity | seed 1', 'sort s1', 'copy,
    seed=1'), so the seeds of one configuration share the name of their group."""
    if not name or seed is None or pd.isna(seed):
        return name
    return re.sub(rf"[\s|,;:-]*\b(?:seed|s)\s*=?\s*{int(seed)}\s*$", "", name).strip() or name


def short_label(row: dict[str, Any], varied: Optional[list[str]] = None) -> str:
    """A run's label, ending in its id's tail: with `varied` (config columns) their values ('rope s1
    (a1b2c3)'); else its own name ('1 layer (a1b2c3)'); else PE, norm, layers, seed and task. Runs shown
    together are labelled by `label_runs`."""
    tail = f"({str(row['run_id'])[-6:]})"
    if varied:
        return " ".join([compact(c, row.get(c)) for c in varied] + [tail])
    if own_name(row):
        return f"{own_name(row)} {tail}"
    recurrent = row.get("model.arch") in RECURRENT
    cols = (("model.arch",) if recurrent else ("model.pos", "model.norm")) + ("model.n_layers", "train.seed", "task.name")
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
    between groups, as lab.views.seed_groups.group_runs; `rows`: their runs' listing rows), their runs' labels
    without the seed: the runs' own name when they share one, the same fields for runs without a name
    ('rope pre-LN (2 seeds)' for 'rope pre-LN s1 (a1b2c3)'), else the values that tell the groups apart. A group
    of runs started with "my own seed" is the class's band: '2 layers (class: 12 students)'."""
    names, _, cols, more = _naming(rows) if len(rows) > 1 else ({}, [], [], False)
    keys = {key: dict(key) for key in groups}
    columns = _varied(keys, _ordered([c for c, _ in next(iter(groups), ())]))
    owns = {key: {without_seed(own_name(rows[r]), rows[r].get("train.seed")) for r in members}
            for key, members in groups.items()}
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
        n = len(members)
        if all(rows[r].get("seed_from") == "class" for r in members):  # "my own seed": one run a student
            out[key] = f"{label or 'all runs'} (class: {n} student{'s' if n != 1 else ''})"
        else:
            out[key] = f"{label or 'all runs'} ({n} seed{'s' if n != 1 else ''})"
    return out
