"""One declaration per config field: bounds, label, help, CLI flag, share key, widget, ablation axis.

A config dataclass declares each field once with `knob(default, ...)`; everything else reads that
declaration: validation (`validate`), the command line's flags (lab/cli/main.py), the app's widgets and share
links (ui/knobs.py), the ablation grid's axes (lab/engine/grid.py) and Compare's columns and filters. Adding
a knob means adding its field here-style in lab/config.py and its behaviour in the model or trainer;
nothing else. The idea is TensorFlow Playground's single table of state properties that drives both the
UI and the URL. No torch and no gradio here: widgets are described as plain data.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import typing
from dataclasses import dataclass, field
from typing import Any, Iterator, Literal, Optional


class ConfigError(ValueError):
    """A user-facing validation error that names the offending field."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


@dataclass(frozen=True)
class Widget:
    """How the app shows a knob: a dropdown, radio, slider, number box or text box (plain data; ui/knobs.py
    builds it). `lo`/`hi` bound the widget only (a slider's range), which may be narrower than what
    validation allows; `options` are a dropdown's values when they are not the field's closed set of
    choices; `when` = ("task.name", "text") shows the widget only while that knob has that value."""

    kind: Literal["dropdown", "radio", "slider", "number", "textbox"]
    lo: Optional[float] = None
    hi: Optional[float] = None
    step: Optional[float] = None
    options: tuple[Any, ...] = ()
    when: Optional[tuple[str, Any]] = None


def dropdown(*options: object) -> Widget:
    """A dropdown offering `options` (for a number field: its usual values)."""
    return Widget("dropdown", options=tuple(options))


def slider(lo: float, hi: float, step: float = 1) -> Widget:
    return Widget("slider", lo, hi, step)


def number(lo: float | None = None, hi: float | None = None) -> Widget:
    return Widget("number", lo, hi)


DROPDOWN, RADIO = Widget("dropdown"), Widget("radio")  # a closed set's choices as a dropdown or radio buttons


@dataclass(frozen=True)
class Spec:
    """What a field means to people and to every interface (see the module docstring)."""

    label: str  # "Heads": what every interface calls the field
    help: str  # one line: shown under the widget and in `--help`
    lo: Optional[float] = None  # numeric bounds, checked by `validate`
    hi: Optional[float] = None
    lo_open: bool = False  # lo itself is not allowed (a learning rate above 0)
    widget: Optional[Widget] = None  # None: not a knob in the app (chosen by the server or derived)
    advanced: bool = False  # in the closed "Advanced" accordion of its section
    flag: Optional[str] = ""  # CLI flag; "" derives "--d-model" from the name; None: no flag
    url: Optional[str] = ""  # key in share links and API parameters; "" = the field name; None: not shared
    axis: Optional[str] = None  # the ablation grid's name for this axis ("PE"), if it is one
    short: str = ""  # the name in grid run names ("pos=rope"); "" = the field name
    column: Optional[str] = None  # its header in Compare's run table, if shown there
    filter: bool = False  # Compare can filter stored runs by it


def knob(default: Any, **spec: Any) -> Any:
    """A dataclass field with its default and its declaration (`Spec`)."""
    return field(default=default, metadata={"spec": Spec(**spec)})


@dataclass(frozen=True)
class FieldInfo:
    """A declared field of one config section, with everything derived from its declaration."""

    section: str  # "model"
    name: str  # "n_heads"
    kind: type  # int, float or str
    choices: tuple[str, ...]  # the closed set of a Literal field, else ()
    default: Any
    spec: Spec

    @property
    def key(self) -> str:
        """'model.n_heads': the flat column name in the store's table."""
        return f"{self.section}.{self.name}"

    @property
    def flag(self) -> Optional[str]:
        return None if self.spec.flag is None else self.spec.flag or "--" + self.name.replace("_", "-")

    @property
    def url(self) -> Optional[str]:
        return None if self.spec.url is None else self.spec.url or self.name

    @property
    def short(self) -> str:
        return self.spec.short or self.name

    @property
    def label_help(self) -> str:
        """'Heads: attention heads per layer; ...' (the CLI's help line)."""
        return f"{self.spec.label}: {self.spec.help}"

    def allowed(self) -> str:
        """What the field accepts, in words: 'one of pre, post, none' or '1 to 64'."""
        if self.choices:
            return "one of " + ", ".join(self.choices)
        if self.kind is str:
            return "text"
        lo, hi = self.spec.lo, self.spec.hi
        if lo is None or hi is None:
            return "an integer" if self.kind is int else "a number"
        left = "above " if self.spec.lo_open else ""
        return f"{left}{_num(lo)} to {_num(hi)}"

    def check(self, value: Any) -> None:
        """ConfigError naming `key` unless `value` is allowed."""
        if self.choices:
            if value not in self.choices:
                raise ConfigError(self.key, suggest(value, self.choices))
        elif self.kind is int:
            _int(self.key, value, int(self.spec.lo), int(self.spec.hi))
        elif self.kind is float:
            _float(self.key, value, self.spec.lo, self.spec.hi, self.spec.lo_open)


def _num(x: float) -> str:
    return f"{int(x):,}".replace(",", "_") if float(x).is_integer() and abs(x) >= 10_000 else f"{x:g}"


@functools.lru_cache(maxsize=None)
def declared(cls: type) -> tuple[FieldInfo, ...]:
    """The declared fields of a config section class, in declaration order."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        spec = f.metadata.get("spec")
        if spec is None:
            continue
        hint = hints[f.name]
        choices = tuple(typing.get_args(hint)) if typing.get_origin(hint) is Literal else ()
        kind = str if choices else hint
        out.append(FieldInfo(cls.SECTION, f.name, kind, choices, f.default, spec))
    return tuple(out)


def validate(obj: Any) -> None:
    """Check every declared field of a config section instance (its `__post_init__` calls this)."""
    for info in declared(type(obj)):
        info.check(getattr(obj, info.name))


def iter_fields(*classes: type) -> Iterator[FieldInfo]:
    for cls in classes:
        yield from declared(cls)


MAX_SHOWN = 40  # characters of a refused value repeated in a message


def shown(value: Any) -> str:
    """A refused value as a message repeats it: its repr, cut to MAX_SHOWN characters (a megabyte pasted
    into a field must not come back in the error)."""
    text = repr(value) if len(str(value)) <= 10 * MAX_SHOWN else repr(str(value)[: MAX_SHOWN + 1])
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 1] + "…"


def suggest(value: Any, allowed: tuple[str, ...]) -> str:
    """"'rop' is not one of ... (did you mean 'rope'?)"."""
    text = str(value)
    close = difflib.get_close_matches(text, allowed, n=1) if len(text) <= MAX_SHOWN else []
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{shown(value)} is not one of {', '.join(allowed)}{hint}"


def _int(name: str, value: Any, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(name, f"{shown(value)} is not an integer (allowed: {lo} to {hi})")
    if not lo <= value <= hi:
        raise ConfigError(name, f"{value} is out of range (allowed: {lo} to {hi})")


def _float(name: str, value: Any, lo: float, hi: float, lo_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise ConfigError(name, f"{shown(value)} is not a number (allowed: {lo} to {hi})")
    if value > hi or value < lo or (lo_open and value == lo):
        left = "above" if lo_open else "from"
        raise ConfigError(name, f"{value} is out of range (allowed: {left} {lo} to {hi})")
