"""The Inspect tab's layout and events: the run picker, probe and step controls, the attention heatmaps,
the interventions panel, and the positional encodings of two runs side by side (views in ui/inspect/attention.py).

Every control writes what it asked into one hidden action box, in the browser, and one event draws from
that box. Gradio (6.x) runs an `always_last` event that is triggered while it runs once more when it
ends, but it does so by dispatching the *first* trigger's event again, to every listener of that event:
two such listeners on one control (the heatmaps and the positional panel both on the run picker) re-ran
each other for ever, and the re-run carried the first trigger's event data. So each control's event has
one listener that runs on the server, and the handler reads no event data: it reads the box, and which
run the page shows (a state), so a run change merged into a later action is still drawn as a new run.
tests/test_event_wiring.py checks the rule for every event of the app.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import gradio as gr

from lab.views.analysis import MAX_PROBE_CHARS
from lab.views.plots import KIND_TITLES
from ui.common import AppContext, errors_as_messages, kept, with_api_params
from ui.inspect.attention import (KINDS, SOURCES, TYPED_LABEL, Drawn, Shown, attention_figures,
                        attention_view, positional_panel, run_choices, run_label, step_slider, typed_note)
from ui.inspect.circuits import build_circuits_panel
from ui.inspect.interventions import build_intervene_panel

ACTIONS = ("run", "source", "text", "step")  # the controls that redraw the heatmaps, as the action box names them


@dataclass(frozen=True)
class PageView(Shown):
    """What one action redraws: the heatmaps and their controls (Shown), and the run now shown."""
    shown: Any = kept()


def page_view(ctx: AppContext, action: Any, shown: Any, run_id: Any, source: Any, text: Any, step: Any) -> tuple:
    """The page's answer to the last action (`action`: "<control> <random>"; `shown`: the run the heatmaps
    show). A run other than the one shown is drawn as a run change, whatever the action says."""
    trigger = str(action or "").split(" ")[0]
    trigger = "run" if run_id != shown else (trigger if trigger in ACTIONS else "")
    out = attention_view(ctx, run_id, source, text, step, trigger)
    return PageView(**{f.name: v for f, v in zip(fields(Shown), out)}, shown=run_id).values()


def side_a(ctx: AppContext, run_id: Any, shown: Any) -> tuple:
    """Run A's name and positional panel, and the run they show: redrawn only when the run changed."""
    if run_id == shown:
        return (gr.skip(),) * 5
    return (run_label(ctx, run_id), *positional_panel(ctx, run_id, "A"), run_id)


