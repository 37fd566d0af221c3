"""Inspect's intervention panel (issue 15), for the run and probe input picked above it: the model's answer
token by token (and free generation for decoder runs); interventions applied on a button, with their effect
on the held-out metrics, the answer and the attention; the head importance map (a click on a cell knocks
that head out); the logit lens. It runs on the weights at the Training step slider's step with the sampled
probe (the attention snapshots keep the weights of models up to 1M parameters, in float16), else on the
run's final weights.

Every click or change reaches the panel through its action box (ui/inspect/actions.py), and one event draws
every part (`panel_update`); the panels remember the run and input they show (a gr.State): an event that
finds another run picked redraws every part for it and applies nothing made with the previous run's
controls, so no part can keep another run's data. What each part shows is in
ui/inspect/intervention_views.py; the API's endpoints (`/answer`, `/intervene`, `/importance`,
`/logit_lens`, `/generate`) take everything explicitly.
"""
from __future__ import annotations

import math
import random
from typing import Any, Optional

import gradio as gr

from lab.config import ConfigError, RunConfig
from lab.model import Transformer
from lab.views.probe_plots import head_at
from ui.common import AppContext, errors_as_messages, with_api_params
from ui.inspect.actions import action_box, draw_from, read, write_cell_on, write_on
from ui.inspect.intervention_views import (API, KINDS, MAX_TEXT, MODES, POSITIONAL, POSITIONAL_INFO, SEE_NOTE, MapCache, ablated_parts,
                                answer_parts, api_call, cleared, cleared_ablated, compute_maps, controls, final_model,
                                generated_text, importance_parts, lens_parts, page_probe, spec_from, table)

TRIGGERS = ("run", "source", "text", "drawn", "apply", "reset", "importance", "cell", "generate")
WEIGHTS_NOTE = ("Final weights (step {step}): the answer, interventions, head importance and logit lens use the "
                "run's final weights. Move the Training step slider (sampled probe) to use the weights kept with "
                "an earlier attention snapshot.")
MAX_SEED = 2**32 - 1  # the Sample seed box's largest value; a seed drawn for a click is below 1,000,000 (short to type)
STEP_NOTE = ("Weights at step {step} (kept with the attention snapshot, in float16): the answer, interventions, "
             "head importance and logit lens use the model as it was then.")


def parse_action(action: Any) -> tuple[str, Optional[tuple[str, str]]]:
    """The action box's value -> (trigger, the importance cell clicked or None): "apply 0.42" is Apply,
    "cell 0.42\n1\n0\nlayer 1" a click on row 1's cell of head 0, that row being layer 1."""
    trigger, lines = read(action, TRIGGERS)
    return trigger, ((lines[2], f"head {lines[1]}") if trigger == "cell" and len(lines) == 3 else None)


def sample_seed(seed: Any) -> Optional[int]:
    """The Sample seed box's value: None when empty (a new sample each click), else a whole number from 0 to
    MAX_SEED; ConfigError naming the box for anything else."""
    if seed is None or (isinstance(seed, str) and not seed.strip()):
        return None
    try:
        value = float(seed)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value.is_integer() and 0 <= value <= MAX_SEED):
        raise ConfigError("Sample seed", f"{seed!r} (allowed: a whole number from 0 to {MAX_SEED}, or empty for a "
                                         "new sample each click)")
    return int(value)


def sample_parts(cfg: RunConfig, model: Transformer, prompt: Any, temperature: Any, n_tokens: Any,
                 seed: Any) -> dict[str, Any]:
    """Generate's sample and the note beside it: with the Sample seed box empty, a new seed each click (the
    note names it, so the sample can be had again); with a seed, that seed's sample. Temperature 0 is greedy:
    the same answer on every click, whatever the seed."""
    chosen = sample_seed(seed)
    used = random.randrange(1_000_000) if chosen is None else chosen
    text = generated_text(cfg, model, prompt, temperature, n_tokens, used)  # checks the prompt and the sliders
    if float(temperature) == 0:
        note = ("Greedy (temperature 0): the most likely token at each step, the same on every click; no seed "
                "is used.")
    elif chosen is None:
        note = (f"Sampled at temperature {float(temperature):g} with seed **{used}**: type it into Sample seed to "
                "get this sample again; leave the box empty for a new sample each click.")
    else:
        note = (f"Sampled at temperature {float(temperature):g} with seed **{used}** (from Sample seed): the same "
                "sample on every click; empty the box for a new one each click.")
    return {"gen_out": text, "gen_note": note}


