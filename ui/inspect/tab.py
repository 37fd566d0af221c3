"""The Inspect tab's layout and events: the run picker, probe and step controls, the attention heatmaps,
the interventions panel, and the positional encodings of two runs side by side (views in ui/inspect/attention.py).

Its controls redraw the heatmaps through an action box, as ui/inspect/actions.py explains; the panels below
(interventions, circuits) and side A's positional panel follow once the heatmaps are drawn, at the step the
heatmaps set, so that every panel reads one step. The endpoints for scripts (`/attention`,
`/positional_a`, ...) take everything explicitly and have no trigger on the page.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import gradio as gr

from lab.views.analysis import MAX_PROBE_CHARS
from lab.views.plots import KIND_TITLES
from ui.common import PRIVATE, AppContext, errors_as_messages, kept, with_api_params
from ui.inspect.actions import action_box, draw_from, read, stamp, write_on
from ui.inspect.attention import (KINDS, SOURCES, TYPED_LABEL, Drawn, Shown, attention_figures,
                                  attention_view, positional_panel, run_choices, run_label, step_slider, typed_note)
from ui.inspect.circuits import build_circuits_panel
from ui.inspect.interventions import build_intervene_panel
from ui.projector import section

ACTIONS = ("run", "source", "text", "step")
# Every way of setting the Training step ends in the slider's one `release` event, which the heatmaps answer
# (the panels below follow the step they set: `wire_views`). Gradio 6.31 sends `release` on a pointer-up (a drag, a click on the track) and when its number box
# loses focus (Tab), but not for Enter in the box or for the keyboard on the slider: here Enter leaves the box
# (as Tab does), and an arrow or Page key moves to the next or previous snapshot (the steps the label lists:
# the slider holds any step, the panels draw the nearest snapshot) and releases, as Home and End do. Play
# (the button beside the slider) steps through the snapshots that way, each shown by every panel for PLAY_MS.
PLAY_MS = 1500
STEP_KEYS_JS = """(() => {
  const PLAY_MS = %d;
  const MOVES = {ArrowRight: 1, ArrowUp: 1, PageUp: 1, ArrowLeft: -1, ArrowDown: -1, PageDown: -1};
  const mine = (e) => e.target instanceof HTMLInputElement && e.target.closest('#inspect-step') ? e.target : null;
  const release = (el) => el.dispatchEvent(new PointerEvent('pointerup', {bubbles: true}));
  const snapshots = (el) => {
    const label = el.closest('#inspect-step').querySelector('label');
    return ((label ? label.innerText : '').split(':')[1] || '').match(/\\d+/g)?.map(Number) || [];
  };
  document.addEventListener('keydown', (e) => {
    const el = mine(e);
    if (!el) return;
    if (el.type === 'number' && e.key === 'Enter') { el.blur(); return; }
    if (el.type !== 'range' || !(e.key in MOVES)) return;
    e.preventDefault();
    const v = Number(el.value), steps = snapshots(el);
    const next = MOVES[e.key] > 0 ? steps.find((s) => s > v) : steps.reverse().find((s) => s < v);
    if (next === undefined) return;
    el.value = String(next);
    el.dispatchEvent(new Event('input', {bubbles: true}));
    release(el);
  }, true);
  document.addEventListener('keyup', (e) => {
    const el = mine(e);
    if (el && el.type === 'range' && (e.key === 'Home' || e.key === 'End')) release(el);
  }, true);
  // Play: the next snapshot PLAY_MS after every panel that stated a step when it moved states this one (a panel
  // busy redrawing states none for a moment: it is waited for); a slow server slows the animation, it never
  // skips a snapshot. From the first snapshot when at the last.
  let playing = null, shownAt = 0, stating = [];
  const PANELS = ['#inspect-caption', '#answer-weights-note', '#lens-note', '#circuits-roles-note'];
  const stated = (sel) => {
    const m = (document.querySelector(sel)?.innerText || '').match(/step (\\d+)/i);
    return m ? Number(m[1]) : null;
  };
  const drawn = (v) => stating.every((sel) => stated(sel) === v);
  const stepTo = (el, next) => {
    stating = PANELS.filter((sel) => stated(sel) !== null);
    el.value = String(next);
    el.dispatchEvent(new Event('input', {bubbles: true}));
    release(el);
    shownAt = 0;
  };
  const button = (text) => { const b = document.querySelector('#inspect-play'); if (b) b.textContent = text; };
  const stop = () => { clearInterval(playing); playing = null; button('▶ Play'); };
  window.labPlay = () => {
    if (playing) { stop(); return; }
    const el = document.querySelector('#inspect-step input[type=range]');
    const steps = el && !el.disabled ? snapshots(el) : [];
    if (steps.length < 2) return;
    if (Number(el.value) >= steps[steps.length - 1]) stepTo(el, steps[0]);
    button('⏸ Pause');
    playing = setInterval(() => {
      const v = Number(el.value);
      if (!drawn(v)) return;
      shownAt = shownAt || Date.now();  // every panel shows this snapshot from now: it stays PLAY_MS
      if (Date.now() - shownAt < PLAY_MS) return;
      const next = snapshots(el).find((s) => s > v);
      if (next === undefined) stop(); else stepTo(el, next);
    }, 200);
  };
})();""" % PLAY_MS  # the controls that redraw the heatmaps, as the action box names them


@dataclass(frozen=True)
class PageView(Shown):
    """What one action redraws: the heatmaps and their controls (Shown), and the run now shown."""
    shown: Any = kept()


@dataclass(frozen=True)
class Side:
    """One side of the positional panel: its run picker and what it draws."""
    pick: Any
    pca: gr.Plot
    fig: gr.Plot
    note: gr.Markdown


@dataclass(frozen=True)
class Page:
    """The tab's components that its events read or write."""
    run: gr.Dropdown
    source: gr.Radio
    text: gr.Textbox
    note: gr.Markdown  # beside the Typed input box
    step: gr.Slider
    caption: gr.Markdown
    figures: dict[str, gr.Plot]
    action: gr.Textbox
    shown: gr.State  # the run whose heatmaps the page shows
    shown_a: gr.State  # the run whose positional panel (side A) the page shows
    a_label: gr.Textbox
    sides: dict[str, Side]
    followers: tuple[gr.Textbox, ...]  # the action boxes of the panels below, which read the step the heatmaps set

    @property
    def probe(self) -> list:
        """The inputs of every attention view: run, probe input, typed text, step."""
        return [self.run, self.source, self.text, self.step]

    def shown_outputs(self, view: type = Shown, **more: Any) -> list:
        """The outputs of a view of the heatmaps and their controls (`view`: Shown or one of its kind)."""
        return view.wired(**self.figures, caption=self.caption, note=self.note, step=self.step, source=self.source,
                          **more)


