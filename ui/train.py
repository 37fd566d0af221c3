"""Train tab: every knob with its explanation, a live parameter count, Start/Stop, live curves.

Start returns at once (the job manager trains in a background thread); a gr.Timer polls the
shown run and redraws its curves, and switches itself off when the run ends. This module lays the
tab out and wires its events; the callbacks are in ui/train_events.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Optional

import gradio as gr

from ui.common import PRIVATE, AppContext, with_api_params
from ui.gpu import gpu_available, wire_gpu_button
from ui.grid import GridPanel, axis_inputs, build_grid_panel, on_preview
from ui.knobs import (ARCH_BOUND, KNOB_KEYS, KNOBS, TASK_SHOWN, build_widgets, config_from_values, shown_for_task,
                      usable_for_arch, wire_task_choice)
from ui.live import ACC_TITLE, LIVE_COLOURS, FrameCache, ShownRuns, SnapshotPictures, live_frames
from ui.share import build_share_panel
from ui.textfile import build_text_upload, text_box_shown
from ui.train_events import (NO_RUN, ContinueOut, DeleteOut, PollOut, StartOut, TrainView, describe, knob_values,
                             load_handler, load_outputs, on_again, on_continue, on_delete, on_delete_ask, on_poll, on_start,
                             on_stop, problem, remembered, validate)

__all__ = ["TrainTab", "build_train_tab", "describe", "problem", "validate"]

POLL_S = 1.0


@dataclass
class TrainTab:
    widgets: dict[str, gr.components.Component]
    run_pick: gr.Dropdown
    on_load: Callable  # applies the page URL (config and hidden controls), restores "my runs"
    load_inputs: list
    load_outputs: list
    grid: Optional[GridPanel] = None  # the ablation grid accordion (ui/grid.py); app.py wires it to Compare


def _live_plots() -> tuple[gr.LinePlot, gr.LinePlot, gr.Image]:
    """The run's loss and accuracy curves, each on its own axis, and its latest attention picture. Fixed
    titles: a changed title redraws with the data from before the update (ui/compare/tab.py); one colour per
    measure in both (train blue, held-out orange), fixed from the start."""
    loss_plot = gr.LinePlot(x="step", y="value", color="series", title="Loss (nats a token)", y_title="cross-entropy",
                            elem_id="live-loss", height=260, x_axis_format="d", color_map=LIVE_COLOURS)
    acc_plot = gr.LinePlot(x="step", y="value", color="series", title=ACC_TITLE, y_title="accuracy", y_lim=[0, 1],
                           elem_id="live-acc", height=260, x_axis_format="d", color_map=LIVE_COLOURS)
    attn_plot = gr.Image(show_label=False, visible=False, elem_id="live-attention", interactive=False, type="filepath")
    return loss_plot, acc_plot, attn_plot


def build_train_tab(ctx: AppContext, my_runs: gr.BrowserState, owner: gr.BrowserState) -> TrainTab:
    """The tab's layout, then its events (`wire_train_tab`)."""
    with gr.Tab("Train", id="train"):
        gr.Markdown("Configure a small Transformer, press **Start**, and watch it learn. Runs keep training "
                    "if you close the tab; find them again under *Run shown* or in **Compare**.")
        with gr.Row(elem_id="train-main"):  # on a phone the Start column comes first (app.py's CSS)
            with gr.Column(scale=2, min_width=320):
                widgets, text_parts = _knob_panel()
            with gr.Column(scale=3):
                summary = gr.Markdown(validate(*[k.default() for k in KNOBS], ctx=ctx), elem_id="config-summary")
                with gr.Row():
                    # enabled by on_load: a Start answered before the page's load event would be undone
                    # by it (on_load restores "Run shown" and "my runs" from the browser)
                    start = gr.Button("Start", variant="primary", elem_id="start-btn", interactive=False)
                    stop = gr.Button("Stop", variant="stop", elem_id="stop-btn")
                    delete = gr.Button("Delete run", variant="secondary", elem_id="delete-btn")
                # a class shares one training per configuration (lab/engine/sharing.py): when Start finds the
                # run already here, the note says so and this button trains the same knobs with a new seed
                again = gr.Button("🎲 Train again with a new seed", size="sm", visible=False, elem_id="again-btn")
                own_seed = gr.Checkbox(False, label="My own seed", elem_id="own-seed",
                                       info="Train with a seed of your own, different from everyone else's in the "
                                            "class: Compare draws the class's runs of one configuration as one band.")
                # on a ZeroGPU Space: train in GPU chunks paid by this user's GPU quota (ui/gpu.py)
                gpu_btn = gr.Button("⚡ Train on GPU", variant="primary", elem_id="gpu-btn", visible=gpu_available())
                # what a refused Start, Stop or Delete says, next to the buttons; cleared by the next knob
                # change or a good Start (a raised error would mark every output of the event red, for good)
                note = gr.Markdown("", elem_id="start-note")
                with gr.Row(visible=False, elem_id="delete-confirm") as confirm_row:
                    confirm_text = gr.Markdown(elem_id="delete-confirm-text")
                    confirm_yes = gr.Button("Yes, delete it", variant="stop", size="sm", elem_id="delete-yes")
                    confirm_no = gr.Button("Cancel", size="sm", elem_id="delete-no")
                run_pick = gr.Dropdown(label="Run shown", choices=[], value=None, allow_custom_value=True,
                                       elem_id="run-pick", info="Runs started from this browser.")
                progress = gr.Markdown(NO_RUN, elem_id="progress")
                with gr.Row(elem_id="continue-row"):  # a finished run trains on, in its own folder
                    more = gr.Number(200, label="More steps", precision=0, minimum=1, elem_id="continue-steps",
                                     info="From the run's last checkpoint.", scale=2)
                    cont = gr.Button("Continue training", size="sm", elem_id="continue-btn", scale=1)
                cont_note = gr.Markdown("", elem_id="continue-note")
                loss_plot, acc_plot, attn_plot = _live_plots()
                build_share_panel(widgets, ctx.jobs.limits.max_upload_bytes)
                grid = build_grid_panel(ctx, widgets, my_runs, owner)
        timer = gr.Timer(POLL_S, active=False)
        # inside the tab: a component made directly under gr.Tabs is taken for a tab, and every tab header
        # after it shows the wrong label
        seen = gr.State({})  # what this page's last poll sent (ui/live.py)
        locked = gr.State([])  # the knobs a classroom link locked
    view = TrainView(widgets, summary, start, again, own_seed, note, confirm_row, confirm_text, run_pick, progress, more, cont_note,
                     loss_plot, acc_plot, attn_plot, timer, seen, grid, my_runs, owner, locked)
    wire_knob_changes(ctx, view, text_parts)
    wire_train_tab(ctx, view, {"stop": stop, "delete": delete, "gpu": gpu_btn, "continue": cont,
                               "confirm_yes": confirm_yes, "confirm_no": confirm_no})
    return TrainTab(widgets, run_pick, load_handler(ctx, view), [my_runs, owner], load_outputs(view), grid)


