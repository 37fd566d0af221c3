"""Run configuration: validation messages, the JSON round-trip, flattening, registry consistency."""
from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import fields, replace
from typing import Iterator

import pytest

import lab.positional
import lab.tasks.batches
from lab.config import (
    ACTIVATIONS,
    ARCHS,
    TRANSFORMERS,
    NORMS,
    POS_ENCODINGS,
    SCHEDULES,
    SCHEMA_VERSION,
    TASK_NAMES,
    ConfigError,
    ModelConfig,
    RunConfig,
    TaskConfig,
    TrainConfig,
    flatten,
)


@contextmanager
def raises_config(field_name: str, *fragments: str) -> Iterator[pytest.ExceptionInfo]:
    """Expect a ConfigError naming `field_name` whose message contains every fragment."""
    with pytest.raises(ConfigError) as info:
        yield info
    err = info.value
    assert err.field == field_name, f"field {err.field!r} != {field_name!r}: {err}"
    msg = str(err)
    assert msg.startswith(field_name + ":"), msg
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in {msg!r}"


# ---- defaults and the error type ------------------------------------------------------------


def test_defaults_are_valid():
    cfg = RunConfig()
    assert cfg.model == ModelConfig() and cfg.task == TaskConfig() and cfg.train == TrainConfig()
    assert cfg.model.d_head * cfg.model.n_heads == cfg.model.d_model
    assert cfg.task.ood_max_len == 2 * cfg.task.max_len  # ood_len = 0 means 2 * max_len


def test_config_error_is_a_value_error_with_field():
    with pytest.raises(ValueError) as info:
        ModelConfig(n_layers=0)
    assert isinstance(info.value, ConfigError)
    assert info.value.field == "model.n_layers"


def test_configs_are_frozen():
    cfg = ModelConfig()
    with pytest.raises(AttributeError):
        cfg.d_model = 8  # type: ignore[misc]


# ---- every error names the field and what is allowed ------------------------------------------


def test_d_model_must_be_divisible_by_n_heads():
    with raises_config("model.d_model", "30", "n_heads=4", "multiple of 4"):
        ModelConfig(d_model=30, n_heads=4)
    ModelConfig(d_model=32, n_heads=4)  # the neighbouring valid value passes


def test_rope_needs_even_head_dim():
    with raises_config("model.pos", "rope", "even", "3"):
        ModelConfig(pos="rope", d_model=12, n_heads=4)  # d_head = 3
    ModelConfig(pos="rope", d_model=12, n_heads=3)  # d_head = 4 is fine
    ModelConfig(pos="none", d_model=12, n_heads=4)  # odd d_head is fine without RoPE


def test_sinusoidal_needs_even_d_model():
    with raises_config("model.d_model", "even", "sinusoidal"):
        ModelConfig(pos="sinusoidal", d_model=15, n_heads=5)
    ModelConfig(pos="learned", d_model=15, n_heads=5)


@pytest.mark.parametrize("arch", TRANSFORMERS)
def test_n_ctx_must_cover_the_longest_sequence_including_ood(arch):
    # reverse, lengths 1..8, ood up to 16: decoder reads prompt SEP answer = 16 + 16 tokens,
    # the encoder-decoder at most 16 per stream.
    task = TaskConfig(name="reverse", max_len=8)
    needed = 32 if arch == "decoder" else 16
    RunConfig(model=ModelConfig(arch=arch, n_ctx=needed), task=task)
    with raises_config("model.n_ctx", str(needed - 1), "reverse", f"n_ctx >= {needed}"):
        RunConfig(model=ModelConfig(arch=arch, n_ctx=needed - 1), task=task)
    # an explicit ood_len moves the requirement
    longer = replace(task, ood_len=20)
    with raises_config("model.n_ctx", "allowed"):
        RunConfig(model=ModelConfig(arch=arch, n_ctx=needed), task=longer)


