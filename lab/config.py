"""Run configuration: frozen dataclasses, validation, lossless JSON round-trip.

One dataclass per component (task, model, train) composed into a `RunConfig`. Each field is declared once
with `knob(...)` (lab/fields.py): its default, bounds, label, one-line help, CLI flag, share key, widget
and whether it is an ablation axis; validation, the CLI, the app's knobs, the grid's axes and Compare's
columns all read that declaration. Variants are made with `dataclasses.replace`. `__post_init__` only
validates; derived values are properties. Every error names the field, the value and what is allowed.
This module imports no torch (the task names and sizes come from lab/tasks/shapes.py, the task registry), so
the UI can validate cheaply.
"""
from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal, Optional, get_args

from lab.fields import (DROPDOWN, RADIO, ConfigError, FieldInfo, Widget, dropdown as _dd, iter_fields, knob,
                        number as _number, shown, slider as _slider, suggest, validate)
from lab.tasks.shapes import TASK_NAMES, readers, task_shape
from lab.textdata import ALLOWED as TEXT_ALLOWED, SPLIT as TEXT_SPLIT, check_text, short_form

SCHEMA_VERSION = 1

# One closed set of values per ablation axis. UI dropdowns read these tuples (TASK_NAMES: lab/tasks/shapes.py).
Arch = Literal["decoder", "encoder-decoder", "rnn", "lstm", "gru"]
Norm = Literal["pre", "post", "none"]
PosEncoding = Literal["sinusoidal", "learned", "rope", "alibi", "none"]
Activation = Literal["relu", "gelu", "swiglu", "geglu"]
Scale = Literal["sqrt", "none"]
OnOff = Literal["on", "off"]
NormType = Literal["layernorm", "rmsnorm"]
TaskName = Literal[TASK_NAMES]  # the registered tasks (lab/tasks/shapes.py SHAPES), in the registry's order
Schedule = Literal["cosine", "linear", "constant"]
YesNo = Literal["no", "yes"]
Device = Literal["auto", "cpu", "cuda", "mps"]

ARCHS: tuple[str, ...] = get_args(Arch)
RECURRENT = ("rnn", "lstm", "gru")  # recurrent baselines (lab/recurrent.py): no attention, no positions, no norms
RECURRENT_READS = ("model.arch", "model.d_model", "model.n_layers", "model.dropout")  # the model knobs they read
# weight blocks per recurrent layer: the plain RNN's one tanh update; LSTM input, forget, cell, output gates;
# GRU reset, update, new
GATES = {"rnn": 1, "lstm": 4, "gru": 3}
TRANSFORMERS = tuple(a for a in ARCHS if a not in RECURRENT)  # the architectures with attention
NORMS: tuple[str, ...] = get_args(Norm)
POS_ENCODINGS: tuple[str, ...] = get_args(PosEncoding)
ACTIVATIONS: tuple[str, ...] = get_args(Activation)
GATED = ("swiglu", "geglu")  # gated feed-forward activations (Shazeer 2020)
NORM_TYPES: tuple[str, ...] = get_args(NormType)
SCHEDULES: tuple[str, ...] = get_args(Schedule)
DEVICES: tuple[str, ...] = get_args(Device)


def _only(field: str) -> str:
    """'modular_addition only': the start of the help of a task field that few tasks read."""
    return f"{', '.join(readers(field))} only"


