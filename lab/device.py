"""Where a run trains, and its data there: the device, bf16 autocast, CPU threads, batches on the device.

Split from the training loop (lab/trainer.py) so that both ways of training, one run alone and k batched
seeds (lab/batched.py), take their batches and held-out data from the same place.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Optional, Sequence

import torch

from lab.config import RunConfig
from lab.tasks.batches import Batch, draw_length, eval_batches, get_task

_THREADS_LOCK = threading.Lock()


def resolve_device(name: str) -> torch.device:
    """"auto" picks CUDA, then Apple's MPS, then the CPU."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("train.device: 'cuda' was asked for but no CUDA GPU is available (allowed here: auto, cpu)")
    mps = getattr(torch.backends, "mps", None)
    if name == "mps" and not (mps and mps.is_available()):
        raise ValueError("train.device: 'mps' was asked for but no Apple GPU is available (allowed here: auto, cpu)")
    return torch.device(name)


def autocast(device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA (Micikevicius et al. 2018, mixed precision; bf16 needs no loss
    scaling): matmuls and attention in bf16, softmax, norms and the loss kept in fp32 by
    torch's autocast lists, fp32 master weights and optimiser. Off on CPU and MPS (fp32)."""
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def set_threads(n: int) -> None:
    """Intra-op threads are process-wide; oversubscribing the cores slows steps many times over
    (benchmarks/RESULTS.md, "Thread oversubscription")."""
    with _THREADS_LOCK:
        if torch.get_num_threads() != n:
            torch.set_num_threads(n)


def to_device(b: Batch, device: torch.device) -> Batch:
    """The batch on `device` (itself if it is there already); a CPU batch bound for CUDA is pinned and
    copied asynchronously, without a host sync."""
    if b.inp.device == device:  # the CPU's every training step
        return b
    if device.type == "cuda" and b.inp.device.type == "cpu":
        b = Batch(b.inp.pin_memory(), b.tgt.pin_memory(), None if b.src is None else b.src.pin_memory())
    return b.to(device)  # non_blocking copies; no copy for a tensor already on the device


def device_eval_batches(cfg: RunConfig, device: torch.device) -> dict[str, list[Batch]]:
    """The run's held-out batches ("eval" at training lengths, "ood" beyond), copied to the device once."""
    return {s: [to_device(b, device) for b in eval_batches(cfg.task, cfg.model.arch, s, cfg.train.eval_samples)]
            for s in ("eval", "ood")}


class BatchSource:
    """The run's training batches, made where the model trains; call it for the next batch. On CUDA
    (`on_device`) the tokens come from a generator on the GPU and only each batch's length (one integer)
    from a CPU generator, so no step waits for a host-to-device copy or a sync. Elsewhere one CPU
    generator makes everything (the streams a CPU run has always used; MPS gets them by copy).
    The generators' states are the data stream's position: `state()` and `restore()` carry it across
    a checkpoint (lab/checkpoint.py)."""

    def __init__(self, cfg: RunConfig, device: torch.device, on_device: Optional[bool] = None) -> None:
        self.task, self.cfg, self.device = get_task(cfg.task.name), cfg, device
        self.kind = "cuda" if (device.type == "cuda" if on_device is None else on_device) else "cpu"
        seed = cfg.train.seed
        self.gens: tuple[torch.Generator, ...] = (
            (torch.Generator().manual_seed(seed),) if self.kind == "cpu"
            else (torch.Generator().manual_seed(seed), torch.Generator(device).manual_seed(seed)))  # lengths, tokens

    def __call__(self) -> Batch:
        cfg, tc = self.cfg, self.cfg.train
        if self.kind == "cpu":
            return to_device(self.task.batch(cfg.task, cfg.model.arch, tc.batch_size, self.gens[0]), self.device)
        length = draw_length(cfg.task, self.gens[0])  # on the CPU generator: no sync with the GPU
        return self.task.batch(cfg.task, cfg.model.arch, tc.batch_size, self.gens[1], length)

    def state(self) -> tuple[torch.Tensor, ...]:
        """Each generator's state (uint8 CPU tensors), in order: where the data stream stands."""
        return tuple(g.get_state() for g in self.gens)

    def restore(self, kind: str, states: Sequence[torch.Tensor], step: int) -> bool:
        """Put the stream back where `state()` found it (True). A state saved by the other kind of source
        (a CUDA run continued on the CPU, or back) cannot be replayed here: the stream is then reseeded
        from the seed and `step`, a sensible continuation but not the same batches (False)."""
        if kind == self.kind and len(states) == len(self.gens):
            for g, s in zip(self.gens, states):
                g.set_state(s)
            return True
        for g in self.gens:
            g.manual_seed(self.cfg.train.seed + 1_000_033 * (step + 1))
        return False


def batch_source(cfg: RunConfig, device: torch.device, on_device: Optional[bool] = None) -> BatchSource:
    """The run's training batches (see BatchSource)."""
    return BatchSource(cfg, device, on_device)