def build_inspect_tab(ctx: AppContext) -> gr.Tab:
    with gr.Tab("Inspect", id="inspect") as tab:
        with gr.Row():  # min widths: on a phone each control gets a line of its own
            run = gr.Dropdown([], label="Run", scale=3, min_width=300, elem_id="inspect-run", allow_custom_value=True)
            source = gr.Radio(list(SOURCES), value="sampled", label="Probe input", scale=1, min_width=160,
                              elem_id="inspect-source")
            with gr.Column(scale=2, min_width=240):
                text = gr.Textbox(label=TYPED_LABEL, placeholder="e.g. 3 1 4 1 5, then Enter", max_lines=1,
                                  max_length=MAX_PROBE_CHARS, elem_id="inspect-text")
                note = gr.Markdown(elem_id="inspect-text-note")  # beside the box it speaks of
        step = gr.Slider(0, 1_000_000, value=0, step=1, label="Training step", elem_id="inspect-step")  # per run
        caption = gr.Markdown(elem_id="inspect-caption")
        # the figures carry their own titles: a label above them would repeat (and cover) them
        plots = [gr.Plot(label=KIND_TITLES[k], show_label=False, visible=False, elem_id=f"attn-{k}") for k in KINDS]
        action = gr.Textbox(visible=False, elem_id="inspect-action")  # what the last change asked
        shown = gr.State(None)  # the run whose heatmaps the page shows
        shown_a = gr.State(None)  # the run whose positional panel (side A) the page shows
        build_intervene_panel(ctx, run, source, text, step)  # the answer, interventions, head importance, logit lens
        build_circuits_panel(ctx, run, step)  # head roles over training, activation patching
        gr.Markdown("### Positional encodings, side by side")
        with gr.Row():
            sides = []
            for side in ("A", "B"):
                with gr.Column(min_width=300):  # a side's picker above its figures (stacked on a phone)
                    if side == "A":
                        pick = run
                        a_label = gr.Textbox(label="A: the run chosen above", interactive=False,
                                             elem_id="inspect-run-a")
                    else:
                        pick = gr.Dropdown([], label="B: compare with run", elem_id="inspect-run-b",
                                           allow_custom_value=True)
                    pca = gr.Plot(label=f"PCA of position vectors ({side})", show_label=False, visible=False,
                                  elem_id=f"pca-{side}")
                    fig = gr.Plot(label=f"Similarity / relative pattern ({side})", show_label=False,
                                  elem_id=f"pe-fig-{side}")
                    side_note = gr.Markdown(elem_id=f"pe-note-{side}")
                    sides.append((pick, side, pca, fig, side_note))
        run_b = sides[1][0]

    @errors_as_messages
    def on_tab():
        """The runs to pick from, the newest picked, and its step slider: never a placeholder under a run (the
        interventions panel reads the slider, and may be asked before the heatmaps are drawn)."""
        ch = run_choices(ctx)
        first = ch[0][1] if ch else None
        return (gr.Dropdown(choices=ch, value=first), gr.Dropdown(choices=ch, value=ch[1][1] if len(ch) > 1 else first),
                step_slider(ctx, first) if first else gr.skip())

    tab.select(on_tab, outputs=[run, run_b, step], api_name="inspect_runs")
    att_inputs = [run, source, text, step]
    figures = dict(zip(KINDS, plots))
    for name, trigger in zip(ACTIONS, (run.change, source.input, text.submit, step.release)):
        if name == "text":  # Enter in a box with something typed picks the typed probe, at once (as the views do)
            gr.on([trigger], None, [text, source], [action, source], show_progress="hidden", api_name="inspect_text",
                  js="(text, source) => ['text ' + Math.random(), String(text || '').trim() ? 'typed' : source]")
        else:
            gr.on([trigger], None, None, action, js=f"() => '{name} ' + Math.random()", api_name=f"inspect_{name}",
                  show_progress="hidden")
    # preprocess=False: the Radio's and Slider's own checks would refuse a bad value with a message naming no
    # field; checked_inputs names it (raw values of these widgets are what the callbacks expect anyway)
    _, _, pca_a, fig_a, note_a = sides[0]
    drawn = action.change(errors_as_messages(lambda *a: page_view(ctx, *a)), inputs=[action, shown, *att_inputs],
                          outputs=PageView.wired(**figures, caption=caption, note=note, step=step, source=source,
                                                 shown=shown),
                          api_name="inspect_view", trigger_mode="always_last", preprocess=False,
                          show_progress_on=plots + [caption])
    # then side A, once the heatmaps are drawn (a chained event is re-run by itself alone)
    drawn.then(errors_as_messages(lambda *a: side_a(ctx, *a)), inputs=[run, shown_a],
               outputs=[a_label, pca_a, fig_a, note_a, shown_a], api_name="inspect_side_a",
               trigger_mode="always_last", preprocess=False)
    # the note follows the box as it changes (typed or pasted): it goes as soon as the input is fixed
    text.change(with_api_params(errors_as_messages(lambda *a: typed_note(ctx, *a)), ["run_id", "source", "text"]),
                inputs=[run, source, text], outputs=note, api_name="check_typed_input", trigger_mode="always_last",
                preprocess=False, show_progress="hidden")
    wire_api(ctx, att_inputs, figures, caption, note, step, source, a_label, sides)
    pick_b, side_b, pca_b, fig_b, note_b = sides[1]
    pick_b.change(with_api_params(errors_as_messages(lambda r: positional_panel(ctx, r, "B")), ["run_id"]),
                  inputs=pick_b, outputs=[pca_b, fig_b, note_b], api_name="positional_b")
    return tab


def wire_api(ctx: AppContext, att_inputs: list, figures: dict, caption, note, step, source, a_label, sides) -> None:
    """Endpoints for API clients only (no trigger on the page): the heatmaps after a change, the slider's
    snapshots, attention that refuses a bad input, a run's name and its positional panel."""
    run = att_inputs[0]
    gr.on([], with_api_params(errors_as_messages(lambda *a: attention_view(ctx, *a)),
                              ["run_id", "source", "text", "step"]),
          inputs=att_inputs, outputs=Shown.wired(**figures, caption=caption, note=note, step=step, source=source),
          api_name="attention_view", preprocess=False)
    gr.on([], with_api_params(errors_as_messages(lambda r: step_slider(ctx, r)), ["run_id"]), inputs=run,
          outputs=step, api_name="snapshot_steps")
    draw = with_api_params(errors_as_messages(lambda *a: attention_figures(ctx, *a)),
                           ["run_id", "source", "text", "step"])
    for name in ("attention_for_run", "attention"):
        gr.on([], draw, inputs=att_inputs, outputs=Drawn.wired(**figures, caption=caption), api_name=name,
              preprocess=False)
    gr.on([], with_api_params(errors_as_messages(lambda r: run_label(ctx, r)), ["run_id"]), inputs=run,
          outputs=a_label, api_name="run_label", show_progress="hidden")
    _, _, pca, fig, side_note = sides[0]
    gr.on([], with_api_params(errors_as_messages(lambda r: positional_panel(ctx, r, "A")), ["run_id"]),
          inputs=run, outputs=[pca, fig, side_note], api_name="positional_a")