CLEAR_REFUSAL_JS = "(note) => typeof note === 'string' && note.startsWith('⚠️') ? '' : note"


def wire_train_tab(ctx: AppContext, v: TrainView, buttons: dict[str, gr.Button]) -> None:
    """The tab's events: the knobs' summary, Start (and Train on GPU), the live poll, Continue, Stop, Delete."""
    inputs = [v.widgets[k] for k in KNOB_KEYS]
    changes = [v.widgets[k].change for k in KNOB_KEYS]
    wire_task_choice(v.widgets)
    names = [k.url_key for k in KNOBS]
    # preprocess=False on every event that reads the knobs: the widgets' own checks (slider bounds, dropdown
    # choices) would reject a bad value with a message that names no field; config_from_values names it.
    gr.on([], with_api_params(partial(validate, ctx=ctx), names), inputs=inputs, outputs=v.summary,
          api_name="validate", show_progress="hidden", preprocess=False)  # API only: see wire_knob_changes
    # a changed knob may be what a refused Start named: a refusal goes (in the browser); the note on a run
    # (watched, or training on the GPU) stays, since it speaks of the run shown, not of the knobs
    gr.on(changes, None, inputs=v.note, outputs=v.note, js=CLEAR_REFUSAL_JS, show_progress="hidden",
          api_name="clear_start_note", queue=False, api_visibility=PRIVATE)
    started = StartOut.wired(v, seed=v.widgets["train.seed"])
    v.start.click(with_api_params(partial(on_start, ctx), names + ["my_runs", "owner", "own_seed"]),
                  inputs=inputs + [v.my_runs, v.owner, v.own_seed], outputs=started, api_name="start",
                  preprocess=False, show_progress_on=[v.note])
    v.again.click(with_api_params(partial(on_again, ctx), names + ["my_runs", "owner"]),
                  inputs=inputs + [v.my_runs, v.owner], outputs=started, api_name="start_new_seed", preprocess=False,
                  show_progress_on=[v.note])
    wire_gpu_button(ctx, buttons["gpu"], inputs + [v.my_runs, v.owner], partial(remembered, ctx), v,
                    lambda vals: config_from_values(knob_values(vals)), problem, names + ["my_runs", "owner"])

    # one cache for every page: a run's curves computed once, each attention snapshot drawn once
    poll, shown = partial(on_poll, ctx, FrameCache(live_frames), SnapshotPictures()), ShownRuns()
    poll_io = {"inputs": [v.run_pick, v.seen], "outputs": PollOut.wired(v), "show_progress": "hidden"}

    def tick(run_id: Optional[str], last: Any, request: gr.Request = None) -> tuple:
        session = request.session_hash if request is not None else None
        ticket = shown.ticket(session)
        out = poll(run_id, last)
        return PollOut().values() if shown.stale(session, run_id, ticket) else out  # changed while it read

    def show_run(run_id: Optional[str], last: Any, request: gr.Request = None) -> tuple:
        out = poll(run_id, last)  # a refused run id (an error shown to the page) is not the run it shows
        shown.show(request.session_hash if request is not None else None, run_id)
        return out

    # unqueued: one HTTP request per refresh, never refused by a full queue (a class polls every second)
    v.timer.tick(tick, api_name="poll", queue=False, **poll_io)
    v.run_pick.change(show_run, api_name="show_run", **poll_io)

    buttons["continue"].click(partial(on_continue, ctx), inputs=[v.run_pick, v.more, v.owner],
                              outputs=ContinueOut.wired(v), api_name="continue_run", show_progress_on=[v.cont_note])
    # its note goes when the user shows another run or starts one (`.input`, not `.change`: a dropdown also
    # reports a change when its choices are refreshed, which would wipe a note just given)
    gr.on([v.run_pick.input, v.start.click], None, outputs=v.cont_note, js="() => ''", queue=False,
          show_progress="hidden", api_name="clear_continue_note", api_visibility=PRIVATE)
    buttons["stop"].click(partial(on_stop, ctx), inputs=[v.run_pick, v.owner], outputs=v.progress, api_name="stop",
                          show_progress_on=[v.note])
    buttons["delete"].click(partial(on_delete_ask, ctx), inputs=[v.run_pick, v.owner],
                            outputs=[v.confirm_row, v.confirm_text],
                            api_name="delete_ask", show_progress_on=[v.note])
    buttons["confirm_no"].click(lambda: gr.Row(visible=False), outputs=v.confirm_row, api_name="delete_cancel",
                                api_visibility=PRIVATE)
    buttons["confirm_yes"].click(partial(on_delete, ctx), inputs=[v.run_pick, v.my_runs, v.owner],
                                 outputs=DeleteOut.wired(v), api_name="delete", show_progress_on=[v.note])