def page_view(ctx: AppContext, action: Any, shown: Any, run_id: Any, source: Any, text: Any, step: Any) -> tuple:
    """The page's answer to the last action (`action`: "<control> <random>"; `shown`: the run the heatmaps
    show). A run other than the one shown is drawn as a run change, whatever the action says."""
    trigger = "run" if run_id != shown else read(action, ACTIONS)[0]
    out = attention_view(ctx, run_id, source, text, step, trigger)
    return PageView(**{f.name: v for f, v in zip(fields(Shown), out)}, shown=run_id).values()


def side_a(ctx: AppContext, run_id: Any, shown: Any) -> tuple:
    """Run A's name and positional panel, and the run they show: redrawn only when the run changed."""
    if run_id == shown:
        return (gr.skip(),) * 5
    return (run_label(ctx, run_id), *positional_panel(ctx, run_id, "A"), run_id)


def tab_runs(ctx: AppContext) -> tuple:
    """The runs to pick from, the newest picked, and its step slider: never a placeholder under a run (the
    interventions panel reads the slider, and may be asked before the heatmaps are drawn)."""
    ch = run_choices(ctx)
    first = ch[0][1] if ch else None
    return (gr.Dropdown(choices=ch, value=first), gr.Dropdown(choices=ch, value=ch[1][1] if len(ch) > 1 else first),
            step_slider(ctx, first) if first else gr.skip())


