"""The app's figures as matplotlib figures, from runs (the public API, docs/python-api.md): curves overlaid
(Compare), seed repeats as a mean with a min-max band (Compare's "Group seed repeats"), the attention grid,
the positional encoding's PCA, the head importance map and the logit lens (Inspect), parameters per component.

Each function returns a new `matplotlib.figure.Figure` (never pyplot's global state): a notebook cell shows
it when it is the cell's last value, `fig.savefig("x.png")` writes it. Runs are `Run` objects or run ids
(with `runs_dir`); legends name runs as Compare does (lab/views/run_labels.py). The curves and the bands
are drawn from Compare's own frames and figures (lab/views/compare_frames.py, lab/views/compare_figures.py),
the ones its page and its PNG export draw.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from lab.api.runs import PathLike, Run, load_runs
from lab.config import RECURRENT, RunConfig
from lab.views import plots
from lab.views.compare_figures import bands_png, curves_png
from lab.views.compare_frames import Selection, curve_series, metric_list, read_selection, seed_groups, x_axis
from lab.views.curves import CURVES, X_AXES
from lab.records import DEC_SELF, AttentionKind

METRICS = tuple(CURVES)  # "train loss (batch)", "held-out loss", "held-out exact-match", ...
RunsLike = Sequence[Run | str] | Run | str


def _selection(runs: RunsLike, runs_dir: Optional[PathLike]) -> Selection:
    """The runs read as Compare reads its selection (lab/views/compare_frames.py): one run store's runs."""
    items = load_runs(runs, runs_dir)
    if len({str(r.store.root) for r in items}) > 1:
        raise ValueError("runs: draw runs of one run store together (these come from several)")
    if not items:
        return Selection(pd.DataFrame(), {})
    return read_selection(items[0].store, [r.run_id for r in items])


def plot_curves(runs: RunsLike, metric: str | Sequence[str] = "held-out loss", x: str = "step",
                title: str = "", runs_dir: Optional[PathLike] = None) -> Figure:
    """One line per run (and per metric, given several) of Compare's curves, as Compare draws them (unsmoothed;
    a colour per run, a dash per metric, losses and accuracies in panels of their own): `metric` one or more
    of `lab.api.figures.METRICS`, `x` "step", "time (s)" or "tokens"; `title`: Compare's (the metrics) unless
    given."""
    metrics, x = metric_list(metric), x_axis(x)
    series, styles = curve_series(_selection(runs, runs_dir), metrics, x, 0.0)
    return curves_png(series, styles, metrics, x, title or None)


def plot_bands(runs: RunsLike, metric: str = "held-out loss", x: str = "step", title: str = "",
               runs_dir: Optional[PathLike] = None) -> Figure:
    """Seed repeats drawn as their mean with a min-max band: runs whose configs differ only in the seed form
    one group (as Compare groups them), named as Compare names them; `title`: Compare's unless given."""
    bands = bands_frame(runs, metric, x, runs_dir)
    return bands_png(bands, metric, x, title or None)


def bands_frame(runs: RunsLike, metric: str = "held-out loss", x: str = "step",
                runs_dir: Optional[PathLike] = None) -> pd.DataFrame:
    """The numbers `plot_bands` draws: columns group, step, x, mean, lo, hi, n (the runs in the group)."""
    (metric,), x = metric_list(metric), x_axis(x)
    return seed_groups(_selection(runs, runs_dir), metric, x, 0.0)[0]


def plot_attention(run: Run | str, text: Optional[str] = None, step: Optional[int] = None,
                   kind: AttentionKind = DEC_SELF, runs_dir: Optional[PathLike] = None) -> Figure:
    """Inspect's grid of attention heatmaps, a row per layer and a column per head, on the run's sampled probe
    or on `text`; `step`: the weights kept at that snapshot (`Run.snapshot_steps()`). Inside `Run.hooks`,
    the heads whose output is removed are hatched."""
    (r,) = load_runs(run, runs_dir)
    probe = r.probe(text)
    patterns = r.attention(text, step, kind)
    labels_q, labels_k = probe.axes(kind)
    spec = r.active_hooks
    silenced = spec.silenced(kind, patterns.shape[1]) if spec is not None and step is None else set()
    where = f"step {step}" if step is not None else "final weights"
    title = f"{plots.KIND_TITLES.get(kind, kind)}: {r.name} ({where})"
    return plots.attention_grid(patterns, labels_q, labels_k, title, silenced)


