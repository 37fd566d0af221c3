"""Evaluation: a model's loss and accuracy on fixed batches, held out and from the training distribution.

At every evaluation point the training loop (lab/trainer.py, both its solo and its batched path) measures
the model on three fixed sets of batches, made once per run from their own seeds (lab/tasks/batches.py
`eval_batches`):

- "eval": held-out samples at the training lengths (modular addition's held-out pairs, the text's last
  10%, fresh sequences for the generated tasks);
- "ood": held-out samples at the longer lengths, for tasks that have them;
- "train": samples of the training distribution at the training lengths: modular addition's training
  pairs, windows of the text's first 90%; for the generated tasks (copy, sort, induction...) training
  draws fresh sequences every step, so fresh sequences are its distribution, and their train and held-out
  metrics differ only by sampling noise. Half as many samples as the held-out set (a small share of a run's
  time: benchmarks/RESULTS.md, "Measurements quoted in the code before"), enough to
  draw the training curve beside the held-out one, the picture that shows memorising against generalising
  (Power et al. 2022, grokking; Zhang et al. 2017, "Understanding deep learning requires rethinking
  generalization").

Metrics are computed as the model is scored while training: the mean cross-entropy (in nats) over the
scored positions, the share of scored tokens whose argmax is right, and the share of sequences with every
scored token right (exact-match; under teacher forcing the same as greedy decoding being right). For
induction the accuracy on the predictable positions is measured too (lab/tasks/batches.py `Task.predictable`):
the first token of a repeat cannot be predicted, so exact-match stays near 1 / n_symbols there even for a
model that copies every later token (Olsson et al. 2022).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

from lab.config import RunConfig
from lab.device import device_eval_batches, to_device
from lab.model import Transformer
from lab.records import EvalRecord
from lab.tasks.batches import IGNORE_INDEX, Batch, eval_batches, get_task

TRAIN_SHARE = 2  # the training set's samples per evaluation: the held-out count divided by this


@dataclass(frozen=True)
class SplitMetrics:
    """One set of batches' metrics: loss in nats, token accuracy, exact-match, and the accuracy on the
    predictable positions (None for tasks where every scored position is predictable)."""

    loss: float
    token_acc: float
    exact_match: float
    predictable_acc: Optional[float] = None


@torch.no_grad()
def measure(model: Transformer, batches: list[Batch], device: torch.device,
            predictable: Optional[Callable[[Tensor], Optional[Tensor]]] = None) -> SplitMetrics:
    """The metrics of `model` over the scored positions of `batches` (in eval mode; the mode is restored).
    `predictable(tgt)`, if given and not None for a batch, marks the positions `predictable_acc` counts.
    One host sync at the end, not one per batch."""
    was_training = model.training
    model.eval()
    dtype = torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64
    zero = torch.zeros((), dtype=dtype, device=device)
    loss_sum, correct, scored, exact, hits, known = zero, zero, zero, zero, zero, zero
    rows, has_predictable = 0, False
    for b in batches:
        b = b.to(device)
        logits = model(b.inp, b.src).logits.float()  # (B, T, vocab)
        mask = b.tgt != IGNORE_INDEX  # (B, T)
        loss_sum = loss_sum + torch.nn.functional.cross_entropy(logits[mask], b.tgt[mask], reduction="sum")
        right = logits.argmax(-1) == b.tgt  # (B, T)
        correct = correct + (right & mask).sum()
        scored = scored + mask.sum()
        exact = exact + (right | ~mask).all(dim=1).sum()
        rows += b.tgt.shape[0]
        sure = predictable(b.tgt) if predictable is not None else None
        if sure is not None:
            has_predictable = True
            hits, known = hits + (right & sure).sum(), known + sure.sum()
    model.train(was_training)
    loss_v, correct_v, scored_v, exact_v, hits_v, known_v = torch.stack(
        [loss_sum, correct, scored, exact, hits, known]).tolist()  # the one sync
    return SplitMetrics(loss_v / max(scored_v, 1), correct_v / max(scored_v, 1), exact_v / max(rows, 1),
                        hits_v / max(known_v, 1) if has_predictable else None)


def evaluate(model: Transformer, batches: list[Batch], device: torch.device) -> tuple[float, float, float]:
    """(loss, token accuracy, exact-match) over the scored positions of `batches`."""
    m = measure(model, batches, device)
    return m.loss, m.token_acc, m.exact_match


def train_samples(eval_samples: int) -> int:
    """How many samples of the training distribution each evaluation measures."""
    return max(1, -(-eval_samples // TRAIN_SHARE))


def evaluation_sets(cfg: RunConfig, device: torch.device) -> dict[str, list[Batch]]:
    """The run's fixed evaluation batches on the device: "eval", "ood" (held out) and "train"."""
    sets = device_eval_batches(cfg, device)
    sets["train"] = [to_device(b, device) for b in
                     eval_batches(cfg.task, cfg.model.arch, "train", train_samples(cfg.train.eval_samples))]
    return sets


class Evaluator:
    """Measures a run's model on its evaluation sets into an EvalRecord (runs batched together share their
    task, so their sets: one Evaluator serves them all)."""

    def __init__(self, cfg: RunConfig, device: torch.device) -> None:
        self.sets, self.device = evaluation_sets(cfg, device), device
        self.predictable = get_task(cfg.task.name).predictable

    def __call__(self, model: Transformer, step: int, tokens: int, clock: Callable[[], float]) -> EvalRecord:
        """The record at `step`; `clock()` gives its elapsed seconds once the measuring is done."""
        held = measure(model, self.sets["eval"], self.device, self.predictable)
        ood = measure(model, self.sets["ood"], self.device) if self.sets["ood"] else None
        train = measure(model, self.sets["train"], self.device, self.predictable) if self.sets["train"] else None
        return EvalRecord(
            step, clock(), tokens, held.loss, held.token_acc, held.exact_match,
            ood.loss if ood else None, ood.token_acc if ood else None, ood.exact_match if ood else None,
            train.loss if train else None, train.token_acc if train else None, train.exact_match if train else None,
            held.predictable_acc, train.predictable_acc if train else None)
