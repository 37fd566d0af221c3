"""Where a run trains, and its data there: the device, bf16 autocast, CPU threads, batches on the device.

Split from the training loop (lab/trainer.py) so that both ways of training, one run alone and k batched
seeds (lab/batched.py), take their batches and held-out data from the same place.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Callable, Optional

import torch

from lab.config import RunConfig
from lab.tasks import Batch, eval_batches, get_task

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
    """Intra-op threads are process-wide; oversubscribing 2 cores slows steps 10-50x (docs/SCIENCE.md)."""
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


def batch_source(cfg: RunConfig, device: torch.device, on_device: Optional[bool] = None) -> Callable[[], Batch]:
    """The run's training batches, made where the model trains. On CUDA (`on_device`) the tokens come
    from a generator on the GPU and only each batch's length (one integer) from a CPU generator, so no
    step waits for a host-to-device copy or a sync. Elsewhere one CPU generator makes everything (the
    streams a CPU run has always used; MPS gets them by copy)."""
    task, tc, arch = get_task(cfg.task.name), cfg.train, cfg.model.arch
    if not (device.type == "cuda" if on_device is None else on_device):
        gen = torch.Generator().manual_seed(tc.seed)
        return lambda: to_device(task.batch(cfg.task, arch, tc.batch_size, gen), device)
    lengths = torch.Generator().manual_seed(tc.seed)
    tokens = torch.Generator(device).manual_seed(tc.seed)
    lo, hi = cfg.task.min_len, cfg.task.max_len

    def draw() -> Batch:
        length = int(torch.randint(lo, hi + 1, (1,), generator=lengths))
        return task.batch(cfg.task, arch, tc.batch_size, tokens, length)
    return draw
