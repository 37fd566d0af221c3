"""Inspect's intervention panel (issue 15), for the run and probe input picked above it: the model's answer
token by token (and free generation for decoder runs); interventions applied on a button, with their effect
on the held-out metrics, the answer and the attention; the head importance map (a click on a cell knocks
that head out); the logit lens. It runs on the weights at the Training step slider's step with the sampled
probe (the attention snapshots keep the weights of models up to 1M parameters, in float16), else on the
run's final weights.

One page event draws every panel (`panel_update`) from the action the last click or change wrote, so its
draws apply in order, and the panels remember the run and input they show (a gr.State): an event that finds
another run picked redraws every panel for it and applies nothing made with the previous run's controls, so
no panel can keep another run's data. What each
part shows is in ui/inspect/intervention_views.py; the API's endpoints (`/answer`, `/intervene`, `/importance`,
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
from ui.inspect.intervention_views import (API, KINDS, MAX_TEXT, MODES, POSITIONAL, SEE_NOTE, MapCache, ablated_parts,
                                answer_parts, api_call, cleared, cleared_ablated, compute_maps, controls, final_model,
                                generated_text, importance_parts, lens_parts, page_probe, spec_from, table)

TRIGGERS = ("run", "source", "text", "step", "apply", "reset", "importance", "cell", "generate")
WEIGHTS_NOTE = ("Final weights (step {step}): the answer, interventions, head importance and logit lens use the "
                "run's final weights. Move the Training step slider (sampled probe) to use the weights kept with "
                "an earlier attention snapshot.")
MAX_SEED = 2**32 - 1  # the Sample seed box's largest value; a seed drawn for a click is below 1,000,000 (short to type)
STEP_NOTE = ("Weights at step {step} (kept with the attention snapshot, in float16): the answer, interventions, "
             "head importance and logit lens use the model as it was then.")


def parse_action(action: Any) -> tuple[str, Optional[tuple[str, str]]]:
    """The action box's value -> (trigger, the importance cell clicked or None): "apply 0.42" is Apply,
    "cell 0.42\nlayer 1\nhead 0" a click on that cell (the number makes every click a change)."""
    lines = str(action or "").split("\n")
    trigger = lines[0].split(" ")[0]
    return (trigger if trigger in TRIGGERS else ""), ((lines[1], lines[2]) if len(lines) == 3 else None)


def cell_action(evt: gr.SelectData) -> Any:
    """The action of a click on an importance grid cell: its row's label and its column's header."""
    index, row = evt.index, evt.row_value
    if not (isinstance(index, (list, tuple)) and len(index) == 2 and isinstance(row, list) and row):
        return gr.skip()
    return f"cell {random.random()}\n{row[0]}\nhead {int(index[1]) - 1}"


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
    # on a new run the slider may still hold the previous run's step: the final weights then
    want = None if fresh or source == "typed" else step
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
        out |= {"weights_note": note} | answer | lens_parts(cfg, model, probe)
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
                          step: gr.Slider) -> None:
    """The panel, under Inspect's attention: it follows the run, probe input and training step picked there."""
    cache, c = MapCache(), {}  # c: output name -> component
    c["shown"] = gr.State("")
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
            prompt = gr.Textbox(label="Prompt", placeholder="e.g. 5 9 2 7 5 9", max_lines=1, max_length=MAX_TEXT,
                                scale=3, min_width=240, elem_id="generate-prompt")
            temperature = gr.Slider(0, 2, value=0, step=0.05, label="Temperature (0 = greedy)", min_width=200,
                                    elem_id="generate-temperature")
            n_tokens = gr.Slider(1, 200, value=20, step=1, label="Tokens to generate", min_width=200,
                                 elem_id="generate-n")
            seed = gr.Number(None, label="Sample seed", precision=0, minimum=0, min_width=140, elem_id="generate-seed",
                             info="empty: a new sample each click")
            gen_btn = gr.Button("Generate", min_width=120, elem_id="generate-btn")
        c["gen_out"] = gr.Textbox(label="Generated (after the prompt)", interactive=False, lines=2,
                                  elem_id="generate-output")
        c["gen_note"] = gr.Markdown(elem_id="generate-seed-note")  # the seed used, to get the sample again
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
                                   elem_id="intervene-pos")
    with gr.Row():
        apply_btn = gr.Button("Apply", variant="primary", elem_id="intervene-apply")
        reset_btn = gr.Button("Reset", elem_id="intervene-reset")
    c["applied_note"] = gr.Markdown(elem_id="intervene-note")
    c["metrics"] = gr.Dataframe(label="Held-out metrics", interactive=False, visible=False, elem_id="intervene-metrics")
    for k in KINDS:  # the figures carry their own titles
        c[f"attn_{k}"] = gr.Plot(show_label=False, visible=False, elem_id=f"ablated-attn-{k}")
    gr.Markdown("### Head importance")
    imp_btn = gr.Button("Compute head importance", elem_id="importance-btn")
    c["grid_note"] = gr.Markdown(elem_id="importance-sentence")
    c["grid"] = gr.Dataframe(label="Head importance (click a cell to knock that head out)", interactive=False,
                             visible=False, elem_id="importance-grid")
    gr.Markdown("### Logit lens")
    c["lens_note"] = gr.Markdown(elem_id="lens-note")
    c["lens"] = gr.Plot(show_label=False, visible=False, elem_id="logit-lens")

    c["action"] = gr.Textbox(visible=False, elem_id="intervene-action")  # what the last click or change asked

    @errors_as_messages
    def update(action: Any, shown: Any, run_id: Any, source: Any, text: Any, heads: Any, mode: Any, skip_ff: Any,
               skip_block: Any, positional: Any, prompt: Any, temperature: Any, n_tokens: Any, step: Any,
               seed: Any = None):
        trigger, cell = parse_action(action)
        out = panel_update(ctx, cache, trigger, shown, run_id, source, text, heads, mode, skip_ff, skip_block,
                           positional, prompt, temperature, n_tokens, cell, step, seed)
        return {c[k]: v for k, v in out.items()}

    # Every trigger writes its action into one box (in the browser, at once), and one event draws from it, so
    # the draws apply in order. While a draw runs, later triggers are deferred to one re-run that Gradio starts
    # without their event data: the box still holds the last action, and `shown` what the panels show.
    triggers = {"run": run.change, "source": source.input, "text": text.submit, "step": step.release,
                "apply": apply_btn.click,
                "reset": reset_btn.click, "importance": imp_btn.click, "generate": gen_btn.click}
    for name, trigger in triggers.items():
        gr.on([trigger], None, None, c["action"], js=f"() => '{name} ' + Math.random()", api_name=f"action_{name}")
    c["grid"].select(cell_action, None, c["action"], api_name="importance_cell", show_progress="hidden")
    inputs = [c["action"], c["shown"], run, source, text, c["heads"], c["mode"], c["skip_ff"], c["skip_block"],
              c["positional"], prompt, temperature, n_tokens, step, seed]
    # preprocess=False: the checks name the field
    c["action"].change(update, inputs=inputs, outputs=list(c.values()), api_name="intervene_view",
                       trigger_mode="always_last", preprocess=False,
                       show_progress_on=[c["answer"], c["metrics"], c["grid"], c["lens"], c["gen_out"]])
    by_name = {"run_id": run, "source": source, "text": text, "prompt": prompt, "temperature": temperature,
               "n_tokens": n_tokens} | c
    for name, (params, outs) in API.items():  # API only: no trigger on the page
        fn = errors_as_messages(lambda *a, n=name: api_call(ctx, cache, n, *a))
        gr.on([], with_api_params(fn, params), inputs=[by_name[p] for p in params], outputs=[c[o] for o in outs],
              api_name=name, preprocess=False)
