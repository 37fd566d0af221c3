"""Accuracy against input length: where a model that learned lengths min_len..max_len stops being right.

Delétang et al. 2023 ("Neural Networks and the Chomsky Hierarchy") score a model on lengths beyond its training
ones: a model that learned the task's algorithm stays right as the input grows, one that fitted its training
lengths falls to chance just past them. The length-generalization map (lab/teach/presets/chomsky.py) reads one
number per cell, the accuracy over all longer lengths; this is the curve behind it, one point per length, on
the run's held-out batches (the same fixed sequences its evaluations measure: lab/tasks/batches.py
`eval_batches`), from its final weights.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lab.config import RunConfig
from lab.evaluation import measure
from lab.tasks.batches import eval_batches, get_task

PER_LENGTH = 64  # held-out sequences measured at each length


@dataclass(frozen=True)
class LengthAccuracy:
    """A run's held-out accuracy at one input length."""

    length: int
    trained: bool  # a training length (else one of the longer ones the run never saw)
    token_acc: float
    exact_match: float


@torch.no_grad()
def accuracy_by_length(model: torch.nn.Module, cfg: RunConfig, per_length: int = PER_LENGTH) -> list[LengthAccuracy]:
    """The model's held-out token accuracy and exact-match at each training length and each longer length of
    `cfg`'s task, shortest first (language-model tasks included; a task without longer lengths gives only its
    training ones)."""
    task, device = get_task(cfg.task.name), next(model.parameters()).device
    out = []
    for split, trained in (("eval", True), ("ood", False)):
        lengths = task.lengths(cfg.task, split)
        if not lengths:
            continue
        # one batch per length, in order: eval_batches spreads n samples evenly over the split's lengths
        batches = eval_batches(cfg.task, cfg.model.arch, split, per_length * len(lengths), batch_size=per_length)
        assert len(batches) == len(lengths)
        for length, batch in zip(lengths, batches):
            m = measure(model, [batch], device)
            out.append(LengthAccuracy(length, trained, m.token_acc, m.exact_match))
    return out
