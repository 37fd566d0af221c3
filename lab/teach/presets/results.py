"""What a preset's explanation reads of a finished run in the store, the same for the app's Presets tab and
the command line (`python -m lab preset`): its summary, its held-out and training curves, its last attention
snapshot and, where the preset asks, measures of its final weights (which head matters most, accuracy by
distance). Measures are taken once per run and kept: a finished run's weights never change.
"""
from __future__ import annotations

from typing import Any, Callable

from lab.engine.store import RunStore
from lab.engine.storefs import DamagedRunError, RunNotFoundError
from lab.records import EXACT_MATCH, LOSS
from lab.teach.distance import accuracy_by_distance
from lab.teach.presets.base import Preset, measured
from lab.views.analysis import load_model
from lab.views.probing import importance_map, knockout_summary

# what an explanation may quote of a run's final weights: measure name -> f(model, config)
WEIGHT_MEASURES: dict[str, Callable[..., dict]] = {
    "knockout": lambda model, cfg: knockout_summary(importance_map(model, cfg)),
    "distance": accuracy_by_distance,
}
_MEASURES: dict[tuple[str, str, str], dict] = {}  # (store root, run id, measure) -> its value


def eval_points(store: RunStore, run_id: str, column: str) -> list[tuple[int, float]]:
    """(step, value) of one column of the run's held-out evaluations (a Metric of lab/records.py, or one with
    "train_" or "ood_" before it), oldest first; values not measured (NaN) left out."""
    m = store.metrics(run_id)
    evals = m[m["kind"] == "eval"] if len(m) else m
    return sorted((int(s), float(v)) for s, v in zip(evals.get("step", []), evals.get(column, [])) if v == v)


def run_history(store: RunStore, run_id: str) -> tuple[list, list[tuple[int, float]]]:
    """The run's head-role scores at each kept snapshot (lab/circuits/head_roles.py) and its held-out loss at
    each evaluation: what Learn page 13 and Inspect's circuits panel draw and the induction preset's sentence
    quotes."""
    from lab.circuits.head_roles import scores_over_training

    return scores_over_training(store, run_id), eval_points(store, run_id, LOSS)


def induction_forming(store: RunStore, run_id: str) -> dict[str, Any]:
    """When the run's induction head formed: the top induction score at the first snapshot and at the end, the
    head, the first step it passed 0.4 (the numbers `python -m lab heads` and Learn page 13 show), the
    snapshot interval, and the held-out loss's steepest fall."""
    from lab.circuits.head_roles import crossing_step, steepest_fall
    from lab.interventions import head_name

    series, losses = run_history(store, run_id)
    if len(series) < 2:
        return {}
    layer, head, end = series[-1].top("induction")
    return {"start": float(series[0].scores["induction"].max()), "end": end, "head": head_name(layer, head),
            "crossing": crossing_step(series), "every": series[1].step - series[0].step,
            "fall": steepest_fall(losses)}


def fourier_forming(store: RunStore, run_id: str) -> dict[str, Any]:
    """How the token embedding's power gathered in a few frequencies around the held-out jump of a modular-
    addition run (Nanda et al. 2023; lab/circuits/fourier.py `around_jump`): the share in the 8 strongest
    frequencies at the first snapshot, the last one of the memorising model (training accuracy first at 95% or
    more, held-out still below 50%), the first one after the jump and at the end."""
    from lab.circuits.fourier import around_jump, spectra_over_training

    held_out = eval_points(store, run_id, EXACT_MATCH)
    memorised = next((s for s, v in eval_points(store, run_id, f"train_{EXACT_MATCH}") if v >= 0.95), None)
    return around_jump(spectra_over_training(store, run_id), held_out, memorised)


# what an explanation may quote of a run's whole training (its snapshots and curves): name -> f(store, run id)
HISTORY_MEASURES: dict[str, Callable[[RunStore, str], dict]] = {"heads": induction_forming,
                                                                 "fourier": fourier_forming}


def wanted(preset: Preset, name: str) -> tuple[str, ...]:
    """The measures of run `name`'s final weights that `preset`'s explanation quotes (WEIGHT_MEASURES keys)."""
    return tuple(m for m in (*WEIGHT_MEASURES, *HISTORY_MEASURES) if name in getattr(preset, m))


def measure_of(store: RunStore, run_id: str, what: str) -> dict:
    """A measure of the run's final weights (WEIGHT_MEASURES) or of its training (HISTORY_MEASURES), taken once
    and kept ({} without weights)."""
    key = (str(store.root), run_id, what)
    if key not in _MEASURES:
        try:
            if what in HISTORY_MEASURES:
                _MEASURES[key] = HISTORY_MEASURES[what](store, run_id)
            else:
                cfg, weights = store.config(run_id), store.load_weights(run_id)
                _MEASURES[key] = WEIGHT_MEASURES[what](load_model(cfg, weights), cfg)
        except (RunNotFoundError, DamagedRunError):
            return {}
        while len(_MEASURES) > 64:
            _MEASURES.pop(next(iter(_MEASURES)))
    return _MEASURES[key]


def run_result(store: RunStore, run_id: str, summary: dict, measures: tuple[str, ...] = ()) -> dict[str, Any]:
    """What a preset's explanation reads of a finished run: its summary, held-out and training curves, its
    last attention snapshot (so the sentence can quote the step and the pattern it measured) and the
    `measures` of its final weights the preset asks for."""
    m = store.metrics(run_id)
    evals = m[m["kind"] == "eval"].dropna(axis=1, how="all").to_dict("records")
    train = [(int(s), float(v)) for s, v in m.loc[m["kind"] == "train", ["step", "loss"]].itertuples(index=False)]
    steps = store.snapshot_steps(run_id)
    return measured(summary, evals, train, store.load_snapshot(run_id, steps[-1]) if steps else None,
                    **{what: measure_of(store, run_id, what) for what in measures})


def explanation(store: RunStore, preset: Preset, ids: dict[str, str]) -> str:
    """`preset`'s explanation of the finished runs `ids` (run name -> id); runs without a summary are missing."""
    results = {}
    for name, run_id in ids.items():
        try:
            summary = store.summary(run_id)
        except (RunNotFoundError, DamagedRunError):
            continue
        if summary:
            results[name] = run_result(store, run_id, summary, wanted(preset, name))
    return preset.explain(results)
