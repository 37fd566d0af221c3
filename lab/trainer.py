"""The training loop: one synchronous function, callbacks with small frozen records, a stop check.

No threads and no files here (see jobs.py and runs.py). Reproducible from the seed: the model is
initialised from a forked global RNG seeded with `train.seed`, the data come from a per-run
`torch.Generator`, and dropout masks from the global RNG seeded with `train.seed` at the start, so
two runs with one config give the same numbers on the same device (with dropout, when no other
run trains in the same process at the same time: the app's worker processes run one at a time).
"""
from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch
from torch import Tensor

from lab.config import RunConfig, TrainConfig
from lab.model import Transformer
from lab.optim import FastAdamW, clip_grad_norm
from lab.records import EvalRecord, Record, SnapshotRecord, StepRecord
from lab.tasks import IGNORE_INDEX, Batch, eval_batches, get_task, probe

_INIT_LOCK = threading.Lock()  # model init uses the global RNG: one thread at a time
_THREADS_LOCK = threading.Lock()
MAX_LOGGED_STEPS = 500  # train records per run, at most (plus the last step)


@dataclass(frozen=True)
class TrainResult:
    steps_done: int
    stopped: bool
    wall_s: float
    device: str
    params: int
    tokens_per_s: float
    final_train_loss: float
    final_eval: Optional[EvalRecord]
    state_dict: dict[str, Tensor]  # final weights, on the CPU


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


def set_threads(n: int) -> None:
    """Intra-op threads are process-wide; oversubscribing 2 cores slows steps 10-50x (docs/SCIENCE.md)."""
    with _THREADS_LOCK:
        if torch.get_num_threads() != n:
            torch.set_num_threads(n)


def build_model(cfg: RunConfig, device: torch.device | str = "cpu") -> Transformer:
    """A freshly initialised model for this config, seeded from `train.seed`."""
    vocab = get_task(cfg.task.name).vocab_size(cfg.task)
    with _INIT_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.train.seed)
        model = Transformer(cfg.model, vocab)
    return model.to(device)


def make_optimizer(model: torch.nn.Module, tc: TrainConfig) -> torch.optim.Optimizer:
    """AdamW with weight decay on matrices only: no decay for biases, norms and embeddings."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        embedding = name.startswith(("tok_emb", "pos."))
        (decay if p.dim() >= 2 and not embedding else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": tc.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = all(p.device.type in ("cpu", "cuda") for p in decay + no_decay)  # one kernel, no per-tensor ops
    return torch.optim.AdamW(groups, lr=tc.lr, betas=(tc.beta1, tc.beta2), foreach=not fused, fused=fused)


def lr_at(step: int, tc: TrainConfig) -> float:
    """Linear warmup over `warmup` steps, then cosine / linear decay to min_lr_ratio * lr (or constant)."""
    if step < tc.warmup:
        return tc.lr * (step + 1) / tc.warmup
    if tc.schedule == "constant" or tc.steps <= tc.warmup:
        return tc.lr
    frac = min(1.0, (step - tc.warmup) / max(1, tc.steps - 1 - tc.warmup))
    shape = 0.5 * (1 + math.cos(math.pi * frac)) if tc.schedule == "cosine" else 1 - frac
    return tc.lr * (tc.min_lr_ratio + (1 - tc.min_lr_ratio) * shape)


def train_step(model: Transformer, b: Batch, params: list[Tensor], opt: FastAdamW, clip: float,
               amp: contextlib.AbstractContextManager) -> tuple[Tensor, Tensor]:
    """One optimisation step: forward, backward, clip the gradients' joint norm to `clip`, AdamW.
    Returns (loss, grad norm before clipping), both on the device: no host sync here."""
    with amp:
        loss = model(b.inp, b.src, b.tgt).loss
    for p in params:  # zero_grad(set_to_none=True), without walking the param groups
        p.grad = None
    loss.backward()
    grad_norm = clip_grad_norm([p.grad for p in params if p.grad is not None], clip)
    opt.step()
    return loss, grad_norm


@torch.no_grad()
def evaluate(model: Transformer, batches: list[Batch], device: torch.device) -> tuple[float, float, float]:
    """(loss, token accuracy, exact-match) over scored positions of held-out batches."""
    was_training = model.training
    model.eval()
    loss_sum = correct = scored = exact = rows = 0.0
    for b in batches:
        b = b.to(device)
        out = model(b.inp, b.src)
        mask = b.tgt != IGNORE_INDEX  # (B, T)
        logits = out.logits[mask]  # (N, vocab)
        loss_sum += torch.nn.functional.cross_entropy(logits, b.tgt[mask], reduction="sum").item()
        hit = (out.logits.argmax(-1) == b.tgt) | ~mask  # (B, T)
        correct += (hit & mask).sum().item()
        scored += mask.sum().item()
        exact += hit.all(dim=1).sum().item()
        rows += b.tgt.shape[0]
    model.train(was_training)
    return loss_sum / max(scored, 1), correct / max(scored, 1), exact / max(rows, 1)


@torch.no_grad()
def probe_attention(model: Transformer, cfg: RunConfig, device: torch.device) -> dict[str, np.ndarray]:
    """Attention patterns for the run's fixed probe input: kind -> (n_layers, n_heads, Tq, Tk)."""
    was_training = model.training
    model.eval()
    b = probe(cfg.task, cfg.model.arch).to(device)
    out = model(b.inp, b.src, need_weights=True)
    model.train(was_training)
    return {k: v[:, 0].float().cpu().numpy() for k, v in out.attention.items()}  # drop batch dim