@pytest.mark.parametrize(
    "make, field_name",
    [
        (lambda: ModelConfig(n_layers=0), "model.n_layers"),
        (lambda: ModelConfig(n_heads=0), "model.n_heads"),
        (lambda: ModelConfig(d_model=0), "model.d_model"),
        (lambda: ModelConfig(d_model=-64), "model.d_model"),
        (lambda: ModelConfig(d_ff=-1), "model.d_ff"),
        (lambda: ModelConfig(n_ctx=0), "model.n_ctx"),
        (lambda: TaskConfig(min_len=0), "task.min_len"),
        (lambda: TaskConfig(max_len=0), "task.max_len"),
        (lambda: TaskConfig(n_symbols=1), "task.n_symbols"),
        (lambda: TrainConfig(steps=0), "train.steps"),
        (lambda: TrainConfig(batch_size=-3), "train.batch_size"),
        (lambda: TrainConfig(eval_every=0), "train.eval_every"),
        (lambda: TrainConfig(lr=0.0), "train.lr"),
        (lambda: TrainConfig(lr=-1e-3), "train.lr"),
    ],
)
def test_non_positive_sizes_are_refused(make, field_name):
    with raises_config(field_name, "out of range", "allowed"):
        make()


def test_max_len_below_min_len_is_refused():
    with raises_config("task.max_len", "min_len=5", "allowed"):
        TaskConfig(min_len=5, max_len=4)
    with raises_config("task.ood_len", "max_len=8"):
        TaskConfig(max_len=8, ood_len=8)


@pytest.mark.parametrize(
    "make, field_name, shown",
    [
        (lambda: ModelConfig(d_model=True), "model.d_model", "True"),
        (lambda: ModelConfig(n_layers=False), "model.n_layers", "False"),
        (lambda: ModelConfig(d_model="64"), "model.d_model", "'64'"),
        (lambda: ModelConfig(n_heads=2.0), "model.n_heads", "2.0"),
        (lambda: TrainConfig(steps="100"), "train.steps", "'100'"),
        (lambda: TrainConfig(seed=None), "train.seed", "None"),
    ],
)
def test_bool_str_float_where_an_int_is_expected(make, field_name, shown):
    with raises_config(field_name, shown, "not an integer", "allowed"):
        make()


@pytest.mark.parametrize(
    "make, field_name",
    [
        (lambda: TrainConfig(lr="1e-3"), "train.lr"),
        (lambda: TrainConfig(lr=True), "train.lr"),
        (lambda: TrainConfig(weight_decay=float("nan")), "train.weight_decay"),
        (lambda: ModelConfig(dropout=None), "model.dropout"),
    ],
)
def test_non_numbers_where_a_float_is_expected(make, field_name):
    with raises_config(field_name, "not a number", "allowed"):
        make()


@pytest.mark.parametrize(
    "make, field_name, allowed, suggestion",
    [
        (lambda: ModelConfig(pos="rop"), "model.pos", POS_ENCODINGS, "rope"),
        (lambda: ModelConfig(pos="sinusodial"), "model.pos", POS_ENCODINGS, "sinusoidal"),
        (lambda: ModelConfig(norm="pr"), "model.norm", NORMS, "pre"),
        (lambda: ModelConfig(arch="decodr"), "model.arch", ARCHS, "decoder"),
        (lambda: ModelConfig(activation="gelu2"), "model.activation", ACTIVATIONS, "gelu"),
        (lambda: TaskConfig(name="revers"), "task.name", TASK_NAMES, "reverse"),
        (lambda: TrainConfig(schedule="cosin"), "train.schedule", SCHEDULES, "cosine"),
    ],
)
def test_unknown_choice_lists_allowed_values_and_suggests(make, field_name, allowed, suggestion):
    with raises_config(field_name, f"did you mean {suggestion!r}", *allowed):
        make()


def test_unknown_choice_without_close_match_has_no_suggestion():
    with raises_config("model.pos", *POS_ENCODINGS) as info:
        ModelConfig(pos="zzzzzzzz")
    assert "did you mean" not in str(info.value)


def test_induction_with_encoder_decoder_is_refused():
    with raises_config("task.name", "induction", "decoder"):
        RunConfig(model=ModelConfig(arch="encoder-decoder"), task=TaskConfig(name="induction", min_len=4))


# ---- from_dict / from_json ----------------------------------------------------------------


def test_from_dict_rejects_unknown_keys_with_suggestion():
    with raises_config("model.d_modle", "unknown key", "did you mean 'd_model'"):
        RunConfig.from_dict({"model": {"d_modle": 64}})
    with raises_config("modle", "unknown key", "did you mean 'model'"):
        RunConfig.from_dict({"modle": {"d_model": 64}})
    with raises_config("train.stpes", "did you mean 'steps'"):
        RunConfig.from_dict({"train": {"stpes": 10}})


