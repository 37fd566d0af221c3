"""Ablation grid, an accordion inside the Train tab: vary one to three axes of the current knobs,
see the run count and a time estimate (the job manager's, from this server's measured speed and queue:
lab/engine/estimate.py), launch every run, and open Compare on them (grouped).

The base config is the Train tab's knobs (`config_from_values`, as Start uses). Everything is
validated before anything launches (lab/engine/grid.py), so a bad value or combination creates no run.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from typing import Any

import gradio as gr

from lab.config import ConfigError, in_words
from lab.engine.grid import AXES, MAX_AXES, MAX_RUNS, build_grid
from ui.common import PRIVATE, AppContext, Outputs, errors_as_messages, kept, remember_runs, with_api_params
from ui.compare.tab import opening
from ui.knobs import KNOB_KEYS, KNOBS, config_from_values

EXAMPLES = {"PE": "rope, alibi", "norm": "pre, post", "heads": "1, 2, 4", "layers": "1, 2",
            "d_model": "32, 64", "seed": "1, 2, 3", "lr": "1e-3, 3e-3, 1e-2", "warmup": "0, 100"}
INTRO = (f"Vary up to {MAX_AXES} axes of the config above; every other setting comes from the knobs. Each run is "
         f"named by its values (e.g. `pos=rope seed=1`); integer values may be a range (`0..4`). At most {MAX_RUNS} "
         "runs per grid (larger sweeps: `python -m lab sweep`, on a Ray cluster too). Add a **seed** axis to "
         "see how much of a difference is luck: Compare draws seed repeats as a mean with a min-max band.")


@dataclass
class GridPanel:
    axes: list[gr.Dropdown]
    values: list[gr.Textbox]
    preview: gr.Markdown
    launch: gr.Button
    knob_inputs: list
    my_runs: gr.BrowserState
    owner: gr.BrowserState
    ctx: AppContext

    def wire(self, tabs: gr.Tabs, compare: Any) -> None:
        """Register Launch once Compare exists: it opens Compare on the grid's runs, grouped."""
        opens = compare.opener(tabs)
        inputs = self.knob_inputs + axis_inputs(self) + [self.my_runs, self.owner]
        self.launch.click(with_api_params(partial(launch_grid, self.ctx), api_names() + ["my_runs", "owner"]),
                          inputs=inputs, outputs=GridLaunch.wired(self, **opens),
                          api_name="grid_launch", preprocess=False)


@dataclass(frozen=True)
class GridLaunch(Outputs):
    """Launch's outputs: the preview line (what was launched), the remembered runs, Compare opened on them
    (ui/compare/tab.py `Opened`'s fields, in its order)."""
    preview: Any = kept()
    my_runs: Any = kept()
    tabs: Any = kept()
    asked: Any = kept()


@errors_as_messages
def launch_grid(ctx: AppContext, *args: Any) -> tuple:
    """Submit every run of the grid (knob values, (axis, values) pairs, then the browser's runs and owner)."""
    n_knobs = len(KNOB_KEYS)
    knobs, rest = args[:n_knobs], args[n_knobs:]
    cfgs = grid_configs(knobs, rest[:2 * MAX_AXES])
    runs, who = rest[2 * MAX_AXES:]
    claims = ctx.jobs.claim_many(cfgs, owner=who if isinstance(who, str) else "")
    ids = list(dict.fromkeys(c.run_id for c in claims))
    there = sum(c.attached for c in claims)
    text = (f"✅ **Launched {len(ids) - there} runs** ({', '.join(c.name for c in cfgs[:4])}"
            f"{', …' if len(cfgs) > 4 else ''}). Compare shows them as they train.")
    if there:  # the same configuration, seed and code: that run's result, not a copy (lab/engine/sharing.py)
        text += (f" {there} of the grid's {len(claims)} configurations were already trained, training or queued on "
                 "this server: you see those runs (same configuration, same seed) instead of copies.")
    return GridLaunch(preview=text, my_runs=remember_runs(runs, ids), **opening(ids)).values()