@dataclass(frozen=True)
class TaskConfig:
    """Which toy task, and the lengths it is trained and evaluated at."""

    SECTION: ClassVar[str] = "task"
    name: TaskName = knob("reverse", label="Task", help="What the model must learn (described beside the Start "
                          "button).", widget=DROPDOWN, flag="--task", url="task", column="task", filter=True)
    min_len: int = knob(1, label="Shortest training length", help="Training lengths are drawn from [shortest, "
                        "longest].", lo=1, hi=512, widget=_slider(1, 32))
    max_len: int = knob(8, label="Longest training length", help="Evaluation also runs on longer inputs (up to "
                        "twice this), to test length generalisation.", lo=1, hi=512, widget=_slider(1, 32))
    ood_len: int = knob(0, label="Longest evaluation length", help="Evaluation beyond training uses lengths up to "
                        "this; 0 means twice the longest training length.", lo=0, hi=1024, widget=_number(0),
                        advanced=True)
    n_symbols: int = knob(10, label="Alphabet size", help="How many distinct symbols the inputs use "
                          f"({', '.join(readers('n_symbols'))}).", lo=2, hi=1000, widget=_slider(2, 64))
    modulus: int = knob(97, label="Modulus p", help=f"{_only('modulus')}: the model learns (a + b) mod p.",
                        lo=2, hi=1000, widget=_number(2), advanced=True)
    train_fraction: float = knob(0.3, label="Training fraction", help=f"{_only('train_fraction')}: the share of "
                                 "all (a, b) pairs seen in training; the rest are held out.", lo=0.0, hi=0.95,
                                 lo_open=True, widget=_slider(0.05, 0.95, 0.05), advanced=True)
    text: str = knob("", label="Your text", help=f"{_only('text')}: a character-level language model learns to "
                     f"continue it; {TEXT_SPLIT} ({TEXT_ALLOWED}).",
                     widget=Widget("textbox", when=("task.name", "text")))

    def __post_init__(self) -> None:
        validate(self)
        check_text(self.text, "task.text")
        if self.max_len < self.min_len:
            raise ConfigError(
                "task.max_len", f"{self.max_len} is below min_len={self.min_len} (allowed: >= min_len)"
            )
        if self.ood_len and self.ood_len <= self.max_len:
            raise ConfigError(
                "task.ood_len",
                f"{self.ood_len} must exceed max_len={self.max_len} (or be 0 for 2 * max_len)",
            )

    @property
    def ood_max_len(self) -> int:
        return self.ood_len or 2 * self.max_len


