"""Inspect tab: attention heatmaps (layers x heads, every attention kind) with one step slider,
and the positional encodings of two runs side by side (PCA, similarity, relative patterns).

The sampled probe's attention comes from the snapshots saved during training (scrubbing never
retrains); a typed probe runs a fresh model loaded from the run's final weights, and the step slider
then says so (disabled, at the final step).

Every picture is a matplotlib figure: an update carries the whole picture, so it always shows the run
picked. (The PCA was a native scatter plot: sent a new run's points and axis limits in one update, it
rebuilt its chart for the new limits from the points it still held, so it showed the previous run's
points and colour scale under the new run's axes, and "NaN" after a run without position vectors.)

The page's events answer a typed input that cannot be drawn next to the Typed input box and keep the
heatmaps shown; the API endpoints (`/attention`, `/attention_for_run`) refuse it with an error naming
the field.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from typing import Any, Optional

import gradio as gr

from lab.config import RECURRENT, ConfigError, flatten
from lab.views.analysis import (MAX_PROBE_CHARS, PROBE_SOURCES, allowed_symbols, attention, load_model, parse_probe,
                                positional_view, sampled_probe)
from lab.views.plots import KIND_TITLES, attention_grid, pca_figure, positional_figure
from lab.views.run_labels import short_label
from ui.common import AppContext, Outputs, kept
from ui.inspect.intervention_views import NO_ATTENTION

KINDS = tuple(KIND_TITLES)  # the attention kinds, in the order their figures stand
SOURCES = PROBE_SOURCES
TYPED_LABEL = "Typed input"  # the box's label: its messages name it
TYPED_CAPTION = "Typed input, final weights (step {step})."
ROWS_NOTE = " Rows are queries (the token attending), columns are keys; each row sums to 1."


def checked_inputs(ctx: AppContext, run_id: Any, source: Any = "sampled", text: Any = "", step: Any = 0) -> float:
    """Refuse what the widgets cannot send but an API client can: each message names the field.
    Returns the step as a float."""
    ctx.store.path(run_id)  # RunIdError: not a run id (no path tricks)
    if source not in SOURCES:
        raise ConfigError("source", f"{source!r} is not one of {', '.join(SOURCES)}")
    if not isinstance(text, (str, type(None))) or len(text or "") > MAX_PROBE_CHARS:
        raise ConfigError("probe", f"must be text of at most {MAX_PROBE_CHARS} characters")
    try:
        value = float(step if step not in (None, "") else 0)
    except (TypeError, ValueError):
        value = float("nan")
    if not math.isfinite(value) or value < 0:
        raise ConfigError("step", f"{step!r} is not a training step (allowed: a number >= 0)")
    return value


def run_choices(ctx: AppContext) -> list[tuple[str, str]]:
    df = ctx.store.list()
    df = df[df["damaged"] == ""] if "damaged" in df.columns else df
    return [(short_label(r), r["run_id"]) for r in df.iloc[::-1].to_dict("records")]


def step_slider(ctx: AppContext, run_id: Optional[str], at: Optional[int] = None) -> gr.Slider:
    """The slider over a run's attention snapshots, at `at` (default: the last one)."""
    if run_id:
        checked_inputs(ctx, run_id)
    steps = ctx.store.snapshot_steps(run_id) if run_id else []
    if not steps:
        return gr.Slider(minimum=0, maximum=1, value=0, step=1, interactive=False,
                         label="Training step (no attention snapshots saved yet)")
    if len(steps) == 1:  # nothing to move between (and a slider needs minimum < maximum)
        return gr.Slider(minimum=0, maximum=max(steps[0], 1), value=steps[0], step=1, interactive=False,
                         label=f"Training step (1 snapshot: {steps[0]})")
    # step 1, so that every snapshot step is a value the slider can hold (snapshots are rounded: 0, 53, 107, ...);
    # the panels draw the snapshot nearest the value and write it back, and the arrow keys move from snapshot
    # to snapshot (STEP_KEYS_JS, which reads the steps from this label)
    return gr.Slider(minimum=steps[0], maximum=steps[-1], value=steps[-1] if at is None else at, step=1,
                     interactive=True, label=f"Training step ({len(steps)} snapshots: {', '.join(map(str, steps))})")


def final_slider(ctx: AppContext, run_id: str) -> gr.Slider:
    """The slider while a typed input is shown: disabled at the step the final weights come from."""
    steps = ctx.store.snapshot_steps(run_id)
    final = int((ctx.store.summary(run_id) or {}).get("steps") or (steps[-1] if steps else 0))
    top = max([final, 1, *steps[-1:]])
    return gr.Slider(minimum=min(steps[0], final, top - 1) if steps else 0, maximum=top, value=final,
                     interactive=False, label=f"Training step: final weights (step {final}), used by a typed input")