def test_from_dict_validates_values_and_types():
    with raises_config("model.pos", "did you mean 'rope'"):
        RunConfig.from_dict({"model": {"pos": "rop"}})
    with raises_config("model", "JSON object"):
        RunConfig.from_dict({"model": [1, 2]})
    with raises_config("config", "JSON object"):
        RunConfig.from_dict([1, 2])
    with raises_config("config", "not valid JSON"):
        RunConfig.from_json("{not json")


def test_from_dict_partial_sections_use_defaults_and_ints_become_floats():
    cfg = RunConfig.from_dict({"model": {"d_model": 32, "dropout": 0}, "train": {"lr": 1}})
    assert cfg.model == ModelConfig(d_model=32)
    assert type(cfg.model.dropout) is float
    assert cfg.task == TaskConfig()
    assert cfg.train.lr == 1.0 and type(cfg.train.lr) is float
    with raises_config("train.steps", "not an integer"):
        RunConfig.from_dict({"train": {"steps": 10.0}})  # a float never silently becomes an int


def _every_field_changed() -> RunConfig:
    return RunConfig(
        model=ModelConfig(
            arch="encoder-decoder", n_layers=3, n_heads=2, d_model=48, d_ff=96, dropout=0.1,
            activation="swiglu", norm="post", pos="sinusoidal", n_ctx=200, head_dim=12, scale="none",
            residual="off", norm_type="rmsnorm", qk_norm="on", pos_range=64,
        ),
        task=TaskConfig(
            name="sort", min_len=2, max_len=10, ood_len=15, n_symbols=5, modulus=13, train_fraction=0.5,
            text="Sort is the task; the text is kept as modulus is (each counts for its own task only).\n" * 4,
        ),
        train=TrainConfig(
            steps=77, batch_size=16, lr=1e-3, warmup=7, schedule="linear", min_lr_ratio=0.05,
            weight_decay=0.01, decay_embeddings="yes", beta1=0.8, beta2=0.95, grad_clip=0.5, label_smoothing=0.05,
            eval_every=11, eval_samples=64, snapshots=3, seed=123, device="cpu", threads=1,
        ),
        name="every field changed",
    )


def test_round_trip_config_really_changes_every_field():
    cfg, default = _every_field_changed(), RunConfig()
    assert cfg.name != default.name
    for key in ("model", "task", "train"):
        for f in fields(getattr(cfg, key)):
            assert getattr(getattr(cfg, key), f.name) != getattr(getattr(default, key), f.name), f"{key}.{f.name}"


def test_json_round_trip_is_lossless():
    cfg = _every_field_changed()
    text = cfg.to_json()
    back = RunConfig.from_json(text)
    assert back == cfg
    assert back.to_json() == text
    assert flatten(back) == flatten(cfg)
    for k, v in flatten(cfg).items():  # types survive too (1e-3 stays a float, 16 an int)
        assert type(flatten(back)[k]) is type(v), k
    assert json.loads(text)["schema_version"] == SCHEMA_VERSION
    assert RunConfig.from_dict(cfg.to_dict()) == cfg
    assert RunConfig.from_json(RunConfig().to_json()) == RunConfig()


def test_schema_version_mismatch_is_refused():
    data = RunConfig().to_dict()
    data["schema_version"] = SCHEMA_VERSION + 1
    with raises_config("schema_version", str(SCHEMA_VERSION + 1), "allowed"):
        RunConfig.from_dict(data)
    data["schema_version"] = SCHEMA_VERSION
    assert RunConfig.from_dict(data) == RunConfig()


def test_flatten_gives_dotted_columns():
    cfg = _every_field_changed()
    flat = flatten(cfg)
    assert flat["model.d_model"] == 48
    assert flat["task.name"] == "sort"
    assert flat["train.lr"] == 1e-3
    assert flat["name"] == "every field changed"
    n_fields = sum(len(fields(getattr(cfg, k))) for k in ("model", "task", "train"))
    assert len(flat) == n_fields + 1
    assert all(k == "name" or k.split(".")[0] in ("model", "task", "train") for k in flat)


# ---- closed sets and registries agree -----------------------------------------------------


def test_positional_registry_matches_literal():
    assert set(lab.positional.REGISTRY) == set(POS_ENCODINGS)
    for name, cls in lab.positional.REGISTRY.items():
        assert cls.name == name


def test_task_registry_matches_literal():
    assert set(lab.tasks.batches.TASKS) == set(TASK_NAMES)
    for name, task in lab.tasks.batches.TASKS.items():
        assert task.name == name