@dataclass(frozen=True)
class ModelConfig:
    """Architecture knobs. Vocabulary size comes from the task."""

    SECTION: ClassVar[str] = "model"
    arch: Arch = knob("decoder", label="Architecture", help="decoder: one causal stack reads prompt|answer (GPT). "
                      "encoder-decoder: the original paper, with cross-attention from decoder to encoder. rnn "
                      "(Elman's tanh recurrence), lstm, gru: the recurrent baselines the paper replaced, reading "
                      "prompt|answer one token at a time (d_model wide, Layers deep; the attention, position and "
                      "norm knobs do not apply).",
                      widget=RADIO, column="arch", filter=True, axis="arch")
    pos: PosEncoding = knob("learned", label="Positional encoding", help="How the model knows token order: added "
                            "vectors (sinusoidal, learned), rotated queries/keys (RoPE), a distance penalty on "
                            "scores (ALiBi), or nothing.", widget=DROPDOWN, axis="PE", column="PE", filter=True)
    norm: Norm = knob("pre", label="LayerNorm placement", help="pre: x + f(LN(x)) (GPT-2, stable); post: "
                      "LN(x + f(x)) (the 2017 paper, needs warmup at high learning rates); none.", widget=RADIO,
                      axis="norm", column="norm", filter=True)
    n_heads: int = knob(4, label="Heads", help="Attention heads per layer; d_model must be divisible by it.",
                        lo=1, hi=64, widget=_slider(1, 16), axis="heads", short="heads", column="heads")
    n_layers: int = knob(2, label="Layers", help="Blocks per stack (encoder and decoder each, for "
                         "encoder-decoder). Induction needs at least 2.", lo=1, hi=24, widget=_slider(1, 8),
                         axis="layers", short="layers", column="layers")
    d_model: int = knob(64, label="d_model", help="Width of the residual stream (embedding size).", lo=1, hi=4096,
                        widget=_dd(16, 32, 48, 64, 96, 128, 192, 256), axis="d_model", column="d_model")
    d_ff: int = knob(256, label="d_ff", help="Width of each feed-forward layer; 0 makes an attention-only model.",
                     lo=0, hi=16384, widget=_number(0))
    activation: Activation = knob("gelu", label="Activation", help="Non-linearity inside the feed-forward layer. "
                                  "swiglu, geglu: gated, act(x W) * (x V) (Shazeer 2020), with 2/3 of d_ff hidden "
                                  "units, so the layer keeps about 2 d d_ff weights.", widget=RADIO, axis="activation",
                                  short="act")
    head_dim: int = knob(0, label="d_head", help="Width of each head's queries, keys and values; 0 = d_model / "
                         "Heads (the paper). The output projection maps Heads x d_head back to d_model. It sets d_k and "
                         "d_v together; the paper's Table 3, row B, varies d_k alone (d_v stays 64).", lo=0, hi=1024, widget=_number(0),
                         advanced=True, axis="d_head")
    scale: Scale = knob("sqrt", label="Attention scaling", help="sqrt: scores divided by sqrt(d_head) (Vaswani et "
                        "al. 2017, sec. 3.2.1); none: scaling removed, so the scores' variance grows with d_head and "
                        "the softmax saturates.", widget=RADIO, advanced=True, axis="scaling")
    residual: OnOff = knob("on", label="Residual connections", help="on: each sublayer adds to its input, x + f(x) "
                           "(He et al. 2016; the paper, sec. 3.1); off: x = f(x), which deep stacks struggle to "
                           "train.", widget=RADIO, advanced=True, axis="residual")
    norm_type: NormType = knob("layernorm", label="Norm type", help="layernorm: centre and scale, with a gain and a "
                               "bias (Ba et al. 2016); rmsnorm: scale by the root mean square only, with a gain "
                               "(Zhang & Sennrich 2019).", widget=RADIO, advanced=True, axis="norm type",
                               short="norm_type")
    qk_norm: OnOff = knob("off", label="QK-norm", help="on: each head's queries and keys are normalised (the norm "
                          "type above) before their dot product, which bounds the attention logits (Dehghani et al. "
                          "2023).", widget=RADIO, advanced=True, axis="QK-norm", short="qk_norm")
    dropout: float = knob(0.0, label="Dropout", help="Randomly zeroes activations while training; 0 is best for "
                          "toy tasks.", lo=0.0, hi=0.9, widget=_slider(0.0, 0.5, 0.05))
    pos_range: int = knob(0, label="Randomized positions", help="0: off. Otherwise, while training, each "
                          "sequence's position ids are an ordered random subset of 0 to this number - 1 (Ruoss et "
                          "al. 2023), so the model meets ids beyond its training lengths; evaluation reads the real "
                          "positions 0, 1, 2... It must cover the longest evaluated sequence.", lo=0, hi=8192,
                          widget=_number(0), advanced=True, axis="random positions", short="pos_range")
    n_ctx: int = knob(128, label="Context length", help="Longest sequence the model accepts (the size of a learned "
                      "PE table); unless given, the task's longest sequence, at least 8 (lab/derived.py).", lo=1,
                      hi=8192, url=None)

    def __post_init__(self) -> None:
        validate(self)
        if self.arch in RECURRENT:  # no heads, positions or norms: their rules do not apply
            return
        if self.d_model % self.n_heads and not self.head_dim:
            raise ConfigError(
                "model.d_model",
                f"{self.d_model} is not divisible by n_heads={self.n_heads} "
                f"(allowed: a multiple of {self.n_heads}, or set d_head)",
            )
        if self.pos == "rope" and self.d_head % 2:
            raise ConfigError(
                "model.pos",
                f"'rope' needs an even head dimension, but d_head = {self.d_head} "
                "(change d_model, n_heads or d_head)",
            )
        if self.pos == "sinusoidal" and self.d_model % 2:
            raise ConfigError("model.d_model", f"{self.d_model} must be even for 'sinusoidal'")
        if self.pos_range and self.pos == "none":
            raise ConfigError("model.pos_range", f"{self.pos_range} randomizes positions, but positional encoding "
                              "'none' has none (allowed: 0, or pick an encoding)")

    @property
    def d_head(self) -> int:
        """Each head's width: `head_dim`, or d_model / n_heads when it is 0 (the paper's d_k = d_v)."""
        return self.head_dim or self.d_model // self.n_heads

    # ---- TransformerLens's names for the same settings (HookedTransformerConfig's) -------------------------
    @property
    def d_mlp(self) -> int:
        """The feed-forward layer's hidden width (TransformerLens's d_mlp): `d_ff_hidden`."""
        return self.d_ff_hidden

    @property
    def attn_only(self) -> bool:
        return self.d_ff == 0

    @property
    def act_fn(self) -> str:
        """relu, gelu, or the gated layers' inner activation (silu for swiglu, gelu for geglu)."""
        return {"swiglu": "silu", "geglu": "gelu"}.get(self.activation, self.activation)

    @property
    def normalization_type(self) -> Optional[str]:
        """"LN", "RMS", or None without norms (TransformerLens's names; where they sit is `norm`)."""
        return None if self.norm == "none" else {"layernorm": "LN", "rmsnorm": "RMS"}[self.norm_type]

    @property
    def positional_embedding_type(self) -> str:
        """TransformerLens's name of `pos` where it has one (learned: standard, rope: rotary), else `pos`."""
        return {"learned": "standard", "rope": "rotary"}.get(self.pos, self.pos)

    @property
    def d_ff_hidden(self) -> int:
        """The feed-forward layer's hidden units: d_ff, or 2/3 of it (rounded, at least 1) for a gated
        activation, whose two input matrices then hold about as many weights as one of d_ff (Shazeer 2020)."""
        if self.activation in GATED and self.d_ff:
            return max(1, round(2 * self.d_ff / 3))
        return self.d_ff


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation and bookkeeping."""

    SECTION: ClassVar[str] = "train"
    steps: int = knob(1000, label="Steps", help="Optimizer steps. 1000-2000 solve most tasks in under a minute.",
                      lo=1, hi=1_000_000, widget=_number(1), column="steps")
    batch_size: int = knob(64, label="Batch size", help="Sequences per step.", lo=1, hi=8192,
                           widget=_dd(16, 32, 64, 128, 256))
    lr: float = knob(3e-3, label="Learning rate", help="AdamW step size; too high diverges, especially with "
                     "post-LN.", lo=0.0, hi=10.0, lo_open=True, widget=_number(0), axis="lr")
    warmup: int = knob(100, label="Warmup steps", help="The learning rate ramps up linearly over these steps.",
                       lo=0, hi=1_000_000, widget=_number(0), axis="warmup")
    schedule: Schedule = knob("cosine", label="LR schedule", help="After warmup the learning rate decays to the "
                              "floor below (cosine, linear) or stays (constant).", widget=RADIO, advanced=True)
    min_lr_ratio: float = knob(0.1, label="LR floor", help="The decay ends at this fraction of the learning rate.",
                               lo=0.0, hi=1.0, widget=_number(0, 1), advanced=True)
    weight_decay: float = knob(0.1, label="Weight decay", help="AdamW decay on weight matrices (not biases, norms, "
                               "embeddings); grokking needs it.", lo=0.0, hi=10.0, widget=_number(0), advanced=True)
    decay_embeddings: YesNo = knob("no", label="Decay embeddings", help="Weight decay also shrinks the token and "
                                   "learned position embeddings (Nanda et al. 2023, grokking; minGPT spares them).",
                                   widget=RADIO, advanced=True)
    beta1: float = knob(0.9, label="Adam beta1", help="Momentum of the gradient average.", lo=0.0, hi=0.9999,
                        widget=_number(0, 1), advanced=True)
    beta2: float = knob(0.98, label="Adam beta2", help="Memory of the squared-gradient average.", lo=0.0,
                        hi=0.99999, widget=_number(0, 1), advanced=True)
    grad_clip: float = knob(1.0, label="Gradient clip", help="Largest global gradient norm; 0 turns clipping off.",
                            lo=0.0, hi=1e6, widget=_number(0), advanced=True)
    label_smoothing: float = knob(0.0, label="Label smoothing", help="Training targets keep 1 - this of their "
                                  "probability and spread the rest over the vocabulary (the 2017 paper used 0.1); "
                                  "held-out loss stays plain cross-entropy.", lo=0.0, hi=0.5,
                                  widget=_slider(0.0, 0.3, 0.05), advanced=True)
    eval_every: int = knob(100, label="Evaluate every", help="Steps between held-out evaluations (and the last "
                           "step).", lo=1, hi=1_000_000, widget=_number(1), advanced=True)
    eval_samples: int = knob(512, label="Evaluation samples", help="Held-out sequences per evaluation.", lo=1,
                             hi=100_000, widget=_number(1), advanced=True)
    snapshots: int = knob(6, label="Attention snapshots", help="How many times during training the probe's "
                          "attention is saved for the Inspect tab's step slider.", lo=0, hi=50,
                          widget=_slider(0, 20), advanced=True)
    seed: int = knob(0, label="Seed", help="Same seed, same run: initial weights and data are reproducible.", lo=0,
                     hi=2**31 - 1, widget=_number(0), axis="seed", column="seed")
    device: Device = knob("auto", label="Device", help="Where the run trains: auto = CUDA, then MPS, then the CPU "
                          "(the server chooses in the app).", url=None)
    threads: int = knob(0, label="CPU threads", help="Intra-op CPU threads for this run; 0 = chosen by the runner.",
                        lo=0, hi=256, url=None)

    def __post_init__(self) -> None:
        validate(self)


@dataclass(frozen=True)
class RunConfig:
    """Everything needed to reproduce a run, seed included."""

    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    name: str = ""  # optional human label

    def __post_init__(self) -> None:
        for key, cls in (("model", ModelConfig), ("task", TaskConfig), ("train", TrainConfig)):
            if not isinstance(getattr(self, key), cls):
                raise ConfigError(key, f"expected a {cls.__name__}")
        if not isinstance(self.name, str) or len(self.name) > 200:
            raise ConfigError("name", "must be a string of at most 200 characters")
        needed = task_shape(self.task.name).max_seq_len(self.task, self.model.arch)
        if self.model.pos_range and self.model.arch not in RECURRENT and needed > self.model.pos_range:
            raise ConfigError(
                "model.pos_range",
                f"{self.model.pos_range} is shorter than the longest sequence of task {self.task.name!r} "
                f"({needed} tokens, evaluation beyond training included); allowed: 0 (off) or at least {needed}",
            )
        if needed > self.model.n_ctx:
            raise ConfigError(
                "model.n_ctx",
                f"{self.model.n_ctx} is shorter than the longest sequence of task "
                f"{self.task.name!r} ({needed} tokens, evaluation beyond training included); "
                f"allowed: n_ctx >= {needed}",
            )

    # ---- JSON round-trip -------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, **dataclasses.asdict(self)}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    @classmethod
    def from_dict(cls, data: Any) -> "RunConfig":
        if not isinstance(data, dict):
            raise ConfigError("config", "must be a JSON object")
        data = dict(data)
        version = data.pop("schema_version", SCHEMA_VERSION)
        if version != SCHEMA_VERSION:
            raise ConfigError("schema_version", f"{shown(version)} is not supported (allowed: {SCHEMA_VERSION})")
        _reject_unknown("", data, cls)
        parts: dict[str, Any] = {}
        for key, sub in (("model", ModelConfig), ("task", TaskConfig), ("train", TrainConfig)):
            section = data.get(key, {})
            if not isinstance(section, dict):
                raise ConfigError(key, "must be a JSON object")
            _reject_unknown(key + ".", section, sub)
            parts[key] = sub(**{k: _coerce(sub, k, v) for k, v in section.items()})
        return cls(**parts, name=data.get("name", ""))

    @classmethod
    def from_json(cls, text: str) -> "RunConfig":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError("config", f"is not valid JSON ({exc.msg} at line {exc.lineno})") from None
        return cls.from_dict(data)


def _reject_unknown(prefix: str, data: dict[str, Any], cls: type) -> None:
    known = tuple(f.name for f in fields(cls))
    for key in data:
        if key not in known:
            raise ConfigError(prefix + str(key), "unknown key; " + suggest(key, known).split(" is ", 1)[1])


def _coerce(cls: type, key: str, value: Any) -> Any:
    """JSON has one number type: accept 1 for a float field (1e-3 stays a float)."""
    ftype = {f.name: f.type for f in fields(cls)}[key]
    if ftype == "float" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def flatten(cfg: RunConfig) -> dict[str, Any]:
    """Config as flat columns: {'model.d_model': 64, ...} (the store's table view, Compare's tables, run
    labels). The task's text is shown short (its start, length and a hash: lab/textdata.py short_form): a
    listing never holds every run's 100 KB; config.json keeps it whole."""
    out: dict[str, Any] = {"name": cfg.name}
    for key in ("model", "task", "train"):
        for f in fields(getattr(cfg, key)):
            out[f"{key}.{f.name}"] = getattr(getattr(cfg, key), f.name)
    out["task.text"] = short_form(cfg.task.text)
    return out


