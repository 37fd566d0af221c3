"""The run store's tensor files: a run's final weights (`weights.safetensors`) and its attention snapshots
(`attention/step_0000100.safetensors`: the probe's attention and, for models up to 1M parameters, float16
weights at that step, so interventions can run on the model as it was then).

`RunTensors` is the part of `RunStore` (lab/engine/store.py) that reads and writes them; the store gives it
`root` and `_existing(run_id)` (the run's folder, checked). Every file is written whole by the store's
atomic write (serialised in memory first: safetensors' own save_file renames a `.tmpXXXXXX` of its own,
which a SIGKILL would leave behind with no writer's name for the sweep), and read by safetensors, which
loads tensors only and never executes code.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.numpy import load_file as _np_load, save as _np_bytes
from safetensors.torch import load_file as _pt_load, save as _pt_bytes

from lab.engine.storefs import RunNotFoundError, _atomic_write, _check_step, _safe_load, temp_tag
from lab.records import SnapshotRecord

WEIGHTS_PREFIX = "weights."  # snapshot file keys of the weights kept beside the attention patterns


class RunTensors:
    """Weights and attention snapshots of stored runs (mixed into RunStore)."""

    root: Path

    def _existing(self, run_id: str) -> Path:  # pragma: no cover - RunStore's
        raise NotImplementedError

    def summary(self, run_id: str) -> dict[str, Any] | None:  # pragma: no cover - RunStore's
        raise NotImplementedError

    def save_weights(self, run_id: str, state_dict: dict[str, torch.Tensor]) -> None:
        """Save CPU copies as weights.safetensors (atomically; copies also untie shared storage)."""
        tensors = {}
        for key, value in state_dict.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"state_dict[{key!r}]: expected a tensor, got {type(value).__name__}")
            tensors[key] = value.detach().to("cpu", copy=True).contiguous()
        _atomic_write(self._existing(run_id) / "weights.safetensors", _pt_bytes(tensors), temp_tag(self.root))

    def load_weights(self, run_id: str) -> dict[str, torch.Tensor]:
        """The final weights (safetensors: tensors only, nothing is unpickled or executed)."""
        path = self._existing(run_id) / "weights.safetensors"
        if not path.is_file():
            raise RunNotFoundError(f"run_id: {run_id!r} has no saved weights")
        return _safe_load(path, _pt_load)

    def save_snapshot(self, run_id: str, rec: SnapshotRecord) -> None:
        """Attention patterns at rec.step -> attention/step_{step:07d}.safetensors (float16)."""
        _check_step(rec.step)
        folder = self._existing(run_id) / "attention"
        folder.mkdir(exist_ok=True)
        arrays = {k: np.ascontiguousarray(v, dtype=np.float16) for k, v in rec.patterns.items()}
        arrays |= {WEIGHTS_PREFIX + k: np.ascontiguousarray(v, dtype=np.float16) for k, v in rec.weights.items()}
        _atomic_write(folder / f"step_{rec.step:07d}.safetensors", _np_bytes(arrays), temp_tag(self.root))

    def snapshot_steps(self, run_id: str) -> list[int]:
        folder = self._existing(run_id) / "attention"
        names = (p.name for p in folder.glob("step_*.safetensors")) if folder.is_dir() else ()
        return sorted(int(n[5:-12]) for n in names if n[5:-12].isdigit())

    def snapshot_near(self, run_id: str, step: float | None = None) -> int | None:
        """The snapshot step nearest `step` (None: the last one), or None for a run without snapshots: every
        view of one chosen step (Inspect's panels, the API) reads the same snapshot."""
        steps = self.snapshot_steps(run_id)
        if not steps:
            return None
        return steps[-1] if step is None else min(steps, key=lambda s: abs(s - step))

    def _snapshot(self, run_id: str, step: int) -> dict[str, np.ndarray]:
        _check_step(step)
        path = self._existing(run_id) / "attention" / f"step_{step:07d}.safetensors"
        if not path.is_file():
            raise RunNotFoundError(f"step: run {run_id!r} has no attention snapshot at step {step}")
        return _safe_load(path, _np_load)

    def load_snapshot(self, run_id: str, step: int) -> dict[str, np.ndarray]:
        """The probe's attention at a snapshot step: kind -> (layers, heads, Tq, Tk) float32."""
        return {k: v.astype(np.float32) for k, v in self._snapshot(run_id, step).items()
                if not k.startswith(WEIGHTS_PREFIX)}

    def load_snapshot_weights(self, run_id: str, step: int) -> dict[str, torch.Tensor] | None:
        """The weights kept with the snapshot at `step` (float16 values as float32 tensors), or None where
        that snapshot has none (a model too large to keep them, or a run stored before they were kept)."""
        weights = {k[len(WEIGHTS_PREFIX):]: torch.from_numpy(v.astype(np.float32))
                   for k, v in self._snapshot(run_id, step).items() if k.startswith(WEIGHTS_PREFIX)}
        return weights or None

    def weights_at(self, run_id: str, step: int | None = None) -> tuple[dict[str, torch.Tensor], int]:
        """(weights, their step): the final weights (step None, or the run's last step), else those kept with
        the attention snapshot at `step`. RunNotFoundError naming `step` where there are none."""
        summary = self.summary(run_id) or {}
        last = int(summary.get("steps") or 0)
        if step is None or (summary and step == last):
            return self.load_weights(run_id), last
        weights = self.load_snapshot_weights(run_id, step)
        if weights is None:
            raise RunNotFoundError(f"step: the snapshot at step {step} kept no weights (a model over 1M parameters, "
                                   "or a run stored before snapshots kept them): use the final weights")
        return weights, step

