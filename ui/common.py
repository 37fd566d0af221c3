"""What every tab shares: the app context, error handling that never shows a traceback, and
the conversions from stored metrics to the long-format frames that `gr.LinePlot` draws."""
from __future__ import annotations

import functools
import inspect
import logging
from dataclasses import dataclass
from typing import Any, Callable, Optional

import gradio as gr
import pandas as pd

from lab.config import ConfigError, in_words
from lab.engine.jobs import JobManager
from lab.engine.store import RunStore

log = logging.getLogger("lab.app")
TERMINAL = ("completed", "stopped", "failed", "interrupted")


@dataclass(frozen=True)
class AppContext:
    store: RunStore
    jobs: JobManager


def errors_as_messages(fn: Callable) -> Callable:
    """Turn any exception in a callback into a one-line message (gr.Error), never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except ConfigError as exc:  # the field by its label, as the knob beside it reads
            what, message = in_words(exc)
            raise gr.Error(_one_line(ValueError(f"{what}: {message}")), print_exception=False) from None
        except (ValueError, KeyError, FileNotFoundError) as exc:
            raise gr.Error(_one_line(exc), print_exception=False) from None
        except Exception as exc:  # unexpected: log it for the operator, say it plainly to the user
            log.exception("callback %s failed", fn.__name__)
            raise gr.Error(f"Something went wrong ({type(exc).__name__}): {_one_line(exc)}",
                           print_exception=False) from None

    return wrapper


def with_api_params(fn: Callable, names: list[str]) -> Callable:
    """Give a *args callback real parameter names, so the API (gradio_client) shows them."""
    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]

    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        return fn(*args)

    wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    return wrapper


def _one_line(exc: BaseException) -> str:
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    return " ".join(text.split())[:500] or type(exc).__name__


LABEL_FORMATS: dict[str, Callable[[Any], str]] = {  # config column -> its compact form in a label
    "model.pos": str, "model.norm": lambda v: f"{v}-LN", "model.n_layers": lambda v: f"L{v}",
    "model.n_heads": lambda v: f"h{v}", "model.d_model": lambda v: f"d{v}", "train.seed": lambda v: f"s{v}",
    "model.arch": lambda v: "enc-dec" if v == "encoder-decoder" else "dec", "task.name": str,
}
MAX_LABEL_PARTS = 3  # vega cuts legend labels at ~160 px (about 25 characters)


def compact(column: str, value: Any) -> str:
    """One config value as a label part: 'rope', 'post-LN', 'L2', 's1', 'lr=0.01'."""
    fmt = LABEL_FORMATS.get(column)
    if fmt is not None:
        return fmt(value)
    if isinstance(value, float):
        value = f"{value:g}"
    return f"{column.split('.')[-1]}={value}"


def short_label(row: dict[str, Any], varied: Optional[list[str]] = None) -> str:
    """A short run label, the distinguishing part first and the run id's tail last: with `varied` (the
    config columns that differ among the runs shown together) their values ('rope s1 (a1b2c3)'); else
    the run's name; else PE, norm, layers, seed and task."""
    tail = f"({str(row['run_id'])[-6:]})"
    if varied:
        parts = [compact(c, row.get(c)) for c in varied[:MAX_LABEL_PARTS]]
        return " ".join(parts + (["…"] if len(varied) > MAX_LABEL_PARTS else []) + [tail])
    if row.get("name"):
        return f"{row['name']} {tail}"
    cols = ("model.pos", "model.norm", "model.n_layers", "train.seed", "task.name")
    arch = " enc-dec" if row.get("model.arch") == "encoder-decoder" else ""
    return " ".join(compact(c, row.get(c)) for c in cols) + f"{arch} {tail}"


CURVES = {  # metric choice -> (record kind, column)
    "train loss": ("train", "loss"),
    "eval loss": ("eval", "loss"),
    "exact-match (training lengths)": ("eval", "exact_match"),
    "exact-match (longer lengths)": ("eval", "ood_exact_match"),
    "token accuracy (training lengths)": ("eval", "token_acc"),
    "loss (longer lengths)": ("eval", "ood_loss"),
}
X_AXES = {"step": "step", "time (s)": "elapsed_s", "tokens": "tokens"}
SERIES_COLOURS = ("#4c78a8", "#f58518", "#e45756", "#72b7b2", "#54a24b", "#eeca3b", "#b279a2", "#ff9da6",
                  "#9d755d", "#bab0ac")  # vega's default categorical palette (tableau10)

# Gradio 6.31's LinePlot fixes its colour scale to the series in the value it first draws, then only
# swaps the data: a series that appears later is never drawn. It redraws from scratch when a prop
# such as color_map changes, but an update applies its props one by one with the value last, so that
# redraw still sees the old value. Hence: live plots name every series from the first poll
# (`with_series`), and Compare sends the new curves first and their colour map in a second step.


def with_series(frame: pd.DataFrame, column: str, names: tuple[str, ...], x: str) -> pd.DataFrame:
    """`frame` plus one row without a value for each series in `names` that it lacks (it draws nothing)."""
    present = set(frame[column])
    missing = [n for n in names if n not in present]
    if not missing:
        return frame
    pad = pd.DataFrame({x: [0] * len(missing), "value": [float("nan")] * len(missing), column: missing})
    return pd.concat([frame, pad], ignore_index=True)


def colour_map(names: list[str]) -> dict[str, str]:
    return {n: SERIES_COLOURS[i % len(SERIES_COLOURS)] for i, n in enumerate(dict.fromkeys(names))}


def curve(metrics: pd.DataFrame, metric: str, x: str = "step", smoothing: float = 0.0) -> pd.DataFrame:
    """One metric of one run as columns (x, value); EMA smoothing for the noisy train loss."""
    kind, col = CURVES[metric]
    if metrics.empty or col not in metrics.columns:
        return pd.DataFrame({"x": [], "value": []})
    df = metrics[metrics["kind"] == kind][[X_AXES[x], col]].dropna()
    df.columns = ["x", "value"]
    if smoothing > 0 and len(df):
        df["value"] = df["value"].ewm(alpha=1 - smoothing, adjust=True).mean()
    return df.reset_index(drop=True)


MY_RUNS_KEPT = 50  # run ids a browser remembers (as the Train tab keeps them)


def remember_runs(runs: Any, new_ids: list[str]) -> list[str]:
    """The browser's "my runs" list with `new_ids` first (a BrowserState may hold anything: keep strings)."""
    old = [r for r in (runs if isinstance(runs, list) else [])[:200] if isinstance(r, str) and r not in new_ids]
    return (list(new_ids) + old)[:max(MY_RUNS_KEPT, len(new_ids))]
