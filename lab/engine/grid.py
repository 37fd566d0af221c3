"""Ablation grids: axes x values -> named, validated run configs (no gradio here). Their seed repeats are
grouped by lab/views/seed_groups.py, for Compare's mean curve with a min-max band and the sweep's table.

A grid varies one to three axes of a base config (the Train tab's knobs), or up to every axis from the
command line (`python -m lab sweep --grid "pos=rope,alibi norm=pre,post seed=0..4"`, lab/cli/sweep.py,
read by `parse_spec`). Every config is built and
validated before anything is launched, so one invalid combination (e.g. heads=3 with d_model=64)
stops the whole grid with a message naming the axis values. Each run's `name` encodes its values
("pos=rope norm=pre seed=1").

Time estimates are the job manager's (lab/engine/estimate.py), over the cost model of lab/engine/cost.py.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Sequence


from lab.config import ConfigError, RunConfig, declared_fields
from lab.derived import resolve, stated_in

MAX_RUNS = 32  # one grid launches at most this many runs from the app
MAX_AXES = 3
SWEEP_MAX_RUNS = 1000  # a command-line sweep (on a cluster, 5 PEs x 3 norms x 4 depths x 5 seeds is 300)


@dataclass(frozen=True)
class Axis:
    key: str  # the UI's name: "PE"
    field: str  # the config field: "model.pos"
    short: str  # the name in run names: "pos"
    choices: tuple[str, ...] = ()  # allowed values for a text axis; empty = a number
    lo: float = 1  # numeric axes: smallest allowed value
    kind: type = int  # a numeric axis's type: int or float (the learning rate)
    hi: float = math.inf
    lo_open: bool = False  # lo itself is not allowed (a learning rate above 0)

    def allowed(self) -> str:
        """What a numeric axis accepts, in words: '1 or more', 'above 0 to 10'."""
        if self.kind is int:
            return f"{self.lo:g} or more"
        return f"{'above' if self.lo_open else 'from'} {self.lo:g} to {self.hi:g}"


# The ablation axes are the config fields declared with `axis=` (lab/config.py), in declaration order
AXES: dict[str, Axis] = {f.spec.axis: Axis(f.spec.axis, f.key, f.short, f.choices, f.spec.lo or 0, f.kind,
                                           math.inf if f.spec.hi is None else f.spec.hi, f.spec.lo_open)
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
    if ax.kind is int and not ax.choices:
        items = [v for item in items for v in _expand(axis, item)]
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
            value = _number(ax, item)
        if value in values:
            raise GridError(f"grid.{axis}", f"{item!r} is listed twice")
        values.append(value)
    return tuple(values)


def _number(ax: Axis, item: str) -> Any:
    """One value of a numeric axis, checked against its bounds (GridError naming the axis)."""
    try:
        value = ax.kind(item)
    except ValueError:
        what = "an integer" if ax.kind is int else "a number"
        raise GridError(f"grid.{ax.key}", f"{item!r} is not {what} (allowed: {ax.allowed()})") from None
    if not (value > ax.lo or (value == ax.lo and not ax.lo_open)) or value > ax.hi or value != value:
        raise GridError(f"grid.{ax.key}", f"{item} is out of range (allowed: {ax.allowed()})")
    return value


def _expand(axis: str, item: str) -> list[str]:
    """An integer axis's "0..4" (both ends included) -> ["0", "1", "2", "3", "4"]; anything else as it is."""
    lo, sep, hi = item.partition("..")
    if not sep:
        return [item]
    if not (lo.isdigit() and hi.isdigit()) or int(hi) < int(lo) or int(hi) - int(lo) >= SWEEP_MAX_RUNS:
        raise GridError(f"grid.{axis}", f"{item!r} is not a range (allowed: FIRST..LAST, e.g. 0..4, "
                        f"at most {SWEEP_MAX_RUNS} values)")
    return [str(v) for v in range(int(lo), int(hi) + 1)]


def parse_spec(text: str) -> list[tuple[str, tuple[Any, ...]]]:
    """'pos=rope,alibi norm=pre,post seed=0..4' -> [("PE", ("rope", "alibi")), ("norm", ...), ("seed", (0, ..., 4))]:
    axes by their short names (as in run names) or their keys, values as `parse_values` reads them."""
    by_name = {a.short: a.key for a in AXES.values()} | {a.key: a.key for a in AXES.values()}
    allowed = ", ".join(a.short for a in AXES.values())
    axes: list[tuple[str, tuple[Any, ...]]] = []
    for part in str(text or "").split():
        name, sep, values = part.partition("=")
        if not sep or name not in by_name:
            raise GridError("grid", f"{part!r} is not AXIS=VALUES (axes: {allowed}; e.g. pos=rope,alibi seed=0..4)")
        if by_name[name] in [a for a, _ in axes]:
            raise GridError(f"grid.{by_name[name]}", "is given twice; give each axis once")
        axes.append((by_name[name], parse_values(by_name[name], values)))
    if not axes:
        raise GridError("grid", f"no axes given (e.g. pos=rope,alibi seed=0..4; axes: {allowed})")
    return axes


def grid_size(axes: Sequence[tuple[str, Sequence[Any]]]) -> int:
    return math.prod(len(v) for _, v in axes) if axes else 0


def run_name(combo: Sequence[tuple[str, Any]]) -> str:
    """[('PE', 'rope'), ('seed', 1), ('lr', 0.003)] -> 'pos=rope seed=1 lr=0.003'."""
    return " ".join(f"{AXES[a].short}={v:g}" if isinstance(v, float) else f"{AXES[a].short}={v}" for a, v in combo)


def _with(base: RunConfig, combo: Sequence[tuple[str, Any]]) -> RunConfig:
    """`base` with the combination's values, named by them; what the base did not state (its n_ctx, when the
    rule gave it) is derived again for the new values, as the app and the command line derive it."""
    data = base.to_dict()
    for axis, value in combo:
        sec, name = AXES[axis].field.split(".")
        data[sec][name] = value
    data["name"] = run_name(combo)
    return resolve(data, stated_in(base))


def build_grid(base: RunConfig, axes: Sequence[tuple[str, Any]], max_runs: int = MAX_RUNS,
               max_axes: int = MAX_AXES) -> list[RunConfig]:
    """Every combination of the axes' values applied to `base`, named by its values; GridError (and
    no configs) if an axis is repeated or unknown, a value is invalid, the grid exceeds `max_runs`, or
    any combination is not a valid config."""
    if not axes:
        raise GridError("grid", "choose at least one axis")
    if len(axes) > max_axes:
        raise GridError("grid", f"{len(axes)} axes chosen (allowed: 1 to {max_axes})")
    parsed: list[tuple[str, tuple[Any, ...]]] = []
    for axis, values in axes:
        if axis in [a for a, _ in parsed]:
            raise GridError(f"grid.{axis}", "is chosen twice; pick each axis once")
        parsed.append((axis, parse_values(axis, values)))
    n = grid_size(parsed)
    if n > max_runs:
        sizes = " x ".join(str(len(v)) for _, v in parsed)
        raise GridError("grid", f"{sizes} = {n} runs is over the cap of {max_runs}; drop some values")
    cfgs = []
    for combo in itertools.product(*[[(a, v) for v in vals] for a, vals in parsed]):
        try:
            cfgs.append(_with(base, combo))
        except ConfigError as exc:
            raise GridError(f"grid.{combo[0][0]}" if len(combo) == 1 else "grid",
                            f"{run_name(combo)} is invalid: {exc}") from None
    return cfgs
