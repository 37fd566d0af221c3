"""Transformer Ablation Lab: the Gradio app (UI only; everything else lives in lab/).

`python app.py` (the repository's entry point, which imports this module) starts it locally; on a Hugging
Face Space the same file is the entry point. `build_demo()` builds the page without launching it, so tests
and `lab.demo()` (a notebook) can import it. It lives in the ui package so that an installed copy brings no
top-level `app` module, which a notebook folder's own app.py would hide.
"""
from __future__ import annotations

import os
import sys
from typing import Optional

import gradio as gr

from lab.config import ConfigError
from lab.engine.backup import backup_dir, restore
from lab.engine.bundle import bundle_paths, load_bundles
from lab.device import set_threads
from lab.engine.environment import default_queue_size, detect
from lab.engine.jobs import SPARE_DELAY_S, JobManager
from lab.engine.limits import Limits
from lab.engine.store import RunStore
from lab.views.curve_figures import warm_up
from ui.common import PRIVATE, AppContext
from ui.compare.tab import build_compare_tab
from ui.inspect.tab import STEP_KEYS_JS, build_inspect_tab
from ui.learn import build_learn_tab
from ui.page_scripts import PAGE_CSS, PAGE_JS
from ui.projector import PROJECTOR_CSS, PROJECTOR_JS, build_projector_toggle, wire_projector_load
from ui.presets import build_presets_tab, compare_said
from ui.train import build_train_tab

TITLE = "Transformer Ablation Lab"
CSS = """
#config-summary {min-height: 3em}
/* grids a click reads (head importance, patching): the clicked cell keeps its colour and number (Gradio paints a
   selected cell's text box near-white, under white text on a dark cell) and shows no row/column buttons */
#importance-grid .cell-selected span.text, #circuits-residual .cell-selected span.text,
#circuits-heads .cell-selected span.text {background: transparent !important}
#importance-grid .selection-button, #circuits-residual .selection-button, #circuits-heads .selection-button {
  display: none !important}
footer {display: none !important}
@media (max-width: 640px) {
  /* a phone: every tab's name fits on the tab bar (none hides behind a menu), and the Train tab shows
     the summary, Start and the curves above the knobs */
  .tab-container button {padding: 6px 7px !important; font-size: 14px !important}
  #train-main {flex-direction: column-reverse !important}
  /* attention heatmaps keep a readable size and scroll sideways inside their own box; the picture starts at
     the box's left edge when wider than it (Gradio centres it with flexbox, which spills a wide picture out
     on both sides, and a box cannot be scrolled left of its start), and auto margins centre a narrower one */
  #attn-enc_self .matplotlib, #attn-dec_self .matplotlib, #attn-cross .matplotlib,
  #circuits-roles-fig .matplotlib, #circuits-cell-attn .matplotlib, #circuits-fourier .matplotlib {
    overflow-x: auto; align-items: flex-start !important}
  #attn-enc_self img, #attn-dec_self img, #attn-cross img, #circuits-roles-fig img, #circuits-cell-attn img,
  #circuits-fourier img {
    max-width: none !important; width: 640px !important; margin: 0 auto; flex-shrink: 0}
  /* a preset's result table (Table 3's five columns) scrolls sideways in its card, words whole (squeezed into
     390 px, its cells broke words into single letters) */
  [id^="preset-card-"] table, #compare-note table {display: block; overflow-x: auto}
  [id^="preset-card-"] td, [id^="preset-card-"] th, #compare-note td, #compare-note th {
    word-break: normal !important; overflow-wrap: normal !important; min-width: 5.5em}
}
"""


def build_demo(store: Optional[RunStore] = None, jobs: Optional[JobManager] = None,
               limits: Optional[Limits] = None) -> gr.Blocks:
    """The whole page. `limits` (default: from the environment, see lab/engine/limits.py) applies to a
    JobManager built here; a given `jobs` brings its own."""
    store = store or RunStore()
    ctx = AppContext(store=store, jobs=jobs or JobManager(store, limits=limits or Limits.from_env()))
    with gr.Blocks(title=TITLE) as demo:
        gr.Markdown(f"# {TITLE}\nTrain a small Transformer on a toy task in seconds, then see *why* each design "
                    "choice matters by comparing runs side by side.")
        projector = build_projector_toggle()
        my_runs = gr.BrowserState([], storage_key="lab-my-runs")
        owner = gr.BrowserState("", storage_key="lab-owner")
        last_preset = gr.BrowserState({}, storage_key="lab-last-preset")
        with gr.Tabs(elem_id="tabs") as tabs:
            train = build_train_tab(ctx, my_runs, owner)
            presets = build_presets_tab(ctx, last_preset)
            compare = build_compare_tab(ctx, note_source=(last_preset, compare_said))
            build_inspect_tab(ctx)
            build_learn_tab(ctx)
        train.grid.wire(tabs, compare)  # presets and the grid open Compare on their runs
        presets.wire(tabs, compare, my_runs, owner)
        wire_projector_load(demo, projector)
        demo.load(train.on_load, inputs=train.load_inputs, outputs=train.load_outputs, api_name="load")
        demo.load(presets.on_load, inputs=presets.last, outputs=[presets.status, presets.timer],
                  api_name="load_presets", api_visibility=PRIVATE)
    # an explicit size: on ZeroGPU Gradio would take max_size=1 and refuse a class ("Queue is full")
    demo.queue(default_concurrency_limit=8, max_size=default_queue_size())
    quiet_when_idle(demo)
    demo.lab_context = ctx  # for tests and the launcher; not read by callbacks
    return demo


