"""Run configuration: frozen dataclasses, validation, lossless JSON round-trip.

One dataclass per component (model, task, train) composed into a `RunConfig`.
Variants are made with `dataclasses.replace`. `__post_init__` only validates;
derived values are properties. Every error names the field, the value and what
is allowed. This module imports no torch, so the UI can validate cheaply.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
from dataclasses import dataclass, field, fields
from typing import Any, Literal, get_args

SCHEMA_VERSION = 1

# One closed set of values per ablation axis. UI dropdowns read these tuples.
Arch = Literal["decoder", "encoder-decoder"]
Norm = Literal["pre", "post", "none"]
PosEncoding = Literal["sinusoidal", "learned", "rope", "alibi", "none"]
Activation = Literal["relu", "gelu"]
TaskName = Literal[
    "copy", "reverse", "sort", "addition", "modular_addition", "induction", "parity", "histogram"
]
Schedule = Literal["cosine", "linear", "constant"]
Device = Literal["auto", "cpu", "cuda", "mps"]

ARCHS: tuple[str, ...] = get_args(Arch)
NORMS: tuple[str, ...] = get_args(Norm)
POS_ENCODINGS: tuple[str, ...] = get_args(PosEncoding)
ACTIVATIONS: tuple[str, ...] = get_args(Activation)
TASK_NAMES: tuple[str, ...] = get_args(TaskName)
SCHEDULES: tuple[str, ...] = get_args(Schedule)
DEVICES: tuple[str, ...] = get_args(Device)


class ConfigError(ValueError):
    """A user-facing validation error that names the offending field."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


