"""One table of knobs drives the Train tab's widgets, validation, the share URL and JSON import.

Each knob names its config field once ("model.n_heads"); its widget, its one-line explanation
and its URL key come from here. Every config field a run's result depends on is a knob (the
rarely changed ones are `advanced`, in a closed accordion), so a link or a JSON file carries the
whole experiment. Not knobs: n_ctx (derived from the task so that the longest sequence, evaluation
beyond training included, always fits), and where the run trains (device, threads: the server's
choice).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional
from urllib.parse import urlencode

import gradio as gr

from lab.config import (ACTIVATIONS, ARCHS, NORMS, POS_ENCODINGS, SCHEDULES, TASK_NAMES, ConfigError, ModelConfig,
                        RunConfig, TaskConfig)
from lab.tasks import get_task


@dataclass(frozen=True)
class Knob:
    key: str  # "section.field" in RunConfig
    label: str
    info: str  # the one-line explanation shown under the widget
    make: Callable[..., gr.components.Component]
    kind: type = int
    advanced: bool = False  # shown in the closed "Advanced" accordion of its section

    @property
    def url_key(self) -> str:
        """The short name in share URLs and API parameters ("task" for task.name)."""
        return "task" if self.key == "task.name" else self.key.split(".", 1)[1]

    def default(self) -> Any:
        sec, name = self.key.split(".")
        return getattr(getattr(RunConfig(), sec), name)


def _dd(choices):
    return lambda **kw: gr.Dropdown(choices=list(choices), **kw)


def _radio(choices):
    return lambda **kw: gr.Radio(choices=list(choices), **kw)


def _slider(lo, hi, step=1):
    return lambda **kw: gr.Slider(minimum=lo, maximum=hi, step=step, **kw)


def _num(**extra):
    return lambda **kw: gr.Number(**extra, **kw)


KNOBS: tuple[Knob, ...] = (
    Knob("task.name", "Task", "What the model must learn (described beside the Start button).",
         _dd(TASK_NAMES), str),
    Knob("task.min_len", "Shortest training length", "Training lengths are drawn from [shortest, longest].",
         _slider(1, 32)),
    Knob("task.max_len", "Longest training length",
         "Evaluation also runs on longer inputs (up to twice this), to test length generalisation.", _slider(1, 32)),
    Knob("task.n_symbols", "Alphabet size", "How many distinct symbols the inputs use (copy, reverse, sort, "
         "induction, histogram).", _slider(2, 64)),
    Knob("model.arch", "Architecture", "decoder: one causal stack reads prompt|answer (GPT). encoder-decoder: "
         "the original paper, with cross-attention from decoder to encoder.", _radio(ARCHS), str),
    Knob("model.pos", "Positional encoding", "How the model knows token order: added vectors (sinusoidal, "
         "learned), rotated queries/keys (RoPE), a distance penalty on scores (ALiBi), or nothing.",
         _dd(POS_ENCODINGS), str),
    Knob("model.norm", "LayerNorm placement", "pre: x + f(LN(x)) (GPT-2, stable); post: LN(x + f(x)) "
         "(the 2017 paper, needs warmup at high learning rates); none.", _radio(NORMS), str),
    Knob("model.n_layers", "Layers", "Blocks per stack. Induction needs at least 2.", _slider(1, 8)),
    Knob("model.n_heads", "Heads", "Attention heads per layer; d_model must be divisible by it.", _slider(1, 16)),
    Knob("model.d_model", "d_model", "Width of the residual stream (embedding size).", _dd([16, 32, 48, 64, 96, 128,
                                                                                          192, 256])),
    Knob("model.d_ff", "d_ff", "Width of each feed-forward layer; 0 makes an attention-only model.",
         _num(precision=0, minimum=0)),
    Knob("model.activation", "Activation", "Non-linearity inside the feed-forward layer.", _radio(ACTIVATIONS), str),
    Knob("model.dropout", "Dropout", "Randomly zeroes activations while training; 0 is best for toy tasks.",
         _slider(0.0, 0.5, 0.05), float),
    Knob("train.steps", "Steps", "Optimizer steps. 1000-2000 solve most tasks in under a minute.",
         _num(precision=0, minimum=1)),
    Knob("train.batch_size", "Batch size", "Sequences per step.", _dd([16, 32, 64, 128, 256])),
    Knob("train.lr", "Learning rate", "AdamW step size; too high diverges, especially with post-LN.",
         _num(minimum=0), float),
    Knob("train.warmup", "Warmup steps", "The learning rate ramps up linearly over these steps.",
         _num(precision=0, minimum=0)),
    Knob("train.seed", "Seed", "Same seed, same run: initial weights and data are reproducible.",
         _num(precision=0, minimum=0)),
    # advanced: rarely changed, but part of the experiment (presets set them; links and JSON carry them)
    Knob("task.ood_len", "Longest evaluation length", "Evaluation beyond training uses lengths up to this; "
         "0 means twice the longest training length.", _num(precision=0, minimum=0), advanced=True),
    Knob("task.modulus", "Modulus p", "modular_addition only: the model learns (a + b) mod p.",
         _num(precision=0, minimum=2), advanced=True),
    Knob("task.train_fraction", "Training fraction", "modular_addition only: the share of all (a, b) pairs "
         "seen in training; the rest are held out.", _slider(0.05, 0.95, 0.05), float, advanced=True),
    Knob("train.schedule", "LR schedule", "After warmup the learning rate decays to the floor below (cosine, "
         "linear) or stays (constant).", _radio(SCHEDULES), str, advanced=True),
    Knob("train.min_lr_ratio", "LR floor", "The decay ends at this fraction of the learning rate.",
         _num(minimum=0, maximum=1), float, advanced=True),
    Knob("train.weight_decay", "Weight decay", "AdamW decay on weight matrices (not biases, norms, "
         "embeddings); grokking needs it.", _num(minimum=0), float, advanced=True),
    Knob("train.beta1", "Adam beta1", "Momentum of the gradient average.", _num(minimum=0, maximum=1), float,
         advanced=True),
    Knob("train.beta2", "Adam beta2", "Memory of the squared-gradient average.", _num(minimum=0, maximum=1), float,
         advanced=True),
    Knob("train.grad_clip", "Gradient clip", "Largest global gradient norm; 0 turns clipping off.",
         _num(minimum=0), float, advanced=True),
    Knob("train.eval_every", "Evaluate every", "Steps between held-out evaluations (and the last step).",
         _num(precision=0, minimum=1), advanced=True),
    Knob("train.eval_samples", "Evaluation samples", "Held-out sequences per evaluation.",
         _num(precision=0, minimum=1), advanced=True),
    Knob("train.snapshots", "Attention snapshots", "How many times during training the probe's attention is "
         "saved for the Inspect tab's step slider.", _slider(0, 20), advanced=True),
)
KNOB_KEYS = tuple(k.key for k in KNOBS)
BY_URL = {k.url_key: k for k in KNOBS}


def build_widgets(section: str, advanced: bool = False) -> dict[str, gr.components.Component]:
    """Create (and render, inside a Blocks context) the widgets of one config section (its basic or its
    advanced knobs)."""
    return {k.key: k.make(label=k.label, info=k.info, value=k.default(), interactive=True, elem_id=k.url_key)
            for k in KNOBS if k.key.startswith(section + ".") and k.advanced == advanced}


def _as_kind(knob: Knob, value: Any) -> Any:
    if value is None or value == "":
        raise ConfigError(knob.key, "is empty")
    if knob.kind is int:
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                return value  # not a number: the config check names the field and what is allowed
        if isinstance(value, float):
            if not math.isfinite(value) or value != int(value):
                raise ConfigError(knob.key, f"{value!r} is not an integer")
            return int(value)
        return value
    if knob.kind is float and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            raise ConfigError(knob.key, f"{value!r} is not a number") from None
    return value


def config_from_values(values: dict[str, Any], base: Optional[RunConfig] = None) -> RunConfig:
    """Knob values (by key) -> a validated RunConfig; n_ctx sized to the task's longest sequence."""
    data = (base or RunConfig()).to_dict()
    for knob in KNOBS:
        if knob.key in values:
            sec, name = knob.key.split(".")
            data[sec][name] = _as_kind(knob, values[knob.key])
    TaskConfig(**{k: v for k, v in data["task"].items()})  # task errors first, with their own field
    arch = data["model"]["arch"]
    if arch not in ARCHS:
        ModelConfig(arch=arch)  # raises with the allowed values
    task = get_task(data["task"]["name"])
    data["model"]["n_ctx"] = max(8, task.max_seq_len(TaskConfig(**data["task"]), arch))
    return RunConfig.from_dict(data)


