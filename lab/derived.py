"""Derived config values: one rule for what a config holds that its user did not state.

Every entry point builds its config through this module: the app's knobs (ui/knobs.py, so also Start, share
links and uploaded JSON), the command line (`train`, `sweep`: lab/cli/main.py), the ablation grid
(lab/engine/grid.py) and the presets (lab/teach/presets/catalog.py). The same knobs therefore give the same config
wherever they are set.

- model.n_ctx (Context length) is the task's longest sequence at these lengths and this architecture,
  evaluation beyond the training lengths included, and at least N_CTX_FLOOR: a learned PE table has a row
  for every position the task shows it. The floor is what the app has always used, so a share link made
  before this rule (links do not carry n_ctx) still rebuilds the same run.
- task.min_len / task.max_len (the training lengths) start from the task's own defaults (induction 8-16,
  text 16: lab/tasks/shapes.py) or else the fields' (1-8); one length stated alone moves the other default
  only as far as it must (`--max-len 6` for induction: 6-6). In the app, picking a task sets its lengths
  unless the user's own work for it (`lengths_on_choosing`).

A value the user states is kept as stated, and validated like any other: the command line's --n-ctx,
--min-len and --max-len, and in a --config file a value other than the rule's for that file's own knobs
(a run stored with the old command line's n_ctx of 128 reproduces exactly; a file saved by the app, whose
n_ctx is the rule's, follows flags that change the task). The app has no n_ctx control: everything it
builds uses the rule. No torch here, so the app can call it on every knob change.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Collection, Mapping, Optional

from lab.config import ARCHS, ModelConfig, RunConfig, TaskConfig, TrainConfig
from lab.fields import ConfigError
from lab.tasks.shapes import SHAPES, TASK_NAMES, task_shape

N_CTX_FLOOR = 8
N_CTX = "model.n_ctx"
LENGTHS = ("task.min_len", "task.max_len")
_FIELD_DEFAULTS = (TaskConfig.__dataclass_fields__["min_len"].default,
                   TaskConfig.__dataclass_fields__["max_len"].default)


def derived_n_ctx(task: TaskConfig, arch: str) -> int:
    """The context length the other knobs imply (see the module docstring); ConfigError if the task cannot
    run at these lengths or with this architecture."""
    return max(N_CTX_FLOOR, task_shape(task.name).max_seq_len(task, arch))


def default_lengths(name: str) -> tuple[int, int]:
    """(min_len, max_len) a config of task `name` starts from."""
    shape = SHAPES.get(name)
    return (shape.default_lengths if shape else None) or _FIELD_DEFAULTS


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def lengths_for(name: str, min_len: Any = None, max_len: Any = None) -> tuple[Any, Any]:
    """The training lengths of task `name` when the user stated `min_len`, `max_len`, both or neither
    (None): a length not stated is the task's default, moved only as far as the stated one needs. Stated
    values come back as they are (a bad one is refused by the config, naming its field)."""
    lo, hi = default_lengths(name)
    if min_len is None and max_len is None:
        return lo, hi
    if max_len is None:
        return min_len, max(hi, min_len) if _is_int(min_len) else hi
    if min_len is None:
        return (min(lo, max_len) if _is_int(max_len) else lo), max_len
    return min_len, max_len


def resolve(data: Mapping[str, Any], stated: Optional[Collection[str]] = None) -> RunConfig:
    """A validated RunConfig from its dict form (RunConfig.to_dict's shape) with every value the user did not
    state derived by the rule. `stated`: the keys ("task.max_len", "model.n_ctx") the user gave; None means
    every field but model.n_ctx (the app, whose knobs are all on screen). Task errors come first, each
    naming its own field, then the architecture, then the rest."""
    stated = set(stated) if stated is not None else {k for k in _all_keys() if k != N_CTX}
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    for key in ("model", "task", "train"):
        if not isinstance(data.get(key, {}), dict):
            raise ConfigError(key, "must be a JSON object")
        data.setdefault(key, {})
    task_data = {**dataclasses.asdict(TaskConfig()), **data["task"]}
    if not set(LENGTHS) <= stated and task_data["name"] in TASK_NAMES:
        given = [task_data[k.split(".")[1]] if k in stated else None for k in LENGTHS]
        task_data["min_len"], task_data["max_len"] = lengths_for(task_data["name"], *given)
        data["task"].update(min_len=task_data["min_len"], max_len=task_data["max_len"])
    known = {f.name for f in dataclasses.fields(TaskConfig)}
    task = TaskConfig(**{k: v for k, v in task_data.items() if k in known})  # task errors first
    arch = data["model"].get("arch", ModelConfig().arch)
    if arch not in ARCHS:
        ModelConfig(arch=arch)  # raises with the allowed values
    if N_CTX not in stated:
        data["model"]["n_ctx"] = derived_n_ctx(task, arch)
    return RunConfig.from_dict(data)


def stated_in(cfg: RunConfig) -> frozenset[str]:
    """The keys of a complete config (a --config file, a grid's base) whose values the rule would not have
    given for its other knobs: they were chosen, and are kept when other knobs change. Every other field
    counts as stated too, except the lengths when they are the task's defaults and n_ctx when it is the
    rule's."""
    out = set(_all_keys())
    if (cfg.task.min_len, cfg.task.max_len) == default_lengths(cfg.task.name):
        out -= set(LENGTHS)
    if cfg.model.n_ctx == derived_n_ctx(cfg.task, cfg.model.arch):
        out.discard(N_CTX)
    return frozenset(out)


def run_config(model: ModelConfig, task: TaskConfig, train: TrainConfig = TrainConfig(),
               name: str = "") -> RunConfig:
    """RunConfig(model, task, train, name) with model.n_ctx derived by the rule (the presets' configs);
    every other value as given."""
    return RunConfig(model=dataclasses.replace(model, n_ctx=derived_n_ctx(task, model.arch)), task=task,
                     train=train, name=name)


def lengths_on_choosing(name: str, min_len: Any, max_len: Any, text: str = "") -> tuple[int, int]:
    """The training lengths once the user chooses task `name` in the app, with `min_len`-`max_len` on screen:
    kept if the user set them (they are not some task's defaults) and they work for `name`; otherwise
    `name`'s defaults. So picking text or induction never leaves lengths they refuse, and a reverse run's
    lengths do not stay at text's 16 when the user goes back."""
    if name not in TASK_NAMES:
        return min_len, max_len
    ours = default_lengths(name)
    if (min_len, max_len) in {default_lengths(t) for t in TASK_NAMES}:
        return ours
    try:
        task = TaskConfig(name=name, min_len=min_len, max_len=max_len, text=text if isinstance(text, str) else "")
        task_shape(name).check(task, "decoder")  # the lengths' rules (the architecture is not this choice's)
    except ConfigError:
        return ours
    return min_len, max_len


def _all_keys() -> tuple[str, ...]:
    return tuple(f"{cls.SECTION}.{f.name}" for cls in (TaskConfig, ModelConfig, TrainConfig)
                 for f in dataclasses.fields(cls))