@dataclass(frozen=True)
class Drawn(Outputs):
    """The API's `/attention`: one figure per attention kind (named as the kind) and the caption."""
    enc_self: Any = kept()
    dec_self: Any = kept()
    cross: Any = kept()
    caption: Any = kept()


@dataclass(frozen=True)
class Shown(Drawn):
    """`/attention_view`: what is drawn, the note beside the Typed input box, the step slider, the probe choice."""
    note: Any = kept()
    step: Any = kept()
    source: Any = kept()


assert KINDS == tuple(f.name for f in fields(Drawn))[:len(KINDS)]  # a figure's field is its kind


def _figures(patterns: dict, probe, caption: str) -> Drawn:
    return Drawn(caption=caption, **{kind: gr.Plot(attention_grid(patterns[kind], *probe.axes(kind), KIND_TITLES[kind]),
                                                   visible=True) if kind in patterns else gr.Plot(visible=False)
                                     for kind in KINDS})


def _hidden(caption: str) -> Drawn:
    return Drawn(caption=caption, **{kind: gr.Plot(visible=False) for kind in KINDS})


def _final_weights(ctx: AppContext, run_id: str) -> dict:
    if ctx.store.summary(run_id) is None:
        raise ConfigError("run_id", "this run has no final weights yet: wait until it finishes, or use the "
                          "sampled probe")
    return ctx.store.load_weights(run_id)


def _final_step(ctx: AppContext, run_id: str) -> int:
    """The step the run's final weights are from."""
    return int((ctx.store.summary(run_id) or {}).get("steps") or 0)


def _sampled(ctx: AppContext, run_id: str, cfg, step: Optional[float]) -> tuple[Drawn, Optional[int]]:
    """(figures and caption, the snapshot step drawn or None) for the sampled probe at the snapshot
    nearest `step` (None: the last one)."""
    at = ctx.store.snapshot_near(run_id, step)
    if at is None:
        return _hidden("No attention snapshots saved for this run yet."), None
    return _figures(ctx.store.load_snapshot(run_id, at), sampled_probe(cfg), f"Sampled probe input at step {at}."
                    + ROWS_NOTE), at


def attention_figures(ctx: AppContext, run_id: Optional[str], source: str, text: str, step: float) -> tuple:
    """The API's `/attention`: one figure (or a hidden plot) per attention kind, and a caption. Refuses
    an input it cannot draw with an error naming the field."""
    if not run_id:
        return _hidden("Pick a run to see its attention.").values()
    step = checked_inputs(ctx, run_id, source, text, step)
    cfg = ctx.store.config(run_id)
    if cfg.model.arch in RECURRENT:
        return _hidden(NO_ATTENTION.format(arch=cfg.model.arch.upper())).values()
    if source == "sampled":
        return _sampled(ctx, run_id, cfg, step)[0].values()
    weights = _final_weights(ctx, run_id)
    probe = parse_probe(cfg, text)
    return _figures(attention(load_model(cfg, weights), probe.batch), probe,
                    TYPED_CAPTION.format(step=_final_step(ctx, run_id)) + ROWS_NOTE).values()


def typed_note(ctx: AppContext, run_id: Optional[str], source: str, text: Any) -> str:
    """What the note beside the Typed input box says: why the typed input cannot be drawn (naming the
    box), what to type while it is empty, or nothing."""
    if run_id:
        ctx.store.path(run_id)  # RunIdError for anything that is not a run id (no path tricks), whatever the source
    if source != "typed" or not run_id or not isinstance(text, (str, type(None))):
        return ""
    cfg = ctx.store.config(run_id)
    if not (text or "").strip():
        return f"Type symbols of task {cfg.task.name} ({_md(allowed_symbols(cfg))}), then press Enter."
    if len(text) > MAX_PROBE_CHARS:
        return _problem(f"is longer than {MAX_PROBE_CHARS} characters")
    if ctx.store.summary(run_id) is None:
        return _problem("this run has no final weights yet: wait until it finishes, or use the sampled probe")
    try:
        parse_probe(cfg, text)
    except ConfigError as exc:
        return _problem(str(exc).split(": ", 1)[-1])
    return ""


def _problem(message: str) -> str:
    short = message if len(message) <= 200 else message[:197] + "..."
    return f"⚠️ **{TYPED_LABEL}**: {_md(short)}"


def _md(text: str) -> str:
    """`text` with Markdown's special characters escaped (a typed input is echoed in messages)."""
    return re.sub(r"([\\`*_{}\[\]<>()#+\-.!|~])", r"\\\1", text)


