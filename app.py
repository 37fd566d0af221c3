"""Transformer Ablation Lab: the Gradio app (UI only; everything else lives in lab/).

`python app.py` starts it locally; on a Hugging Face Space the same file is the entry point.
`build_demo()` builds the page without launching it, so tests can import it.
"""
from __future__ import annotations

import os
from typing import Optional

import gradio as gr

from lab.jobs import JobManager
from lab.runs import RunStore
from ui.common import AppContext
from ui.compare import build_compare_tab
from ui.inspect import build_inspect_tab
from ui.train import build_train_tab

TITLE = "Transformer Ablation Lab"
CSS = """
#config-summary {min-height: 3em}
footer {display: none !important}
"""


def build_demo(store: Optional[RunStore] = None, jobs: Optional[JobManager] = None) -> gr.Blocks:
    store = store or RunStore()
    ctx = AppContext(store=store, jobs=jobs or JobManager(store))
    with gr.Blocks(title=TITLE) as demo:
        gr.Markdown(f"# {TITLE}\nTrain a small Transformer on a toy task in seconds, then see *why* each design "
                    "choice matters by comparing runs side by side.")
        my_runs = gr.BrowserState([], storage_key="lab-my-runs")
        owner = gr.BrowserState("", storage_key="lab-owner")
        with gr.Tabs(elem_id="tabs"):
            train = build_train_tab(ctx, my_runs, owner)
            build_compare_tab(ctx)
            build_inspect_tab(ctx)
        demo.load(train.on_load, inputs=train.load_inputs, outputs=train.load_outputs, api_name="load")
    demo.queue(default_concurrency_limit=8)
    demo.lab_context = ctx  # for tests and the launcher; not read by callbacks
    return demo


def main() -> None:
    demo = build_demo()
    demo.launch(
        server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
        server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
        css=CSS,
        theme=gr.themes.Soft(),
        run_history=False,
    )


if __name__ == "__main__":
    main()