def probe_controls() -> tuple[gr.Dropdown, gr.Radio, gr.Textbox, gr.Markdown]:
    """The run picker, the probe input, the Typed input box and the note beside it, in one row."""
    with gr.Row():  # min widths: on a phone each control gets a line of its own
        run = gr.Dropdown([], label="Run", scale=3, min_width=300, elem_id="inspect-run", allow_custom_value=True)
        source = gr.Radio(list(SOURCES), value="sampled", label="Probe input", scale=1, min_width=160,
                          elem_id="inspect-source")
        with gr.Column(scale=2, min_width=240):
            text = gr.Textbox(label=TYPED_LABEL, placeholder="e.g. 3 1 4 1 5, then Enter", max_lines=1,
                              max_length=MAX_PROBE_CHARS, elem_id="inspect-text")
            note = gr.Markdown(elem_id="inspect-text-note")  # beside the box it speaks of
    return run, source, text, note


def positional_sides(run: gr.Dropdown) -> tuple[gr.Textbox, dict[str, Side]]:
    """The positional encodings of run A (the run picked above: its name) and of run B (its own picker)."""
    sides = {}
    with gr.Row():
        for side in ("A", "B"):
            with gr.Column(min_width=300):  # a side's picker above its figures (stacked on a phone)
                if side == "A":
                    pick = run
                    a_label = gr.Textbox(label="A: the run chosen above", interactive=False, elem_id="inspect-run-a")
                else:
                    pick = gr.Dropdown([], label="B: compare with run", elem_id="inspect-run-b",
                                       allow_custom_value=True)
                pca = gr.Plot(label=f"PCA of position vectors ({side})", show_label=False, visible=False,
                              elem_id=f"pca-{side}")
                fig = gr.Plot(label=f"Similarity / relative pattern ({side})", show_label=False,
                              elem_id=f"pe-fig-{side}")
                sides[side] = Side(pick, pca, fig, gr.Markdown(elem_id=f"pe-note-{side}"))
    return a_label, sides


def build_inspect_tab(ctx: AppContext) -> gr.Tab:
    with gr.Tab("Inspect", id="inspect") as tab:
        run, source, text, note = probe_controls()
        with gr.Row(equal_height=True):
            step = gr.Slider(0, 1_000_000, value=0, step=1, label="Training step", elem_id="inspect-step",
                             scale=8, min_width=320)  # per run; on a phone, Play goes under it
            play = gr.Button("▶ Play", elem_id="inspect-play", scale=0, min_width=110)
        caption = gr.Markdown(elem_id="inspect-caption")
        # the figures carry their own titles: a label above them would repeat (and cover) them
        figures = {k: gr.Plot(label=KIND_TITLES[k], show_label=False, visible=False, elem_id=f"attn-{k}")
                   for k in KINDS}
        action = action_box("inspect-action")
        shown, shown_a = gr.State(None), gr.State(None)
        # the panels under the heatmaps, in sections a reader folds (projector mode folds them: ui/projector.py)
        with section("The answer, interventions, head importance and logit lens", "inspect-sec-answer"):
            answer = build_intervene_panel(ctx, run, source, text, step)
        with section("Circuits: head roles over training, activation patching", "inspect-sec-circuits"):
            circuits = build_circuits_panel(ctx, run, source, step)
        with section("Positional encodings, side by side", "inspect-sec-positions"):
            a_label, sides = positional_sides(run)
        followers = (answer, circuits)
    page = Page(run, source, text, note, step, caption, figures, action, shown, shown_a, a_label, sides, followers)
    tab.select(errors_as_messages(lambda: tab_runs(ctx)), outputs=[run, sides["B"].pick, step], api_name="inspect_runs")
    # in the browser only: it moves the slider as the arrow keys do (STEP_KEYS_JS), so every panel follows
    play.click(None, js="() => { window.labPlay && window.labPlay(); }", api_name="inspect_play", api_visibility=PRIVATE,
               queue=False)
    write_actions(page)
    wire_views(ctx, page)
    wire_api(ctx, page)
    return tab