def snapshot_steps(tc: TrainConfig) -> set[int]:
    """`snapshots` steps spread evenly from 0 (the untrained model) to the last step."""
    k = tc.snapshots
    if k == 0:
        return set()
    if k == 1:
        return {tc.steps}
    return {round(i * tc.steps / (k - 1)) for i in range(k)}


def train(
    cfg: RunConfig,
    on_record: Optional[Callable[[Record], None]] = None,
    should_stop: Optional[Callable[[], bool]] = None,
    threads: Optional[int] = None,
) -> TrainResult:
    """Train a model for `cfg.train.steps` steps (or until `should_stop()` returns True)."""
    tc = cfg.train
    emit = on_record or (lambda r: None)
    stop = should_stop or (lambda: False)
    device = resolve_device(tc.device)
    if device.type == "cpu":
        set_threads(threads or tc.threads or os.cpu_count() or 1)
    model = build_model(cfg, device)
    model.train()
    if cfg.model.dropout > 0:  # dropout masks come from the global generator: seed it per run, so a
        torch.manual_seed(tc.seed)  # worker process (one run at a time, job after job) repeats a run exactly
    opt = make_optimizer(model, tc)
    next_batch = batch_source(cfg, device)
    evals = device_eval_batches(cfg, device)
    snaps = snapshot_steps(tc)
    log_every = max(1, tc.steps // MAX_LOGGED_STEPS)
    clip = tc.grad_clip if tc.grad_clip > 0 else float("inf")
    amp = autocast(device)
    params = list(model.parameters())  # once: model.parameters() walks every module each call
    fast_opt = FastAdamW(opt)
    # no host sync per step: loss and grad norm stay on the device except at the logged steps

    t0 = time.perf_counter()
    tokens = 0
    window = (0.0, 0)  # (time, tokens) at the last train record, for recent throughput
    loss_val = float("nan")
    last_eval: Optional[EvalRecord] = None

    def do_eval(step: int) -> EvalRecord:
        loss, acc, em = evaluate(model, evals["eval"], device)
        ood = evaluate(model, evals["ood"], device) if evals["ood"] else (None, None, None)
        rec = EvalRecord(step, time.perf_counter() - t0, tokens, loss, acc, em, *ood)
        emit(rec)
        return rec

    if 0 in snaps:
        emit(SnapshotRecord(0, probe_attention(model, cfg, device)))
    step = 0
    stopped = False
    while step < tc.steps:
        if stop():
            stopped = True
            break
        lr = lr_at(step, tc)
        for g in opt.param_groups:
            g["lr"] = lr
        b = next_batch()
        loss, grad_norm = train_step(model, b, params, fast_opt, clip, amp)
        step += 1
        tokens += b.inp.numel() + (b.src.numel() if b.src is not None else 0)
        last = step == tc.steps
        if step % log_every == 0 or last:
            now = time.perf_counter() - t0
            loss_val = loss.item()
            tps = (tokens - window[1]) / max(now - window[0], 1e-9)
            window = (now, tokens)
            emit(StepRecord(step, loss_val, lr, float(grad_norm), tokens, now, tps))
        if step % tc.eval_every == 0 or last:
            last_eval = do_eval(step)
        if step in snaps:
            emit(SnapshotRecord(step, probe_attention(model, cfg, device)))
    if stopped and step > 0:  # a stopped run ends with metrics and attention at the step it reached
        if last_eval is None or last_eval.step != step:
            last_eval = do_eval(step)
        if step not in snaps:  # (at most one snapshot per step)
            emit(SnapshotRecord(step, probe_attention(model, cfg, device)))
    wall = time.perf_counter() - t0
    return TrainResult(
        steps_done=step,
        stopped=stopped,
        wall_s=wall,
        device=str(device),
        params=model.num_params(),
        tokens_per_s=tokens / max(wall, 1e-9),
        final_train_loss=loss_val,
        final_eval=last_eval,
        state_dict={k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
    )
