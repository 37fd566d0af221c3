"""The Train tab's callbacks: what Start, the live poll, Stop, Continue, Delete and the page's load do, each
a module-level function of the tab's components (`TrainView`, bound by ui/train.py with functools.partial)
that returns its outputs by name (`Outputs`), and the config summary that every knob change redraws."""
from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

import gradio as gr

from lab.config import RECURRENT, ConfigError, RunConfig, in_words
from lab.engine.continuation import checkpoint_step
from lab.engine.identity import class_seed, fresh_seed, seeded
from lab.engine.jobs import JobManager
from lab.engine.limits import Limits, check_config, valid_owner
from lab.engine.sharing import describe_claim
from lab.engine.store import LIVE_STATES, TERMINAL_STATES, DamagedRunError, RunNotFoundError
from lab.fields import shown
from lab.params import param_breakdown
from lab.tasks.batches import get_task
from lab.tasks.shapes import loss_baselines
from lab.textdata import text_of
from ui.common import (AppContext, Outputs, acting_owner, errors_as_messages, is_run_id, kept, permission)
from ui.gpu import stop_gpu_run
from ui.grid import GridPanel, axis_choices
from ui.knobs import KNOB_KEYS, KNOBS, config_from_values, values_from_query
from ui.live import FrameCache, Seen, SnapshotPictures, answer, progress_text

NO_RUN = "No run yet."
MY_RUNS_READ = 200  # entries of a browser's "my runs" list read at most (a BrowserState may hold anything)


@dataclass(frozen=True)
class TrainView:
    """The Train tab's components that its callbacks read or write."""
    widgets: dict[str, gr.components.Component]
    summary: gr.Markdown
    start: gr.Button
    again: gr.Button  # "Train again with a new seed", shown when Start attached to a run already there
    own_seed: gr.Checkbox  # "My own seed": each student's Start trains their own seed (lab/engine/identity.py)
    note: gr.Markdown
    confirm_row: gr.Row
    confirm_text: gr.Markdown
    run_pick: gr.Dropdown
    progress: gr.Markdown
    more: gr.Number
    cont_note: gr.Markdown
    loss_plot: gr.LinePlot
    acc_plot: gr.LinePlot
    attn_plot: gr.Image  # the shown run's latest attention snapshot, redrawn as training writes a new one
    timer: gr.Timer
    seen: gr.State
    grid: GridPanel
    my_runs: gr.BrowserState
    owner: gr.BrowserState
    locked: gr.State  # the knob keys a classroom link locked (set at load): the knob event leaves them locked


@dataclass(frozen=True)
class StartOut(Outputs):
    run_pick: Any = kept()
    my_runs: Any = kept()
    progress: Any = kept()
    timer: Any = kept()
    again: Any = kept()
    seed: Any = kept()  # the Seed knob: the seed a class seed or a new seed trains with
    note: Any = kept()


@dataclass(frozen=True)
class PollOut(Outputs):
    progress: Any = kept()
    loss_plot: Any = kept()
    acc_plot: Any = kept()
    attn_plot: Any = kept()
    timer: Any = kept()
    seen: Any = kept()


@dataclass(frozen=True)
class ContinueOut(Outputs):
    cont_note: Any = kept()
    progress: Any = kept()
    timer: Any = kept()


@dataclass(frozen=True)
class DeleteOut(Outputs):
    run_pick: Any = kept()
    my_runs: Any = kept()
    progress: Any = kept()
    confirm_row: Any = kept()
    seen: Any = kept()


def knob_values(args: tuple) -> dict[str, Any]:
    """The knobs' values (in KNOB_KEYS order, as the events send them) by config key."""
    return dict(zip(KNOB_KEYS, args))


