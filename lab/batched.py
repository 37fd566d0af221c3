"""Batched seed repeats: k runs that share every shape, trained as one model with stacked parameters.

Model ensembling with `torch.func` (functional_call + vmap; the technique of the functorch
"model ensembling" tutorial, after JAX's vmap): every parameter gets a leading axis of size k,
one vmapped forward/backward trains all k at once, and each run is stored exactly as if it had
trained alone. What makes each run indistinguishable from its solo twin:
  - init: each slice is `build_model(cfg_i)`, seeded from its own train.seed;
  - data: each run draws its batches from its own `torch.Generator(seed)`, in the same order as
    `lab.trainer.train`; a step's batches are right-padded to the longest one (tokens that no
    earlier position can see in a causal decoder, with targets ignored by the loss);
  - optimiser: AdamW (Loshchilov & Hutter 2019) written out per slice, with the solo optimiser's
    weight-decay rule and epsilon (lab/optim.py `decays`, `EPS`), the gradient clipped
    by each run's own global norm and each run's own learning-rate schedule (runs may differ
    in lr as well as seed);
  - the loop is the trainer's own (`lab.trainer.fit`): evaluation (held-out and training-set metrics,
    lab/evaluation.py), attention snapshots, logging and stopping run on a plain model loaded with the
    run's slice; only the step (`BatchedStepper`) differs.
Results match solo training to float32 round-off (tests/test_batched.py), not bit for bit.
Each member run's checkpoint (`state`) is the per-run format of lab/checkpoint.py: its slice of the
weights and AdamW moments, its step count and its batch source, so any member can be continued alone
(by the solo trainer; it then goes on in fused AdamW's round-off, not this one's).
Limits: decoder-only, no dropout and no randomized positions (per-run draws cannot match the solo runs),
one device.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
from typing import Callable, Optional

import torch
from torch import Tensor
from torch.func import functional_call, vmap

from lab.checkpoint import Checkpoint, RunState
from lab.config import RunConfig
from lab.records import Record
from lab.tasks.batches import IGNORE_INDEX, Batch
from lab.device import autocast, batch_source, resolve_device, set_threads, to_device
from lab.optim import EPS, decays
from lab.trainer import TrainResult, build_model, fit, lr_at


def batch_key(cfg: RunConfig) -> Optional[str]:
    """Runs with equal keys can train as one batched model (they may differ in seed, lr and
    name); None for a config that cannot be batched at all."""
    if cfg.model.arch != "decoder" or cfg.model.dropout > 0 or cfg.model.pos_range:  # per-run draws
        return None
    plain = dataclasses.replace(cfg, name="", train=dataclasses.replace(cfg.train, seed=0, lr=1.0))
    return plain.to_json()


def vmap_attention(device: torch.device) -> contextlib.AbstractContextManager:
    """The attention kernels the vmapped step may use. On CUDA not the memory-efficient one: its backward under
    vmap (torch 2.11, an H200) refused the text task's 31 positions ("LSE is not correctly aligned
    (strideH)"), so three seeds of a text run failed at step 0: flash attention where it applies, else math."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.MATH])


def _pad(t: Tensor, length: int, value: int) -> Tensor:
    return torch.nn.functional.pad(t, (0, length - t.shape[1]), value=value)  # (B, length)


