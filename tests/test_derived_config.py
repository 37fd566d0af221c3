"""One rule for derived config values (lab/derived.py): the app's knobs, the command line, a share link, a
config JSON file, the ablation grid and the presets build the same config from the same knobs, n_ctx
included; a value the user states (--n-ctx, a --config file's own n_ctx) is kept as stated."""
from __future__ import annotations

import json
from dataclasses import replace
from urllib.parse import parse_qsl

import pytest

from lab.cli.main import FIELD_TO_FLAG, build_parser, config_from_args, main
from lab.config import ModelConfig, RunConfig, TaskConfig, declared_fields
from lab.derived import N_CTX_FLOOR, derived_n_ctx, run_config, stated_in
from lab.params import param_breakdown
from lab.engine.grid import build_grid
from lab.teach.presets.catalog import PRESETS
from ui.knobs import BY_URL, config_from_values, query_string, values_from_config, values_from_query
from ui.share import read_config_file

# The same knobs, by their API / share-link names. The first is the issue's: the command line used to
# train it with n_ctx 128 (8,192 learned position parameters) where the app used 32.
KNOB_SETS = [
    {"task": "reverse", "pos": "learned"},
    {"task": "sort", "max_len": 12, "arch": "encoder-decoder", "pos": "sinusoidal"},
    {"task": "modular_addition", "pos": "none", "modulus": 31, "train_fraction": 0.5},  # 3 tokens: the floor
    {"task": "induction", "min_len": 8, "max_len": 16, "n_symbols": 64, "ood_len": 40},
    {"task": "text", "min_len": 16, "max_len": 16, "n_layers": 1},
    {"task": "addition", "max_len": 5, "ood_len": 9, "pos": "rope", "d_model": 32, "lr": 0.001},
    # the recipe's knobs (issue 23) and a recurrent baseline
    {"task": "copy", "scale": "none", "residual": "off", "head_dim": 12, "norm_type": "rmsnorm",
     "activation": "swiglu", "qk_norm": "on", "pos": "rope"},
    {"task": "reverse", "arch": "lstm", "d_model": 80},
]
IDS = ["-".join(f"{k}={v}" for k, v in knobs.items()) for knobs in KNOB_SETS]


def from_app(knobs: dict) -> RunConfig:
    """What Start builds from these knob values (ui/knobs.py)."""
    return config_from_values({BY_URL[k].key: v for k, v in knobs.items()})


def from_cli(*argv: str) -> RunConfig:
    """What `python -m lab train ARGV` would train (parsed and built, not trained)."""
    return config_from_args(build_parser().parse_args(["train", *argv]))


def flags(knobs: dict) -> list[str]:
    return [part for k, v in knobs.items() for part in (FIELD_TO_FLAG[BY_URL[k].key], str(v))]


def through_link(cfg: RunConfig) -> RunConfig:
    values, hide, problems = values_from_query(dict(parse_qsl(query_string(cfg))))
    assert problems == [] and hide == []
    return config_from_values(values)


def through_file(cfg: RunConfig, tmp_path) -> RunConfig:
    path = tmp_path / "config.json"
    path.write_text(cfg.to_json(), encoding="utf-8")
    return read_config_file(str(path))


@pytest.mark.parametrize("knobs", KNOB_SETS, ids=IDS)
def test_app_cli_link_and_file_build_the_same_config(knobs, tmp_path):
    app = from_app(knobs)
    assert from_cli(*flags(knobs)) == app
    assert through_link(app) == app
    assert through_file(app, tmp_path) == app
    assert app.model.n_ctx == derived_n_ctx(app.task, app.model.arch) >= N_CTX_FLOOR


def test_reverse_with_learned_positions_gets_the_apps_context_on_the_command_line():
    cfg = from_cli("--task", "reverse", "--pos", "learned")
    assert cfg.model.n_ctx == 32  # lengths up to 2 * 8 evaluated, prompt and answer: 16 + 16 tokens
    assert param_breakdown(cfg)["positional"] == 32 * cfg.model.d_model  # not 128 * 64 = 8,192


