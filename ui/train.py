"""Train tab: every knob with its explanation, a live parameter count, Start/Stop, live curves.

Start returns at once (the job manager trains in a background thread); a gr.Timer polls the
shown run and redraws its curves, and switches itself off when the run ends.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Callable, Optional

import gradio as gr

from lab.params import param_breakdown
from lab.config import ConfigError, RunConfig, in_words
from lab.engine.continuation import checkpoint_step
from lab.engine.jobs import JobManager
from lab.fields import shown
from lab.engine.limits import Limits, check_config, valid_owner
from lab.engine.store import DamagedRunError, RunNotFoundError
from lab.tasks import get_task
from lab.taskshapes import loss_baselines
from lab.textdata import text_of
from ui.common import (TERMINAL, AppContext, acting_owner, errors_as_messages, is_run_id, permission,
                       with_api_params)
from ui.gpu import gpu_available, stop_gpu_run, wire_gpu_button
from ui.grid import GridPanel, axis_choices, build_grid_panel
from ui.knobs import KNOB_KEYS, KNOBS, build_widgets, config_from_values, values_from_query, wire_task_choice
from ui.live import ACC_TITLE, FrameCache, Seen, answer, live_frames, progress_text
from ui.share import build_share_panel
from ui.textfile import build_text_upload

POLL_S = 1.0


@dataclass
class TrainTab:
    widgets: dict[str, gr.components.Component]
    run_pick: gr.Dropdown
    on_load: Callable  # applies the page URL (config and hidden controls), restores "my runs"
    load_inputs: list
    load_outputs: list
    grid: Optional[GridPanel] = None  # the ablation grid accordion (ui/grid.py); app.py wires it to Compare


def _values(args: tuple) -> dict[str, Any]:
    return dict(zip(KNOB_KEYS, args))


def describe(cfg: RunConfig, limits: Optional[Limits] = None, jobs: Optional[JobManager] = None) -> str:
    """The config in words: the task, the parameter count by component, and, on a server whose limits
    refuse it, that Start will refuse it and why; else, with `jobs`, how long it would take if started now
    (the job manager's estimate from this server's measured speed and queue). Said before anyone clicks."""
    parts = param_breakdown(cfg)
    total = sum(parts.values())
    detail = ", ".join(f"{k} {v:,}" for k, v in parts.items() if v)
    hint = ""
    if cfg.model.pos == "alibi" and cfg.model.n_heads <= 2:
        hint = "\n\n*Hint: with 1-2 heads ALiBi's slopes are tiny (2^-8, 2^-4), so its recency bias is weak.*"
    task = get_task(cfg.task.name)
    if task.name == "text":  # the baseline a character model must beat: the loss of ignoring the context
        text = text_of(cfg.task.text)
        hint += (f"\n\n**{'Your' if cfg.task.text else 'The built-in'} text**: {len(text):,} characters, "
                 f"{task.vocab_size(cfg.task)} distinct. A model that ignores the context scores at best the "
                 f"unigram entropy of its training 90%, {loss_baselines(cfg.task).unigram:.2f} nats a character "
                 "(the loss curve's unit).")
    cost = ""
    try:
        if limits is not None:
            check_config(limits, cfg)
        if jobs is not None:
            cost = f"\n\n⏱ {jobs.estimate([cfg]).text()}"
    except ConfigError as exc:
        what, why = in_words(exc)
        cost = f"\n\n⚠️ **Start will refuse this run** ({what}): {why}"
    return (f"**Task {task.name}**: {task.description}\n\n**{total:,} parameters** ({detail}). "
            f"Longest sequence: {cfg.model.n_ctx} tokens.{hint}{cost}")


def problem(exc: ConfigError) -> str:
    """A refused config or request as one line: the field by its label, then what is wrong and allowed."""
    what, why = in_words(exc)
    return f"⚠️ **{what}**: {' '.join(why.split())}"


def validate(*args: Any, ctx: Optional[AppContext] = None) -> str:
    """The summary of the knobs' values (`ctx`: and what this server says of them: limits, time)."""
    try:
        return describe(config_from_values(_values(args)), *((ctx.jobs.limits, ctx.jobs) if ctx else ()))
    except ConfigError as exc:
        return problem(exc)


