"""What a run's numbers mean for its task, in sentences: a language model's loss against chance and the
unigram baseline, induction's accuracy on the predictable positions, and the warning that a text run is
overfitting its training text.

A language model of real text (the `text` task) is never right on a whole window, so its exact-match says
nothing; its loss (nats a character, as every loss in this lab) is read against two baselines
(lab/tasks/shapes.py `loss_baselines`): chance, ln of the vocabulary size (a uniform guess), and the unigram
baseline, the entropy of the training text's character frequencies (the best a model that ignores context
can do; Shannon 1951, "Prediction and entropy of printed English"). Induction's exact-match counts the first
token of each repeat, which nothing predicts, so the accuracy on the rest of the repeat is its measure
(Olsson et al. 2022). When a text run's held-out loss climbs back up above the unigram baseline, the model
has learned its training text by heart rather than patterns that carry over: it is overfitting (Zhang et al.
2017, "Understanding deep learning requires rethinking generalization").

Plain functions of a task config and metric dicts (a summary's "eval" and "train_set", or metric records
as `RunStore.metrics` rows give them): the app, the CLI and the presets quote the same sentences.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Optional, Sequence

from lab.tasks.shapes import TaskConfig, headline_metrics, loss_baselines
from lab.records import EXACT_MATCH, LOSS, PREDICTABLE_ACC, TOKEN_ACC


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _finite(value: Any) -> Optional[float]:
    """A metric as a float, or None where it is missing or not a number (a record written before it existed)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def unit(cfg: TaskConfig) -> str:
    """What one scored token is for this task, for "nats a ...": character, token."""
    return "character" if cfg.name == "text" else "token"


def baselines_clause(cfg: TaskConfig, loss: float) -> str:
    """Where a loss stands against the task's baselines: 'below the unigram baseline 2.85 nats (a model that
    ignores context) and below chance, ln 40 = 3.69'."""
    b = loss_baselines(cfg)
    chance = f"{'below' if loss < b.chance else 'above'} chance, ln {round(math.exp(b.chance))} = {b.chance:.2f}"
    if b.unigram is None:
        return chance
    where = "below" if loss < b.unigram else "above"
    return f"{where} the unigram baseline {b.unigram:.2f} nats (a model that ignores context) and {chance}"


def headline_sentence(cfg: TaskConfig, metrics: Mapping[str, Any], where: str = "held-out") -> str:
    """One sentence on the metrics that mean something for the task (lab.tasks.shapes.headline_metrics), from a
    dict with LOSS, EXACT_MATCH, TOKEN_ACC (and PREDICTABLE_ACC for induction; lab/records.py) measured on `where`
    ("held-out", "training"): 'Held-out loss 1.52 nats a character, below the unigram baseline ...'."""
    head, lead = headline_metrics(cfg.name), where[:1].upper() + where[1:]
    loss = _finite(metrics.get(LOSS))
    if head[0] == LOSS:
        if loss is None:
            return ""
        text = f"{lead} loss {loss:.2f} nats a {unit(cfg)}, {baselines_clause(cfg, loss)}"
        acc = _finite(metrics.get(PREDICTABLE_ACC))
        if PREDICTABLE_ACC in head and acc is not None:
            text += (f"; {_pct(acc)} right on the predictable positions (each repeat after its first token, "
                     "which nothing predicts)")
        return text + "."
    em = _finite(metrics.get(EXACT_MATCH))
    if em is None:
        return ""
    text = f"{lead} exact-match {_pct(em)} (whole answers right)"
    acc = _finite(metrics.get(TOKEN_ACC))
    if TOKEN_ACC in head and acc is not None:
        text += f", token accuracy {_pct(acc)}"
    return text + (f", loss {loss:.2f} nats a {unit(cfg)}." if loss is not None else ".")


def overfitting_sentence(cfg: TaskConfig, evals: Sequence[Mapping[str, Any]]) -> str:
    """'' unless a text run's held-out loss has risen from its lowest point to above the unigram baseline
    (the model learns its training text by heart); else the sentence that says so. `evals`: the run's
    evaluation records, oldest first, each with "step" and "loss" (held out) and, where measured,
    "train_loss" (the training text)."""
    base = loss_baselines(cfg).unigram
    if base is None:  # the text task only
        return ""
    points = [(int(e["step"]), v) for e in evals if (v := _finite(e.get(LOSS))) is not None and "step" in e]
    if not points:
        return ""
    step, last = points[-1]
    best_step, best = min(points, key=lambda p: p[1])
    if last <= base or last <= best:
        return ""
    train = _finite(evals[-1].get("train_loss"))
    on_train = f", while its loss on the training text is {train:.2f}" if train is not None else ""
    return (f"Overfitting: the held-out loss rose from {best:.2f} (step {best_step}) to {last:.2f} nats a character "
            f"(step {step}), above the unigram baseline {base:.2f}, the loss of a model that only knows how often "
            f"each character occurs{on_train}. The model is learning the training text by heart, not patterns that "
            "carry over to the held-out tenth: a longer text, a smaller model or fewer steps help.")


def first_step(run: Mapping[str, Any], key: str, ok: Callable[[float], bool]) -> Optional[int]:
    """The first evaluated step of a run (a summary with its "evals", oldest first) at which `ok(metric)`
    held, or None (never, or no curve known)."""
    for e in run.get("evals") or ():
        value = e.get(key)
        if value is not None and value == value and ok(float(value)):
            return int(e["step"])
    return None


def held_from(run: Mapping[str, Any], key: str, ok: Callable[[float], bool]) -> Optional[int]:
    """The first evaluated step from which `ok(metric)` held at every later evaluation, or None: what "solved by
    step N" and "from step N on" mean (reached and kept; a curve that dips and recovers counts from its return)."""
    held = None
    for e in run.get("evals") or ():
        value = e.get(key)
        if value is not None and value == value:
            held = (int(e["step"]) if held is None else held) if ok(float(value)) else None
    return held
