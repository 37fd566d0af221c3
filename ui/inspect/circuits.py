"""Inspect's circuits panel (issue 25), for the run and Training step picked above it: every head's role
scores over training beside the held-out loss (lab/circuits/head_roles.py), and activation patching
(lab/circuits/patching.py) on a clean and a corrupted input, at the slider's step.

Head roles: a heads x steps heatmap of the chosen role, the loss under it on the same step axis, a line at
the slider's step, and the scores at that step as a table; for a modular-addition run, grokking's Fourier
picture too (lab/circuits/fourier.py): each frequency's share of the embedding's power over the snapshots,
the strongest few's share, and the training and held-out accuracy on the same axis. Patching: two grids, each cell one patch from the
clean run into the corrupted one (the residual stream at a layer and position; one head's output); a
click on a cell shows that patch's answer and the patched run's attention, and outlines the cell's causal
cone. The inputs are made from the task (Make from task) or typed; the grids follow the step slider.

Its controls reach it through its action box (ui/inspect/actions.py); the one drawing event compares the run
picked with the run the panel shows (a gr.State), so a run change merged into a later action is drawn as a
run change and no part keeps another run's data.
"""
from __future__ import annotations

import random
from typing import Any, Optional

import gradio as gr

from lab.circuits.circuit_figures import (fourier_figure, heads_frame, nearest, residual_frame, residual_rows, roles_figure,
                                  roles_frame)
from lab.circuits.fourier import JUMP, spectra_over_training
from lab.circuits.head_roles import INDUCTION_FORMS, SCORES, crossing_step, steepest_fall
from lab.circuits.pairs import Pair, pair_text, task_pair, typed_pair
from lab.circuits.patching import Patching, capture, patch, patched
from lab.config import ConfigError, in_words
from lab.interventions import head_name
from lab.tasks.batches import get_task
from lab.teach.presets.results import eval_points, run_history
from lab.views.plots import attention_grid
from lab.records import DEC_SELF, EXACT_MATCH
from ui.common import AppContext, errors_as_messages
from ui.inspect.actions import action_box, draw_from, read, write_cell_on, write_on
from ui.inspect.attention import _md
from ui.inspect.intervention_views import MapCache, final_model, table

TRIGGERS = ("run", "drawn", "role", "make", "patch", "cell", "head")
PATCH_NOTE = ("Each cell: how much of the clean answer one patch brings back, copying that activation from the "
              "clean run into the corrupted one (1 = all of the clean answer's lead over the corrupted answer, "
              "0 = none). Click a cell to see that patch's answer and attention.")
OUTPUTS = ("roles_note", "roles_table", "roles_fig", "fourier_note", "fourier", "clean", "corrupt", "pair_note",
           "residual", "heads", "cell_note", "cell_attn", "shown", "make", "patch")
NO_FOURIER = {"fourier_note": "", "fourier": gr.Plot(None, visible=False)}


def parse_action(action: Any) -> tuple[str, Optional[tuple[int, int]]]:
    """The action box's value -> (trigger, the grid cell clicked or None): "cell 0.42\n1\n11" is a click on
    the residual grid's row 1, position 11; "head 0.42\n1\n0" on layer 1 head 0 (a row label may follow)."""
    trigger, lines = read(action, TRIGGERS)
    try:
        cell = (int(lines[0]), int(lines[1])) if len(lines) >= 2 else None
    except ValueError:
        cell = None
    return trigger, cell


def _history(ctx: AppContext, cache: MapCache, run_id: str) -> tuple[list, list]:
    """The run's head-role scores at each kept snapshot and its held-out losses, cached while the run's
    snapshots and final step stay the same."""
    summary = ctx.store.summary(run_id) or {}
    key = (run_id, summary.get("steps"), tuple(ctx.store.snapshot_steps(run_id)))
    found = cache.get(key)
    if found is None:
        found = run_history(ctx.store, run_id)
        cache.put(key, found)
    return found