def describe(cfg: RunConfig, limits: Optional[Limits] = None, jobs: Optional[JobManager] = None) -> str:
    """The config in words: the task, the parameter count by component, and, on a server whose limits
    refuse it, that Start will refuse it and why; else, with `jobs`, how long it would take if started now
    (the job manager's estimate from this server's measured speed and queue). Said before anyone clicks."""
    parts = param_breakdown(cfg)
    total = sum(parts.values())
    detail = ", ".join(f"{k} {v:,}" for k, v in parts.items() if v)
    hint = ""
    if cfg.model.arch in RECURRENT:
        hint = (f"\n\n*A recurrent model ({cfg.model.arch.upper()}): d_model wide, Layers deep, one token at a "
                "time. The attention, positional encoding, norm and feed-forward knobs do not apply to it.*")
    elif cfg.model.pos == "alibi" and cfg.model.n_heads <= 2:
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
        return describe(config_from_values(knob_values(args)), *((ctx.jobs.limits, ctx.jobs) if ctx else ()))
    except ConfigError as exc:
        return problem(exc)


def own_runs(ctx: AppContext, runs: Any) -> list[str]:
    """The well-formed run ids of a browser's "my runs" list (they may not exist)."""
    return [r for r in (runs if isinstance(runs, list) else [])[:MY_RUNS_READ] if is_run_id(ctx, r)]


def remembered(ctx: AppContext, runs: Any, run_id: str) -> list[str]:
    """The runs this browser remembers: the new one first, then up to 49 of the others."""
    return [run_id] + [r for r in own_runs(ctx, runs) if r != run_id][:49]


def shown_run(ctx: AppContext, run_id: Optional[str], verb: str) -> str:
    """The run an action applies to: the one shown (ConfigError when none is; RunIdError for a bad id)."""
    if not run_id:
        raise ConfigError("run_id", f"no run is shown, so there is nothing to {verb}")
    ctx.store.path(run_id)
    return run_id


@errors_as_messages
def on_start(ctx: AppContext, *args: Any) -> tuple:
    """Start the knobs' run: the run already on this server for the same configuration (the note says so and
    offers a new seed), else a new one. "My own seed" (the last input) trains the student's own seed. A
    refused config or a server limit answers in the note beside Start (naming the knob by its label) and
    leaves everything else on the page as it was."""
    *vals, runs, who, own = args
    return start_run(ctx, tuple(vals), runs, who, class_seed(who) if own is True and isinstance(who, str) else None,
                     "class" if own is True else "")


@errors_as_messages
def on_again(ctx: AppContext, *args: Any) -> tuple:
    """"Train again with a new seed": the knobs' run with a fresh random seed (shown in the Seed knob)."""
    *vals, runs, who = args
    return start_run(ctx, tuple(vals), runs, who, fresh_seed())


def start_run(ctx: AppContext, vals: tuple, runs: Any, who: Any, seed: Optional[int] = None,
              seed_from: str = "") -> tuple:
    try:
        cfg = config_from_values(knob_values(vals))
        cfg = cfg if seed is None else seeded(cfg, seed)
        claim = ctx.jobs.claim_many([cfg], owner=who if isinstance(who, str) else "", seed_from=seed_from)[0]
    except ConfigError as exc:
        return StartOut(note=problem(exc)).values()
    runs = remembered(ctx, runs, claim.run_id)
    note = f"🔁 {describe_claim(claim)}" if claim.attached else ""
    return StartOut(run_pick=gr.Dropdown(choices=runs, value=claim.run_id), my_runs=runs,
                    progress=progress_text(ctx, claim.run_id)[1], timer=gr.Timer(active=True), note=note,
                    again=gr.Button(visible=claim.attached),
                    seed=gr.skip() if seed is None else seed).values()