def panel_update(ctx: AppContext, cache: MapCache, trigger: str, shown: Any, run_id: Any, source: Any, text: Any,
                 heads: Any = (), mode: Any = "zero", skip_ff: Any = (), skip_block: Any = (),
                 positional: Any = "intact", prompt: Any = "", temperature: Any = 0.0, n_tokens: Any = 20,
                 cell: Optional[tuple[str, str]] = None, step: Any = None, seed: Any = None) -> dict[str, Any]:
    """What the page shows after `trigger` ("run", "source", "text", "apply", "reset", "importance", "cell",
    "generate"): output name -> value, for the outputs that change. `shown` is what the panels show
    ("run id, source, text, step"); a run other than the shown one resets every panel and control first.
    `step` is the Training step slider's value; `seed` the Sample seed box's (empty: a new sample)."""
    if not run_id:
        return cleared(None) | {"shown": ""}
    ctx.store.path(run_id)  # RunIdError: not a run id
    if trigger == "text":
        if not (text or "").strip():
            return {}
        source = "typed"  # Enter in the box picks the typed input, as the attention view does
    fresh = trigger == "run" or str(shown or "").split("\n")[0] != run_id
    # the slider's step (sampled probe only: a typed one uses the final weights, as the attention view does);
    # on a new run the slider may still hold the previous run's step: the final weights then, until the
    # heatmaps have drawn the new run and set its step ("drawn")
    want = None if (fresh and trigger != "drawn") or source == "typed" else step
    key = f"{run_id}\n{source}\n{text if source == 'typed' else ''}\n{want if want is not None else ''}"
    out: dict[str, Any] = {"shown": key}
    if fresh:
        cfg = ctx.store.config(run_id)
        if ctx.store.summary(run_id) is None:
            return out | cleared(cfg, "This run has no final weights yet: its answer, interventions and head "
                                      "importance come when it finishes.")
        out |= cleared(cfg)
    cfg, model, step = final_model(ctx, run_id, want)
    out["shown"] = key = f"{run_id}\n{source}\n{text if source == 'typed' else ''}\n{step}"
    probe = page_probe(cfg, source, text)
    if fresh or key != shown:
        answer = answer_parts(cfg, model, probe) if probe else {"answer": table(), "answer_note": SEE_NOTE}
        final = int((ctx.store.summary(run_id) or {}).get("steps") or 0)
        note = (WEIGHTS_NOTE if step == final else STEP_NOTE).format(step=step)
        out |= {"weights_note": note} | answer | lens_parts(cfg, model, probe, step)
        out |= cleared_ablated("" if fresh else "Press Apply to see this input with the interventions.")
    if fresh:
        maps = cache.get((run_id, step, "zero"))
        out |= importance_parts(cfg, model, maps, step) if maps else {}
        if trigger not in ("importance", "generate"):  # the other controls' values were the previous run's
            return out
    if trigger == "reset":
        out |= controls(cfg) | cleared_ablated() | {"metrics": table(), "applied_note": ""}
    elif trigger == "apply":
        out |= ablated_parts(cfg, model, spec_from(heads, mode, skip_ff, skip_block, positional), probe, step)
    elif trigger == "cell" and cell is not None and head_at(*cell) is not None:
        picked = [str(head_at(*cell))]
        out |= {"heads": picked} | ablated_parts(cfg, model, spec_from(picked, mode, skip_ff, skip_block, positional),
                                                 probe, step)
    elif trigger == "importance":
        out |= importance_parts(cfg, model, compute_maps(ctx, cache, run_id, cfg, model, step,
                                                         "zero" if fresh else mode), step)
    elif trigger == "generate":
        out |= sample_parts(cfg, model, prompt, temperature, n_tokens, seed)
    return out