def build_train_tab(ctx: AppContext, my_runs: gr.BrowserState, owner: gr.BrowserState) -> TrainTab:
    with gr.Tab("Train", id="train"):
        gr.Markdown("Configure a small Transformer, press **Start**, and watch it learn. Runs keep training "
                    "if you close the tab; find them again under *Run shown* or in **Compare**.")
        with gr.Row(elem_id="train-main"):  # on a phone the Start column comes first (app.py's CSS)
            with gr.Column(scale=2, min_width=320):
                widgets = _knob_panel()
            with gr.Column(scale=3):
                summary = gr.Markdown(validate(*[k.default() for k in KNOBS], ctx=ctx), elem_id="config-summary")
                with gr.Row():
                    # enabled by on_load: a Start answered before the page's load event would be undone
                    # by it (on_load restores "Run shown" and "my runs" from the browser)
                    start = gr.Button("Start", variant="primary", elem_id="start-btn", interactive=False)
                    stop = gr.Button("Stop", variant="stop", elem_id="stop-btn")
                    delete = gr.Button("Delete run", variant="secondary", elem_id="delete-btn")
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
                progress = gr.Markdown("No run yet.", elem_id="progress")
                with gr.Row(elem_id="continue-row"):  # a finished run trains on, in its own folder
                    more = gr.Number(200, label="More steps", precision=0, minimum=1, elem_id="continue-steps",
                                     info="From the run's last checkpoint.", scale=2)
                    cont = gr.Button("Continue training", size="sm", elem_id="continue-btn", scale=1)
                cont_note = gr.Markdown("", elem_id="continue-note")
                # fixed titles: a changed title redraws with the data from before the update (ui/compare.py)
                loss_plot = gr.LinePlot(x="step", y="value", color="series", title="Loss (nats a token)",
                                        y_title="cross-entropy", elem_id="live-loss", height=260, x_axis_format="d")
                acc_plot = gr.LinePlot(x="step", y="value", color="series", title=ACC_TITLE, y_title="accuracy",
                                       y_lim=[0, 1], elem_id="live-acc", height=260, x_axis_format="d")
                build_share_panel(widgets, ctx.jobs.limits.max_upload_bytes)
                grid = build_grid_panel(ctx, widgets, my_runs, owner)
        timer = gr.Timer(POLL_S, active=False)
        # inside the tab: a component made directly under gr.Tabs is taken for a tab, and every tab header
        # after it shows the wrong label
        seen = gr.State({})  # what this page's last poll sent (ui/live.py)
    inputs = [widgets[k] for k in KNOB_KEYS]
    wire_task_choice(widgets)

    names = [k.url_key for k in KNOBS]
    # preprocess=False on every event that reads the knobs: the widgets' own checks (slider bounds, dropdown
    # choices) would reject a bad value with a message that names no field; config_from_values names it.
    gr.on([widgets[k].change for k in KNOB_KEYS], with_api_params(lambda *a: validate(*a, ctx=ctx), names),
          inputs=inputs, outputs=summary, api_name="validate", show_progress="hidden", trigger_mode="always_last",
          preprocess=False)
    gr.on([widgets[k].change for k in KNOB_KEYS], None, outputs=note, js="() => ''", show_progress="hidden",
          api_name="clear_start_note",
          queue=False)  # a changed knob may be what a refused Start named: its note goes (in the browser)

    def remembered(runs: list, run_id: str) -> list:
        """The runs this browser remembers: the new one first, then up to 49 of the others."""
        return [run_id] + [r for r in runs[:200] if is_run_id(ctx, r) and r != run_id][:49]

    @errors_as_messages
    def on_start(*args: Any):
        """Submit the run; a refused config or a server limit answers in the note beside Start (naming the
        knob by its label) and leaves everything else on the page as it was."""
        *vals, runs, who = args
        try:
            cfg = config_from_values(_values(tuple(vals)))
            run_id = ctx.jobs.submit(cfg, owner=who if isinstance(who, str) else "")
        except ConfigError as exc:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip(), problem(exc)
        runs = remembered(runs if isinstance(runs, list) else [], run_id)
        return (gr.Dropdown(choices=runs, value=run_id), runs, progress_text(ctx, run_id)[1], gr.Timer(active=True),
                "")

    start.click(with_api_params(on_start, names + ["my_runs", "owner"]), inputs=inputs + [my_runs, owner],
                outputs=[run_pick, my_runs, progress, timer, note], api_name="start", preprocess=False,
                show_progress_on=[note])

    wire_gpu_button(ctx, gpu_btn, inputs + [my_runs, owner], remembered, [run_pick, my_runs, timer, note],
                    lambda vals: config_from_values(_values(vals)), problem, names + ["my_runs", "owner"])

    frames = FrameCache(live_frames)  # shared by every page: a run's curves computed once per change

    @errors_as_messages
    def on_poll(run_id: Optional[str], last: Any):
        """The shown run's progress and curves; only what changed since this page's last poll is sent
        (gr.skip() keeps what the page shows), and the timer slows down while nothing changes."""
        if not run_id:
            return "No run yet.", None, None, gr.Timer(active=False), {}
        ctx.store.path(run_id)  # RunIdError (a message naming run_id) for anything else
        try:
            state, text = progress_text(ctx, run_id)
            # nothing to draw while queued: a classroom's queue polls cheaply
            ver, (loss, acc) = (None, (None, None)) if state == "queued" else frames.get(ctx, run_id)
        except RunNotFoundError:
            frames.forget(run_id)
            return (f"⚠️ Run {run_id} does not exist (it may have been deleted).", None, None,
                    gr.Timer(active=False), {})
        except DamagedRunError as exc:
            return f"⚠️ Run {run_id} is damaged and cannot be shown: {exc}", None, None, gr.Timer(active=False), {}
        got = answer(Seen.of(last), run_id, text, ver, final=state in TERMINAL)
        return (text if got.send_text else gr.skip(), loss if got.send_frames else gr.skip(),
                acc if got.send_frames else gr.skip(), gr.Timer(got.interval, active=state not in TERMINAL),
                got.seen.as_dict())

    poll_io = {"inputs": [run_pick, seen], "outputs": [progress, loss_plot, acc_plot, timer, seen],
               "show_progress": "hidden"}
    # unqueued: one HTTP request per refresh, never refused by a full queue (a class polls every second)
    timer.tick(on_poll, api_name="poll", queue=False, **poll_io)
    run_pick.change(on_poll, api_name="show_run", **poll_io)

    @errors_as_messages
    def on_stop(run_id: Optional[str], who: Optional[str]):
        if not run_id:
            raise ConfigError("run_id", "no run is shown, so there is nothing to stop")
        ctx.store.path(run_id)
        acting = acting_owner(ctx, who)
        with permission():
            ok = ctx.jobs.stop(run_id, owner=acting)
            if not ok and acting is not None and ctx.store.status(run_id).get("owner") != acting:
                raise PermissionError(f"run_id: {run_id!r} belongs to another user; you can stop only your own runs")
            ok = ok or stop_gpu_run(ctx, run_id)  # a run training in GPU chunks: no job manager knows it
        if not ok:
            gr.Info("That run has already finished.")
        return progress_text(ctx, run_id)[1]

    @errors_as_messages
    def on_continue(run_id: Optional[str], steps: Any, who: Optional[str]):
        """Queue the shown run's continuation, `steps` more from its checkpoint (lab/engine/continuation.py);
        a refusal is answered beside the button."""
        if not run_id:
            return "⚠️ **Run**: no run is shown, so there is nothing to continue", gr.skip(), gr.skip()
        ctx.store.path(run_id)
        try:
            if isinstance(steps, bool) or not isinstance(steps, (int, float)) or steps != int(steps) or steps < 1:
                raise ConfigError("More steps", f"{shown(steps)} is not a whole number of steps (allowed: 1 or more)")
            with permission():
                ctx.jobs.resume(run_id, (checkpoint_step(ctx.store, run_id) or 0) + int(steps),
                                owner=who if isinstance(who, str) else "")
        except ConfigError as exc:
            return problem(exc), gr.skip(), gr.skip()
        return "", progress_text(ctx, run_id)[1], gr.Timer(active=True)

    cont.click(on_continue, inputs=[run_pick, more, owner], outputs=[cont_note, progress, timer],
               api_name="continue_run", show_progress_on=[cont_note])
    # its note goes when the user shows another run or starts one (`.input`, not `.change`: a dropdown also
    # reports a change when its choices are refreshed, which would wipe a note just given)
    gr.on([run_pick.input, start.click], None, outputs=cont_note, js="() => ''", queue=False, show_progress="hidden",
          api_name="clear_continue_note")

    stop.click(on_stop, inputs=[run_pick, owner], outputs=progress, api_name="stop", show_progress_on=[note])

    @errors_as_messages
    def on_delete_ask(run_id: Optional[str]):
        if not run_id:
            raise ConfigError("run_id", "no run is shown, so there is nothing to delete")
        ctx.store.path(run_id)
        return gr.Row(visible=True), f"Delete run **{run_id}** and everything it saved? This cannot be undone."

    delete.click(on_delete_ask, inputs=run_pick, outputs=[confirm_row, confirm_text], api_name="delete_ask",
                 show_progress_on=[note])
    confirm_no.click(lambda: gr.Row(visible=False), outputs=confirm_row, api_name="delete_cancel")

    @errors_as_messages
    def on_delete(run_id: Optional[str], runs: Optional[list], who: Optional[str]):
        if not run_id:
            raise ConfigError("run_id", "no run is shown, so there is nothing to delete")
        ctx.store.path(run_id)
        with permission():
            ctx.jobs.delete(run_id, owner=acting_owner(ctx, who))
        left = [r for r in (runs if isinstance(runs, list) else [])[:200] if is_run_id(ctx, r) and r != run_id]
        left = [r for r in left if ctx.store.exists(r)]
        return (gr.Dropdown(choices=left, value=left[0] if left else None), left,
                f"🗑️ Deleted run {run_id}.", gr.Row(visible=False))

    confirm_yes.click(on_delete, inputs=[run_pick, my_runs, owner],
                      outputs=[run_pick, my_runs, progress, confirm_row], api_name="delete", show_progress_on=[note])

    def on_load(runs: Optional[list], who: Optional[str], request: gr.Request):
        params = dict(request.query_params) if request is not None else {}
        values, hide, problems = values_from_query(params)
        # a control a classroom link hides stays on screen with the teacher's value, read-only
        updates = [gr.update(**({"value": values[k.key]} if k.key in values else {}), interactive=k.key not in hide,
                             info=f"🔒 Set by your teacher for this class. {k.info}" if k.key in hide else k.info)
                   for k in KNOBS]
        runs = [r for r in (runs if isinstance(runs, list) else [])[:200] if is_run_id(ctx, r) and ctx.store.exists(r)]
        note = validate(*[values.get(k.key, k.default()) for k in KNOBS], ctx=ctx)
        if problems:
            rest = " (the rest of the link was applied)" if values else " (so the link's settings were not applied)"
            note = "⚠️ " + "; ".join(problems) + rest + "\n\n" + note
        who = who if isinstance(who, str) and valid_owner(who) else uuid.uuid4().hex
        axes = [gr.Dropdown(choices=axis_choices(hide)) for _ in grid.axes]  # a hidden control is no grid axis
        return (*updates, gr.Dropdown(choices=runs, value=runs[0] if runs else None), runs, who, note, *axes,
                gr.Button(interactive=True))

    return TrainTab(widgets, run_pick, on_load, [my_runs, owner],
                    inputs + [run_pick, my_runs, owner, summary] + grid.axes + [start], grid)


def _knob_panel() -> dict[str, gr.components.Component]:
    widgets: dict[str, gr.components.Component] = {}
    for sec, title in {"task": "Task", "model": "Model", "train": "Training"}.items():
        with gr.Accordion(title, open=True):
            widgets.update(build_widgets(sec))
            if sec == "task":
                build_text_upload(widgets)  # under the "Your text" box, the last of the task's knobs
            if any(k.advanced and k.key.startswith(sec + ".") for k in KNOBS):
                with gr.Accordion(f"Advanced {title.lower()} settings", open=False, elem_id=f"advanced-{sec}"):
                    widgets.update(build_widgets(sec, advanced=True))
    return widgets