# While no event waits, Gradio's queue looks for one every 1 ms and for progress to send every 10 ms
# (gradio/queueing.py, Queue.sleep_when_free and progress_update_sleep_when_free, on Linux): an idle server spent
# about 6% of a core on that alone, 1.2% after (benchmarks/idle_server.py), on a 2-core Space beside the training.
# Every 20 ms and 100 ms: an event waits at most 20 ms more to start, and no event here reports progress.
IDLE_POLL_S = 0.02
PROGRESS_POLL_S = 0.1


def quiet_when_idle(demo: gr.Blocks) -> None:
    """Set the queue's idle polling intervals (after `demo.queue()`; `launch()` keeps its queue)."""
    demo._queue.sleep_when_free = IDLE_POLL_S
    demo._queue.progress_update_sleep_when_free = PROGRESS_POLL_S


def blocked_paths(store: RunStore) -> list[str]:
    """Folders Gradio must never serve: the run store and the app's own source tree (unless
    Gradio's upload/cache folder lies inside one; it must stay servable)."""
    from gradio.utils import get_upload_folder, is_in_or_equal

    cache = os.path.abspath(get_upload_folder())  # where uploads and returned files live (GRADIO_TEMP_DIR)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # above ui/: the checkout (or site-packages)
    return [p for p in (str(store.root), here) if not is_in_or_equal(cache, p)]


def main() -> None:
    limits = Limits.from_env()
    store = RunStore()
    store.sweep()  # temp files and half-written folders a crashed server left behind
    backup = backup_dir()  # LAB_BACKUP_DIR: finished runs are copied there, and come back from there
    if backup is not None:
        back = restore(store, backup)  # a wiped disk (a restarted Space) gets its finished runs back
        print(f"Restored {len(back.runs)} run(s) from {backup}" + (
            f"; {len(back.incomplete)} incomplete backup(s) left for the next start" if back.incomplete else ""),
            flush=True)
    for line in load_bundles(store, bundle_paths(backup=backup)):  # LAB_BUNDLE: a lesson's runs, trained before
        print(line, flush=True)
    interrupted = store.recover()  # runs whose process died (a crashed server) are recorded as interrupted
    print(f"Running on {detect().describe()}", flush=True)  # slots, threads, batching, queue: one line
    # the server computes only small views (Inspect, Learn, interventions): one torch thread, so that on a
    # busy machine it never fights the training workers for cores (more threads made an importance map much
    # slower there, not faster); the workers set their own thread counts
    set_threads(1)
    try:
        jobs = JobManager(store, limits=limits, backup=backup)
    except ConfigError as exc:  # LAB_RAY_ADDRESS names no cluster, or Ray is not installed
        sys.exit(f"app.py: {exc}")
    if jobs.mode == "ray":
        print(f"Training on the {jobs.pool.describe()}: {jobs.max_concurrent} run(s) at once", flush=True)
    jobs.back_up(interrupted)
    jobs.warm_up(SPARE_DELAY_S)  # one worker process per training slot, started once the page is up
    demo = build_demo(store, jobs)
    warm_up()  # plotly's lazily imported modules, before any request (two at once could deadlock)
    demo.launch(server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")), **launch_options(store, limits))


def launch_options(store: RunStore, limits: Limits) -> dict:
    """What the app launches with, here and in a notebook (lab.demo()): the style sheet, the page's own scripts
    (Inspect's Training step keys: ui/inspect/tab.py; what sliders and the run picker refuse: ui/page_scripts.py)
    and the theme, and what it
    serves: only its own cache (the files it returns) and uploads, never the run store or the source; uploads
    capped (a hard wall; ui/share.py names the limit)."""
    return dict(allowed_paths=[], blocked_paths=blocked_paths(store),
                max_file_size=max(limits.max_upload_bytes, 1024 * 1024), css=CSS + PAGE_CSS + PROJECTOR_CSS,
                head=f"<script>{STEP_KEYS_JS}</script><script>{PAGE_JS}</script><script>{PROJECTOR_JS}</script>",
                theme=gr.themes.Soft(),
                run_history=False)


if __name__ == "__main__":
    main()
