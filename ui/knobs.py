"""The knobs: the Train tab's widgets, validation, the share URL and JSON import, from one declaration.

Each knob is a config field declared in lab/config.py with its widget, label, one-line explanation and
URL key; this module only turns those declarations into gradio widgets. Every config field a run's result depends on is a knob (the
rarely changed ones are `advanced`, in a closed accordion), so a link or a JSON file carries the
whole experiment. Not knobs: n_ctx (derived from the task so that the longest sequence, evaluation
beyond training included, always fits: lab/derived.py), and where the run trains (device, threads: the
server's choice). A task knob the chosen task does not read (the alphabet size for text, the lengths for
modular_addition) is hidden while that task is chosen (`Knob.means_something`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence
from urllib.parse import urlencode

import gradio as gr

from lab.config import RECURRENT, RECURRENT_READS, ConfigError, RunConfig, declared_fields
from lab.derived import lengths_on_choosing, resolve
from lab.fields import FieldInfo, shown
from lab.tasks.shapes import SHAPES
from ui.common import PRIVATE


_MAKERS: dict[str, Callable[..., gr.components.Component]] = {
    "dropdown": gr.Dropdown, "radio": gr.Radio, "slider": gr.Slider, "number": gr.Number, "textbox": gr.Textbox}
MAX_LINK_CHARS = 8000  # a share link's query, at most: servers refuse longer request lines (uvicorn's ~16 KB)


@dataclass(frozen=True)
class Knob:
    """A config field shown as a widget: everything about it comes from its declaration (lab/config.py)."""

    field: FieldInfo
    key: str  # "section.field" in RunConfig
    label: str
    info: str  # the one-line explanation shown under the widget
    kind: type
    advanced: bool
    url_key: str  # the short name in share URLs and API parameters ("task" for task.name)

    @classmethod
    def of(cls, f: FieldInfo) -> "Knob":
        return cls(f, f.key, f.spec.label, f.spec.help, f.kind, f.spec.advanced, f.url or f.name)

    def default(self) -> Any:
        return self.field.default

    @property
    def when(self) -> Optional[tuple[str, Any]]:
        """("task.name", "text"): the widget is shown, and its value counts, only while that knob has that
        value (None: always)."""
        return self.field.spec.widget.when if self.field.spec.widget else None

    def applies(self, values: dict[str, Any]) -> bool:
        """Whether the knob is shown (and counts) with these knob values (missing ones: their defaults)."""
        if self.when is None:
            return True
        other, wanted = self.when
        return values.get(other, BY_KEY[other].default()) == wanted

    def means_something(self, task: Any) -> bool:
        """Whether the knob is read when task `task` is chosen (lab/tasks/shapes.py `reads`); every knob
        outside the task section, and every knob for an unknown task, is."""
        sec, name = self.key.split(".")
        return sec != "task" or name == "name" or task not in SHAPES or name in SHAPES[task].reads

    def make(self, **kw: Any) -> gr.components.Component:
        """The widget (rendered where it is called inside a Blocks context)."""
        w = self.field.spec.widget
        assert w is not None  # only declared widgets become knobs
        if w.kind in ("dropdown", "radio"):
            kw["choices"] = list(w.options or self.field.choices)
            if w.kind == "dropdown" and self.kind in (int, float):  # usual values offered, any typed one checked:
                kw["allow_custom_value"] = True  # d_model 100000 is refused by name, not put back to 64 unsaid
        elif w.kind == "slider":
            kw.update(minimum=w.lo, maximum=w.hi, step=w.step)
        elif w.kind == "textbox":  # no max_length: the browser would cut a long paste without a word
            kw.update(lines=4, max_lines=10, placeholder="Empty: the built-in text")
        else:  # number: whole numbers for int fields; bounds only where declared
            kw.update({k: v for k, v in (("minimum", w.lo), ("maximum", w.hi)) if v is not None})
            if self.kind is int:
                kw["precision"] = 0
        task = BY_KEY["task.name"].default()
        if self.when is not None or not self.means_something(task):
            kw.setdefault("visible", self.applies({}) and self.means_something(task))
        return _MAKERS[w.kind](**kw)


# Every declared field with a widget, basic ones first, then the advanced ones (each in section order)
KNOBS: tuple[Knob, ...] = tuple(Knob.of(f) for adv in (False, True) for f in declared_fields()
                                if f.spec.widget is not None and f.spec.advanced == adv)
KNOB_KEYS = tuple(k.key for k in KNOBS)
BY_URL = {k.url_key: k for k in KNOBS}
BY_KEY = {k.key: k for k in KNOBS}


def build_widgets(section: str, advanced: bool = False) -> dict[str, gr.components.Component]:
    """Create (and render, inside a Blocks context) the widgets of one config section (its basic or its
    advanced knobs)."""
    return {k.key: k.make(label=k.label, info=k.info, value=k.default(), interactive=True, elem_id=k.url_key)
            for k in KNOBS if k.key.startswith(section + ".") and k.advanced == advanced}


def _as_kind(knob: Knob, value: Any) -> Any:
    if knob.kind is str and knob.field.spec.widget.kind == "textbox":
        return "" if value is None else value  # an empty text box means the built-in text
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
                raise ConfigError(knob.key, f"{shown(value)} is not an integer")
            return int(value)
        return value
    if knob.kind is float and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            raise ConfigError(knob.key, f"{shown(value)} is not a number") from None
    return value


def config_from_values(values: dict[str, Any], base: Optional[RunConfig] = None) -> RunConfig:
    """Knob values (by key) -> a validated RunConfig; n_ctx derived (lab/derived.py: the task's longest
    sequence, as the command line, the grid and the presets derive it). Task errors come first. A knob
    shown only for another knob's value (the text box, for task text) keeps its default otherwise: a
    hidden box's text does not travel with a run of another task."""
    data = (base or RunConfig()).to_dict()
    for knob in KNOBS:
        if knob.key in values:
            sec, name = knob.key.split(".")
            data[sec][name] = _as_kind(knob, values[knob.key])
    current = {k.key: data[k.key.split(".")[0]][k.key.split(".")[1]] for k in KNOBS}
    for knob in KNOBS:
        if not knob.applies(current):
            sec, name = knob.key.split(".")
            data[sec][name] = knob.default()
    return resolve(data)  # every knob as given; n_ctx by the one rule (lab/derived.py)


