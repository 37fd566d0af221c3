"""The app's presets by name (the public API, docs/python-api.md): their configs, their training and their
measured claims (the explanation the Presets tab writes, from the runs' numbers), and the untrained model a run
of any config starts from.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Sequence

import pandas as pd

from lab.api.configs import make_config
from lab.api.runs import PathLike, Run, train_many
from lab.config import ConfigError, RunConfig

if TYPE_CHECKING:
    from lab.model import Transformer


def presets() -> pd.DataFrame:
    """The app's presets: a row per key with its title, its predict-first question, its reference, how many
    runs it trains and their measured time one after another on one CPU thread."""
    from lab.teach.presets.catalog import PRESETS

    return pd.DataFrame([{"key": p.key, "title": p.title, "question": p.question, "reference": p.reference,
                          "runs": len(p.runs), "wall_s": p.wall_s} for p in PRESETS.values()]).set_index("key")


def _preset(key: str) -> Any:
    from lab.teach.presets.catalog import PRESETS

    if key not in PRESETS:
        raise ConfigError("preset", f"{key!r} is not a preset (allowed: {', '.join(PRESETS)})")
    return PRESETS[key]


def preset_configs(key: str, full: bool = False, **overrides: Any) -> list[RunConfig]:
    """The preset's run configs, exactly the app's (each named), with `make_config` keywords on top (e.g.
    steps=100 for a quick look: the preset's claims are measured at its own settings). `full`: the preset's
    larger version, where it has one (chomsky: the whole length-generalization map)."""
    preset = _preset(key)
    if full and not preset.full:
        raise ConfigError("full", f"preset {key!r} has no larger version")
    cfgs = preset.full if full else preset.runs
    return [make_config(cfg, name=cfg.name, **overrides) if overrides else cfg for cfg in cfgs]


@dataclass(frozen=True)
class PresetRuns:
    """A preset's trained runs (by run name) and the explanation the app gives of them, from their numbers."""
    key: str
    runs: dict[str, Run]
    explanation: str


def explain_preset(key: str, runs: Sequence[Run]) -> str:
    """The preset's explanation of finished `runs` (its own runs, matched by name), as the app's Presets tab
    writes it: the measured claim, or which runs are missing."""
    from lab.teach.presets.results import explanation

    runs = list(runs)
    if not runs:
        raise ValueError("runs: give the preset's trained runs (train_preset returns them)")
    return explanation(runs[0].store, _preset(key), {r.name: r.run_id for r in runs})


def train_preset(key: str, runs_dir: Optional[PathLike] = None, progress: bool = True,
                 threads: Optional[int] = None, full: bool = False, **overrides: Any) -> PresetRuns:
    """Train every run of the preset `key` (`full` and `overrides`: as in `preset_configs`) and explain them."""
    cfgs = preset_configs(key, full, **overrides)
    runs = train_many(cfgs, runs_dir=runs_dir, progress=progress, threads=threads)
    return PresetRuns(key, {cfg.name: run for cfg, run in zip(cfgs, runs)}, explain_preset(key, runs))


def untrained(cfg: Optional[RunConfig] = None, **keywords: Any) -> "Transformer":
    """The model a run of `cfg` (and/or `make_config` keywords) starts from: its initial weights, seeded by
    train.seed, in eval mode, with every hook point and W_* weight (no run is stored)."""
    from lab.trainer import build_model

    cfg = make_config(cfg, **keywords) if keywords or cfg is None else cfg
    return build_model(cfg).eval()  # seeded from train.seed, the caller's random state untouched