def build_intervene_panel(ctx: AppContext, run: gr.Dropdown, source: gr.Radio, text: gr.Textbox,
                          step: gr.Slider) -> gr.Textbox:
    """The panel, under Inspect's attention: it follows the run, probe input and training step picked there.
    Returns its action box: the heatmaps write "drawn" into it once they have set the step (ui/inspect/tab.py)."""
    c: dict[str, Any] = {"shown": gr.State("")}  # output name -> component
    gen, gen_button = answer_section(c)
    buttons = interventions_section(c) | importance_and_lens_section(c) | gen_button
    action = action_box("intervene-action")  # what the last click or change asked
    page = {"run_id": run, "source": source, "text": text, "step": step}
    write_actions(action, page, buttons, c["grid"])
    wire_panel(ctx, MapCache(), action, c, page | gen)
    return action


def answer_section(c: dict[str, Any]) -> tuple[dict[str, Any], dict[str, gr.Button]]:
    """The model's answer, intact and with the interventions, and free generation under them (decoder runs):
    adds the outputs to `c`, returns the generation inputs by name and the Generate button by action name."""
    gr.Markdown("### The model's answer")
    c["weights_note"] = gr.Markdown(elem_id="answer-weights-note")
    with gr.Row():
        for name, label in (("answer", "Intact model"), ("ablated", "With interventions")):
            with gr.Column(min_width=300):
                c[f"{name}_note"] = gr.Markdown(elem_id=f"{name}-summary")
                c[name] = gr.Dataframe(label=label, interactive=False, visible=False, max_height=360,
                                       elem_id=f"{name}-table")
    with gr.Column(visible=False) as c["gen_col"]:
        with gr.Row():
            gen = {"prompt": gr.Textbox(label="Prompt", placeholder="e.g. 5 9 2 7 5 9", max_lines=1,
                                        max_length=MAX_TEXT, scale=3, min_width=240, elem_id="generate-prompt"),
                   "temperature": gr.Slider(0, 2, value=0, step=0.05, label="Temperature (0 = greedy)",
                                            min_width=200, elem_id="generate-temperature"),
                   "n_tokens": gr.Slider(1, 200, value=20, step=1, label="Tokens to generate", min_width=200,
                                         elem_id="generate-n"),
                   "seed": gr.Number(None, label="Sample seed", precision=0, minimum=0, min_width=140,
                                     elem_id="generate-seed", info="empty: a new sample each click")}
            button = gr.Button("Generate", min_width=120, elem_id="generate-btn")
        c["gen_out"] = gr.Textbox(label="Generated (after the prompt)", interactive=False, lines=2,
                                  elem_id="generate-output")
        c["gen_note"] = gr.Markdown(elem_id="generate-seed-note")  # the seed used, to get the sample again
    return gen, {"generate": button}