# The task knobs whose visibility follows the chosen task (the text box has its own rule: ui/textfile.py)
TASK_SHOWN = tuple(k for k in KNOBS if k.key.startswith("task.") and k.key != "task.name" and k.when is None)
LENGTH_KEYS = ("task.min_len", "task.max_len")


# The model knobs a recurrent model does not read: greyed out, saying why, while rnn, lstm or gru is chosen
ARCH_BOUND = tuple(k for k in KNOBS if k.key.startswith("model.") and k.key not in RECURRENT_READS)


def usable_for_arch(arch: Any, locked: Sequence[str] = ()) -> list[Any]:
    """Updates of the ARCH_BOUND widgets when `arch` is chosen: disabled, with the reason first in their
    explanation, for a recurrent model; as declared otherwise. A knob a classroom link `locked` (keys) stays
    as the link set it."""
    recurrent = arch in RECURRENT
    why = (f"Not used by a recurrent model ({str(arch).upper()}): it reads one token at a time, with no attention, "
           "positions, norms or feed-forward layers. ") if recurrent else ""
    return [gr.skip() if k.key in locked else gr.update(interactive=not recurrent, info=why + k.info)
            for k in ARCH_BOUND]


def shown_for_task(task: Any) -> list[dict[str, Any]]:
    """Updates of the TASK_SHOWN widgets when `task` is chosen: visible only if the task reads them."""
    return [gr.update(visible=k.means_something(task)) for k in TASK_SHOWN]


