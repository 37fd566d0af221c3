"""Seed repeats of a grid (or any picked runs) grouped: runs whose configs differ only in the seed form one
group, named by the config values that vary between groups; a group's final values read as 'mean [min, max]'.
Compare draws each group as a mean curve with a min-max band (lab/views/compare_frames.py); the sweep's table
summarises the groups (lab/cli/sweep.py). Several seeds per configuration, as Table 3 of Vaswani et al. 2017
reports no seed spread and small models need one to tell an effect from noise."""
from __future__ import annotations

from typing import Any, Iterable, Mapping

import pandas as pd

from lab.engine.grid import AXES

SEED = "train.seed"
IGNORED = ("name",)  # columns that never make runs different


def varied_columns(configs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Config columns (flat, as lab.config.flatten) whose values differ between the runs: the grid's axes
    first, in AXES order (as in run names), then the others in config order."""
    frame = pd.DataFrame.from_dict(dict(configs), orient="index")
    cols = [c for c in frame.columns if c not in IGNORED and frame[c].astype(str).nunique() > 1]
    first = [a.field for a in AXES.values()]
    return sorted(cols, key=lambda c: first.index(c) if c in first else len(first))


def group_runs(configs: Mapping[str, Mapping[str, Any]]) -> dict[tuple, list[str]]:
    """Runs whose configs are equal except for the seed (and name) -> one group; key = the group's values
    of the varied columns other than the seed (in `varied_columns` order). Groups keep first-seen order."""
    keys = [c for c in varied_columns(configs) if c != SEED]
    groups: dict[tuple, list[str]] = {}
    for run_id, cfg in configs.items():
        groups.setdefault(tuple((k, cfg.get(k)) for k in keys), []).append(run_id)
    return groups


def spread(values: Iterable[Any]) -> str:
    """Final values of a group's runs as 'mean [min, max]' (one run: its value; none: "")."""
    v = pd.to_numeric(pd.Series(list(values), dtype=object), errors="coerce").dropna()
    if v.empty:
        return ""
    return f"{v.mean():.3f} [{v.min():.3f}, {v.max():.3f}]" if len(v) > 1 else f"{v.iloc[0]:.3f}"
