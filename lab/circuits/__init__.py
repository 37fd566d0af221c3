"""Circuits forming over training: head roles (head_roles.py), activation patching (patching.py) and the
Fourier picture of grokking (fourier.py), measured on the weights a run keeps at its snapshot steps."""
from __future__ import annotations

from typing import Any, Iterator, Optional

import torch


def weights_over_training(store: Any, run_id: str) -> Iterator[tuple[int, dict[str, torch.Tensor]]]:
    """(step, weights) at every snapshot step that kept weights, then the final weights, in step order, each
    step once (a stored run of lab/engine/store.py's RunStore: `snapshot_steps`, `weights_at`)."""
    seen: dict[int, dict[str, torch.Tensor]] = {}
    steps: list[Optional[int]] = [*store.snapshot_steps(run_id), None]
    for step in steps:
        try:
            weights, at = store.weights_at(run_id, step)
        except (OSError, LookupError):  # a snapshot that kept no weights, or no final weights yet
            continue
        seen[at] = weights
    for at in sorted(seen):
        yield at, seen[at]
