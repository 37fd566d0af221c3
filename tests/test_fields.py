"""Each config field is declared once (lab/config.py with lab/fields.py); validation, the CLI's flags, the
app's knobs and share keys, the grid's axes and Compare's columns are all read from that declaration."""
from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

import lab.cli.main as cli
from lab.config import SECTIONS, ConfigError, RunConfig, declared_fields
from lab.engine.grid import AXES
from ui.compare.tab import FILTERS, TABLE_COLS
from ui.knobs import KNOBS, BY_URL

FIELDS = declared_fields()
NUMERIC = [f for f in FIELDS if f.kind in (int, float)]


def test_every_dataclass_field_is_declared_once():
    every = {f"{cls.SECTION}.{f.name}" for cls in SECTIONS for f in dataclasses.fields(cls)}
    keys = [f.key for f in FIELDS]
    assert sorted(keys) == sorted(every) and len(set(keys)) == len(keys)
    for f in FIELDS:  # the declared default is the dataclass default
        assert getattr(getattr(RunConfig(), f.section), f.name) == f.default
        assert f.spec.label and f.spec.help, f.key


def test_flags_keys_and_axes_are_generated_and_unique():
    flags = [f.flag for f in FIELDS if f.flag]
    urls = [f.url for f in FIELDS if f.url]
    assert len(set(flags)) == len(flags) and len(set(urls)) == len(urls)
    assert set(cli.FIELDS) == set(flags) and cli.FIELD_TO_FLAG["model.d_model"] == "--d-model"
    assert cli.FIELD_TO_FLAG["task.name"] == "--task"
    assert [k.key for k in KNOBS] == ([f.key for f in FIELDS if f.spec.widget and not f.spec.advanced]
                                      + [f.key for f in FIELDS if f.spec.widget and f.spec.advanced])
    assert set(BY_URL) == {f.url for f in FIELDS if f.spec.widget}
    assert {a.field for a in AXES.values()} == {f.key for f in FIELDS if f.spec.axis}
    assert AXES["PE"].choices == next(f.choices for f in FIELDS if f.key == "model.pos")
    assert {k for k in TABLE_COLS if "." in k and not k.startswith("final.")} == {
        f.key for f in FIELDS if f.spec.column}
    assert set(FILTERS) == {f.key for f in FIELDS if f.spec.filter}


@pytest.mark.parametrize("info", [f for f in FIELDS if f.flag], ids=lambda f: f.key)
def test_every_flag_reaches_its_field(info):
    """`--flag VALUE` for every declared field lands in that field (the CLI has no table of its own)."""
    value = "cpu" if info.key == "train.device" else info.choices[-1] if info.choices else info.default
    longer = ["--min-len", "4"] if info.key == "task.name" else []  # language-model tasks need 4 (induction)
    args = cli.build_parser().parse_args(["train", info.flag, str(value), *longer])
    assert getattr(getattr(cli.config_from_args(args), info.section), info.name) == value


@pytest.mark.parametrize("info", NUMERIC, ids=lambda f: f.key)
def test_bounds_come_from_the_declaration(info):
    """One past each declared bound is refused, naming the field and what is allowed."""
    cls = next(c for c in SECTIONS if c.SECTION == info.section)
    too_big = info.spec.hi + (1 if info.kind is int else info.spec.hi * 0.01 + 0.01)
    with pytest.raises(ConfigError) as err:
        cls(**{info.name: info.kind(too_big)})
    assert err.value.field == info.key and "allowed" in str(err.value)
    below = info.spec.lo if info.spec.lo_open else info.spec.lo - 1
    with pytest.raises(ConfigError) as err:
        cls(**{info.name: info.kind(below)})
    assert err.value.field == info.key


@pytest.mark.app
def test_config_validation_imports_no_torch():
    """Building and validating a config (its task's lengths included) loads no torch."""
    code = ("import sys; from lab.config import RunConfig, TaskConfig; "
            "RunConfig(task=TaskConfig(name='addition', max_len=9)); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_huge_refused_value_is_not_echoed_back():
    """A megabyte pasted into a field (or sent to the API) comes back as a short excerpt, not whole."""
    from ui.train import validate
    from ui.knobs import KNOBS

    values = [("x" * 1_000_000 if k.key == "task.name" else k.default()) for k in KNOBS]
    text = validate(*values)
    assert text.startswith("⚠️ **Task**") and len(text) < 300 and "xxxx…" in text, text[:400]
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict({"model": {"d_model": "9" * 100_000}})
    assert len(str(err.value)) < 200
