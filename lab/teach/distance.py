"""Accuracy against distance: how far back the token a model must write was read (the reverse task).

In the decoder-only format (prompt, separator, answer: lab/tasks/batches.py `Task.layout`) answer token j of a
reversed prompt of length P is predicted at sequence position P + j and copies the prompt token at position
P - 1 - j: it looks 2j + 1 positions back, from 1 (the last prompt token, written first) to 2P - 1 (the
first, written last). Attention reads any earlier position in one step; a recurrent model must carry each
token through its state, one step at a time, for that many steps. Vaswani et al. 2017, section 4 and
Table 1: a self-attention layer's longest path between two positions is O(1), a recurrent layer's O(n).

Used by the "Why attention, not recurrence" preset (lab/teach/presets/catalog.py), measured on a run's final weights.
"""
from __future__ import annotations

from typing import Any

import torch

from lab.config import RunConfig
from lab.tasks.batches import IGNORE_INDEX, eval_batches

SAMPLES = 256  # held-out sequences measured (the presets' eval_samples)


@torch.no_grad()
def accuracy_by_distance(model: torch.nn.Module, cfg: RunConfig, n_samples: int = SAMPLES) -> dict[int, float]:
    """{distance: held-out accuracy} over the answer tokens of a decoder-only or recurrent reverse run: the
    share of answer tokens 2j + 1 positions after the prompt token they copy that the model gets right."""
    if cfg.task.name != "reverse" or cfg.model.arch == "encoder-decoder":
        raise ValueError("accuracy by distance is defined for the reverse task in the decoder-only format")
    was_training = model.training
    model.eval()
    hits = torch.zeros(0, dtype=torch.float64)
    counts = torch.zeros(0, dtype=torch.float64)
    for b in eval_batches(cfg.task, cfg.model.arch, "eval", n_samples):
        logits = model(b.inp, b.src).logits  # (B, T, vocab)
        mask = b.tgt != IGNORE_INDEX  # (B, T): the answer tokens
        right = (logits.argmax(-1) == b.tgt) & mask
        distance = (2 * (mask.cumsum(1) - 1) + 1)[mask]  # (n_scored,) 2j + 1 for answer token j
        size = int(distance.max()) + 1
        hits = _grown(hits, size) + torch.bincount(distance, weights=right[mask].double(), minlength=size)
        counts = _grown(counts, size) + torch.bincount(distance, minlength=size).double()
    model.train(was_training)
    return {d: float(hits[d] / counts[d]) for d in range(len(counts)) if counts[d] > 0}


def _grown(t: torch.Tensor, size: int) -> torch.Tensor:
    return torch.cat([t, t.new_zeros(max(0, size - len(t)))]) if len(t) < size else t


def near_and_far(by_distance: dict[Any, float]) -> tuple[int, float, int, float]:
    """(shortest distance, its accuracy, longest distance, its accuracy); keys may be strings (from JSON)."""
    d = sorted(int(k) for k in by_distance)
    acc = {int(k): float(v) for k, v in by_distance.items()}
    return d[0], acc[d[0]], d[-1], acc[d[-1]]
