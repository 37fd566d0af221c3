"""Learn tab: short pages in data-flow order, each with its formula (KaTeX) and a picture drawn live
from the selected stored run, or from a fresh untrained model of the default config.

Building the tab computes nothing: a page's picture is drawn when the tab is opened, the page
changes, or the run / probe input changes. The pages live in lab/teach/lesson_pages.py, their numbers
in lab/teach/lessons.py and their figures in lab/teach/lesson_figures.py.
"""
from __future__ import annotations

from functools import partial
from typing import Optional

import gradio as gr

from lab.config import RECURRENT, ConfigError, flatten
from lab.teach.lesson_figures import page_figure, shown_on_page
from lab.views.analysis import MAX_PROBE_CHARS
from lab.teach.lesson_pages import PAGE_KEYS, PAGES, markdown, page
from lab.teach.lessons import Subject, default_subject
from lab.teach.presets.results import run_history
from lab.engine.storefs import RunNotFoundError
from lab.views.run_labels import short_label
from ui.common import PRIVATE, AppContext, errors_as_messages, with_api_params
from ui.inspect.attention import run_choices

NO_RUN = "(untrained default model)"  # never a run id: run ids start with a letter or digit
LATEX = [{"left": "$$", "right": "$$", "display": True}, {"left": "$", "right": "$", "display": False}]


def subject_for(ctx: AppContext, run_id: Optional[str]) -> Subject:
    """The model a page explains: the run's final weights, its seeded initialisation while it has
    none yet, or the untrained default model when no run is chosen."""
    if not run_id or run_id == NO_RUN:
        return default_subject()
    cfg = ctx.store.config(run_id)  # refuses ids that are not stored runs
    label = short_label({"run_id": run_id, **flatten(cfg)})
    if cfg.model.arch in RECURRENT:
        raise ConfigError("Run", f"{label} is a recurrent run ({cfg.model.arch.upper()}): these pages explain a "
                                 "Transformer's parts (attention, positions, norms), which it has none of. Pick a "
                                 "Transformer run, or none for the untrained default model")
    try:
        weights = ctx.store.load_weights(run_id)
    except RunNotFoundError:
        return Subject(cfg, None, f"run {label}, untrained: it has no final weights yet, so this is the "
                                  f"initialisation it starts from")
    steps = (ctx.store.summary(run_id) or {}).get("steps")
    return Subject(cfg, weights, f"run {label}, its final weights" + (f" after {steps} steps" if steps else ""),
                   int(steps) if steps else None, history=partial(run_history, ctx.store, run_id))


def page_view(ctx: AppContext, key: str, run_id: Optional[str], probe: str):
    """(figure, "model shown" line, caption) for one page. Checks what an API client could send."""
    page(key)  # KeyError naming the allowed pages
    if not isinstance(probe, (str, type(None))) or len(probe or "") > MAX_PROBE_CHARS:
        raise ConfigError("probe", f"must be text of at most {MAX_PROBE_CHARS} characters")
    if not isinstance(run_id, (str, type(None))):
        raise ConfigError("run_id", f"{run_id!r} is not a run id (pick a run from the list)")
    subject = subject_for(ctx, run_id)
    fig, caption = page_figure(key, subject, probe or "")
    return fig, f"**Model shown:** {shown_on_page(key, subject)}.", caption


def neighbour(key: Optional[str], step: int) -> str:
    i = PAGE_KEYS.index(key) if key in PAGE_KEYS else 0
    return PAGE_KEYS[min(max(i + step, 0), len(PAGE_KEYS) - 1)]


def build_learn_tab(ctx: AppContext) -> gr.Tab:
    with gr.Tab("Learn", id="learn") as tab:
        gr.Markdown("How a Transformer works, one step at a time in the order data flows through it. Each "
                    "picture is computed now from the model you choose: one of your runs, or a fresh untrained "
                    "model of the default config.")
        with gr.Row():
            # min_width: on a phone the two stack, each as wide as the screen (side by side they were cut off)
            run = gr.Dropdown([(NO_RUN, NO_RUN)], value=NO_RUN, label="Model to explain", scale=3,
                              elem_id="learn-run", allow_custom_value=True, min_width=300)
            probe = gr.Textbox(label="Probe input (optional; Enter to use it)", scale=2, elem_id="learn-probe",
                               min_width=300,
                               placeholder="empty: the run's fixed probe; or symbols of its task, e.g. 3 1 4 1 5")
        pages = gr.Radio([(p.title, p.key) for p in PAGES], value=PAGES[0].key, label="Page",
                         elem_id="learn-page")
        text = gr.Markdown(markdown(PAGES[0]), latex_delimiters=LATEX, elem_id="learn-text")
        source = gr.Markdown(elem_id="learn-source")
        figure = gr.Plot(label="Picture", show_label=False, elem_id="learn-figure", format="png")
        caption = gr.Markdown(elem_id="learn-caption")
        with gr.Row():
            prev = gr.Button("← Previous page", size="sm", elem_id="learn-prev")
            nxt = gr.Button("Next page →", size="sm", elem_id="learn-next")

    @errors_as_messages
    def on_tab(current: Optional[str]):
        ch = [(NO_RUN, NO_RUN)] + run_choices(ctx)
        keep = current if current in {v for _, v in ch} else NO_RUN
        return gr.Dropdown(choices=ch, value=keep)

    draw = with_api_params(errors_as_messages(lambda *a: page_view(ctx, *a)), ["page", "run_id", "probe"])
    draw_io = dict(inputs=[pages, run, probe], outputs=[figure, source, caption])
    tab.select(on_tab, inputs=run, outputs=run, api_name="learn_runs", api_visibility=PRIVATE).then(
        draw, **draw_io, api_name="learn_open", trigger_mode="always_last", api_visibility=PRIVATE)
    pages.change(with_api_params(errors_as_messages(lambda k: markdown(page(k))), ["page"]), inputs=pages, outputs=text,
                 api_name="learn_text").then(draw, **draw_io, api_name="learn_figure", trigger_mode="always_last")
    gr.on([run.change, probe.submit], draw, **draw_io, api_name="learn_redraw", trigger_mode="always_last",
          api_visibility=PRIVATE)
    prev.click(lambda k: neighbour(k, -1), inputs=pages, outputs=pages, api_name="learn_prev", api_visibility=PRIVATE)
    nxt.click(lambda k: neighbour(k, 1), inputs=pages, outputs=pages, api_name="learn_next", api_visibility=PRIVATE)
    return tab