SECTIONS = (TaskConfig, ModelConfig, TrainConfig)


def declared_fields() -> tuple[FieldInfo, ...]:
    """Every declared field of a run config, section by section (task, model, train)."""
    return tuple(iter_fields(*SECTIONS))


def in_words(exc: ConfigError) -> tuple[str, str]:
    """(what, message) as the app says an error: the field by its label, and the fields the message names
    by their labels too ("d_model", "64 is not divisible by Heads = 3 (allowed: a multiple of 3)"). Plain
    words that happen to be field names ("steps") stay; "model.arch", "n_heads" and "seed=1" are renamed."""
    fields_ = declared_fields()
    labels = {f.key: f.spec.label for f in fields_}
    names = {f.name: f.spec.label for f in fields_ if f.name != "name"}
    others = {"model": "Model size", "owner": "User token", "runs per user": "Runs per user", "queue": "Queue",
              "run": "Run"}
    what = (labels.get(exc.field) or others.get(exc.field)
            or (f"Grid axis {exc.field[5:]}" if exc.field.startswith("grid.") else exc.field))
    text = str(exc).split(": ", 1)[1] if ": " in str(exc) else str(exc)
    text = re.sub(r"\b(task|model|train)\.(\w+)\b", lambda m: labels.get(m.group(0), m.group(0)), text)

    def rename(m: re.Match) -> str:
        word, eq = m.group(1), m.group(2)
        if word in names and (eq or "_" in word):
            return names[word] + (" = " if eq else "")
        return m.group(0)
    return what, re.sub(r"\b([a-z][a-z0-9_]*)\b(=)?", rename, text)