def test_small_tasks_get_the_floor():
    cfg = from_app({"task": "modular_addition"})
    assert cfg.model.n_ctx == N_CTX_FLOOR == 8  # `a b =` is 3 tokens; the app has always used 8


def preset_argv(cfg: RunConfig) -> list[str]:
    """Flags for every knob of a preset run that differs from the default (n_ctx left to the rule)."""
    default = RunConfig()
    out = []
    for f in declared_fields():
        if f.key == "model.n_ctx" or not f.flag:
            continue
        value = getattr(getattr(cfg, f.section), f.name)
        if value != getattr(getattr(default, f.section), f.name) or f.key in ("task.min_len", "task.max_len"):
            out += [f.flag, repr(value) if isinstance(value, float) else str(value)]
    return out


PRESET_RUNS = [(p.key, c) for p in PRESETS.values() for c in p.runs]


@pytest.mark.parametrize("key,cfg", PRESET_RUNS, ids=[f"{k}-{c.name}" for k, c in PRESET_RUNS])
def test_a_preset_is_what_the_app_and_the_cli_build_from_its_knobs(key, cfg):
    unnamed = replace(cfg, name="")
    assert config_from_values(values_from_config(cfg)) == unnamed
    assert from_cli(*preset_argv(cfg)) == unnamed
    assert cfg.model.n_ctx == derived_n_ctx(cfg.task, cfg.model.arch)


def test_run_config_derives_only_n_ctx():
    model, task = ModelConfig(d_model=32, n_heads=2), TaskConfig(name="copy", max_len=5)
    cfg = run_config(model, task, name="x")
    assert cfg.model == replace(model, n_ctx=20) and cfg.task == task and cfg.name == "x"


def test_the_grid_derives_what_its_base_did_not_state():
    base = from_app({"task": "sort", "max_len": 6})
    grid = build_grid(base, [("PE", "rope, learned"), ("layers", "1, 3")])
    assert [c.model.n_ctx for c in grid] == [24] * 4 and {c.model.pos for c in grid} == {"rope", "learned"}
    stated = replace(base, model=replace(base.model, n_ctx=64))
    assert [c.model.n_ctx for c in build_grid(stated, [("PE", "rope, learned")])] == [64, 64]


# ---- what a user states is kept --------------------------------------------------------------------
def test_an_n_ctx_flag_is_kept_and_checked(tmp_path, capsys):
    assert from_cli("--task", "reverse", "--n-ctx", "100").model.n_ctx == 100
    rc = main(["train", "--n-ctx", "31", "--runs-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert rc == 2 and "model.n_ctx" in err and "--n-ctx" in err and "Context length" in err and "n_ctx >= 32" in err
    assert not (tmp_path / "runs").exists()


def test_a_config_file_keeps_its_own_n_ctx_and_follows_flags_where_it_was_derived(tmp_path):
    old = tmp_path / "old.json"  # a run stored by the command line before the rule: n_ctx 128
    old.write_text(RunConfig().to_json(), encoding="utf-8")
    assert RunConfig().model.n_ctx == 128 and "model.n_ctx" in stated_in(RunConfig())
    assert from_cli("--config", str(old)).model.n_ctx == 128  # reproduces exactly
    assert from_cli("--config", str(old), "--max-len", "16").model.n_ctx == 128  # stated: kept
    saved = tmp_path / "saved.json"  # a file saved by the app: its n_ctx is the rule's
    saved.write_text(from_app({"task": "reverse"}).to_json(), encoding="utf-8")
    assert json.loads(saved.read_text())["model"]["n_ctx"] == 32
    assert from_cli("--config", str(saved)).model.n_ctx == 32
    assert from_cli("--config", str(saved), "--max-len", "16").model.n_ctx == 64  # derived: follows the flag
    assert from_cli("--config", str(saved), "--max-len", "16", "--n-ctx", "70").model.n_ctx == 70