def _transformer(r: Run, lacks: str) -> None:
    """Refuse a recurrent run (LSTM, GRU) by its architecture, saying what it lacks."""
    if r.config.model.arch in RECURRENT:
        raise ValueError(f"model.arch: this run is {r.config.model.arch}, a recurrent baseline with {lacks}; "
                         "pick a Transformer run")


def plot_pca(run: Run | str, step: Optional[int] = None, runs_dir: Optional[PathLike] = None) -> Figure:
    """The positional encoding as Inspect draws it: the position vectors' first two principal components and
    their cosine similarity (a learned table as trained, or at the snapshot `step`), or for RoPE and ALiBi
    the relative pattern they impose on the scores."""
    from lab.views.analysis import positional_view

    (r,) = load_runs(run, runs_dir)
    _transformer(r, "no positional encoding: the recurrence itself orders the tokens")
    weights = r.store.weights_at(r.run_id, step)[0]
    return plots.positional_figure(positional_view(r.config, weights), f"{r.name}: {r.config.model.pos}")


def plot_importance(run: Run | str, mode: str = "zero", kind: AttentionKind = DEC_SELF,
                    runs_dir: Optional[PathLike] = None) -> Figure:
    """The head importance map: for each layer (row) and head (column), how much knocking out that head alone
    raises the held-out loss; the sentence under it names the head that matters most."""
    (r,) = load_runs(run, runs_dir)
    imp = r.importance_map(mode, kind)
    rise = imp.loss - imp.intact_loss  # (layers, heads)
    n_layers, n_heads = rise.shape
    fig = Figure(figsize=(max(4.5, 1.1 * n_heads + 2.2), 1.0 * n_layers + 2.0), layout="constrained")
    ax = fig.subplots()
    top = max(float(np.abs(rise).max()), 1e-9)
    im = ax.imshow(rise, cmap="viridis", vmin=min(0.0, float(rise.min())), vmax=top, aspect="auto")
    for (layer, head), v in np.ndenumerate(rise):
        ax.text(head, layer, f"{v:+.2f}", ha="center", va="center", fontsize=9,
                color="black" if v > 0.55 * top else "white")
    ax.set_xticks(range(n_heads), [f"head {h}" for h in range(n_heads)])
    ax.set_yticks(range(n_layers), [f"layer {i}" for i in range(n_layers)])
    fig.colorbar(im, ax=ax, label="held-out loss rise (nats)", shrink=0.9)
    ax.set_title(f"Head importance ({mode} knockout): {r.name}", fontsize=10)
    ax.set_xlabel(imp.sentence(), fontsize=8, wrap=True)
    return fig


def plot_logit_lens(run: Run | str, text: Optional[str] = None, runs_dir: Optional[PathLike] = None) -> Figure:
    """The logit lens on the sampled probe or `text`: what the model would predict at each position if the
    stack stopped after the embedding and after each layer, coloured by the right token's probability."""
    from lab.views.probe_plots import lens_figure
    from lab.views.probing import logit_lens

    (r,) = load_runs(run, runs_dir)
    _transformer(r, "no residual stream for a logit lens to read")
    probe = r.probe(text)
    return lens_figure(logit_lens(r.model, r.config, probe.batch), probe.dec_labels, f"Logit lens: {r.name}")


def plot_params(configs: Sequence[RunConfig | Run] | dict[str, RunConfig], title: str = "") -> Figure:
    """Parameters per component (embeddings, attention, mlp, norms, ...) as stacked bars, one per config or
    run (a dict gives the bars' names)."""
    from lab.params import param_breakdown

    named = dict(configs) if isinstance(configs, dict) else {
        (c.name if isinstance(c, Run) else c.name or f"config {i}"): c for i, c in enumerate(configs)}
    fig = plots.params_figure({n: param_breakdown(c.config if isinstance(c, Run) else c) for n, c in named.items()})
    if title:
        fig.suptitle(title)
    return fig


__all__ = ["METRICS", "X_AXES", "plot_curves", "plot_bands", "bands_frame", "plot_attention", "plot_pca",
           "plot_importance", "plot_logit_lens", "plot_params"]
