"""Ablation grids: axes x values -> named, validated run configs, a time estimate, and the grouping
of seed repeats that Compare draws as a mean curve with a min-max band (no gradio here).

A grid varies one to three axes of a base config (the Train tab's knobs). Every config is built and
validated before anything is launched, so one invalid combination (e.g. heads=3 with d_model=64)
stops the whole grid with a message naming the axis values. Each run's `name` encodes its values
("pos=rope norm=pre seed=1").

Time estimate: FLOPs-based, with constants measured on the 2-core dev CPU (one intra-op thread
per job, as the job manager runs concurrent jobs). Training FLOPs per step follow PaLM's count
(Chowdhery et al. 2022, app. B): 6 * N_matmul * tokens + 12 * n_layers * d_model * T * tokens;
an evaluation is a forward pass (a third of that per token). Small models are bound by per-op
overhead, not FLOPs, so each step and each eval batch also pays a fixed cost per block. The runs
share `max_concurrent` workers in submission order. Other jobs on the machine make it slower.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import numpy as np
import pandas as pd

from lab.config import ConfigError, RunConfig, declared_fields
from lab.taskshapes import task_shape

MAX_RUNS = 32  # one grid launches at most this many runs
MAX_AXES = 3


@dataclass(frozen=True)
class Axis:
    key: str  # the UI's name: "PE"
    field: str  # the config field: "model.pos"
    short: str  # the name in run names: "pos"
    choices: tuple[str, ...] = ()  # allowed values for a text axis; empty = an integer
    lo: int = 1  # integer axes: smallest allowed value


# The ablation axes are the config fields declared with `axis=` (lab/config.py), in declaration order
AXES: dict[str, Axis] = {f.spec.axis: Axis(f.spec.axis, f.key, f.short, f.choices, int(f.spec.lo or 0))
                         for f in declared_fields() if f.spec.axis}


class GridError(ConfigError):
    """A grid that cannot launch; `field` is "grid" or "grid.<axis>"."""


def parse_values(axis: str, text: Any) -> tuple[Any, ...]:
    """'rope, alibi' or '1 2 3' (or a list) -> validated values for `axis`, in the order given."""
    if axis not in AXES:
        raise GridError("grid.axis", f"{axis!r} is not one of {', '.join(AXES)}")
    ax = AXES[axis]
    items = text if isinstance(text, (list, tuple)) else str(text or "").replace(",", " ").split()
    items = [str(v).strip() for v in items if str(v).strip()]
    if not items:
        raise GridError(f"grid.{axis}", "no values given (list them separated by commas, e.g. "
                        f"{'rope, alibi' if ax.choices else '1, 2'})")
    values: list[Any] = []
    for item in items:
        if ax.choices:
            if item not in ax.choices:
                raise GridError(f"grid.{axis}", f"{item!r} is not one of {', '.join(ax.choices)}")
            value: Any = item
        else:
            try:
                value = int(item)
            except ValueError:
                raise GridError(f"grid.{axis}", f"{item!r} is not an integer (allowed: {ax.lo} or more)") from None
            if value < ax.lo:
                raise GridError(f"grid.{axis}", f"{value} is out of range (allowed: {ax.lo} or more)")
        if value in values:
            raise GridError(f"grid.{axis}", f"{item!r} is listed twice")
        values.append(value)
    return tuple(values)


def grid_size(axes: Sequence[tuple[str, Sequence[Any]]]) -> int:
    return math.prod(len(v) for _, v in axes) if axes else 0


def run_name(combo: Sequence[tuple[str, Any]]) -> str:
    """[('PE', 'rope'), ('seed', 1)] -> 'pos=rope seed=1'."""
    return " ".join(f"{AXES[a].short}={v}" for a, v in combo)


def _with(base: RunConfig, combo: Sequence[tuple[str, Any]]) -> RunConfig:
    parts = {"model": base.model, "train": base.train}
    changes: dict[str, dict[str, Any]] = {"model": {}, "train": {}}
    for axis, value in combo:
        sec, name = AXES[axis].field.split(".")
        changes[sec][name] = value
    model = replace(parts["model"], **changes["model"])  # validates the model section
    return replace(base, model=model, train=replace(parts["train"], **changes["train"]), name=run_name(combo))


def build_grid(base: RunConfig, axes: Sequence[tuple[str, Any]]) -> list[RunConfig]:
    """Every combination of the axes' values applied to `base`, named by its values; GridError (and
    no configs) if an axis is repeated or unknown, a value is invalid, the grid exceeds MAX_RUNS, or
    any combination is not a valid config."""
    if not axes:
        raise GridError("grid", "choose at least one axis")
    if len(axes) > MAX_AXES:
        raise GridError("grid", f"{len(axes)} axes chosen (allowed: 1 to {MAX_AXES})")
    parsed: list[tuple[str, tuple[Any, ...]]] = []
    for axis, values in axes:
        if axis in [a for a, _ in parsed]:
            raise GridError(f"grid.{axis}", "is chosen twice; pick each axis once")
        parsed.append((axis, parse_values(axis, values)))
    n = grid_size(parsed)
    if n > MAX_RUNS:
        sizes = " x ".join(str(len(v)) for _, v in parsed)
        raise GridError("grid", f"{sizes} = {n} runs is over the cap of {MAX_RUNS}; drop some values")
    cfgs = []
    for combo in itertools.product(*[[(a, v) for v in vals] for a, vals in parsed]):
        try:
            cfgs.append(_with(base, combo))
        except ConfigError as exc:
            raise GridError(f"grid.{combo[0][0]}" if len(combo) == 1 else "grid",
                            f"{run_name(combo)} is invalid: {exc}") from None
    return cfgs


# ---- time estimate ------------------------------------------------------------------------------
# Fitted (least squares on relative error) to 20 timed runs of 13 configs on the dev machine (2 shared
# cores, 1 thread per run; d_model 32-256, 1-6 layers, batch 16-256, decoder and encoder-decoder, 200
# steps): predictions were within 0.62x to 1.36x of the measured wall time. A rough guide, said so in the UI.
STEP_OVERHEAD_S = 3.7e-3  # per training step: optimizer, batch generation, Python
BLOCK_OVERHEAD_S = 0.96e-3  # per block per training step (forward + backward op overhead)
EVAL_BLOCK_OVERHEAD_S = BLOCK_OVERHEAD_S / 3  # per block per evaluation batch (forward only)
FLOPS_PER_S = 1.2e11  # effective matmul FLOP/s of one core at these sizes
ELEMENT_S = 7.8e-8  # per token, block and d_model unit: LayerNorm, softmax, GELU, adds (memory-bound)

def _seq_tokens(cfg: RunConfig, length: int) -> tuple[int, int]:
    """(tokens per sequence, decoder tokens T) at one task length."""
    task = task_shape(cfg.task.name)
    p, a = task.prompt_len(cfg.task, length), task.answer_len(cfg.task, length)
    if cfg.model.arch == "encoder-decoder":
        return p + a, a
    return p + a, p + a


def flops_per_token(cfg: RunConfig, seq_len: int) -> float:
    """Training FLOPs per token (PaLM's count): 6 N_matmul + 12 n_layers d_model T."""
    m = cfg.model
    vocab = task_shape(cfg.task.name).vocab_size(cfg.task)
    cross = m.arch == "encoder-decoder"
    per_block = 4 * m.d_model ** 2 + 2 * m.d_model * m.d_ff
    n_matmul = m.n_layers * per_block * (2 if cross else 1) + (m.n_layers * 4 * m.d_model ** 2 if cross else 0)
    n_matmul += m.d_model * vocab
    return 6.0 * n_matmul + 12.0 * m.n_layers * m.d_model * seq_len * (2 if cross else 1)


def run_seconds(cfg: RunConfig) -> float:
    """Estimated wall time of one run on one free core."""
    tc, m = cfg.train, cfg.model
    task = task_shape(cfg.task.name)
    blocks = m.n_layers * (2 if m.arch == "encoder-decoder" else 1)
    train_lens = task.lengths(cfg.task, "train")
    seqs = [_seq_tokens(cfg, L) for L in train_lens]
    step_flops = np.mean([tc.batch_size * n * flops_per_token(cfg, t) for n, t in seqs])
    step_elems = np.mean([tc.batch_size * n for n, _ in seqs]) * blocks * m.d_model
    step_s = (STEP_OVERHEAD_S + BLOCK_OVERHEAD_S * blocks + step_flops / FLOPS_PER_S
              + step_elems * ELEMENT_S)
    n_evals = tc.steps // tc.eval_every + (1 if tc.steps % tc.eval_every else 0)
    eval_s = 0.0
    for split in ("eval", "ood"):
        lens = task.lengths(cfg.task, split)
        if not lens:
            continue
        per_len = max(1, -(-tc.eval_samples // len(lens)))
        for L in lens:
            n, t = _seq_tokens(cfg, L)
            eval_s += -(-per_len // 256) * EVAL_BLOCK_OVERHEAD_S * blocks
            eval_s += per_len * n * (flops_per_token(cfg, t) / FLOPS_PER_S + blocks * m.d_model * ELEMENT_S) / 3
    return tc.steps * step_s + n_evals * eval_s


@dataclass(frozen=True)
class Estimate:
    runs: int
    run_s: tuple[float, ...]  # each run alone on a free core
    wall_s: float  # all of them through `workers` workers in submission order
    scale: float = 1.0  # measured / modelled time of this server's recent runs (already applied)
    scale_runs: int = 0  # how many finished jobs that ratio comes from (0: none, scale 1)

    def text(self, workers: int) -> str:
        total = sum(self.run_s)
        head = (f"**{self.runs} run{'s' if self.runs != 1 else ''}**, about {_dur(self.wall_s)} with {workers} "
                f"running at a time ({_dur(total)} of training in all). ")
        how = ("Estimated from each config's FLOPs plus per-step and per-layer overheads measured on an idle "
               "2-core CPU (about ±40% there), one core per run")
        if self.scale_runs:
            return head + how + (f", times {self.scale:.1f}: the ratio of measured to estimated time over this "
                                 f"server's last {self.scale_runs} finished jobs. It changes with the load.")
        return head + how + "; a busy server is slower."


def _dur(s: float) -> str:
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.1f} min"


BatchKey = Optional[Callable[[RunConfig], Optional[str]]]


def _jobs(cfgs: Sequence[RunConfig], batch_key: BatchKey) -> list[list[int]]:
    """Indices of `cfgs` grouped into jobs: runs with an equal batch key train as one job."""
    jobs: dict[Any, list[int]] = {}
    for i, cfg in enumerate(cfgs):
        key = batch_key(cfg) if batch_key is not None else None
        jobs.setdefault(("run", i) if key is None else key, []).append(i)
    return list(jobs.values())


def load_factor(finished: Sequence[tuple[RunConfig, float]], batch_key: BatchKey = None,
                last: int = 20) -> tuple[float, int]:
    """(median of measured / estimated seconds, number of jobs) over the last `last` finished jobs, from
    runs given as (config, wall_s), oldest first. Members of one batched job share its wall time: a job
    is the runs with one batch key and one wall time, estimated as the sum of its runs. (1.0, 0) if none."""
    jobs: dict[Any, tuple[float, list[RunConfig]]] = {}
    for i, (cfg, wall) in enumerate(finished):
        key = batch_key(cfg) if batch_key is not None else None
        jobs.setdefault((i,) if key is None else (key, round(wall, 3)), (wall, []))[1].append(cfg)
    ratios = [wall / sum(run_seconds(c) for c in members) for wall, members in jobs.values()][-last:]
    return (float(np.median(ratios)), len(ratios)) if ratios else (1.0, 0)


def estimate(cfgs: Sequence[RunConfig], workers: int, batch_key: BatchKey = None,
             scale: tuple[float, int] = (1.0, 0)) -> Estimate:
    """Per-run estimates, and the wall time when `workers` jobs run at once (FIFO, like the job manager).
    With `batch_key` (the job manager batches seed repeats: lab/batched.py), runs with an equal key form
    one job, counted as the sum of its runs (the same arithmetic, done in one model). `scale` (from
    `load_factor`) multiplies every run's time."""
    times = tuple(scale[0] * float(run_seconds(c)) for c in cfgs)
    free = [0.0] * max(1, workers)
    for job in _jobs(cfgs, batch_key):  # each job goes to the worker that frees up first
        i = free.index(min(free))
        free[i] += sum(times[j] for j in job)
    return Estimate(len(cfgs), times, float(max(free)) if times else 0.0, scale[0], scale[1])


# ---- grouping seed repeats ----------------------------------------------------------------------
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


def has_repeats(configs: Mapping[str, Mapping[str, Any]]) -> bool:
    return any(len(g) > 1 for g in group_runs(configs).values())


def band(curves: Iterable[pd.DataFrame]) -> pd.DataFrame:
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