def interventions_section(c: dict[str, Any]) -> dict[str, gr.Button]:
    """The intervention controls, Apply and Reset, the held-out metrics and the attention under them: adds
    the outputs to `c`, returns the buttons by action name."""
    gr.Markdown("### Interventions\nCompose them, then **Apply**. They act on the weights named above, at "
                "inference (hooks on the model; the stored weights never change).")
    with gr.Row():
        c["heads"] = gr.CheckboxGroup([], label="Heads to knock out (layer.head)", scale=3, min_width=300,
                                      elem_id="intervene-heads")
        c["mode"] = gr.Radio(list(MODES), value="zero", label="Knockout", min_width=200, elem_id="intervene-mode",
                             info="zero: the head outputs 0; mean: its mean over held-out data")
    with gr.Row():
        c["skip_ff"] = gr.CheckboxGroup([], label="Skip feed-forward (layers)", min_width=200,
                                        elem_id="intervene-skip-ff")
        c["skip_block"] = gr.CheckboxGroup([], label="Skip block (layers)", min_width=200,
                                           elem_id="intervene-skip-block")
        c["positional"] = gr.Radio(POSITIONAL, value="intact", label="Positional encoding", min_width=240,
                                   elem_id="intervene-pos", info=POSITIONAL_INFO)
    with gr.Row():
        buttons = {"apply": gr.Button("Apply", variant="primary", elem_id="intervene-apply"),
                   "reset": gr.Button("Reset", elem_id="intervene-reset")}
    c["applied_note"] = gr.Markdown(elem_id="intervene-note")
    c["metrics"] = gr.Dataframe(label="Held-out metrics", interactive=False, visible=False, elem_id="intervene-metrics")
    for k in KINDS:  # the figures carry their own titles
        c[f"attn_{k}"] = gr.Plot(show_label=False, visible=False, elem_id=f"ablated-attn-{k}")
    return buttons


def importance_and_lens_section(c: dict[str, Any]) -> dict[str, gr.Button]:
    """The head importance grid (a click on a cell knocks that head out) and the logit lens: adds the
    outputs to `c`, returns the importance button by action name."""
    gr.Markdown("### Head importance")
    button = c["importance_btn"] = gr.Button("Compute head importance", elem_id="importance-btn")
    c["grid_note"] = gr.Markdown(elem_id="importance-sentence")
    c["grid"] = gr.Dataframe(label="Head importance (click a cell to knock that head out)", interactive=False,
                             visible=False, elem_id="importance-grid")
    gr.Markdown("### Logit lens")
    c["lens_note"] = gr.Markdown(elem_id="lens-note")
    c["lens"] = gr.Plot(show_label=False, visible=False, elem_id="logit-lens")
    return {"importance": button}


def write_actions(action: gr.Textbox, page: dict[str, Any], buttons: dict[str, gr.Button],
                  grid: gr.Dataframe) -> None:
    """Inspect's controls above the panel, the panel's buttons and a click on an importance cell write their
    action into the panel's box (ui/inspect/actions.py)."""
    write_on(action, {"run": page["run_id"].change, "source": page["source"].input, "text": page["text"].submit}
             | {name: b.click for name, b in buttons.items()}, "action")
    write_cell_on(grid, action, "cell", "importance_cell")


def wire_panel(ctx: AppContext, cache: MapCache, action: gr.Textbox, c: dict[str, Any],
               page: dict[str, Any]) -> None:
    """The panel's one drawing event (`panel_update`, from the box) and the API's endpoints, which take
    everything explicitly (no trigger on the page). `page`: Inspect's controls and the generation inputs."""
    @errors_as_messages
    def update(asked: Any, shown: Any, run_id: Any, source: Any, text: Any, heads: Any, mode: Any, skip_ff: Any,
               skip_block: Any, positional: Any, prompt: Any, temperature: Any, n_tokens: Any, step: Any,
               seed: Any = None):
        trigger, cell = parse_action(asked)
        out = panel_update(ctx, cache, trigger, shown, run_id, source, text, heads, mode, skip_ff, skip_block,
                           positional, prompt, temperature, n_tokens, cell, step, seed)
        return {c[k]: v for k, v in out.items()}

    by_name = page | c
    inputs = [by_name[k] for k in ("shown", "run_id", "source", "text", "heads", "mode", "skip_ff", "skip_block",
                                   "positional", "prompt", "temperature", "n_tokens", "step", "seed")]
    draw_from(action, update, inputs, list(c.values()), "intervene_view",
              [c["answer"], c["metrics"], c["grid"], c["lens"], c["gen_out"]])
    for name, (params, outs) in API.items():  # API only: no trigger on the page
        fn = errors_as_messages(lambda *a, n=name: api_call(ctx, cache, n, *a))
        gr.on([], with_api_params(fn, params), inputs=[by_name[p] for p in params], outputs=[c[o] for o in outs],
              api_name=name, preprocess=False)