def fourier_parts(ctx: AppContext, cache: MapCache, run_id: str, step: Any) -> dict[str, Any]:
    """A modular-addition run's Fourier picture (Nanda et al. 2023) over its snapshots, beside its training and
    held-out accuracy, with the slider's step marked and read in words."""
    summary = ctx.store.summary(run_id) or {}
    key = ("fourier", run_id, summary.get("steps"), tuple(ctx.store.snapshot_steps(run_id)))
    found = cache.get(key)
    if found is None:
        accuracy = {name: eval_points(ctx.store, run_id, col)
                    for name, col in (("held-out", EXACT_MATCH), ("training pairs", f"train_{EXACT_MATCH}"))}
        found = (spectra_over_training(ctx.store, run_id), accuracy)
        cache.put(key, found)
    spectra, accuracy = found
    if not spectra:
        return {"fourier_note": "No weights kept yet for the Fourier picture.", "fourier": gr.Plot(None, visible=False)}
    at = spectra[-1] if not isinstance(step, (int, float)) else min(spectra, key=lambda s: abs(s.step - step))
    n = len(at.power)
    note = (f"**At step {at.step}, the {len(at.top)} strongest frequencies (k = {', '.join(map(str, at.top))}) hold "
            f"{at.fraction:.0%} of the token embedding's non-constant power** (spread evenly: "
            f"{len(at.top) / n:.0%}). ")
    jump = next((s for s, v in sorted(accuracy["held-out"]) if v >= JUMP), None)
    note += (f"Held-out exact-match first reached {JUMP:.0%} at step {jump}: Nanda et al. 2023 found the power "
             "spread while a model memorises and gathered in a few key frequencies once it generalises."
             if jump is not None else f"Held-out exact-match never reached {JUMP:.0%} in this run.")
    return {"fourier_note": note, "fourier": gr.Plot(fourier_figure(spectra, accuracy, at.step), visible=True)}


def roles_parts(series: list, losses: list, role: str, step: Any) -> dict[str, Any]:
    """The heatmap, the table at the slider's step and the sentence that reads them."""
    scores = nearest(series, step if isinstance(step, (int, float)) else None)
    layer, head, top = scores.top(role)
    note = f"**At step {scores.step}, the top {role} score is {top:.2f} ({head_name(layer, head)}).**"
    if role == "induction":
        formed, fall = crossing_step(series), steepest_fall(losses)
        note += (f" No head passes {INDUCTION_FORMS} in this run." if formed is None else
                 f" The top induction score first passes {INDUCTION_FORMS} at step {formed}.")
        if fall:
            note += f" The held-out loss falls fastest between steps {fall[0]} and {fall[1]} (shaded grey under the heatmap)."
    note += f" Measured on {scores.half} random tokens repeated once; move the Training step slider to scrub."
    return {"roles_note": note, "roles_table": table(roles_frame(scores, role)),
            "roles_fig": gr.Plot(roles_figure(series, losses, role, scores.step), visible=True)}


def _labels(cfg: Any, tokens: Any) -> list[str]:
    task = get_task(cfg.task.name)
    return [task.label(cfg.task, int(t)) for t in tokens[0]]


def _no_grids(note: str) -> dict[str, Any]:
    return {"pair_note": note, "residual": table(), "heads": table(), "cell_note": "",
            "cell_attn": gr.Plot(None, visible=False)}


def patch_parts(cfg: Any, model: Any, at: int, pair: Pair, trigger: str,
                cell: Optional[tuple[int, int]]) -> dict[str, Any]:
    """Both grids at the weights of step `at`, and, for a clicked cell, that patch's answer and attention."""
    try:
        p = patch(model, pair.clean, pair.corrupt)
    except ValueError as exc:
        return _no_grids(f"⚠️ **Corrupted input** at step {at}: {str(exc).split(': ', 1)[-1]}. Change the corrupted "
                         "input (or press Make from task); before a circuit forms, a later step may tell them apart.")
    clean, corrupt = _labels(cfg, pair.clean), _labels(cfg, pair.corrupt)
    name = lambda tok: get_task(cfg.task.name).label(cfg.task, tok)  # noqa: E731
    note = (f"Weights at step {at}. Clean answer **{name(p.clean_answer)}**, corrupted answer "
            f"**{name(p.corrupt_answer)}** ({pair.how.rstrip('.')}). " + PATCH_NOTE)
    picked_res = cell if trigger == "cell" and cell and cell[0] < p.residual.shape[0] and \
        cell[1] < p.residual.shape[1] else None
    picked_head = cell if trigger == "head" and cell and cell[0] < p.heads.shape[0] and \
        cell[1] < p.heads.shape[1] else None
    out = {"pair_note": note, "residual": table(residual_frame(p, clean, corrupt, picked_res)),
           "heads": table(heads_frame(p, picked_head)), "cell_note": "", "cell_attn": gr.Plot(None, visible=False)}
    if picked_res or picked_head:
        out |= cell_parts(cfg, model, pair, p, "residual" if picked_res else "head", picked_res or picked_head,
                          corrupt)
    return out


