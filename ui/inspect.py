"""Inspect tab: attention heatmaps (layers x heads, every attention kind) with one step slider,
and the positional encodings of two runs side by side (PCA, similarity, relative patterns).

The sampled probe's attention comes from the snapshots saved during training (scrubbing never
retrains); a typed probe runs a fresh model loaded from the run's final weights.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import gradio as gr
import pandas as pd

from lab.views.analysis import attention, load_model, parse_probe, positional_view, sampled_probe
from lab.config import ConfigError
from lab.views.plots import KIND_TITLES, attention_grid, positional_figure
from ui.common import AppContext, errors_as_messages, with_api_params, short_label

KINDS = ("enc_self", "dec_self", "cross")
SOURCES = ("sampled", "typed")
MAX_PROBE_CHARS = 1000


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


def step_slider(ctx: AppContext, run_id: Optional[str]) -> gr.Slider:
    if run_id:
        checked_inputs(ctx, run_id)
    steps = ctx.store.snapshot_steps(run_id) if run_id else []
    if not steps:
        return gr.Slider(minimum=0, maximum=1, value=0, step=1, interactive=False,
                         label="Training step (no attention snapshots saved yet)")
    gap = steps[1] - steps[0] if len(steps) > 1 else 1
    return gr.Slider(minimum=steps[0], maximum=steps[-1], value=steps[-1], step=max(gap, 1), interactive=True,
                     label=f"Training step ({len(steps)} snapshots: {', '.join(map(str, steps))})")


def attention_figures(ctx: AppContext, run_id: Optional[str], source: str, text: str, step: float):
    """One figure (or a hidden plot) per attention kind, and a caption."""
    if not run_id:
        return [gr.Plot(visible=False)] * len(KINDS) + ["Pick a run to see its attention."]
    step = checked_inputs(ctx, run_id, source, text, step)
    cfg = ctx.store.config(run_id)
    if source == "typed":
        if not ctx.store.exists(run_id) or ctx.store.summary(run_id) is None:
            raise ConfigError("run_id", "this run has no final weights yet: wait until it finishes, or use the "
                              "sampled probe")
        probe = parse_probe(cfg, text)
        patterns = attention(load_model(cfg, ctx.store.load_weights(run_id)), probe.batch)
        caption = "Typed input, final weights."
    else:
        probe = sampled_probe(cfg)
        steps = ctx.store.snapshot_steps(run_id)
        if not steps:
            return [gr.Plot(visible=False)] * len(KINDS) + ["No attention snapshots saved for this run yet."]
        at = min(steps, key=lambda s: abs(s - step))
        patterns = ctx.store.load_snapshot(run_id, at)
        caption = f"Sampled probe input at step {at}."
    labels = {"enc_self": (probe.src_labels, probe.src_labels), "dec_self": (probe.dec_labels, probe.dec_labels),
              "cross": (probe.dec_labels, probe.src_labels)}
    out = []
    for kind in KINDS:
        if kind in patterns:
            q, k = labels[kind]
            out.append(gr.Plot(attention_grid(patterns[kind], q, k, KIND_TITLES[kind]), visible=True))
        else:
            out.append(gr.Plot(visible=False))
    caption += " Rows are queries (the token attending), columns are keys; each row sums to 1."
    return out + [caption]


def positional_panel(ctx: AppContext, run_id: Optional[str]):
    """(PCA scatter frame, figure, caption) for one run's positional encoding."""
    if not run_id:
        return None, None, "Pick a run."
    checked_inputs(ctx, run_id)
    cfg = ctx.store.config(run_id)
    weights = ctx.store.load_weights(run_id) if ctx.store.summary(run_id) is not None else None
    view = positional_view(cfg, weights)
    fig = positional_figure(view, short_label({"run_id": run_id, **_flat(cfg)}), with_pca=False)
    if view.pca is None:
        return pd.DataFrame({"pc1": [], "pc2": [], "position": []}), fig, view.note or ""
    pcs = pd.DataFrame({"pc1": view.pca[:, 0], "pc2": view.pca[:, 1] if view.pca.shape[1] > 1 else 0.0,
                        "position": range(len(view.pca))})
    lims = {f"{a}_lim": _padded(pcs[c]) for a, c in (("x", "pc1"), ("y", "pc2"))}  # no point on the frame
    ev = view.explained
    trained = "" if weights is not None or cfg.model.pos != "learned" else " (untrained: the run has no weights yet)"
    caption = (f"PCA of {len(pcs)} position vectors{trained}: PC1 explains {ev[0]:.0%} and PC2 "
               f"{ev[1] if len(ev) > 1 else 0:.0%} of their variance. Nearby positions close together means "
               f"the encoding varies smoothly with position.")
    return gr.ScatterPlot(value=pcs, **lims), fig, caption