def _suggest(value: str, allowed: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(str(value), allowed, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{value!r} is not one of {', '.join(allowed)}{hint}"


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(name, _suggest(value, allowed))


def _int(name: str, value: Any, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(name, f"{value!r} is not an integer (allowed: {lo} to {hi})")
    if not lo <= value <= hi:
        raise ConfigError(name, f"{value} is out of range (allowed: {lo} to {hi})")


def _float(name: str, value: Any, lo: float, hi: float, lo_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise ConfigError(name, f"{value!r} is not a number (allowed: {lo} to {hi})")
    if value > hi or value < lo or (lo_open and value == lo):
        left = "above" if lo_open else "from"
        raise ConfigError(name, f"{value} is out of range (allowed: {left} {lo} to {hi})")


@dataclass(frozen=True)
class ModelConfig:
    """Architecture knobs. Vocabulary size comes from the task."""

    arch: Arch = "decoder"  # GPT-style causal stack, or the original encoder-decoder
    n_layers: int = 2  # blocks per stack (encoder and decoder each, for encoder-decoder)
    n_heads: int = 4
    d_model: int = 64
    d_ff: int = 256  # feed-forward width; 0 = attention-only blocks
    dropout: float = 0.0
    activation: Activation = "gelu"
    norm: Norm = "pre"  # pre-LN x + f(LN(x)); post-LN LN(x + f(x)); none
    pos: PosEncoding = "learned"
    n_ctx: int = 128  # longest sequence the model accepts (size of a learned PE table)

    def __post_init__(self) -> None:
        _choice("model.arch", self.arch, ARCHS)
        _int("model.n_layers", self.n_layers, 1, 24)
        _int("model.n_heads", self.n_heads, 1, 64)
        _int("model.d_model", self.d_model, 1, 4096)
        _int("model.d_ff", self.d_ff, 0, 16384)
        _float("model.dropout", self.dropout, 0.0, 0.9)
        _choice("model.activation", self.activation, ACTIVATIONS)
        _choice("model.norm", self.norm, NORMS)
        _choice("model.pos", self.pos, POS_ENCODINGS)
        _int("model.n_ctx", self.n_ctx, 1, 8192)
        if self.d_model % self.n_heads:
            raise ConfigError(
                "model.d_model",
                f"{self.d_model} is not divisible by n_heads={self.n_heads} "
                f"(allowed: a multiple of {self.n_heads})",
            )
        if self.pos == "rope" and self.d_head % 2:
            raise ConfigError(
                "model.pos",
                f"'rope' needs an even head dimension, but d_model/n_heads = {self.d_head} "
                "(change d_model or n_heads)",
            )
        if self.pos == "sinusoidal" and self.d_model % 2:
            raise ConfigError("model.d_model", f"{self.d_model} must be even for 'sinusoidal'")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads


@dataclass(frozen=True)
class TaskConfig:
    """Which toy task, and the lengths it is trained and evaluated at."""

    name: TaskName = "reverse"
    min_len: int = 1  # training lengths are drawn uniformly from [min_len, max_len]
    max_len: int = 8
    ood_len: int = 0  # longest length for the beyond-training evaluation; 0 = 2 * max_len
    n_symbols: int = 10  # alphabet size (copy, reverse, sort, induction, histogram)
    modulus: int = 97  # modular_addition only
    train_fraction: float = 0.3  # modular_addition: share of all (a, b) pairs used for training

    def __post_init__(self) -> None:
        _choice("task.name", self.name, TASK_NAMES)
        _int("task.min_len", self.min_len, 1, 512)
        _int("task.max_len", self.max_len, 1, 512)
        if self.max_len < self.min_len:
            raise ConfigError(
                "task.max_len", f"{self.max_len} is below min_len={self.min_len} (allowed: >= min_len)"
            )
        _int("task.ood_len", self.ood_len, 0, 1024)
        if self.ood_len and self.ood_len <= self.max_len:
            raise ConfigError(
                "task.ood_len",
                f"{self.ood_len} must exceed max_len={self.max_len} (or be 0 for 2 * max_len)",
            )
        _int("task.n_symbols", self.n_symbols, 2, 1000)
        _int("task.modulus", self.modulus, 2, 1000)
        _float("task.train_fraction", self.train_fraction, 0.0, 0.95, lo_open=True)

    @property
    def ood_max_len(self) -> int:
        return self.ood_len or 2 * self.max_len


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation and bookkeeping."""

    steps: int = 1000
    batch_size: int = 64
    lr: float = 3e-3
    warmup: int = 100  # linear warmup steps, then `schedule` decays to min_lr_ratio * lr
    schedule: Schedule = "cosine"
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1  # AdamW; applied to matrices only, not biases, norms or embeddings
    beta1: float = 0.9
    beta2: float = 0.98
    grad_clip: float = 1.0  # max global grad norm; 0 = no clipping
    eval_every: int = 100  # steps between held-out evaluations (also at the last step)
    eval_samples: int = 512
    snapshots: int = 6  # attention snapshots of the probe input saved through training
    seed: int = 0
    device: Device = "auto"  # auto = CUDA, then MPS, then CPU
    threads: int = 0  # intra-op CPU threads for this run; 0 = chosen by the runner

    def __post_init__(self) -> None:
        _int("train.steps", self.steps, 1, 1_000_000)
        _int("train.batch_size", self.batch_size, 1, 8192)
        _float("train.lr", self.lr, 0.0, 10.0, lo_open=True)
        _int("train.warmup", self.warmup, 0, 1_000_000)
        _choice("train.schedule", self.schedule, SCHEDULES)
        _float("train.min_lr_ratio", self.min_lr_ratio, 0.0, 1.0)
        _float("train.weight_decay", self.weight_decay, 0.0, 10.0)
        _float("train.beta1", self.beta1, 0.0, 0.9999)
        _float("train.beta2", self.beta2, 0.0, 0.99999)
        _float("train.grad_clip", self.grad_clip, 0.0, 1e6)
        _int("train.eval_every", self.eval_every, 1, 1_000_000)
        _int("train.eval_samples", self.eval_samples, 1, 100_000)
        _int("train.snapshots", self.snapshots, 0, 50)
        _int("train.seed", self.seed, 0, 2**31 - 1)
        _choice("train.device", self.device, DEVICES)
        _int("train.threads", self.threads, 0, 256)


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
        from lab.tasks import get_task  # pure-python layout; avoids a circular import

        needed = get_task(self.task.name).max_seq_len(self.task, self.model.arch)
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
            raise ConfigError("schema_version", f"{version!r} is not supported (allowed: {SCHEMA_VERSION})")
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
            raise ConfigError(prefix + str(key), "unknown key; " + _suggest(key, known).split(" is ", 1)[1])


def _coerce(cls: type, key: str, value: Any) -> Any:
    """JSON has one number type: accept 1 for a float field (1e-3 stays a float)."""
    ftype = {f.name: f.type for f in fields(cls)}[key]
    if ftype == "float" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def flatten(cfg: RunConfig) -> dict[str, Any]:
    """Config as flat columns: {'model.d_model': 64, ...} (the store's table view)."""
    out: dict[str, Any] = {"name": cfg.name}
    for key in ("model", "task", "train"):
        for f in fields(getattr(cfg, key)):
            out[f"{key}.{f.name}"] = getattr(getattr(cfg, key), f.name)
    return out