def cell_parts(cfg: Any, model: Any, pair: Pair, p: Patching, kind: str, cell: tuple[int, int],
               corrupt: list[str]) -> dict[str, Any]:
    """One patch's answer, how much it restores, and the patched run's attention."""
    _, rows, heads = capture(model, pair.clean)
    if kind == "residual":
        row, pos = cell
        out = patched(model, pair.corrupt, rows, heads, "residual", row, [pos], need_weights=True)
        what = (f"the residual stream {residual_rows(p.heads.shape[0])[row]} at position {pos} "
                f"({corrupt[pos]} in the corrupted input)")
        cone = (" Outlined: its causal cone, the cells this patch can change (later rows, the same or later "
                "positions).")
    else:
        layer, head = cell
        out = patched(model, pair.corrupt, rows, heads, "head", head, [layer], need_weights=True)
        what, cone = f"{head_name(layer, head)}'s output at every position", ""
    last = out.logits[0, -1]
    ld = float(last[p.clean_answer] - last[p.corrupt_answer])
    restored = (ld - p.ld_corrupt) / (p.ld_clean - p.ld_corrupt)
    answer = get_task(cfg.task.name).label(cfg.task, int(last.argmax()))
    back = "the clean answer" if int(last.argmax()) == p.clean_answer else "not the clean answer"
    note = (f"**Patched {what}: the answer is {answer} ({back}), {restored:.0%} restored.**{cone} The attention "
            "below is the patched run's.")
    patterns = out.attention[DEC_SELF][:, 0].float().numpy()  # (L, B, H, T, T) -> (L, H, T, T)
    fig = attention_grid(patterns, corrupt, corrupt, "Attention of the corrupted run with this patch")
    return {"cell_note": note, "cell_attn": gr.Plot(fig, visible=True)}


def panel_update(ctx: AppContext, cache: MapCache, action: Any, shown: Any, run_id: Any, step: Any, role: Any,
                 clean: Any, corrupt: Any, source: Any = "sampled") -> dict[str, Any]:
    """What the panel shows after the last action; only the parts the action changes are sent. `source` is
    Inspect's probe input: a typed one is drawn with the final weights, so the panel reads them too."""
    trigger, cell = parse_action(action)
    set_by_heatmaps = trigger == "drawn"  # the heatmaps have set the Training step (a step, probe or run change)
    if set_by_heatmaps:
        trigger = "step"
    if source == "typed":
        step = None
    if not run_id:
        return {"roles_note": "Pick a run to see its heads' roles over training.", "roles_table": table(),
                "roles_fig": gr.Plot(None, visible=False), "clean": "", "corrupt": "", "shown": None} | NO_FOURIER \
            | _no_grids("")
    if role not in SCORES:
        raise ConfigError("Head role", f"{role!r} is not one of {', '.join(SCORES)}")
    ctx.store.path(run_id)  # RunIdError: not a run id
    trigger = "run" if run_id != shown else trigger
    if trigger == "run" and not set_by_heatmaps:  # the slider may hold the previous run's step: drawn at its end
        step = None
    cfg = ctx.store.config(run_id)
    if cfg.model.arch != "decoder":
        return {"roles_note": f"Head roles and patching are measured on decoder-only Transformers; this run is "
                              f"{cfg.model.arch}.", "roles_table": table(), "roles_fig": gr.Plot(None, visible=False),
                "clean": "", "corrupt": "", "shown": run_id} | NO_FOURIER | _no_grids("") | _patching_offered(False)
    out: dict[str, Any] = {"shown": run_id} | (_patching_offered(True) if trigger == "run" else {})
    series, losses = _history(ctx, cache, run_id)
    if series and isinstance(step, (int, float)):  # the slider moves by the first gap; snapshots are rounded
        step = nearest(series, step).step  # every part reads the weights of one step, the one it says
    if trigger in ("run", "step", "role"):
        out |= roles_parts(series, losses, role, step) if series else {
            "roles_note": "No weights kept yet: each run keeps them at its attention snapshot steps.",
            "roles_table": table(), "roles_fig": gr.Plot(None, visible=False)}
    if trigger in ("run", "step"):  # grokking's Fourier picture, for modular addition only
        out |= fourier_parts(ctx, cache, run_id, step) if cfg.task.name == "modular_addition" else NO_FOURIER
    if trigger == "role":
        return out
    if ctx.store.summary(run_id) is None:
        state = (ctx.store.status(run_id) or {}).get("state", "")
        why = ("wait until it finishes" if state in ("queued", "running", "") else
               f"this run {state} before its end and kept no final weights; pick a finished run")
        return out | ({"clean": "", "corrupt": ""} if trigger == "run" else {}) | _no_grids(
            f"Patching needs the run's final weights: {why}.")
    cfg, model, at = final_model(ctx, run_id, step if isinstance(step, (int, float)) else None)
    if trigger in ("run", "make"):
        pair = task_pair(cfg, model, 0 if trigger == "run" else random.randrange(1_000_000))
        out |= {"clean": pair_text(cfg, pair.clean), "corrupt": pair_text(cfg, pair.corrupt)}
    elif trigger in ("step", "patch", "cell", "head"):
        if trigger == "step" and not (str(clean or "").strip() and str(corrupt or "").strip()):
            return out
        try:
            pair = typed_pair(cfg, clean, corrupt)
        except ConfigError as exc:
            what, message = in_words(exc)
            return out | _no_grids(f"⚠️ **{what}**: {_md(message)}")
    else:
        return out
    return out | patch_parts(cfg, model, at, pair, trigger, cell)