def _padded(col: pd.Series, margin: float = 0.08) -> list[float]:
    lo, hi = float(col.min()), float(col.max())
    pad = margin * (hi - lo) or 1.0
    return [lo - pad, hi + pad]


def _flat(cfg) -> dict[str, Any]:
    from lab.config import flatten
    return flatten(cfg)


def build_inspect_tab(ctx: AppContext) -> gr.Tab:
    with gr.Tab("Inspect", id="inspect") as tab:
        with gr.Row():
            run = gr.Dropdown([], label="Run", scale=3, elem_id="inspect-run", allow_custom_value=True)
            source = gr.Radio(["sampled", "typed"], value="sampled", label="Probe input", scale=1)
            text = gr.Textbox(label="Typed input", placeholder="e.g. 3 1 4 1 5", scale=2)
        step = gr.Slider(0, 1_000_000, value=0, step=1, label="Training step", elem_id="inspect-step")  # bounds: per run
        caption = gr.Markdown()
        plots = [gr.Plot(label=KIND_TITLES[k], visible=False, elem_id=f"attn-{k}") for k in KINDS]
        gr.Markdown("### Positional encodings, side by side")
        with gr.Row(equal_height=True):
            gr.Markdown("**A** is the run chosen above. Pick **B** to compare its positions with A's.")
            run_b = gr.Dropdown([], label="B: compare with run", elem_id="inspect-run-b", allow_custom_value=True)
        with gr.Row():
            sides = []
            for side in ("A", "B"):
                with gr.Column():
                    pick = run if side == "A" else run_b
                    scatter = gr.ScatterPlot(x="pc1", y="pc2", color="position", height=260,
                                             title=f"PCA of position vectors ({side})", elem_id=f"pca-{side}")
                    fig = gr.Plot(label=f"Similarity / relative pattern ({side})", elem_id=f"pe-fig-{side}")
                    note = gr.Markdown()
                    sides.append((pick, scatter, fig, note))

    @errors_as_messages
    def on_tab():
        ch = run_choices(ctx)
        first = ch[0][1] if ch else None
        return gr.Dropdown(choices=ch, value=first), gr.Dropdown(choices=ch, value=ch[1][1] if len(ch) > 1 else first)

    tab.select(on_tab, outputs=[run, run_b], api_name="inspect_runs")
    draw = with_api_params(errors_as_messages(lambda *a: attention_figures(ctx, *a)), ["run_id", "source", "text", "step"])
    att_inputs, att_outputs = [run, source, text, step], plots + [caption]
    run.change(with_api_params(errors_as_messages(lambda r: step_slider(ctx, r)), ["run_id"]), inputs=run, outputs=step, api_name="snapshot_steps").then(
        draw, inputs=att_inputs, outputs=att_outputs, api_name="attention_for_run", preprocess=False)
    gr.on([source.change, text.submit, step.release], draw, inputs=att_inputs, outputs=att_outputs,
          api_name="attention", trigger_mode="always_last", preprocess=False)
    # preprocess=False: the Radio's and Slider's own checks would refuse a bad value with a message naming
    # no field; checked_inputs names it (raw values of these widgets are what the callback expects anyway)
    for i, (pick, scatter, fig, note) in enumerate(sides):
        pick.change(with_api_params(errors_as_messages(lambda r: positional_panel(ctx, r)), ["run_id"]), inputs=pick, outputs=[scatter, fig, note],
                    api_name=f"positional_{'ab'[i]}")
    return tab