def write_actions(page: Page) -> None:
    """The controls that redraw the heatmaps write their action into the box (ui/inspect/actions.py)."""
    write_on(page.action, {"run": page.run.change, "source": page.source.input, "step": page.step.release},
             "inspect")
    # Enter in a box with something typed picks the typed probe, at once (as the views do)
    page.text.submit(None, [page.text, page.source], [page.action, page.source], api_name="inspect_text",
                     js=f"(text, source) => [{stamp('text')}, String(text || '').trim() ? 'typed' : source]",
                     show_progress="hidden", api_visibility=PRIVATE)


def wire_views(ctx: AppContext, page: Page) -> None:
    """The page's server events: the heatmaps from the action box, then side A; the note beside the Typed
    input box; side B from its picker."""
    plots = list(page.figures.values())
    drawn = draw_from(page.action, errors_as_messages(lambda *a: page_view(ctx, *a)), [page.shown, *page.probe],
                      page.shown_outputs(PageView, shown=page.shown), "inspect_view", plots + [page.caption])
    # then the panels below: the step they read is the one the heatmaps have just set and shown (the snapshot
    # nearest the value asked, or the run's last on a run change), so every panel shows one step
    drawn.then(None, None, list(page.followers), js=f"() => [{', '.join(stamp('drawn') for _ in page.followers)}]",
               api_name="inspect_drawn", show_progress="hidden", api_visibility=PRIVATE)
    a = page.sides["A"]  # then side A, once the heatmaps are drawn (a chained event is re-run by itself alone)
    drawn.then(errors_as_messages(lambda *args: side_a(ctx, *args)), inputs=[page.run, page.shown_a],
               outputs=[page.a_label, a.pca, a.fig, a.note, page.shown_a], api_name="inspect_side_a",
               trigger_mode="always_last", preprocess=False, api_visibility=PRIVATE)
    # the note follows the box as it changes (typed or pasted): it goes as soon as the input is fixed
    page.text.change(errors_as_messages(lambda *a: typed_note(ctx, *a)), inputs=[page.run, page.source, page.text],
                     outputs=page.note, api_name="check_typed_input", trigger_mode="always_last", preprocess=False,
                     show_progress="hidden", api_visibility=PRIVATE)
    b = page.sides["B"]
    b.pick.change(with_api_params(errors_as_messages(lambda r: positional_panel(ctx, r, "B")), ["run_id"]),
                  inputs=b.pick, outputs=[b.pca, b.fig, b.note], api_name="positional_b")


def wire_api(ctx: AppContext, page: Page) -> None:
    """Endpoints for API clients only (no trigger on the page): the heatmaps after a change, the slider's
    snapshots, attention that refuses a bad input, and a run's positional panel (side A)."""
    run, params = page.run, ["run_id", "source", "text", "step"]
    gr.on([], with_api_params(errors_as_messages(lambda *a: attention_view(ctx, *a)), params), inputs=page.probe,
          outputs=page.shown_outputs(), api_name="attention_view", preprocess=False)
    gr.on([], with_api_params(errors_as_messages(lambda r: step_slider(ctx, r)), ["run_id"]), inputs=run,
          outputs=page.step, api_name="snapshot_steps")
    draw = with_api_params(errors_as_messages(lambda *a: attention_figures(ctx, *a)), params)
    for name in ("attention_for_run", "attention"):
        gr.on([], draw, inputs=page.probe, outputs=Drawn.wired(**page.figures, caption=page.caption), api_name=name,
              preprocess=False)
    a = page.sides["A"]
    gr.on([], with_api_params(errors_as_messages(lambda r: positional_panel(ctx, r, "A")), ["run_id"]),
          inputs=run, outputs=[a.pca, a.fig, a.note], api_name="positional_a")