@errors_as_messages
def on_poll(ctx: AppContext, frames: FrameCache, pictures: SnapshotPictures, run_id: Optional[str],
            last: Any) -> tuple:
    """The shown run's progress and curves; only what changed since this page's last poll is sent (the
    rest keeps what the page shows), and the timer slows down while nothing changes."""
    stopped = {"loss_plot": None, "acc_plot": None, "attn_plot": gr.Image(None, visible=False),
               "timer": gr.Timer(active=False), "seen": {}}
    if not run_id:  # none shown; just after a delete, its message stays (the picker's change polls here)
        deleted = isinstance(last, dict) and last.get("deleted")
        return (PollOut(**stopped) if deleted else PollOut(progress=NO_RUN, **stopped)).values()
    ctx.store.path(run_id)  # RunIdError (a message naming run_id) for anything else
    try:
        state, text = progress_text(ctx, run_id)
        # nothing to draw while queued: a classroom's queue polls cheaply
        ver, (loss, acc) = (None, (None, None)) if state == "queued" else frames.get(ctx, run_id)
    except RunNotFoundError:
        frames.forget(run_id)
        return PollOut(progress=f"⚠️ Run {run_id} does not exist (it may have been deleted).", **stopped).values()
    except DamagedRunError as exc:
        return PollOut(progress=f"⚠️ Run {run_id} is damaged and cannot be shown: {exc}", **stopped).values()
    final, seen = state in TERMINAL_STATES, Seen.of(last)
    got = answer(seen, run_id, text, ver, final=final)
    sent = {"progress": text} if got.send_text else {}
    sent |= {"loss_plot": loss, "acc_plot": acc} if got.send_frames else {}
    snap = None if state == "queued" else ctx.store.snapshot_near(run_id)  # the latest attention snapshot
    if snap != seen.snapshot or seen.run != run_id:
        png = None if snap is None else pictures.get(ctx, run_id, snap)
        sent["attn_plot"] = gr.Image(png, visible=png is not None)
    return PollOut(timer=gr.Timer(got.interval, active=not final), seen=replace(got.seen, snapshot=snap).as_dict(),
                   **sent).values()


@errors_as_messages
def on_stop(ctx: AppContext, run_id: Optional[str], who: Optional[str]) -> str:
    """Stop the shown run (only one's own on a public server); the run's progress line."""
    run_id = shown_run(ctx, run_id, "stop")
    acting = acting_owner(ctx, who)
    with permission():
        ok = ctx.jobs.stop(run_id, owner=acting)
        if not ok and acting is not None and ctx.store.status(run_id).get("owner") != acting:
            raise PermissionError(f"run_id: {run_id!r} belongs to another user; you can stop only your own runs")
        ok = ok or stop_gpu_run(ctx, run_id)  # a run training in GPU chunks: no job manager knows it
    holders = ctx.jobs.holders(run_id) if ok and acting is not None else []
    if not ok:
        gr.Info("That run has already finished.")
    elif acting is not None and acting not in holders:
        others = len(holders)
        gr.Info(f"You left this run; it goes on for the {others} other{'s' if others != 1 else ''} in the class "
                "who hold it.")
    return progress_text(ctx, run_id)[1]


@errors_as_messages
def on_continue(ctx: AppContext, run_id: Optional[str], steps: Any, who: Optional[str]) -> tuple:
    """Queue the shown run's continuation, `steps` more from its checkpoint (lab/engine/continuation.py);
    a refusal is answered beside the button."""
    if not run_id:
        return ContinueOut(cont_note="⚠️ **Run**: no run is shown, so there is nothing to continue").values()
    ctx.store.path(run_id)
    try:
        if isinstance(steps, bool) or not isinstance(steps, (int, float)) or steps != int(steps) or steps < 1:
            raise ConfigError("More steps", f"{shown(steps)} is not a whole number of steps (allowed: 1 or more)")
        with permission():
            ctx.jobs.resume(run_id, (checkpoint_step(ctx.store, run_id) or 0) + int(steps),
                            owner=who if isinstance(who, str) else "")
    except ConfigError as exc:
        return ContinueOut(cont_note=problem(exc)).values()
    return ContinueOut(cont_note="", progress=progress_text(ctx, run_id)[1], timer=gr.Timer(active=True)).values()


def others_hold(n: int) -> str:
    return f"{n} other{'s' if n != 1 else ''} in the class {'hold' if n != 1 else 'holds'}"