def axis_choices(hidden: tuple[str, ...] | list[str] = ()) -> list[tuple[str, str]]:
    """The axis dropdown's choices, without the axes whose control a classroom link hides (config keys)."""
    return [("(none)", "")] + [(a, a) for a, axis in AXES.items() if axis.field not in hidden]


def api_names() -> list[str]:
    return [k.url_key for k in KNOBS] + [f"{p}{i}" for i in range(1, MAX_AXES + 1) for p in ("axis", "values")]


def axis_inputs(panel: GridPanel) -> list:
    """The axis pickers and their value boxes, in the order (axis1, values1, axis2, values2, ...)."""
    return [w for pair in zip(panel.axes, panel.values) for w in pair]


def grid_configs(knobs: tuple, pairs: tuple) -> list:
    """Knob values (in KNOB_KEYS order) and (axis, values) pairs -> the grid's configs (GridError/ConfigError)."""
    base = config_from_values(dict(zip(KNOB_KEYS, knobs)))
    axes = [(a, v) for a, v in zip(pairs[0::2], pairs[1::2]) if a]
    return build_grid(base, axes)


def preview_text(ctx: AppContext, knobs: tuple, pairs: tuple) -> str:
    if not any(pairs[0::2]):
        return "Choose an axis and list its values to see how many runs the grid makes."
    try:
        cfgs = grid_configs(knobs, pairs)
    except ConfigError as exc:
        what, why = in_words(exc)  # the axis and fields by their labels, as the knobs read
        return f"⚠️ **{what}**: {why}"
    n = len(cfgs)
    return f"**{n} run{'s' if n != 1 else ''}.** {ctx.jobs.estimate(cfgs).text(counted=False)}"


@errors_as_messages
def on_preview(ctx: AppContext, *args: Any) -> str:
    """The preview line for the knobs' values and the (axis, values) pairs."""
    return preview_text(ctx, args[:len(KNOB_KEYS)], args[len(KNOB_KEYS):])


def build_grid_panel(ctx: AppContext, widgets: dict, my_runs: gr.BrowserState,
                     owner: gr.BrowserState) -> GridPanel:
    """The accordion (call inside the Train tab); call `.wire(tabs, compare)` once Compare is built."""
    with gr.Accordion("Ablation grid", open=False, elem_id="grid"):
        gr.Markdown(INTRO)
        axes, values = [], []
        for i in range(1, MAX_AXES + 1):
            with gr.Row():
                axes.append(gr.Dropdown(axis_choices(), value="", label=f"Axis {i}", scale=1,
                                        elem_id=f"grid-axis-{i}"))
                values.append(gr.Textbox(label="Values (comma-separated)", placeholder="e.g. rope, alibi", scale=2,
                                         elem_id=f"grid-values-{i}"))
        preview = gr.Markdown(preview_text(ctx, (), ("",) * 2 * MAX_AXES), elem_id="grid-preview")
        launch = gr.Button("Launch grid", variant="primary", elem_id="grid-launch")
    knob_inputs = [widgets[k] for k in KNOB_KEYS]
    panel = GridPanel(axes, values, preview, launch, knob_inputs, my_runs, owner, ctx)

    # A newly chosen axis gets example values if its box is empty. In the browser, at once: a server
    # round trip could land after the user had typed values, and overwrite them.
    on_axis = f"(axis, text) => (axis && !String(text || '').trim()) ? ({json.dumps(EXAMPLES)}[axis] || '') : text"
    for i, (ax, box) in enumerate(zip(axes, values), start=1):
        ax.input(None, inputs=[ax, box], outputs=box, js=on_axis, api_name=f"grid_axis{i}_examples",
                 show_progress="hidden", api_visibility=PRIVATE)
    # API only: on the page the Train tab's one knob event draws the preview (ui/train.py `on_knobs_changed`)
    gr.on([], with_api_params(partial(on_preview, ctx), api_names()), inputs=knob_inputs + axis_inputs(panel),
          outputs=preview, api_name="grid_preview", show_progress="hidden", preprocess=False)
    return panel
