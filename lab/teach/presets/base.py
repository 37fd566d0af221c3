"""What every preset shares: the `Preset` record (its runs, question, Compare curve and explanation), the
result a preset's explanation reads of a run (`measured`) and the small helpers explanations write numbers
with. The presets themselves: lab/teach/presets/catalog.py (the papers' known results) and lab/teach/presets/why.py
(the paper's own questions). No gradio; plain data and text.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

from lab.config import RunConfig
from lab.records import LOSS, Metric
from lab.views.curve_figures import Mark
from lab.views.curves import CURVES

Results = dict[str, dict[str, Any]]  # run name -> summary dict (lab.engine.jobs.summary_of)
SOLVED = 0.999  # "Hello, sort": solved from the first evaluation at or above this exact-match it keeps (loss_reading.held_from)
METRICS = tuple(CURVES)  # the curves Compare can open on


@dataclass(frozen=True)
class Preset:
    key: str  # "hello_sort"
    title: str  # "Hello, sort"
    question: str  # the predict-before-you-click question
    reference: str  # paper / source, and what differs from it
    runs: tuple[RunConfig, ...]  # each with a short, unique `name`
    metrics: tuple[str, ...]  # the Compare curves its sentence reads (METRICS), the first drawn in the map and bands
    wall_s: float  # measured wall time of all runs, one after another, 1 thread each, on the dev CPU
    _explain: Callable[[Results], str] = field(repr=False, compare=False, default=lambda r: "")
    knockout: tuple[str, ...] = ()  # runs whose head importance the explanation quotes (measured on their weights)
    distance: tuple[str, ...] = ()  # runs whose accuracy by distance it quotes (lab/teach/distance.py, their weights)
    heads: tuple[str, ...] = ()  # runs whose head roles over training it quotes (lab/circuits, their snapshots)
    fourier: tuple[str, ...] = ()  # runs whose embedding's Fourier share over training it quotes (lab/circuits)
    _marks: Callable[[Results], tuple[Mark, ...]] = field(repr=False, compare=False, default=lambda r: ())
    # a larger version of the experiment than the one-click runs, for the command line and a GPU (`--full`);
    # the explanation reads either
    full: tuple[RunConfig, ...] = field(repr=False, default=())

    def explain(self, results: Results) -> str:
        """1-3 sentences built from the measured summaries; says which runs are missing, if any."""
        missing = [c.name for c in self.runs if not (results.get(c.name) or {}).get("eval")]
        if missing:
            return f"No final results yet for: {', '.join(missing)}. Run the whole preset to see what happened."
        text = self._explain(results)
        stopped = [c.name for c in self.runs if results[c.name].get("stopped")]
        return text + (f" (Stopped early: {', '.join(stopped)}.)" if stopped else "")

    def marks(self, results: Results) -> tuple[Mark, ...]:
        """The steps the explanation quotes, to mark on the curves (none until every run has a result)."""
        if any(not (results.get(c.name) or {}).get("eval") for c in self.runs):
            return ()
        return self._marks(results)


# ---- reading results ---------------------------------------------------------------------------------
def measured(summary: dict[str, Any], evals: Optional[list[dict[str, Any]]] = None,
             train: Optional[list[tuple[int, float]]] = None, attention: Optional[dict[str, Any]] = None,
             knockout: Optional[dict[str, Any]] = None, distance: Optional[dict[int, float]] = None,
             heads: Optional[dict[str, Any]] = None, fourier: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """A run's result as the explanations read it: its summary, plus (when known) its held-out curve
    (`evals`: one dict per evaluation, oldest first, with step, loss, exact_match...), its training-loss
    curve (`train`: (step, loss)), its last attention snapshot (kind -> (layers, heads, Tq, Tk)) and, for the
    runs a preset names in `knockout`, its head knockout (lab.views.probing.knockout_summary), and for those
    named in `distance`, its held-out accuracy by distance (lab.teach.distance.accuracy_by_distance), for those
    in `heads`, when its induction head formed (lab.teach.presets.results.induction_forming), and for those in
    `fourier`, its embedding's share in a few frequencies around the jump (results.fourier_forming)."""
    return {**summary, "evals": evals or [], "train": train or [], "attention": attention or {},
            "knockout": knockout or {}, "distance": distance or {}, "heads": heads or {}, "fourier": fourier or {}}


def _ev(r: Results, name: str, key: Metric = LOSS) -> float:
    return float(r[name]["eval"][key])


def _ood(r: Results, name: str, key: Metric = LOSS) -> float:
    return float((r[name].get("ood") or {}).get(key, math.nan))


def _n(x: float) -> str:
    """A number for a sentence: 0.41, 2.2, 0.0003."""
    return f"{x:.2g}" if abs(x) < 0.01 else f"{x:.2f}"


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _variant(base: RunConfig, name: str, model: Optional[dict] = None, task: Optional[dict] = None,
             train: Optional[dict] = None) -> RunConfig:
    return replace(base, name=name, model=replace(base.model, **(model or {})),
                   task=replace(base.task, **(task or {})), train=replace(base.train, **(train or {})))