@errors_as_messages
def on_delete_ask(ctx: AppContext, run_id: Optional[str], who: Optional[str] = None) -> tuple:
    """Ask before deleting the shown run: (the confirmation row shown, its question). A run others in the class
    hold too is only removed from this student's runs, and the question says so."""
    run_id = shown_run(ctx, run_id, "delete")
    acting = acting_owner(ctx, who) if ctx.jobs.limits.public and isinstance(who, str) and who else None
    holders = ctx.jobs.holders(run_id) if acting is not None else []
    others = [h for h in holders if h != acting]
    if acting in holders and others:
        return gr.Row(visible=True), (f"Remove run **{run_id}** from your runs? {others_hold(len(others))} it too, "
                                      "so it stays on this server for them.")
    try:
        state = ctx.jobs.status(run_id).state
    except DamagedRunError:
        state = ""  # a damaged status: deleting it is the way out
    if state in LIVE_STATES:  # said before asking: the question would only be refused after the click
        raise ValueError(f"Run shown: {run_id} is {state}; press Stop first, then Delete run")
    return gr.Row(visible=True), f"Delete run **{run_id}** and everything it saved? This cannot be undone."


@errors_as_messages
def on_delete(ctx: AppContext, run_id: Optional[str], runs: Optional[list], who: Optional[str]) -> tuple:
    """Delete the shown run (only one's own on a public server); show the next remembered run that exists."""
    run_id = shown_run(ctx, run_id, "delete")
    with permission():
        holders = ctx.jobs.delete(run_id, owner=acting_owner(ctx, who))
    left = [r for r in own_runs(ctx, runs) if r != run_id and ctx.store.exists(r)]
    said = (f"🗑️ Removed run {run_id} from your runs. {others_hold(len(holders))} it too, so it stays on this "
            "server for them." if holders else f"🗑️ Deleted run {run_id}.")
    return DeleteOut(run_pick=gr.Dropdown(choices=left, value=left[0] if left else None), my_runs=left,
                     progress=said, confirm_row=gr.Row(visible=False),
                     seen={"deleted": run_id}).values()


def load_handler(ctx: AppContext, view: TrainView) -> Callable:
    """The page's load event (a closure: gradio passes the request to a parameter typed gr.Request). It
    applies the page URL (knob values, and the controls a classroom link hides, read-only with the teacher's
    value), restores "my runs" and the run shown, gives the browser an owner token, and enables Start."""

    def on_load(runs: Optional[list], who: Optional[str], request: gr.Request) -> dict:
        params = dict(request.query_params) if request is not None else {}
        values, hide, problems = values_from_query(params)
        out: dict = {view.widgets[k.key]: gr.update(
            **({"value": values[k.key]} if k.key in values else {}), interactive=k.key not in hide,
            info=f"🔒 Set by your teacher for this class. {k.info}" if k.key in hide else k.info) for k in KNOBS}
        runs = [r for r in own_runs(ctx, runs) if ctx.store.exists(r)]
        note = validate(*[values.get(k.key, k.default()) for k in KNOBS], ctx=ctx)
        if problems:
            rest = " (the rest of the link was applied)" if values else " (so the link's settings were not applied)"
            note = "⚠️ " + "; ".join(problems) + rest + "\n\n" + note
        out |= {axis: gr.Dropdown(choices=axis_choices(hide)) for axis in view.grid.axes}  # a hidden control is no axis
        return out | {view.run_pick: gr.Dropdown(choices=runs, value=runs[0] if runs else None), view.my_runs: runs,
                      view.owner: who if isinstance(who, str) and valid_owner(who) else uuid.uuid4().hex,
                      view.summary: note, view.start: gr.Button(interactive=True), view.locked: list(hide)}

    return on_load


def load_outputs(view: TrainView) -> list:
    """Every component the load event may write (its handler names each one it writes)."""
    return ([view.widgets[k] for k in KNOB_KEYS] + [view.run_pick, view.my_runs, view.owner, view.summary]
            + view.grid.axes + [view.start, view.locked])
