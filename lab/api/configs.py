"""Configs from keywords: `make_config`, `make_grid`, `count_params` (the public API, docs/python-api.md).

A keyword is a command-line flag without its dashes (`--n-layers` is `n_layers`, `--task` is `task`), and a
config is built exactly as `python -m lab train` builds it (lab/cli/main.py config_from_args): the defaults,
or a base config, with the stated values on top, and what nobody stated derived by the one rule of
lab/derived.py (the task's training lengths, the context length). Every value is validated by the config's
own dataclasses, so a wrong one raises `ConfigError` naming the field, the value and what is allowed.
"""
from __future__ import annotations

import difflib
import itertools
from typing import Any, Iterable, Mapping, Optional

from lab.config import ConfigError, RunConfig, declared_fields
from lab.derived import resolve, stated_in
from lab.fields import FieldInfo

# keyword -> its declared field: "n_layers" -> model.n_layers (every field that has a command-line flag)
KEYWORDS: dict[str, FieldInfo] = {f.flag[2:].replace("-", "_"): f for f in declared_fields() if f.flag}
# TransformerLens's config names (HookedTransformerConfig) -> (our keyword, their value -> ours); values that
# have no equal here raise ConfigError naming what is allowed
LENS_NAMES: dict[str, tuple[str, dict[Any, Any]]] = {
    "d_head": ("head_dim", {}), "d_mlp": ("d_ff", {}),
    "act_fn": ("activation", {"relu": "relu", "gelu": "gelu"}),  # gated layers: activation swiglu or geglu
    "normalization_type": ("norm_type", {"LN": "layernorm", "RMS": "rmsnorm"}),
    "positional_embedding_type": ("pos", {"standard": "learned", "rotary": "rope", "alibi": "alibi"}),
    "attn_only": ("d_ff", {True: 0, False: None}),  # None: nothing changes
}
NOT_HERE = {"d_vocab": "the vocabulary is the task's: its symbols and a separator (set n_symbols, or modulus for "
                       "modular_addition; Run.to_str_tokens names the tokens)",
            "original_architecture": "this lab builds its own model: choose arch, pos, norm and the sizes",
            "tokenizer_name": "the tasks are toy sequences with their own tokens (set task)"}


def _from_lens(keyword: str, value: Any) -> tuple[str, Any]:
    """A TransformerLens config name and value as this lab's keyword and value."""
    ours, values = LENS_NAMES[keyword]
    if not values:
        return ours, value
    if value not in values:
        raise ConfigError(keyword, f"TransformerLens's {keyword}={value!r} has no equal here (allowed: "
                          f"{', '.join(map(repr, values))}; or set {ours} directly: lab.config_keywords())")
    return ours, values[value]


def config_keywords() -> dict[str, str]:
    """Every keyword `make_config` accepts, with what it sets and allows: {"n_layers": "Layers: Blocks per
    stack ... (allowed: 1 to 24; default 2)", ...}, in the command line's order (task, model, train)."""
    return {kw: f"{f.label_help} (allowed: {f.allowed()}; default {f.default!r})" for kw, f in KEYWORDS.items()}


def make_config(base: Optional[RunConfig] = None, /, *, name: Optional[str] = None, **keywords: Any) -> RunConfig:
    """A validated run config: `base` (default: the defaults) with `keywords` on top.

    >>> cfg = make_config(task="copy", n_layers=2, pos="sinusoidal", steps=200)
    >>> cfg.model.n_layers, cfg.task.name
    (2, 'copy')
    >>> make_config(cfg, norm="post").model.norm   # a variant of a config: the rest stays
    'post'

    `name` labels the run (in listings and legends). A keyword that is not a field, or a value a field does
    not allow, raises ConfigError naming it (`config_keywords()` lists them). TransformerLens's names are
    taken too (`LENS_NAMES`: d_head, d_mlp, act_fn, normalization_type, positional_embedding_type,
    attn_only), and its d_vocab is refused saying what sets the vocabulary here."""
    if base is not None and not isinstance(base, RunConfig):
        raise ConfigError("config", f"expected a RunConfig as the base, got {type(base).__name__}")
    data = (base or RunConfig()).to_dict()
    stated = set(stated_in(base)) if base is not None else set()
    for keyword, value in keywords.items():
        if keyword in NOT_HERE:
            raise ConfigError(keyword, f"is TransformerLens's name, not a setting here: {NOT_HERE[keyword]}")
        if keyword in LENS_NAMES:
            keyword, value = _from_lens(keyword, value)
            if value is None:
                continue
        info = KEYWORDS.get(keyword)
        if info is None:
            close = difflib.get_close_matches(keyword, KEYWORDS, n=1)
            hint = f"did you mean {close[0]!r}?" if close else "lab.config_keywords() lists them"
            raise ConfigError(keyword, f"is not a config keyword; {hint}")
        data[info.section][info.name] = value
        stated.add(info.key)
    if name is not None:
        data["name"] = name
    return resolve(data, stated)


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def make_grid(base: Optional[RunConfig] = None, /, **axes: Iterable[Any]) -> list[RunConfig]:
    """Every combination of the axes' values applied to `base`, each config named by its values (the ablation
    grid of the app, from Python): the first axis varies slowest.

    >>> grid = make_grid(make_config(task="copy"), pos=["learned", "sinusoidal"], seed=[0, 1])
    >>> [c.name for c in grid]
    ['pos=learned seed=0', 'pos=learned seed=1', 'pos=sinusoidal seed=0', 'pos=sinusoidal seed=1']

    Axes are `make_config` keywords with a list of values each; ConfigError names a bad one."""
    if not axes:
        raise ConfigError("grid", "give at least one axis, e.g. seed=[0, 1, 2]")
    lists = {}
    for axis, values in axes.items():
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            raise ConfigError(axis, f"an axis takes a list of values, got {values!r}")
        lists[axis] = list(values)
        if not lists[axis]:
            raise ConfigError(axis, "has no values")
    out = []
    for combo in itertools.product(*lists.values()):
        changes = dict(zip(lists, combo))
        out.append(make_config(base, name=" ".join(f"{k}={_shown(v)}" for k, v in changes.items()), **changes))
    return out


def count_params(cfg: RunConfig, by_component: bool = False) -> int | Mapping[str, int]:
    """The model's parameter count for `cfg`, from the formula (nothing is built or trained), or with
    `by_component` its parts (embeddings, positional, attention, mlp, norms, head, recurrent), as Compare's bars show them.

    >>> count_params(make_config(n_layers=2)) < count_params(make_config(n_layers=4))
    True
    """
    from lab.params import param_breakdown

    parts = param_breakdown(cfg)
    return dict(parts) if by_component else sum(parts.values())
