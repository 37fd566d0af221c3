"""The app in a notebook: `demo()` builds the whole Gradio app on a run store, for `demo().launch()` to show
inline (the public API, docs/python-api.md). Only this module loads gradio, and only when it is called: the
app comes from ui/app.py (`build_demo`), shipped in the wheel with the ui package."""
from __future__ import annotations

import functools
from typing import Any, Optional

from lab.api.runs import PathLike
from lab.engine.store import RunStore


def demo(runs_dir: Optional[PathLike] = None) -> Any:  # a gradio.Blocks (lab/ never imports gradio itself)
    """The whole app on the run store `runs_dir`, built but not started: `demo(...).launch()` shows it in a
    notebook cell (inline) or serves it at http://127.0.0.1:7860, with `python app.py`'s settings (its style
    sheet; the run store and the source never served, uploads capped), each of which a keyword of `launch`
    overrides. Runs started in it train in worker processes; runs trained with `train` on the same folder
    appear in its Compare and Inspect tabs."""
    import importlib.util

    if importlib.util.find_spec("gradio") is None or importlib.util.find_spec("plotly") is None:
        raise ImportError("demo: the app needs its extra packages (gradio, plotly): pip install "
                          "'transformer-ablation-lab[app]' (or, in a checkout, pip install -r requirements.txt)")
    from ui.app import build_demo, launch_options  # gradio loads here, never on `import lab`
    from lab.engine.limits import Limits

    store, limits = RunStore(runs_dir), Limits.from_env()
    blocks = build_demo(store, limits=limits)
    blocks.launch = functools.partial(blocks.launch, **launch_options(store, limits))
    return blocks