def build_circuits_panel(ctx: AppContext, run: gr.Dropdown, source: gr.Radio, step: gr.Slider) -> gr.Textbox:
    """The panel's controls and its one drawing event, under the interventions panel. Returns its action box:
    the heatmaps write "drawn" into it once they have set the step (ui/inspect/tab.py)."""
    c: dict[str, Any] = {}  # output name -> component
    role = roles_section(c)
    buttons = patching_section(c)
    c["shown"] = gr.State(None)  # the run the panel shows
    action = action_box("circuits-action")  # what the last click or change asked
    write_on(action, {"run": run.change, "role": role.input, "make": buttons["make"].click,
                      "patch": [buttons["patch"].click, c["clean"].submit, c["corrupt"].submit]},  # Enter patches
             "circuits")
    write_cell_on(c["residual"], action, "cell", "circuits_cell")
    write_cell_on(c["heads"], action, "head", "circuits_head")
    cache = MapCache(size=8)

    @errors_as_messages
    def update(asked: Any, shown: Any, run_id: Any, step: Any, role: Any, clean: Any, corrupt: Any, probe: Any):
        out = panel_update(ctx, cache, asked, shown, run_id, step, role, clean, corrupt, probe)
        return {c[k]: v for k, v in out.items()}

    draw_from(action, update, [c["shown"], run, step, role, c["clean"], c["corrupt"], source], [c[k] for k in OUTPUTS],
              "circuits_view", [c["roles_fig"], c["fourier"], c["residual"], c["cell_attn"]])
    return action


def _patching_offered(offered: bool) -> dict[str, gr.Button]:
    """Make from task and Patch: enabled for a decoder-only run; otherwise greyed out, saying why."""
    why = " (decoder-only runs)" if not offered else ""
    return {"make": gr.Button(f"Make from task{why}", interactive=offered),
            "patch": gr.Button(f"Patch{why}", interactive=offered)}


def roles_section(c: dict[str, Any]) -> gr.Radio:
    """Head roles over training and, for modular addition, grokking's Fourier picture: adds the outputs to
    `c`, returns the Head role control."""
    gr.Markdown("### Circuits forming: head roles over training")
    role = gr.Radio(list(SCORES), value="induction", label="Head role", elem_id="circuits-role",
                    info="how much of each head's attention goes where the role would put it")
    c["roles_note"] = gr.Markdown(elem_id="circuits-roles-note")
    c["roles_table"] = gr.Dataframe(label="Scores at the slider's step", interactive=False, visible=False,
                                    elem_id="circuits-roles-table")
    c["roles_fig"] = gr.Plot(show_label=False, visible=False, elem_id="circuits-roles-fig")
    c["fourier_note"] = gr.Markdown(elem_id="circuits-fourier-note")  # modular addition: grokking's Fourier picture
    c["fourier"] = gr.Plot(show_label=False, visible=False, elem_id="circuits-fourier")
    return role


def patching_section(c: dict[str, Any]) -> dict[str, gr.Button]:
    """Activation patching: the two inputs, the two grids, a clicked cell's answer and attention; adds them
    to `c`, returns the buttons by action name."""
    gr.Markdown("### Activation patching")
    with gr.Row():
        c["clean"] = gr.Textbox(label="Clean input", max_lines=1, min_width=260, elem_id="circuits-clean")
        c["corrupt"] = gr.Textbox(label="Corrupted input", max_lines=1, min_width=260, elem_id="circuits-corrupt")
    with gr.Row():
        buttons = {"make": gr.Button("Make from task", elem_id="circuits-make"),
                   "patch": gr.Button("Patch", variant="primary", elem_id="circuits-patch")}
    c["pair_note"] = gr.Markdown(elem_id="circuits-pair-note")
    c["residual"] = gr.Dataframe(label="Residual stream: patch one layer at one position (click a cell)",
                                 interactive=False, visible=False, elem_id="circuits-residual")
    c["heads"] = gr.Dataframe(label="Head outputs: patch one head at every position (click a cell)",
                              interactive=False, visible=False, elem_id="circuits-heads")
    c["cell_note"] = gr.Markdown(elem_id="circuits-cell-note")
    c["cell_attn"] = gr.Plot(show_label=False, visible=False, elem_id="circuits-cell-attn")
    c["make"], c["patch"] = buttons["make"], buttons["patch"]
    return buttons