def values_from_config(cfg: RunConfig) -> dict[str, Any]:
    return {k.key: getattr(getattr(cfg, k.key.split(".")[0]), k.key.split(".")[1]) for k in KNOBS}


def query_string(cfg: RunConfig, hide: tuple[str, ...] = ()) -> str:
    """The share URL's query: every knob that differs from the default, the seed always."""
    defaults = values_from_config(RunConfig())
    pairs = {k.url_key: v for k, v in ((k, values_from_config(cfg)[k.key]) for k in KNOBS)
             if v != defaults[k.key] or k.key == "train.seed"}
    if hide:
        pairs["hide"] = ",".join(hide)
    return urlencode(pairs)


def values_from_query(params: dict[str, str]) -> tuple[dict[str, Any], list[str], list[str]]:
    """URL query -> (knob values, knob keys to hide, problems). Unknown keys are reported, not ignored."""
    values: dict[str, Any] = {}
    problems: list[str] = []
    for key, text in params.items():
        if key in ("hide", "__theme", "view"):
            continue
        knob = BY_URL.get(key)
        if knob is None:
            problems.append(f"unknown URL option {key!r}")
            continue
        values[knob.key] = text if knob.kind is str else _number(text)
    hide = [BY_URL[h].key for h in params.get("hide", "").split(",") if h in BY_URL]
    problems += [f"unknown control to hide {h!r}" for h in params.get("hide", "").split(",") if h and h not in BY_URL]
    try:
        config_from_values(values)
    except ConfigError as exc:
        problems.append(f"URL option {exc}")
        values = {}
    return values, hide, problems


def _number(text: str) -> Any:
    try:
        f = float(text)
    except ValueError:
        return text
    return int(f) if f.is_integer() and "." not in text and "e" not in text.lower() else f