def on_knobs_changed(ctx: AppContext, *values: Any) -> list:
    """The page's answer to a change of any knob or grid axis (`values`: the knobs in KNOB_KEYS order, the
    grid's axes and values, then the knobs a classroom link locked): the summary, the grid's preview, which task knobs are shown, and whether
    the text box (with its upload button and note) is."""
    *values, locked = values
    knobs = values[:len(KNOB_KEYS)]
    task, arch = knobs[KNOB_KEYS.index("task.name")], knobs[KNOB_KEYS.index("model.arch")]
    return [validate(*knobs, ctx=ctx), on_preview(ctx, *values), *shown_for_task(task), *text_box_shown(task),
            *usable_for_arch(arch, locked if isinstance(locked, list) else [])]


def wire_knob_changes(ctx: AppContext, v: TrainView, text_parts: list) -> None:
    """One event answers every knob and grid-axis change. Gradio runs an `always_last` event that was
    triggered while it ran once more when it ends by dispatching the first trigger's event again, to every
    listener of that event; two such listeners on one control (the summary and the grid's preview) could
    re-run each other for ever. tests/test_event_wiring.py checks the rule for every event of the app."""
    watched = [v.widgets[k] for k in KNOB_KEYS] + axis_inputs(v.grid)
    gr.on([w.change for w in watched], partial(on_knobs_changed, ctx), inputs=watched + [v.locked],
          outputs=[v.summary, v.grid.preview, *(v.widgets[k.key] for k in TASK_SHOWN), *text_parts,
                   *(v.widgets[k.key] for k in ARCH_BOUND)],
          api_name="knobs_changed", show_progress="hidden", trigger_mode="always_last", preprocess=False,
          api_visibility=PRIVATE)


def _knob_panel() -> tuple[dict[str, gr.components.Component], list]:
    """The knobs' widgets by key, and the components shown only for the text task (ui/textfile.py)."""
    widgets: dict[str, gr.components.Component] = {}
    text_parts: list = []
    for sec, title in {"task": "Task", "model": "Model", "train": "Training"}.items():
        with gr.Accordion(title, open=True):
            widgets.update(build_widgets(sec))
            if sec == "task":
                text_parts = build_text_upload(widgets)  # under the "Your text" box, the last task knob
            if any(k.advanced and k.key.startswith(sec + ".") for k in KNOBS):
                with gr.Accordion(f"Advanced {title.lower()} settings", open=False, elem_id=f"advanced-{sec}"):
                    widgets.update(build_widgets(sec, advanced=True))
    return widgets, text_parts
