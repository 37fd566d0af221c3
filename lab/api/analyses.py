"""The app's analyses of a run as numbers (the public API, docs/python-api.md; `Run.head_roles`, `Run.patching`,
`Run.fourier`, `Run.logit_lens`, `Run.accuracy_by_length` call these): its head roles, activation patching grids,
the Fourier picture of a modular-addition embedding, the logit lens and its accuracy at each input length as
pandas DataFrames. Each reads the same functions as the app's
views (lab/circuits, lab/views), so the numbers are the ones the app draws. A run here is anything with the
`Run` handle's config, model, probe, store and run_id (lab/api/runs.py, which imports this module).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import pandas as pd

from lab.config import ConfigError

Run = Any  # lab/api/runs.py's Run handle (which imports this module: named here only in words)


def head_roles(run: Run, step: Optional[int] = None, seed: int = 0) -> pd.DataFrame:
    """Each head's role scores (previous-token, induction, ...; lab/circuits/head_roles.py, as Inspect's head
    roles panel) on repeated random sequences: a row per (layer, head), a column per score."""
    from lab.circuits.head_roles import head_scores

    model = run.model if step is None else run.load_model(step)
    scores = head_scores(model, run.config, step if step is not None else run.summary.get("steps", 0), seed)
    layers, heads = next(iter(scores.scores.values())).shape
    rows = [{"layer": layer, "head": head, **{name: float(s[layer, head]) for name, s in scores.scores.items()}}
            for layer in range(layers) for head in range(heads)]
    return pd.DataFrame(rows).set_index(["layer", "head"])


@dataclass(frozen=True)
class PatchingGrids:
    """Activation patching of one clean and one corrupted input (Meng et al. 2022; lab/circuits/patching.py):
    the share of the clean answer's logit difference each single patch restores (0: the corrupted run, 1: the
    clean one), for the residual stream (row per stream, column per position) and for each head's output."""
    residual: pd.DataFrame
    heads: pd.DataFrame
    clean_answer: str
    corrupt_answer: str
    ld_clean: float
    ld_corrupt: float
    how: str  # what the corruption changed


def patching(run: Run, clean: Optional[str] = None, corrupt: Optional[str] = None) -> PatchingGrids:
    """Both patching grids, as Inspect's circuits panel draws them: on `clean` and `corrupt` typed as in Inspect
    (of one length), or, with neither, the task's own pair (the corruption that moves the answer most)."""
    from lab.circuits.pairs import task_pair, typed_pair
    from lab.circuits.patching import patch
    from lab.tasks.batches import get_task

    cfg = run.config
    if (clean is None) != (corrupt is None):
        raise ConfigError("Corrupted input" if corrupt is None else "Clean input", "give both inputs, or neither")
    pair = task_pair(cfg, run.model) if clean is None else typed_pair(cfg, clean, corrupt)
    grids = patch(run.model, pair.clean, pair.corrupt)
    task = get_task(cfg.task.name)
    label = lambda tok: task.label(cfg.task, int(tok))  # noqa: E731
    positions = [f"{t} {label(tok)}" for t, tok in enumerate(pair.clean[0])]
    rows = [f"resid_pre {layer}" for layer in range(cfg.model.n_layers)] + [f"resid_post {cfg.model.n_layers - 1}"]
    return PatchingGrids(pd.DataFrame(grids.residual, index=rows, columns=positions),
                         pd.DataFrame(grids.heads, index=pd.Index(range(cfg.model.n_layers), name="layer"),
                                      columns=pd.Index(range(cfg.model.n_heads), name="head")),
                         label(grids.clean_answer), label(grids.corrupt_answer), grids.ld_clean, grids.ld_corrupt,
                         pair.how)


def fourier(run: Run, step: Optional[int] = None) -> pd.DataFrame:
    """The Fourier picture of a modular-addition run's number embedding (Nanda et al. 2023; lab/circuits/
    fourier.py): a row per frequency k, its power and its share of the non-constant power."""
    from lab.circuits.fourier import frequency_power, number_embedding

    weights, _ = run.store.weights_at(run.run_id, step)
    power, _ = frequency_power(number_embedding(run.config, weights))
    total = float(power.sum())
    return pd.DataFrame({"power": power, "share": power / total if total else power * 0},
                        index=pd.Index(range(1, len(power) + 1), name="frequency"))


def logit_lens(run: Run, text: Optional[str] = None) -> pd.DataFrame:
    """The logit lens (nostalgebraist 2020) on `probe(text)`: the residual stream after the embedding and after
    each block, through the final norm and the unembedding; a row per (stream, position) with the most likely
    next token, its probability and the right token's probability (NaN where nothing is scored)."""
    from lab.views.probing import logit_lens as lens_of

    probe = run.probe(text)
    lens = lens_of(run.model, run.config, probe.batch)
    return pd.DataFrame([{"stream": row, "position": t, "input": probe.dec_labels[t], "top": lens.top[i][t],
                          "top_prob": float(lens.top_prob[i, t]), "target_prob": float(lens.target_prob[i, t])}
                         for i, row in enumerate(lens.rows) for t in range(len(lens.top[i]))])


def accuracy_by_length(run: Run, per_length: int = 64) -> pd.DataFrame:
    """The run's held-out token accuracy and exact-match at each input length, its training lengths and the
    longer ones it never saw (lab/views/length_curves.py: the curve behind a cell of the length-generalization
    map), from its final weights: a row per length."""
    from lab.views.length_curves import accuracy_by_length as by_length

    rows = by_length(run.model, run.config, per_length)
    return pd.DataFrame([{"trained": r.trained, "token_acc": r.token_acc, "exact_match": r.exact_match} for r in rows],
                        index=pd.Index([r.length for r in rows], name="length"))
