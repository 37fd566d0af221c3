"""The stability preset: pre-LN against post-LN over learning rate x warmup, drawn by Compare as a stability
map (lab/views/stability_map.py), to find where post-LN fails without warmup and pre-LN still trains.

Xiong et al. 2020, On Layer Normalization in the Transformer Architecture: the original post-LN Transformer
needs a learning-rate warmup (its gradients near the output are large at initialisation), while pre-LN
trains without one and tolerates larger learning rates. The grid: norm in {pre, post} x warmup in {0, 50,
150} x learning rate in {3e-3, 1e-2, 3e-2, 1e-1}, 24 runs of a 4-layer model (d 64) sorting 12 symbols over
10 for 200 steps with cosine decay. benchmarks/RESULTS.md ("The presets as measured") records what it measured.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional

from lab.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from lab.derived import run_config
from lab.engine.grid import build_grid, run_name

BASE = run_config(
    model=ModelConfig(n_layers=4, n_heads=4, d_model=64, d_ff=256, norm="pre", pos="learned"),
    task=TaskConfig(name="sort", min_len=12, max_len=12, n_symbols=10),
    train=TrainConfig(steps=200, batch_size=64, lr=1e-2, warmup=0, schedule="cosine", eval_every=10,
                      eval_samples=256, snapshots=0),
)
NORMS, WARMUPS, LRS = ("pre", "post"), (0, 50, 150), (3e-3, 1e-2, 3e-2, 1e-1)
AXES = [("norm", NORMS), ("warmup", WARMUPS), ("lr", LRS)]
CHANCE = math.log(BASE.task.n_symbols)  # the held-out loss of guessing among the 10 symbols
FAILS = 0.9 * CHANCE  # a final held-out loss at or above this: the run learned nothing
TRAINS = 0.5  # at or below this: it trained (a loss of 0.5 is most symbols right)


def configs() -> list[RunConfig]:
    """The grid's runs, each named by its values ('norm=post warmup=0 lr=0.03'), as the ablation grid names them."""
    return build_grid(BASE, AXES, max_runs=len(NORMS) * len(WARMUPS) * len(LRS))


def name(norm: str, warmup: int, lr: float) -> str:
    return run_name([("norm", norm), ("warmup", warmup), ("lr", lr)])


def _loss(r: Mapping[str, Mapping[str, Any]], norm: str, warmup: int, lr: float) -> float:
    ev = (r.get(name(norm, warmup, lr)) or {}).get("eval") or {}
    v = ev.get("loss")
    return float(v) if v is not None else math.nan


def failing_region(r: Mapping[str, Mapping[str, Any]]) -> list[float]:
    """The learning rates at which post-LN without warmup failed (loss >= FAILS, or not finite) while pre-LN
    without warmup trained (loss <= TRAINS): the region the preset is about."""
    def failed(v: float) -> bool:
        return not math.isfinite(v) or v >= FAILS
    return [lr for lr in LRS if failed(_loss(r, "post", 0, lr)) and _loss(r, "pre", 0, lr) <= TRAINS]


def _n(x: float) -> str:
    return "not finite" if not math.isfinite(x) else f"{x:.2f}"


def explain(r: Mapping[str, Mapping[str, Any]], lr_text: Optional[dict[float, str]] = None) -> str:
    """The explanation, from the measured final held-out losses."""
    lr_of = lr_text or {lr: f"{lr:g}" for lr in LRS}
    region = failing_region(r)
    steps = next((v.get("steps") for v in r.values() if v and v.get("steps")), BASE.train.steps)
    measured = f"Each cell is the final held-out loss after {steps} steps (guessing: ln 10 = {CHANCE:.2f}). "
    if not region:
        worst = max(LRS, key=lambda lr: _loss(r, "post", 0, lr) - _loss(r, "pre", 0, lr))
        return (f"This time no learning rate had both post-LN learning nothing without warmup (held-out loss at least "
                f"{FAILS:.2f}) and pre-LN training (at most {TRAINS}). " + measured +
                f"The widest gap was at {lr_of[worst]}: pre-LN {_n(_loss(r, 'pre', 0, worst))}, post-LN "
                f"{_n(_loss(r, 'post', 0, worst))}. "
                + (f"These runs trained {steps} steps, not the preset's {BASE.train.steps}; " if steps !=
                   BASE.train.steps else "") + "where the edge lies is partly luck: add a seed axis.")
    lr = region[0]
    post_w = ", ".join(f"{w} warmup steps {_n(_loss(r, 'post', w, lr))}" for w in WARMUPS)
    fine = [x for x in LRS if max(_loss(r, "pre", 0, x), _loss(r, "post", 0, x)) <= TRAINS]
    both = (f"At {' and '.join(lr_of[x] for x in fine)} both train without warmup. " if fine else "")
    # the finding first: projector mode shows the first sentence as the headline (ui/projector.py)
    return (
        f"Without warmup, post-LN learned nothing at learning rate {' and '.join(lr_of[x] for x in region)} "
        f"(held-out loss {', '.join(_n(_loss(r, 'post', 0, x)) for x in region)}) where pre-LN trained "
        f"({', '.join(_n(_loss(r, 'pre', 0, x)) for x in region)}): that is the map's failing region. " + measured
        + f"{both}Warmup moves post-LN's edge: at {lr_of[lr]}, post-LN ended at {post_w}. Xiong et al. 2020 found the "
        "same: the original post-LN Transformer needs warmup, pre-LN trains without it and at larger learning "
        "rates. Read the map left to right: each panel's bright cells are where that placement trains.")