def attention_view(ctx: AppContext, run_id: Optional[str], source: str, text: str, step: float,
                   trigger: str = "") -> list:
    """What the page shows after a change (`trigger`: "run", "text" or another widget): the figures
    and caption, the note beside the Typed input box, the step slider, and the probe choice.

    A typed input that cannot be drawn keeps the figures shown (after a run change they belong to
    another run: hidden instead) and says why beside the box. Pressing Enter in the box picks the
    typed probe. The slider always says what is shown: the snapshot drawn, or the final weights."""
    if not run_id:
        return _shown(_hidden("Pick a run to see its attention."), note="")
    step = checked_inputs(ctx, run_id, source, text, step)
    probe_choice = gr.skip()
    if trigger == "text":
        if not (text or "").strip():
            return list(Shown(note=typed_note(ctx, run_id, source, text)).values())
        source = probe_choice = "typed"
    cfg = ctx.store.config(run_id)
    if cfg.model.arch in RECURRENT:  # nothing to draw, whatever the probe
        return _shown(_hidden(NO_ATTENTION.format(arch=cfg.model.arch.upper())), note="",
                      step=final_slider(ctx, run_id) if trigger == "run" else gr.skip(), source=probe_choice)
    if source == "sampled":
        drawn, at = _sampled(ctx, run_id, cfg, None if trigger == "run" else step)
        # a step the slider already holds is not written back: a later key press (a burst of arrows) would be
        # overwritten by this earlier answer, and the next draw would read the earlier step again
        kept_step = trigger == "step" and at is not None and step == at
        return _shown(drawn, note="", step=gr.skip() if kept_step else step_slider(ctx, run_id, at), source=probe_choice)
    note = typed_note(ctx, run_id, source, text)
    if note and trigger == "run":  # the figures shown belong to another run: hidden
        hidden = _hidden("Nothing drawn for this run yet: see the note beside Typed input.")
        return _shown(hidden, note=note, step=step_slider(ctx, run_id), source=probe_choice)
    if note:  # the figures shown stay
        return list(Shown(note=note, source=probe_choice).values())
    probe = parse_probe(cfg, text)
    drawn = _figures(attention(load_model(cfg, _final_weights(ctx, run_id)), probe.batch), probe,
                     TYPED_CAPTION.format(step=_final_step(ctx, run_id)) + ROWS_NOTE)
    return _shown(drawn, note="", step=final_slider(ctx, run_id), source=probe_choice)


def _shown(drawn: Drawn, **more: Any) -> list:
    """`/attention_view`'s values: the figures and caption of `drawn` and the outputs in `more`."""
    return list(Shown(**{f.name: getattr(drawn, f.name) for f in fields(Drawn)}, **more).values())


def run_label(ctx: AppContext, run_id: Optional[str]) -> str:
    """The run's name as the pickers show it ("" for none)."""
    if not run_id:
        return ""
    checked_inputs(ctx, run_id)
    return short_label({"run_id": run_id, **flatten(ctx.store.config(run_id))})


def positional_panel(ctx: AppContext, run_id: Optional[str], side: str = ""):
    """(PCA figure, similarity or relative-pattern figure, caption) for one run's positional encoding;
    the PCA plot is hidden for an encoding without position vectors (RoPE, ALiBi, none)."""
    if not run_id:
        return gr.Plot(None, visible=False), None, "Pick a run."
    checked_inputs(ctx, run_id)
    cfg = ctx.store.config(run_id)
    if cfg.model.arch in RECURRENT:
        return (gr.Plot(None, visible=False), None,
                f"{run_label(ctx, run_id)}: a recurrent run ({cfg.model.arch.upper()}) has no positional encoding; "
                "the recurrence itself orders the tokens.")
    weights = ctx.store.load_weights(run_id) if ctx.store.summary(run_id) is not None else None
    view = positional_view(cfg, weights)
    label = run_label(ctx, run_id)
    title = f"{side} · {label}" if side else label
    fig = positional_figure(view, title, with_pca=False)
    if view.pca is None:
        return gr.Plot(None, visible=False), fig, view.note or ""
    ev = view.explained
    trained = "" if weights is not None or cfg.model.pos != "learned" else " (untrained: the run has no weights yet)"
    caption = (f"PCA of {len(view.pca)} position vectors{trained}: PC1 explains {ev[0]:.0%} and PC2 "
               f"{ev[1] if len(ev) > 1 else 0:.0%} of their variance. Nearby positions close together means "
               f"the encoding varies smoothly with position.")
    return gr.Plot(pca_figure(view, title), visible=True), fig, caption