class BatchedStepper:
    """k runs' parameters stacked on a leading axis: one vmapped forward and backward, AdamW per slice."""

    def __init__(self, cfgs: list[RunConfig], device: torch.device) -> None:
        tc0 = cfgs[0].train
        self.cfgs, self.device = cfgs, device
        self.models = [build_model(c, device) for c in cfgs]  # each seeded from its own train.seed
        self.shell = self.models[0]  # runs the stacked parameters; its own values are never used
        names = [n for n, _ in self.shell.named_parameters()]
        self.params = {n: torch.stack([dict(m.named_parameters())[n].detach() for m in self.models]).requires_grad_()
                       for n in names}  # name -> (k, *shape)
        self.buffers = dict(self.shell.named_buffers())
        self.moments = {n: (torch.zeros_like(p), torch.zeros_like(p)) for n, p in self.params.items()}  # AdamW m, v
        self.wd = {n: (tc0.weight_decay if decays(n, p.dim() - 1, tc0.decay_embeddings == "yes") else 0.0)  # (k, *shape)
                   for n, p in self.params.items()}
        self.sources = [batch_source(c, device) for c in cfgs]  # each run's own batches, as it would get alone
        self.clip = tc0.grad_clip if tc0.grad_clip > 0 else float("inf")
        self.betas = (tc0.beta1, tc0.beta2)
        self.amp = autocast(device)
        self.live = list(range(len(cfgs)))  # runs still training, in stack order
        self.steps_done = 0

    def _loss(self, p: dict[str, Tensor], inp: Tensor, tgt: Tensor) -> Tensor:
        return functional_call(self.shell, (p, self.buffers), (inp, None, tgt),
                               {"label_smoothing": self.cfgs[0].train.label_smoothing}).loss

    def step(self, step: int) -> tuple[list[float], Tensor, Tensor, list[int]]:
        batches = [self.sources[i]() for i in self.live]
        T = max(b.inp.shape[1] for b in batches)
        inp = torch.stack([_pad(b.inp, T, 0) for b in batches])  # (k, B, T)
        tgt = torch.stack([_pad(b.tgt, T, IGNORE_INDEX) for b in batches])  # (k, B, T)
        stacked = to_device(Batch(inp, tgt), self.device)
        lrs = [lr_at(step, self.cfgs[i].train) for i in self.live]
        with self.amp, vmap_attention(self.device):
            losses = vmap(self._loss)(self.params, stacked.inp, stacked.tgt)  # (k,)
            for p in self.params.values():
                p.grad = None
            losses.sum().backward()  # slices are independent: each gets its own run's gradient
        lr_t = torch.tensor(lrs)  # (k,); on CUDA a pinned, asynchronous copy: no host sync per step
        lr_t = lr_t.pin_memory().to(self.device, non_blocking=True) if self.device.type == "cuda" else lr_t
        norms = _adamw_step(self.params, self.moments, self.wd, lr_t, step + 1, *self.betas, self.clip)
        self.steps_done = step + 1
        return lrs, losses, norms, [b.inp.numel() for b in batches]

    def model(self, j: int) -> torch.nn.Module:
        """The plain model of stack slice j, loaded with that slice's parameters."""
        m = self.models[self.live[j]]
        with torch.no_grad():
            for n, p in m.named_parameters():
                p.copy_(self.params[n][j])
        return m

    def state(self, j: int) -> RunState:
        """Live run j's checkpoint state in the solo format: its slices of the stacked parameters and
        moments (AdamW's step count as torch keeps it: a float32 scalar), its model's buffers, its batches."""
        m = self.model(j)
        step = torch.tensor(float(self.steps_done), dtype=torch.float32)
        moments = {n: (mv[0][j].detach().cpu().clone(), mv[1][j].detach().cpu().clone())
                   for n, mv in self.moments.items()}
        src = self.sources[self.live[j]]
        return RunState({k: v.detach().cpu().clone() for k, v in m.state_dict().items()},
                        {n: mv[0] for n, mv in moments.items()}, {n: mv[1] for n, mv in moments.items()},
                        {n: step.clone() for n in moments}, src.state(), src.kind)

    def keep(self, kept: list[int]) -> None:
        idx = torch.tensor(kept, device=self.device)
        self.params = {n: p.detach()[idx].requires_grad_() for n, p in self.params.items()}
        self.moments = {n: (m[idx], v[idx]) for n, (m, v) in self.moments.items()}
        self.live = [self.live[j] for j in kept]


def train_batched(
    cfgs: list[RunConfig],
    on_record: Optional[list[Callable[[Record], None]]] = None,
    should_stop: Optional[list[Callable[[], bool]]] = None,
    threads: Optional[int] = None,
    on_checkpoint: Optional[list[Callable[[Checkpoint], None]]] = None,
    stop_at: Optional[int] = None,
) -> list[TrainResult]:
    """Train k runs whose configs share a `batch_key` as one batched model (the trainer's own loop);
    returns one TrainResult per run, in order, as each would have trained alone. `on_checkpoint[i]` gets
    run i's checkpoints (the solo format), `stop_at` stops them all at that step."""
    keys = {batch_key(c) for c in cfgs}
    if None in keys or len(keys) != 1:
        raise ValueError("configs: batched runs must be decoder-only, without dropout or randomized positions, and "
                         "differ only in "
                         "train.seed, train.lr and name")
    k, tc0 = len(cfgs), cfgs[0].train
    device = resolve_device(tc0.device)
    if device.type == "cpu":
        set_threads(threads or tc0.threads or 1)
    stepper = BatchedStepper(list(cfgs), device)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*batching rule.*")  # CPU SDPA: vmap falls back to a loop
        return fit(cfgs, stepper, device, on_record or [lambda r: None] * k, should_stop or [lambda: False] * k,
                   on_checkpoint, None, stop_at)


@torch.no_grad()
def _adamw_step(params: dict[str, Tensor], state: dict[str, tuple[Tensor, Tensor]], wd: dict[str, float],
                lr: Tensor, t: int, b1: float, b2: float, clip: float) -> Tensor:
    """Per-slice gradient clipping by global norm, then AdamW with per-slice learning rates `lr` (k,),
    for stacked (k, ...) parameters. Returns the (k,) pre-clipping gradient norms."""
    grads = {n: p.grad for n, p in params.items()}
    first = next(iter(params.values()))
    k = first.shape[0]
    sq = torch.zeros(k, device=first.device)
    for g in grads.values():
        sq += g.pow(2).reshape(k, -1).sum(1)
    norms = sq.sqrt()  # (k,)
    coef = (clip / (norms + 1e-6)).clamp(max=1.0)  # as clip_grad_norm_
    bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
    for n, p in params.items():
        shape = (k,) + (1,) * (p.dim() - 1)
        g = grads[n] * coef.view(shape)
        m, v = state[n]
        m.lerp_(g, 1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        if wd[n]:
            p.mul_(1 - lr.view(shape) * wd[n])
        denom = (v.sqrt() / math.sqrt(bc2)).add_(EPS)
        p.sub_((lr / bc1).view(shape) * m / denom)
    return norms