def lengths_for_task(task: Any, min_len: Any, max_len: Any, text: Any = "") -> tuple[Any, Any]:
    """The length sliders' values after the user picks `task` (lab/derived.py `lengths_on_choosing`): the
    task's defaults unless the user's own lengths work for it, so Start is never refused for them."""
    try:
        lo, hi = (_as_kind(BY_KEY[k], v) for k, v in zip(LENGTH_KEYS, (min_len, max_len)))
    except ConfigError:
        lo = hi = None  # an empty or broken slider: the task's defaults
    return lengths_on_choosing(task, lo, hi, text if isinstance(text, str) else "")


def wire_task_choice(widgets: dict[str, gr.components.Component]) -> None:
    """When the user picks a task (`.input`), set lengths it accepts: a link's or a file's lengths stay as
    they were set. Which knobs are shown follows every change of the task (a link or an uploaded config sets
    it too): `shown_for_task`, answered by the Train tab's one knob event (ui/train.py)."""
    task = widgets["task.name"]
    task.input(lambda *a: list(lengths_for_task(*a)), inputs=[task, *(widgets[k] for k in LENGTH_KEYS),
               widgets["task.text"]], outputs=[widgets[k] for k in LENGTH_KEYS], api_name="task_lengths", queue=False,
               show_progress="hidden", preprocess=False, api_visibility=PRIVATE)


def values_from_config(cfg: RunConfig) -> dict[str, Any]:
    return {k.key: getattr(getattr(cfg, k.key.split(".")[0]), k.key.split(".")[1]) for k in KNOBS}


def query_string(cfg: RunConfig, hide: tuple[str, ...] = ()) -> str:
    """The share URL's query: every knob that differs from the default, the seed always."""
    defaults = values_from_config(RunConfig())
    pairs = {k.url_key: v for k, v in ((k, values_from_config(cfg)[k.key]) for k in KNOBS)
             if v != defaults[k.key] or k.key == "train.seed"}
    if hide:
        pairs["hide"] = ",".join(hide)
    query = urlencode(pairs)
    if len(query) > MAX_LINK_CHARS:
        raise ConfigError("task.text", f"is too long for a link ({len(query):,} characters once encoded; allowed: "
                          f"{MAX_LINK_CHARS:,}): share it with Download config JSON instead")
    return query


def values_from_query(params: dict[str, str]) -> tuple[dict[str, Any], list[str], list[str]]:
    """URL query -> (knob values, knob keys to hide, problems). Unknown keys are reported, not ignored."""
    values: dict[str, Any] = {}
    problems: list[str] = []
    for key, text in params.items():
        if key in ("hide", "__theme", "view", "projector"):  # the page's own options (ui/projector.py)
            continue
        knob = BY_URL.get(key)
        if knob is None:
            problems.append(f"unknown URL option {shown(key)}")
            continue
        values[knob.key] = text if knob.kind is str else _number(text)
    hide = [BY_URL[h].key for h in params.get("hide", "").split(",") if h in BY_URL]
    problems += [f"unknown control to hide {shown(h)}" for h in params.get("hide", "").split(",") if h and h not in BY_URL]
    refused = _refusals(values)
    problems += [f"URL option {exc}" for exc in refused]
    return ({} if refused else values), hide, problems


def _refusals(values: dict[str, Any]) -> list[ConfigError]:
    """Every refused value among `values` (by knob key), not only the first: the check is repeated without each
    value it names until the rest pass or it names one not given (a rule between several knobs)."""
    left, refused = dict(values), []
    while True:
        try:
            config_from_values(left)
            return refused
        except ConfigError as exc:
            if str(exc) not in map(str, refused):
                refused.append(exc)
            if exc.field not in left:
                return refused
            del left[exc.field]


def _number(text: str) -> Any:
    try:
        f = float(text)
    except ValueError:
        return text
    return int(f) if f.is_integer() and "." not in text and "e" not in text.lower() else f

